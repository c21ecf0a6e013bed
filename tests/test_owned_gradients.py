"""Note [Owned gradients] (autograd/task/step.py): a commit adopts a staged array as a
leaf's first ``.grad`` only when the engine made it and nobody else holds it. Every
array somebody else holds (a hook, a retained non-leaf gradient, a custom Function's
result, the caller's ``gradient=``) is copied, so a later commit's in-place addition
into ``.grad`` never writes into it.

Each case runs on the inline commit (the sums added in place on the loop) and on the
large-commit path (summed on a worker into fresh arrays, then published), and checks
values, not timings."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, get_engine, set_engine

# inline_threshold: 2**62 commits inline; 0 offloads every node and sums the commit on
# a worker (commit.sum_fresh + commit.publish)
THRESHOLDS = [2**62, 0]


@pytest.fixture(params=THRESHOLDS, ids=["inline-commit", "worker-commit"])
def engine(request):
    prev = get_engine()
    eng = Engine(inline_threshold=request.param)
    set_engine(eng)
    yield eng
    set_engine(prev)


async def test_a_tensor_hook_keeps_the_gradient_it_saw(engine, adopted):
    w = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    kept: list[ag.Tensor] = []
    w.register_hook(lambda g: kept.append(g))
    await ag.backward((w * 2.0).sum())
    await ag.backward((w * 2.0).sum())
    assert adopted == [False]  # the hook saw the array: copied
    assert [k.tolist() for k in kept] == [[2.0] * 3, [2.0] * 3]
    assert w.grad.tolist() == [4.0] * 3
    assert not np.shares_memory(w.grad.numpy(), kept[0].numpy())


async def test_a_retained_non_leaf_gradient_is_not_shared_with_a_leaf(engine, adopted):
    """``y = x + 0`` passes its gradient through to ``x``: the same array reaches
    ``y.grad`` (retain_grad) and ``x.grad``."""
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x + 0.0
    y.retain_grad()
    loss = (y * ag.tensor([3.0, 5.0])).sum()
    await ag.backward(loss, retain_graph=True)
    assert not np.shares_memory(x.grad.numpy(), y.grad.numpy())
    await ag.backward(loss)
    assert x.grad.tolist() == [6.0, 10.0]
    assert y.grad.tolist() == [6.0, 10.0]
    assert adopted[0] is False  # x's gradient is the array y's gradient is


class SameGradTwice(ag.autograd.Function):
    """Returns one new Tensor as the gradient of both inputs."""

    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, g):
        h = g * 1.0  # (a new array: only the engine's own rule could tell it apart)
        return h, h


async def test_a_function_returning_one_array_for_two_inputs(engine, adopted):
    a = ag.tensor([1.0, 2.0], requires_grad=True)
    b = ag.tensor([3.0, 4.0], requires_grad=True)
    for _ in range(2):
        await ag.backward(SameGradTwice.apply(a, b).sum())
    assert adopted == [False, False]  # a custom Function's results are the user's
    assert a.grad.tolist() == [2.0, 2.0] and b.grad.tolist() == [2.0, 2.0]
    assert not np.shares_memory(a.grad.numpy(), b.grad.numpy())


async def test_the_callers_gradient_is_never_written_into(engine, adopted):
    v = ag.tensor([1.0, 2.0], requires_grad=True)
    w = ag.tensor([5.0, 6.0], requires_grad=True)
    g = ag.tensor([3.0, 4.0])
    for _ in range(2):
        await ag.backward(v + w, g)  # add passes the caller's gradient through to both
    assert g.tolist() == [3.0, 4.0]
    assert v.grad.tolist() == [6.0, 8.0] and w.grad.tolist() == [6.0, 8.0]
    assert not np.shares_memory(v.grad.numpy(), g.numpy())
    assert not np.shares_memory(v.grad.numpy(), w.grad.numpy())
    assert adopted == [False, False]


async def test_a_gradient_routed_to_two_leaves_is_copied_for_each(engine, adopted):
    """One array for two leaves (``add``'s rule returns its input gradient for both):
    neither adopts it, so accumulating into one leaves the other alone."""
    a = ag.tensor([1.0, 2.0], requires_grad=True)
    b = ag.tensor([3.0, 4.0], requires_grad=True)
    for _ in range(2):
        await ag.backward(((a + b) * 2.0).sum())
    assert a.grad.tolist() == [4.0, 4.0] and b.grad.tolist() == [4.0, 4.0]
    assert adopted == [False, False]


@pytest.mark.parametrize("n", [3, 70_000])
async def test_a_kernels_new_array_is_adopted(engine, adopted, n):
    """A built-in kernel's new array (``w * 2``'s gradient) becomes ``.grad`` itself,
    run inline, offloaded, or in a worker chain (``inline_threshold=0``)."""
    w = ag.tensor(np.arange(n, dtype=np.float64), requires_grad=True)
    await ag.backward((w * 2.0).sum())
    assert adopted == [True]
    np.testing.assert_array_equal(w.grad.numpy(), np.full(n, 2.0))


async def test_a_deferred_sum_is_adopted(engine, adopted):
    """The sum of a large leaf's several gradients (deferred: Note [Deferred sums]) is
    a fresh array the engine made; its value is the eager sum's."""
    n = 70_000
    u = ag.tensor(np.arange(n, dtype=np.float64), requires_grad=True)
    await ag.backward((u * 2.0 + u * 3.0).sum())
    assert adopted == [True]
    np.testing.assert_array_equal(u.grad.numpy(), np.full(n, 5.0))


async def test_a_pre_commit_function_sees_arrays_that_are_then_copied(engine, adopted):
    """A pre-commit function may keep the Tensors it is shown (Note [Pre-commit]):
    none of them is adopted."""
    w = ag.tensor([1.0, 2.0], requires_grad=True)
    shown: list[ag.Tensor] = []
    loss = (w * 2.0).sum()
    # (queued from a node hook: queue_pre_commit needs the running backward)
    loss.grad_fn.register_prehook(lambda grads: ag.autograd.queue_pre_commit(
        lambda view: shown.extend(view.values())) and None)
    await ag.backward(loss, retain_graph=True)
    await ag.backward(loss)
    assert [s.tolist() for s in shown] == [[2.0, 2.0], [2.0, 2.0]]
    assert w.grad.tolist() == [4.0, 4.0]
    assert adopted == [False]


# Note [A whole view of new memory] (backend.py): a rule's result reshaped from an array
# nothing else holds is adopted too; a view of memory anybody else holds never is.

async def test_a_kernels_new_array_reshaped_is_adopted(engine, adopted):
    """Batch norm's input gradient is built as (N, C, H*W) and returned reshaped."""
    rng = np.random.default_rng(0)
    x = ag.tensor(rng.standard_normal((4, 3, 5, 5)), requires_grad=True)
    g = rng.standard_normal((4, 3, 5, 5))
    out = ag.nn.functional.batch_norm(x, None, None, training=True)
    await ag.backward(out, ag.tensor(g), retain_graph=True)
    assert adopted[0] is True
    first = x.grad.numpy().copy()
    await ag.backward(out, ag.tensor(g))  # (added in place into the adopted array)
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-12)
    assert not np.shares_memory(x.grad.numpy(), g)


async def test_a_view_of_a_retained_gradient_is_copied(engine, adopted):
    """``reshape``'s rule returns its gradient reshaped: here that gradient is also the
    retained ``t.grad``, so ``x.grad`` must not share its memory."""
    x = ag.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    t = x.reshape(6)
    t.retain_grad()
    loss = (t * ag.tensor(np.arange(6.0))).sum()
    await ag.backward(loss, retain_graph=True)
    assert True not in adopted  # (x.grad's, and t.grad's own)
    assert not np.shares_memory(x.grad.numpy(), t.grad.numpy())
    await ag.backward(loss)
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(t.grad.numpy(), 2 * np.arange(6.0))


async def test_a_view_of_the_callers_gradient_is_copied(engine, adopted):
    x = ag.tensor(np.zeros((2, 3)), requires_grad=True)
    g = np.arange(6.0)
    for _ in range(2):
        await ag.backward(x.reshape(6), ag.from_numpy(g))
    np.testing.assert_array_equal(g, np.arange(6.0))
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(6.0).reshape(2, 3))
    assert adopted == [False]


def test_which_views_the_numpy_backend_owns():
    from asyncgrad.backend import NUMPY

    def made_here():
        return np.empty(6).reshape(2, 3)

    held = np.empty(6)
    assert NUMPY.owns_memory(np.empty(6))
    assert NUMPY.owns_memory(made_here())  # whole, contiguous, nobody else holds the base
    assert not NUMPY.owns_memory(held.reshape(2, 3))  # ``held`` is the base
    assert not NUMPY.owns_memory(np.empty(6)[:3])  # part of its base
    assert not NUMPY.owns_memory(np.empty((2, 3)).T)  # not C-contiguous
    read_only = np.empty(6).reshape(2, 3)
    read_only.flags.writeable = False
    assert not NUMPY.owns_memory(read_only)
    other = held.reshape(3, 2)
    assert not NUMPY.owns_memory(other.reshape(6))  # ``other`` views the base too
