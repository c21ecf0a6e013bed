"""Kernels on worker threads completed by a loop callback (Note [Completion by callback]
in autograd/sched/offload.py), and a split node's input gradient routed before its leaf
gradients (Note [Input gradient first]).

What must hold: a cancelled or failed backward returns only after the kernels a
worker started, withdraws the ones it did not, commits nothing and leaves no thread
or task behind; errors carry the node's note; the gradients are the inline engine's;
the next node starts while a leaf gradient is still being computed, unless a hook
could see that order, in which case the order is PyTorch's."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, Function, get_engine, set_engine
from asyncgrad.autograd.graph.record import record
from asyncgrad.functional import linear
from asyncgrad.ops._spec import defop

BACKENDS = ["asyncio", pytest.param("trio", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("trio") is None, reason="trio not installed"))]
WAIT = 10.0  # seconds: only a broken engine waits this long (a deadlock guard, not a timing)


@pytest.fixture
def use_engine():
    prev = get_engine()
    made: list[Engine] = []

    def use(**kwargs) -> Engine:
        engine = Engine(**kwargs)
        made.append(engine)
        set_engine(engine)
        return engine

    yield use
    set_engine(prev)


class Gate(Function):
    """Identity whose backward blocks its worker until ``release`` is set."""

    started: threading.Event
    release: threading.Event
    events: list[str]

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        Gate.events.append("kernel started")
        Gate.started.set()
        Gate.release.wait(WAIT)
        Gate.events.append("kernel ended")
        return g


def _reset_gate() -> None:
    Gate.started, Gate.release, Gate.events = threading.Event(), threading.Event(), []


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelled_backward_returns_after_its_running_kernel_and_commits_nothing(backend, use_engine):
    engine = use_engine(inline_threshold=0, max_workers=2)  # every node on a worker
    _reset_gate()
    x = ag.tensor(np.arange(4.0), requires_grad=True)
    loss = Gate.apply(x * 2.0).sum()
    before = engine.statistics()

    async def main() -> None:
        scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                await ag.backward(loss, retain_graph=True)
            Gate.events.append("backward returned")

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            assert await anyio.to_thread.run_sync(Gate.started.wait, WAIT)
            scope.cancel()
            await anyio.sleep(0.05)  # room for a wrong early return (it must not happen)
            Gate.events.append("released")
            Gate.release.set()

    anyio.run(main, backend=backend)
    assert Gate.events == ["kernel started", "released", "kernel ended", "backward returned"]
    assert x.grad is None  # commit on success only
    stats = engine.statistics()
    assert stats.graph_tasks_cancelled == before.graph_tasks_cancelled + 1
    assert stats.kernels_in_flight == 0 and stats.graph_tasks_running == 0
    # nothing was freed: the same backward runs again, whole
    _reset_gate()
    Gate.release.set()
    anyio.run(ag.backward, loss, backend=backend)
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 2.0))


class _Tracking(ThreadPoolExecutor):
    """One thread; remembers every future it handed out."""

    def __init__(self) -> None:
        super().__init__(1)
        self.futures: list = []

    def submit(self, *args, **kwargs):
        future = super().submit(*args, **kwargs)
        self.futures.append(future)
        return future


def test_cancellation_withdraws_the_kernels_no_worker_started(use_engine):
    executor = _Tracking()  # one thread: the second branch's kernel waits for it
    use_engine(inline_threshold=0, executor=executor)
    _reset_gate()
    x = ag.tensor(np.ones(3), requires_grad=True)
    y = ag.tensor(np.ones(3), requires_grad=True)
    loss = Gate.apply(y * 3.0).sum() + Gate.apply(x * 2.0).sum()  # one Gate runs, the other waits

    async def main() -> None:
        task = asyncio.create_task(ag.backward(loss))
        assert await asyncio.to_thread(Gate.started.wait, WAIT)
        # the add's two parts (a split node: one future per input), the two sums and
        # both Gates' kernels. (Waiting for 5 raced: the second Gate could still be
        # unsubmitted when the task was cancelled, and then nothing was withdrawn.)
        for _ in range(int(WAIT / 0.001)):
            if len(executor.futures) >= 6:
                break
            await asyncio.sleep(0.001)
        assert len(executor.futures) == 6
        task.cancel()
        for _ in range(int(WAIT / 0.001)):  # until the backward withdrew the queued kernel
            if any(f.cancelled() for f in executor.futures):
                break
            await asyncio.sleep(0.001)
        Gate.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    try:
        asyncio.run(main())
    finally:
        executor.shutdown()
    assert Gate.events == ["kernel started", "kernel ended"]  # the queued one never ran
    assert sum(f.cancelled() for f in executor.futures) == 1
    assert x.grad is None and y.grad is None


def test_error_in_an_offloaded_kernel_carries_the_nodes_note_and_waits_for_the_other_kernels(use_engine):
    engine = use_engine(inline_threshold=0, max_workers=2)
    _reset_gate()

    class Boom(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            assert Gate.started.wait(WAIT)  # raise while Gate's kernel runs on the other worker
            raise ValueError("boom in backward")

    x = ag.tensor(np.ones(3), requires_grad=True)
    y = ag.tensor(np.ones(3), requires_grad=True)
    loss = Gate.apply(x * 2.0).sum() + Boom.apply(y * 3.0).sum()

    async def main() -> None:
        task = asyncio.create_task(ag.backward(loss))
        await asyncio.sleep(0.05)  # room for a wrong early return
        Gate.events.append("released")
        Gate.release.set()
        with pytest.raises(ValueError, match="boom in backward") as info:
            await task
        Gate.events.append("backward raised")
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "BoomBackward" in notes

    before = engine.statistics()
    asyncio.run(main())
    assert Gate.events == ["kernel started", "released", "kernel ended", "backward raised"]
    assert x.grad is None and y.grad is None
    stats = engine.statistics()
    assert stats.graph_tasks_failed == before.graph_tasks_failed + 1 and stats.kernels_in_flight == 0


def test_a_version_check_failing_before_a_split_kernel_raises_the_in_place_error(use_engine):
    use_engine(inline_threshold=1, max_workers=2)
    a = ag.tensor(np.ones(8), requires_grad=True)
    b = ag.tensor(np.full(8, 2.0), requires_grad=True)
    p, q = a * 1.0, b * 1.0
    loss = (p * q).sum()  # a large two-input node: split, its saved p and q checked first
    with ag.no_grad():
        q.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
        asyncio.run(ag.backward(loss))
    assert "MulBackward0" in "\n".join(getattr(info.value, "__notes__", []))
    assert a.grad is None and b.grad is None


def test_no_worker_thread_or_task_outlives_many_cancelled_backwards(use_engine):
    engine = use_engine(inline_threshold=0, max_workers=2)
    x = ag.tensor(np.ones(1000), requires_grad=True)

    async def main() -> None:
        for k in range(20):
            loss = ((x * 2.0).sin() * 3.0).sum()
            task = asyncio.create_task(ag.backward(loss))
            for _ in range(k % 4):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
    assert engine.statistics().kernels_in_flight == 0
    assert all(pool.threads <= 2 for pool in engine._pools.values())  # (a pool per niceness)
    assert engine.statistics().graph_tasks_running == 0


# --- the input gradient first ------------------------------------------------------------
def _mlp(seed: int = 0, layers: int = 3, width: int = 16, batch: int = 8):
    rng = np.random.default_rng(seed)
    params = []
    for _ in range(layers):
        params.append(ag.tensor(rng.standard_normal((width, width)) / 4, requires_grad=True))
        params.append(ag.tensor(rng.standard_normal(width) / 4, requires_grad=True))
    x = ag.tensor(rng.standard_normal((batch, width)))
    return params, x


def _mlp_loss(params, x, on_hidden=None):
    h = x
    n = len(params) // 2
    for i in range(n):
        h = linear(h, params[2 * i], params[2 * i + 1])
        if i < n - 1:
            h = h.relu()
            if on_hidden is not None:
                on_hidden(i, h)
    return (h * h).mean()


def test_an_offloaded_mlp_gives_the_inline_engines_gradients(use_engine):
    grads = {}
    for name, threshold in (("offloaded", 1), ("inline", 2**62)):
        use_engine(inline_threshold=threshold, max_workers=2)
        params, x = _mlp()
        asyncio.run(ag.backward(_mlp_loss(params, x)))
        grads[name] = [p.grad.numpy().copy() for p in params]
    for a, b in zip(grads["offloaded"], grads["inline"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_the_next_layer_starts_while_the_leaf_gradient_is_computed(use_engine):
    """Layer k's leaf gradient waits, on its worker, for layer k-1's input gradient to
    be computed: possible only when layer k's input gradient was routed first."""
    events: list[str] = []
    lock = threading.Lock()
    dx_done = {k: threading.Event() for k in range(4)}

    def log(what: str) -> None:
        with lock:
            events.append(what)

    def rule_x(m, g, ans, x, w, k):
        out = g * w
        log(f"dx{k}")
        dx_done[k].set()
        return out

    def rule_w(m, g, ans, x, w, k):
        if k > 0:
            assert dx_done[k - 1].wait(WAIT), "the next layer did not start before this dW ended"
        log(f"dW{k}")
        return g * x

    spec = defop("ScaleBackward0", np.multiply, rule_x, rule_w, save="x y")
    use_engine(inline_threshold=1, max_workers=2)
    rng = np.random.default_rng(0)
    ws = [ag.tensor(rng.standard_normal(8), requires_grad=True) for _ in range(4)]
    h = ag.tensor(rng.standard_normal(8), requires_grad=True)
    x0 = h
    for k in range(4):  # layer k = 0 is the first in forward, the last in backward
        h = record(spec, (h, ws[k]), np.multiply(h.data, ws[k].data), params={"k": k})
    asyncio.run(ag.backward(h.sum()))
    for k in (3, 2, 1):
        assert events.index(f"dx{k - 1}") < events.index(f"dW{k}")
    assert events.index("dx3") < events.index("dx2") < events.index("dx1") < events.index("dx0")
    expected = np.prod([w.data for w in ws], axis=0)
    np.testing.assert_allclose(x0.grad.numpy(), expected)
    for k in range(4):
        np.testing.assert_allclose(ws[k].grad.numpy(), expected / ws[k].data * x0.data)


def test_hooks_see_pytorchs_order_when_a_linear_layer_is_offloaded(use_engine):
    """With hooks on the leaves, a layer's gradients are routed together, leaves first
    (PyTorch's AccumulateGrad order): the same sequence as every node inline."""
    orders = {}
    for name, threshold in (("offloaded", 1), ("inline", 2**62)):
        use_engine(inline_threshold=threshold, max_workers=2)
        params, x = _mlp()
        order: list[str] = []
        for j, p in enumerate(params):
            p.register_hook(lambda g, j=j, order=order: order.append(f"param{j}"))

        def on_hidden(i, h, order=order):
            h.register_hook(lambda g: order.append(f"hidden{i}"))

        asyncio.run(ag.backward(_mlp_loss(params, x, on_hidden)))
        orders[name] = order
    assert orders["offloaded"] == orders["inline"]
    assert orders["inline"][:3] == ["param4", "param5", "hidden1"]


def test_a_gradient_passed_through_to_a_leaf_is_never_adopted_from_the_callers_array(use_engine):
    """A split add's gradient for its leaf is the incoming gradient itself; when that is
    the caller's gradient, ``.grad`` must be a copy (Note [Owned gradients]): neither
    may change the other."""
    use_engine(inline_threshold=0, max_workers=2)  # (an add has no work to speak of)
    rng = np.random.default_rng(1)
    b = ag.tensor(rng.standard_normal(6), requires_grad=True)
    x = ag.tensor(rng.standard_normal(6), requires_grad=True)
    user = np.arange(6.0)
    kept = user.copy()
    y = (x * 2.0) + b  # (x * 2.0: an input gradient, so the add is split)
    asyncio.run(ag.backward(y, ag.from_numpy(user)))
    assert not np.shares_memory(b.grad.numpy(), user)
    user += 100.0  # the caller reuses its array
    np.testing.assert_array_equal(b.grad.numpy(), kept)
    np.testing.assert_array_equal(x.grad.numpy(), 2 * kept)


def test_a_hook_on_a_leaf_keeps_its_layers_gradients_together(use_engine):
    """With a hook on a layer's leaf, the next layer's input gradient is computed only
    after that hook ran (PyTorch's order), even while the leaf's kernel is slow."""
    events: list[str] = []
    lock = threading.Lock()
    dx_done = {k: threading.Event() for k in range(3)}

    def log(what: str) -> None:
        with lock:
            events.append(what)

    def rule_x(m, g, ans, x, w, k):
        log(f"dx{k}")
        dx_done[k].set()
        return g * w

    def rule_w(m, g, ans, x, w, k):
        if k > 0:
            dx_done[k - 1].wait(0.2)  # room for the next layer to start early (it must not)
        return g * x

    spec = defop("ScaleBackward0", np.multiply, rule_x, rule_w, save="x y")
    use_engine(inline_threshold=1, max_workers=2)
    rng = np.random.default_rng(0)
    ws = [ag.tensor(rng.standard_normal(8), requires_grad=True) for _ in range(3)]
    for k, w in enumerate(ws):
        w.register_hook(lambda g, k=k: log(f"hook w{k}"))
    h = ag.tensor(rng.standard_normal(8), requires_grad=True)
    for k in range(3):
        h = record(spec, (h, ws[k]), np.multiply(h.data, ws[k].data), params={"k": k})
    asyncio.run(ag.backward(h.sum()))
    assert events == ["dx2", "hook w2", "dx1", "hook w1", "dx0", "hook w0"]


@pytest.mark.parametrize("blas", [True, False], ids=["blas", "split"])
def test_an_error_in_a_leaf_gradient_after_the_input_gradient_was_routed(use_engine, blas):
    """Split (an elementwise node), the input gradient already went on to the next
    node; either way the leaf gradient's error fails the whole backward, names the
    node, and commits nothing."""
    def rule_x(m, g, ans, x, w):
        return g * w

    def rule_w(m, g, ans, x, w):
        raise ValueError("no leaf gradient today")

    spec = defop("FailingBackward0", np.multiply, rule_x, rule_w, save="x y", blas=blas)
    engine = use_engine(inline_threshold=1, max_workers=2)
    rng = np.random.default_rng(0)
    x0 = ag.tensor(rng.standard_normal(8), requires_grad=True)
    w = ag.tensor(rng.standard_normal(8), requires_grad=True)
    h = record(spec, (x0 * 2.0, w), np.multiply(x0.data * 2.0, w.data))
    before = engine.statistics()
    with pytest.raises(ValueError, match="no leaf gradient today") as info:
        asyncio.run(ag.backward(h.sum()))
    assert "FailingBackward0" in "\n".join(getattr(info.value, "__notes__", []))
    assert x0.grad is None and w.grad is None
    stats = engine.statistics()
    assert stats.graph_tasks_failed == before.graph_tasks_failed + 1 and stats.kernels_in_flight == 0
