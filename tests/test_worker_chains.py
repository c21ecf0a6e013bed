"""Worker chains (Note [Worker chains] in autograd/task/graph_task.py): a branch of heavy
nodes runs on one worker thread, one hop, with the bookkeeping back on the loop.

These tests pin what chaining must not change (gradients, error attribution, cancellation,
retry) and that it happens (thread hops per node)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import asyncgrad as ag
from conftest import cancel_while_blocked
from asyncgrad.autograd import Engine, get_engine, set_engine

N = 4096  # elements per array: heavy with the threshold below, cheap to compute


@pytest.fixture
def engines():
    """An offloading engine whose threshold makes N-element nodes heavy, and an
    all-inline engine for reference; the default engine is restored afterwards."""
    prev = get_engine()
    yield Engine(inline_threshold=N), Engine(inline_threshold=2**62)
    set_engine(prev)


async def _backward_with(engine: Engine, loss) -> None:
    set_engine(engine)
    await ag.backward(loss)


def _leaves(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = ag.tensor(rng.standard_normal(N), requires_grad=True)
    w = ag.tensor(rng.uniform(0.5, 1.5, N), requires_grad=True)
    return x, w


def _branchy_loss(x, w):
    """Two long branches of heavy nodes with pass-through adds between them (light),
    a fork (``h`` feeds both), a join, and a leaf (``w``) shared by every branch."""
    h = x.sin() * w
    a = h
    b = h
    for _ in range(6):
        a = (a.tanh() + 1.0) * w
        b = (b.cos() - 0.5).exp() * 0.25
    return (a * b).sum() + a.sum() + (b * w).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_chained_gradients_equal_the_inline_engine(engines, seed):
    """Equal up to rounding: ``w`` sums gradients from branches that finish in either
    order when offloaded (exactness on integer data: test_deferred_sums.py)."""
    offload, inline = engines
    x1, w1 = _leaves(seed)
    x2, w2 = _leaves(seed)
    await _backward_with(offload, _branchy_loss(x1, w1))
    await _backward_with(inline, _branchy_loss(x2, w2))
    np.testing.assert_allclose(x1.grad.numpy(), x2.grad.numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(w1.grad.numpy(), w2.grad.numpy(), rtol=1e-12, atol=1e-15)
    assert offload.statistics().thread_hops > 0 and inline.statistics().thread_hops == 0


async def test_a_branch_of_heavy_nodes_takes_one_thread_hop(engines):
    offload, _ = engines
    x = ag.tensor(np.linspace(-1, 1, N), requires_grad=True)
    y = x
    for _ in range(10):
        y = (y.sin() + 0.5) * 0.9  # heavy (sin, mul by a constant) and light (add) nodes
    await _backward_with(offload, y.sum())
    stats = offload.statistics()
    # sin and mul are heavy: 20 nodes offloaded, the adds in between ride along
    assert stats.nodes_offloaded >= 20
    assert stats.thread_hops == 1
    # gradient: d/dx of the composed map, checked against the same chain done by hand
    g = np.ones(N)
    v = [np.linspace(-1, 1, N)]
    for _ in range(10):
        v.append((np.sin(v[-1]) + 0.5) * 0.9)
    for k in range(10, 0, -1):
        g = g * 0.9 * np.cos(v[k - 1])
    np.testing.assert_allclose(x.grad.numpy(), g, rtol=1e-12)


async def test_a_fork_returns_to_the_loop_so_both_branches_can_run(engines):
    offload, _ = engines
    x = ag.tensor(np.linspace(-1, 1, N), requires_grad=True)
    h = x.sin().sin()
    a = h.cos().cos()
    b = h.tanh().tanh()
    await _backward_with(offload, (a + b).sum())
    # at least one hop per branch and one for the shared trunk: the fork is not chained
    assert offload.statistics().thread_hops >= 3


async def test_an_error_inside_a_chain_names_the_node_that_raised(engines):
    offload, _ = engines
    x = ag.tensor(np.linspace(-1, 1, N), requires_grad=True)
    ys = [x]
    for _ in range(6):
        ys.append(ys[-1].sin())
    loss = ys[-1].sum()
    with ag.no_grad():
        ys[3].add_(1.0)  # modifies in place a value saved for the SinBackward of ys[4]
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
        await _backward_with(offload, loss)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"SinBackward0 (sequence_nr={ys[4].grad_fn.sequence_nr})" in notes
    assert notes.count("asyncgrad: raised while running") == 1
    assert x.grad is None


async def test_cancelling_stops_a_chain_between_nodes_and_the_backward_can_be_retried(engines):
    """The unpack hook of the third node of a chain blocks until the test has cancelled
    the backward; the chain must stop after that node and run none of the others."""
    offload, inline = engines
    x = ag.tensor(np.linspace(-1, 1, N), requires_grad=True)
    unpacked: list[int] = []
    blocking = threading.Event()
    release = threading.Event()
    tasks: list = []

    def pack(t):
        return t

    def unpack(t):
        unpacked.append(1)
        if len(unpacked) == 3 and not release.is_set():
            tasks.append(ag.autograd.current_graph_task_id())
            blocking.set()
            release.wait(10)
        return t

    with ag.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = x
        for _ in range(8):
            y = y.sin()
    loss = y.sum()
    set_engine(offload)
    await cancel_while_blocked(ag.backward(loss), blocking, release)
    assert len(unpacked) == 3
    assert x.grad is None
    assert offload.statistics().graph_tasks_cancelled == 1
    # nothing was freed: the same backward runs again and gives the right gradient
    unpacked.clear()
    await ag.backward(loss)
    assert len(unpacked) == 8
    expected = np.ones(N)
    v = [np.linspace(-1, 1, N)]
    for _ in range(8):
        v.append(np.sin(v[-1]))
    for k in range(8, 0, -1):
        expected = expected * np.cos(v[k - 1])
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)


# --- leaves do not end a chain (Note [Worker chains] in sched/placement.py) ------------------------
def _linear_relu(params, x):
    from asyncgrad.functional import linear

    h = x
    n = len(params) // 2
    for i in range(n):
        h = linear(h, params[2 * i], params[2 * i + 1])
        if i < n - 1:
            h = h.relu()
    return h.sum()


def _mlp_params(seed=0, layers=3, width=12, batch=5):
    rng = np.random.default_rng(seed)
    ps = []
    for _ in range(layers):
        ps.append(rng.standard_normal((width, width)) / 3)
        ps.append(rng.standard_normal(width) / 3)
    return ps, rng.standard_normal((batch, width))


async def test_an_mlp_backward_is_one_chain_through_its_linear_layers(engines, blas_threaded):
    """Linear layers (BLAS nodes) and the ReLUs between them run on one worker, one hop;
    gradients as the inline engine's, and as finite differences (float64)."""
    _, inline = engines
    offload = Engine(inline_threshold=1)
    p0, x0 = _mlp_params()
    grads = {}
    for name, engine in (("offload", offload), ("inline", inline)):
        ps = [ag.tensor(p, requires_grad=True) for p in p0]
        await _backward_with(engine, _linear_relu(ps, ag.tensor(x0)))
        grads[name] = [p.grad.numpy() for p in ps]
    assert offload.statistics().thread_hops == 1
    for a, b in zip(grads["offload"], grads["inline"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    eps = 1e-6
    for k in (0, 3, 4):  # a weight, a bias, the last weight: central differences, a few entries
        for idx in [(0,) * p0[k].ndim, tuple(s - 1 for s in p0[k].shape)]:
            hi = [p.copy() for p in p0]
            lo = [p.copy() for p in p0]
            hi[k][idx] += eps
            lo[k][idx] -= eps
            f = lambda ps: _linear_relu([ag.tensor(p) for p in ps], ag.tensor(x0)).item()  # noqa: E731
            assert abs((f(hi) - f(lo)) / (2 * eps) - grads["offload"][k][idx]) < 1e-6


async def test_a_weight_with_a_hook_ends_the_chain_and_its_hook_sees_its_gradient(engines, blas_threaded):
    """A hook on a leaf runs when the node feeding it comes back, as without chains: the
    chain ends there, so the layers below run only after it could run."""
    _, inline = engines
    offload = Engine(inline_threshold=1)
    p0, x0 = _mlp_params(seed=1)
    grads = {}
    seen = []
    for name, engine in (("offload", offload), ("inline", inline)):
        ps = [ag.tensor(p, requires_grad=True) for p in p0]
        ps[2].register_hook(lambda g, name=name: seen.append(
            (name, threading.current_thread() is threading.main_thread(), g.numpy().copy())))
        await _backward_with(engine, _linear_relu(ps, ag.tensor(x0)))
        grads[name] = [p.grad.numpy() for p in ps]
    assert offload.statistics().thread_hops == 2  # the chain ends at the layer feeding ps[2]
    assert [(n, main) for n, main, _ in seen] == [("offload", True), ("inline", True)]
    np.testing.assert_allclose(seen[0][2], seen[1][2], rtol=1e-12, atol=1e-14)
    for a, b in zip(grads["offload"], grads["inline"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
