"""The engine's fast paths for small backward calls (issue 11) behave exactly as the
general paths: plain leaves staged in place (Note [Plain leaves] in task/step.py), the
one-leading-axis sum in validation.fix_gradient, the in-place commit loop, and the
scalar ``backward(loss)`` preparation. Values, orders and errors, never durations."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.graph import AccumulateGrad
from asyncgrad.autograd.tools.reference import ReferenceEngine
from asyncgrad.autograd.graph.validate import fix_gradient
from asyncgrad.functional import linear
from asyncgrad.ops._broadcast import sum_to


def _mlp(dtype, seed=0):
    rng = np.random.default_rng(seed)
    ps = [ag.from_numpy(rng.standard_normal(s).astype(dtype)).requires_grad_()
          for s in [(5, 4), (5,), (3, 5), (3,)]]
    return ps, rng.standard_normal((6, 4)).astype(dtype)


def _torch_grads(ps, x, passes):
    torch = pytest.importorskip("torch")  # optional oracle: CI has no torch
    tps = [torch.from_numpy(p.numpy().copy()).requires_grad_() for p in ps]
    for _ in range(passes):
        h = torch.relu(torch.nn.functional.linear(torch.from_numpy(x), tps[0], tps[1]))
        h = torch.nn.functional.linear(h, tps[2], tps[3])
        (h * h).mean().backward()
    return [t.grad.numpy() for t in tps]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
async def test_plain_leaves_accumulate_over_passes_as_pytorch(dtype):
    ps, x = _mlp(dtype)
    expected = _torch_grads(ps, x, 3)
    first = None
    for i in range(3):
        h = linear(linear(ag.from_numpy(x), ps[0], ps[1]).relu(), ps[2], ps[3])
        await ag.backward((h * h).mean())
        if i == 0:
            first = [p.grad for p in ps]
    for p, e in zip(ps, expected):
        np.testing.assert_allclose(p.grad.numpy(), e, rtol=1e-5 if dtype == np.float32 else 1e-12)
        assert p.grad.dtype == dtype
    # later passes add in place into the same .grad Tensors (as PyTorch's accumulation)
    assert all(p.grad is g for p, g in zip(ps, first))


async def test_plain_leaf_first_grad_is_owned_and_never_aliases_another_leaf():
    """A leaf staged in place gets the kernel's fresh array; one array routed to two
    leaves (``a + b``'s gradients are the incoming one) is copied for each."""
    a = ag.from_numpy(np.ones(3, np.float32)).requires_grad_()
    b = ag.from_numpy(np.ones(3, np.float32)).requires_grad_()
    await ag.backward((a + b).sum())
    await ag.backward((a + b).sum())
    assert a.grad.numpy() is not b.grad.numpy()
    np.testing.assert_array_equal(a.grad.numpy(), [2, 2, 2])
    np.testing.assert_array_equal(b.grad.numpy(), [2, 2, 2])


async def _leaf_order(engine, hooked):
    """The order of post-accumulate-grad hooks and the gradients, under ``engine``;
    ``hooked``: the leaves given a tensor hook (they take the general path)."""
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(engine)
    try:
        ps, x = _mlp(np.float64)
        log = []
        for i, p in enumerate(ps):
            p.register_post_accumulate_grad_hook(lambda t, i=i: log.append(i))
        for i in hooked:
            ps[i].register_hook(lambda g: g * 2)
        for _ in range(2):
            h = linear(linear(ag.from_numpy(x), ps[0], ps[1]).relu(), ps[2], ps[3])
            await ag.backward((h * h).mean())
        return log, [p.grad.numpy().copy() for p in ps]
    finally:
        ag.autograd.set_engine(prev)


@pytest.mark.parametrize("hooked", [(), (1,), (0, 3), (0, 1, 2, 3)])
async def test_plain_and_hooked_leaves_keep_the_reference_order(hooked):
    """Post-accumulate-grad hooks run in the order the leaves became ready whether or
    not a leaf took the plain path: the same order, and the same gradients, as the
    reference executor (every node through prepare/run_kernel/finish)."""
    log, grads = await _leaf_order(Engine(), hooked)
    ref_log, ref_grads = await _leaf_order(ReferenceEngine(), hooked)
    assert log == ref_log
    for g, r in zip(grads, ref_grads):
        np.testing.assert_array_equal(g, r)


async def test_leaf_reached_twice_sums_both_gradients_once():
    """A leaf used by two nodes: its first gradient is staged plain, the second added."""
    w = ag.from_numpy(np.arange(4.0)).requires_grad_()
    await ag.backward((w * w).sum() + (w * 3.0).sum())
    np.testing.assert_array_equal(w.grad.numpy(), 2 * np.arange(4.0) + 3.0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape,gshape", [((4,), (7, 4)), ((2, 3), (5, 2, 3)), ((1,), (3, 1)), ((), (6,))])
def test_leading_axis_sum_matches_sum_to(dtype, shape, gshape):
    x = ag.from_numpy(np.zeros(shape, dtype)).requires_grad_()
    node = (x * 1.0).grad_fn
    g = np.random.default_rng(0).standard_normal(gshape).astype(dtype)
    out = fix_gradient(node, 0, g)
    ref = sum_to(g, shape)
    assert out.shape == shape and out.dtype == dtype
    np.testing.assert_array_equal(out, ref)


def test_fix_gradient_still_refuses_incompatible_shapes():
    x = ag.from_numpy(np.zeros((4,), np.float32)).requires_grad_()
    node = (x * 1.0).grad_fn
    with pytest.raises(RuntimeError, match="invalid gradient at index 0"):
        fix_gradient(node, 0, np.zeros((3, 5), np.float32))


async def test_bias_gradient_gradcheck_float64():
    rng = np.random.default_rng(3)
    x = ag.from_numpy(rng.standard_normal((5, 3)))
    w = ag.from_numpy(rng.standard_normal((2, 3))).requires_grad_()
    b = ag.from_numpy(rng.standard_normal(2)).requires_grad_()
    assert ag.autograd.gradcheck(lambda w, b: linear(x, w, b), (w, b))


@pytest.mark.parametrize("make", [
    lambda: ag.from_numpy(np.ones(3, np.float32)).requires_grad_() * 2,  # not a scalar
    lambda: ag.from_numpy(np.ones((), np.float32)),  # does not require grad
])
async def test_scalar_backward_errors_as_the_general_path(make):
    """``backward(t)`` (the fast path) raises what ``backward([t])`` (the general one) does."""
    errors = []
    for arg in (make(), [make()]):
        with pytest.raises(RuntimeError) as info:
            await ag.backward(arg)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


async def test_scalar_backward_retain_graph_and_second_call_error():
    w = ag.from_numpy(np.ones(2)).requires_grad_()
    loss = (w * w).sum()
    await ag.backward(loss, retain_graph=True)
    await ag.backward(loss)
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 4.0])
    with pytest.raises(RuntimeError, match="second time"):
        await ag.backward(loss)


def test_accumulate_grad_node_is_the_plain_path_target():
    w = ag.from_numpy(np.ones(2)).requires_grad_()
    assert type((w * 1.0).grad_fn.next_functions[0][0]) is AccumulateGrad
