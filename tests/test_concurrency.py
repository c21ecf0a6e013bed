"""Issue 3: many backward calls at once, offload, commit-on-success, cancellation,
exit-on-error, reentrancy, final callbacks, and both anyio backends."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, get_engine, set_engine


@pytest.fixture
def engine():
    """A fresh default engine for the test (restored afterwards)."""
    prev = get_engine()
    eng = Engine()
    set_engine(eng)
    yield eng
    set_engine(prev)


@pytest.fixture
def offload_all(engine):
    """Every node's kernel goes to a worker thread."""
    engine.inline_threshold = 0
    return engine


def _model(seed: int = 0):
    rng = np.random.default_rng(seed)
    w1 = ag.tensor(rng.integers(-3, 4, (8, 6)).astype(np.float64), requires_grad=True)
    w2 = ag.tensor(rng.integers(-3, 4, (1, 8)).astype(np.float64), requires_grad=True)
    return w1, w2


def _loss(w1, w2, k: int):
    x = ag.tensor(np.arange(6 * 4, dtype=np.float64).reshape(4, 6) % (k + 2) - 1)
    h = (x @ w1.T) * 2 - 1
    return (h @ w2.T).sum() * (k % 5 + 1)


async def _sequential_grads(n: int):
    w1, w2 = _model()
    for k in range(n):
        await ag.backward(_loss(w1, w2, k))
    return w1.grad.numpy().copy(), w2.grad.numpy().copy()


@pytest.mark.parametrize("mode", ["inline", "offload"])
async def test_64_concurrent_tasks_sum_exactly(engine, mode):
    if mode == "offload":
        engine.inline_threshold = 0
    expected = await _sequential_grads(64)
    w1, w2 = _model()
    await asyncio.gather(*(ag.backward(_loss(w1, w2, k)) for k in range(64)))
    np.testing.assert_array_equal(w1.grad.numpy(), expected[0])
    np.testing.assert_array_equal(w2.grad.numpy(), expected[1])
    stats = engine.statistics()
    assert stats.graph_tasks_succeeded >= 64 and stats.graph_tasks_running == 0
    if mode == "offload":
        assert stats.nodes_offloaded > 0


def test_4_threads_x_16_tasks_each_with_own_loop(engine):
    expected = asyncio.run(_sequential_grads(64))
    w1, w2 = _model()
    errors: list[BaseException] = []

    def thread_main(t: int) -> None:
        async def run() -> None:
            await asyncio.gather(*(ag.backward(_loss(w1, w2, t * 16 + j)) for j in range(16)))
        try:
            asyncio.run(run())
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=thread_main, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    np.testing.assert_array_equal(w1.grad.numpy(), expected[0])
    np.testing.assert_array_equal(w2.grad.numpy(), expected[1])


async def test_concurrent_backward_through_one_shared_graph_with_retain_graph(offload_all):
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * x).sin().sum()
    await asyncio.gather(*(ag.backward(y, retain_graph=True) for _ in range(10)))
    np.testing.assert_allclose(x.grad.numpy(), 10 * np.cos(x.data**2) * 2 * x.data)


async def test_grad_calls_in_parallel_do_not_touch_grad(offload_all):
    x = ag.tensor([1.0, -2.0], requires_grad=True)
    outs = await asyncio.gather(*(ag.grad((x * k).exp().sum(), x) for k in range(1, 9)))
    for k, (g,) in enumerate(outs, start=1):
        np.testing.assert_allclose(g.numpy(), k * np.exp(k * x.data))
    assert x.grad is None


async def test_offloaded_and_inline_give_identical_gradients(engine):
    x = ag.randn(50, 40, requires_grad=True)
    w = ag.randn(40, 30, requires_grad=True)
    y = ((x @ w).tanh() * (x @ w).sigmoid()).mean()
    (inline,) = [g.numpy() for g in await ag.grad(y, [x], retain_graph=True)]
    engine.inline_threshold = 0
    (offloaded,) = [g.numpy() for g in await ag.grad(y, [x])]
    np.testing.assert_array_equal(inline, offloaded)
    assert engine.statistics().nodes_offloaded > 0


# --- commit on success, cancellation ----------------------------------------------------------


def _graph_with_many_steps():
    x = ag.tensor(np.linspace(-1, 1, 64), requires_grad=True)
    w = ag.tensor(np.linspace(0.5, 1.5, 64), requires_grad=True)
    h = x
    for i in range(30):
        h = (h * w).sin() + x * (0.01 * i)
    return x, w, h.sum()


@pytest.mark.parametrize("mode", ["inline", "offload"])
async def test_cancellation_at_random_points_changes_nothing(engine, mode):
    """300 seeded trials, each cancelled after a random delay between none and 1.5x an
    uncancelled backward's time (so some complete): a cancelled backward commits
    nothing, a completed one adds exactly one gradient, and no kernel, GraphTask or
    thread is left behind."""
    if mode == "offload":
        engine.inline_threshold = 0  # every node on a worker thread (and in worker chains)
    else:
        engine.yield_interval = 0.0  # yield after every node, so there are many cancel points
    rng = random.Random(1234)
    x, w, y = _graph_with_many_steps()
    (gx_ref, gw_ref) = [g.numpy().copy() for g in await ag.grad(y, [x, w], retain_graph=True)]
    start = time.perf_counter()
    await ag.grad(y, [x, w], retain_graph=True)
    duration = time.perf_counter() - start
    x.grad = ag.tensor(np.full(64, 7.0))
    w.grad = None
    threads_before = threading.active_count()
    completed = cancelled = 0
    for _ in range(300):
        x_before = x.grad.numpy().copy()
        w_before = None if w.grad is None else w.grad.numpy().copy()
        with anyio.CancelScope() as scope:
            async def canceller(delay: float = rng.uniform(0.0, 1.5 * duration)) -> None:
                await anyio.sleep(delay)
                scope.cancel()

            returned = False
            async with anyio.create_task_group() as tg:
                tg.start_soon(canceller)
                await ag.backward(y, retain_graph=True)
                returned = True  # (the cancellation may still land after this line)
                tg.cancel_scope.cancel()
        stats = engine.statistics()
        assert stats.kernels_in_flight == 0 and stats.graph_tasks_running == 0
        if not returned:
            cancelled += 1
            np.testing.assert_array_equal(x.grad.numpy(), x_before)  # nothing committed
            if w_before is None:
                assert w.grad is None
            else:
                np.testing.assert_array_equal(w.grad.numpy(), w_before)
        else:
            completed += 1
            np.testing.assert_allclose(x.grad.numpy(), x_before + gx_ref, rtol=1e-12)
            np.testing.assert_allclose(w.grad.numpy(), gw_ref if w_before is None else w_before + gw_ref,
                                       rtol=1e-12)
    assert cancelled > 0 and completed > 0
    # worker threads are pooled (at most max_workers of them), never one per backward
    assert threading.active_count() <= threads_before + engine.max_workers
    # a last backward without retain_graph: saved tensors were never freed by the others
    x_before = x.grad.numpy().copy()
    await ag.backward(y)
    np.testing.assert_allclose(x.grad.numpy(), x_before + gx_ref, rtol=1e-12)


async def test_wait_for_timeout_leaves_grads_and_allows_retry(offload_all):
    x, w, y = _graph_with_many_steps()
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):
        await asyncio.wait_for(ag.backward(y), timeout=1e-6)
    assert x.grad is None and w.grad is None
    await ag.backward(y)
    assert x.grad is not None


async def test_cancel_waits_for_running_kernels(offload_all, monkeypatch):
    """The await ends only after every kernel it started has finished."""
    from asyncgrad.autograd.graph import record as recording

    finished: list[float] = []
    original = recording.OpNode.apply
    started = threading.Event()

    def slow_apply(self, grads, m):
        started.set()
        time.sleep(0.05)
        out = original(self, grads, m)
        finished.append(time.perf_counter())
        return out

    monkeypatch.setattr(recording.OpNode, "apply", slow_apply)
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() + x.sin()).sum()
    with anyio.CancelScope() as scope:
        async def cancel_once_a_kernel_runs() -> None:
            await anyio.to_thread.run_sync(started.wait)
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_once_a_kernel_runs)
            await ag.backward(y)
    returned = time.perf_counter()
    assert scope.cancelled_caught
    assert finished and max(finished) <= returned
    assert x.grad is None


async def test_task_cancelled_from_outside(offload_all):
    x, w, y = _graph_with_many_steps()
    task = asyncio.create_task(ag.backward(y))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert x.grad is None and w.grad is None
    assert offload_all.statistics().graph_tasks_running == 0


# --- exit on error ----------------------------------------------------------------------------


class Boom(ValueError):
    pass


@pytest.mark.parametrize("mode", ["inline", "offload"])
async def test_failing_node_at_random_position_changes_nothing(engine, mode):
    if mode == "offload":
        engine.inline_threshold = 0
    rng = random.Random(7)
    for trial in range(20):
        x = ag.tensor([0.5, 1.5], requires_grad=True)
        w = ag.tensor([2.0, -1.0], requires_grad=True)
        hs = []
        h = x
        for i in range(12):
            h = h * w + i
            hs.append(h)
        bad = hs[rng.randrange(len(hs))]

        def explode(g, trial=trial):
            raise Boom(f"boom {trial}")

        bad.register_hook(explode)
        called = []
        w.register_hook(lambda g, called=called: ag.autograd.queue_callback(lambda: called.append(1)))
        x.grad = ag.tensor([1.0, 1.0])
        with pytest.raises(Boom, match=f"boom {trial}") as info:
            await ag.backward(h.sum())
        assert any("asyncgrad: raised while running" in n for n in getattr(info.value, "__notes__", []))
        np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])
        assert w.grad is None
        assert called == []  # final callbacks do not run after an error


async def test_error_in_one_backward_does_not_affect_others(offload_all):
    w1, w2 = _model()
    expected = await _sequential_grads(8)
    w1, w2 = _model()
    bad_x = ag.tensor([1.0], requires_grad=True)
    bad = (bad_x * 2).sum()
    bad_x.register_hook(lambda g: 1 / 0)
    results = await asyncio.gather(*(ag.backward(_loss(w1, w2, k)) for k in range(8)),
                                   ag.backward(bad), return_exceptions=True)
    assert isinstance(results[-1], ZeroDivisionError)
    assert all(r is None for r in results[:-1])
    np.testing.assert_array_equal(w1.grad.numpy(), expected[0])


async def test_traceback_keeps_the_raising_line(engine):
    x = ag.tensor([1.0], requires_grad=True)

    def hook(g):
        raise KeyError("from the hook")  # the line we look for

    x.register_hook(hook)
    with pytest.raises(KeyError) as info:
        await ag.backward((x * 3).sum())
    assert any("from the hook\")  # the line we look for" in str(entry.statement)
               or entry.name == "hook" for entry in info.traceback)


# --- final callbacks --------------------------------------------------------------------------


async def test_callbacks_sync_async_and_chained(engine):
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    log: list[str] = []

    async def async_cb():
        await anyio.sleep(0)
        log.append(f"async sees grad {x.grad.numpy().tolist()}")

    def queue(g):
        ag.autograd.queue_callback(lambda: (log.append("sync"), ag.autograd.queue_callback(async_cb)))

    x.register_hook(queue)
    await ag.backward((x * 3).sum())
    assert log == ["sync", "async sees grad [3.0, 3.0]"]


async def test_callback_exception_propagates_after_commit(engine):
    x = ag.tensor([1.0], requires_grad=True)

    def bad():
        raise KeyError("cb")

    x.register_hook(lambda g: ag.autograd.queue_callback(bad))
    with pytest.raises(KeyError):
        await ag.backward((x * 2).sum())
    np.testing.assert_array_equal(x.grad.numpy(), [2.0])


def test_queue_callback_outside_backward():
    with pytest.raises(RuntimeError, match="Final callbacks can only be installed during backward pass."):
        ag.autograd.queue_callback(lambda: None)


# --- reentrancy -------------------------------------------------------------------------------


async def test_reentrant_backward_from_a_hook_runs_nested_with_its_own_callbacks(engine):
    param = ag.tensor([1.0, 2.0], requires_grad=True)
    log: list[str] = []
    depth: list[int | None] = []
    outer_id = []

    def hook(g):
        outer_id.append(ag.autograd.current_graph_task_id())
        ag.autograd.queue_callback(lambda: log.append("outer-cb"))
        with ag.enable_grad():  # hooks run with grad mode == create_graph (False here)
            inner = (param * param).sum()

        def inner_hook(gi):
            depth.append(ag.autograd.current_graph_task_id())
            ag.autograd.queue_callback(lambda: log.append("inner-cb"))

        inner.register_hook(inner_hook)
        ag.backward_sync(inner)  # reentrant: nested GraphTask on this thread
        log.append("after-inner")

    y = param * 3
    y.register_hook(hook)
    await ag.backward(y.sum())
    assert log == ["inner-cb", "after-inner", "outer-cb"]
    assert depth[0] != outer_id[0]
    np.testing.assert_allclose(param.grad.numpy(), 2 * param.data + 3)


async def test_reentrant_chain_1000_deep_does_not_hit_recursion_limit(engine):
    n = 1000
    leaves = [ag.tensor([1.0], requires_grad=True) for _ in range(n)]
    roots = [(leaf * 2).sum() for leaf in leaves]
    for k in range(n - 1):
        leaves[k].register_hook(lambda g, k=k: ag.backward_sync(roots[k + 1]) or None)
    await ag.backward(roots[0])
    assert all(leaf.grad.item() == 2.0 for leaf in leaves)


async def test_nested_async_backward_from_a_callback(engine):
    x = ag.tensor([3.0], requires_grad=True)
    z = ag.tensor([5.0], requires_grad=True)
    seen = []

    async def cb():
        seen.append(ag.autograd.current_graph_task_id())
        with ag.enable_grad():
            loss = (z * z).sum()
        await ag.backward(loss)

    x.register_hook(lambda g: ag.autograd.queue_callback(cb))
    await ag.backward((x * 2).sum())
    assert z.grad.item() == 10.0 and x.grad.item() == 2.0


# --- both backends ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("threshold", [None, 0])
def test_backends(backend, threshold):
    pytest.importorskip(backend)
    prev = get_engine()
    set_engine(Engine(inline_threshold=threshold))
    try:
        async def main():
            w1, w2 = _model()
            async with anyio.create_task_group() as tg:
                for k in range(16):
                    tg.start_soon(ag.backward, _loss(w1, w2, k))
            seq1, seq2 = _model()
            for k in range(16):
                await ag.backward(_loss(seq1, seq2, k))
            np.testing.assert_array_equal(w1.grad.numpy(), seq1.grad.numpy())
            x, w, y = _graph_with_many_steps()
            with anyio.move_on_after(0):
                await ag.backward(y)
            assert x.grad is None
            (g,) = await ag.grad(y, [x])
            assert g is not None
            return True

        assert anyio.run(main, backend=backend)
    finally:
        set_engine(prev)


def test_executor_engine():
    from concurrent.futures import ThreadPoolExecutor

    prev = get_engine()
    with ThreadPoolExecutor(2) as pool:
        set_engine(Engine(executor=pool, inline_threshold=0))
        try:
            for backend in ("asyncio", "trio"):
                async def main():
                    x = ag.tensor([1.0, 2.0], requires_grad=True)
                    await ag.backward((x * x).sum())
                    return x.grad.numpy().tolist()

                assert anyio.run(main, backend=backend) == [2.0, 4.0]
        finally:
            set_engine(prev)


def test_sync_forms_refuse_to_block_a_running_loop():
    async def main():
        x = ag.tensor([1.0], requires_grad=True)
        with pytest.raises(RuntimeError, match="await asyncgrad.backward"):
            (x * 2).sum().backward()

    asyncio.run(main())


async def test_statistics_views(offload_all):
    x = ag.tensor(np.ones(4), requires_grad=True)
    seen = []
    x.register_hook(lambda g: seen.append(ag.autograd.current_graph_task_statistics()))
    before = offload_all.statistics()
    await ag.backward((x.exp() * 2).sum())
    after = offload_all.statistics()
    assert ag.autograd.current_graph_task_statistics() is None
    (stats,) = seen
    assert stats.depth == 0 and stats.nodes_offloaded >= 1
    assert after.graph_tasks_succeeded == before.graph_tasks_succeeded + 1
    assert after.nodes_offloaded > before.nodes_offloaded and after.kernels_in_flight == 0
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        after.nodes_inline = 0  # type: ignore[misc]


def test_gradcheck_and_sync_forms_inside_anyio_run():
    """A fresh thread started from inside a loop is not itself running a loop."""
    async def main():
        x = ag.tensor([0.5, 1.0], requires_grad=True)
        return ag.autograd.gradcheck(lambda t: (t * t).sin(), (x,))

    for backend in ("asyncio", "trio"):
        assert anyio.run(main, backend=backend)


async def test_deepcopy_and_pickle_of_a_leaf_share_no_graph():
    import copy
    import pickle

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3  # keeps x's AccumulateGrad alive
    for clone in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert clone.requires_grad and clone is not x
        await ag.backward((clone * 3).sum())
        assert clone.grad.tolist() == [3.0, 3.0]
    assert x.grad is None
    await ag.backward(y.sum())
    assert x.grad.tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(y)


@pytest.mark.parametrize("threshold", [None, 0])
async def test_fresh_leaf_gradient_is_stolen_not_copied(engine, threshold, monkeypatch):
    """Like PyTorch's AccumulateGrad, a gradient nobody else holds becomes .grad without
    a copy (a copy per leaf would double the commit's memory); others are copied."""
    from asyncgrad.autograd.graph import accumulate
    from asyncgrad.autograd.task import commit
    from asyncgrad.functional import linear

    if threshold is not None:
        engine.inline_threshold = threshold
    stolen: list[bool] = []
    real_take = accumulate._take

    def take(g, dt, owned):
        return stolen.append(owned) or real_take(g, dt, owned)

    monkeypatch.setattr(accumulate, "_take", take)  # (in place: through _accumulate)
    monkeypatch.setattr(commit, "_take", take)  # (summed on a worker)
    w = ag.tensor(np.ones((3, 4)), requires_grad=True)
    x = ag.tensor(np.ones((5, 4)))
    await ag.backward(linear(x, w).sum())
    assert stolen == [True] and w.grad.tolist() == [[5.0] * 4] * 3
    g = ag.tensor([3.0, 4.0])
    v = ag.tensor([1.0, 2.0], requires_grad=True)
    await ag.backward(v, g)  # the user's gradient must not become v.grad
    assert stolen == [True, False] and v.grad.data is not g.data


async def test_saved_tensor_hooks_under_create_graph_keep_the_graph_place():
    x = ag.tensor([0.5, 1.0], requires_grad=True)
    unpacks = []
    with ag.autograd.graph.saved_tensors_hooks(lambda t: t.numpy().copy(),
                                               lambda a: unpacks.append(1) or ag.tensor(a)):
        y = x.exp().sum()
    (g,) = await ag.grad(y, x, create_graph=True)
    (gg,) = await ag.grad(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), np.exp(x.data))
    assert unpacks


async def test_split_node_unpacks_its_saved_values_once(offload_all):
    from asyncgrad.functional import linear

    w = ag.tensor(np.ones((3, 4)), requires_grad=True)
    x = ag.tensor(np.ones((5, 4)), requires_grad=True)
    unpacks = []
    with ag.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: unpacks.append(1) or t):
        y = linear(x, w).sum()
    await ag.backward(y)
    assert len(unpacks) == 2  # x and w, once each, though two gradients ran in parallel
    assert w.grad.tolist() == [[5.0] * 4] * 3 and x.grad.tolist() == [[3.0] * 4] * 5


class _Reenter(ag.autograd.Function):
    """backward runs a nested backward through the next level (worker thread when offloaded)."""

    @staticmethod
    def forward(ctx, x, level):
        ctx.level = level
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        depths.append((ctx.level, threading.get_ident(),
                       ag.autograd.current_graph_task_statistics().depth))
        if ctx.level > 0:
            leaf = ag.tensor([1.0], requires_grad=True)
            with ag.enable_grad():
                y = _Reenter.apply(leaf, ctx.level - 1).sum()
            ag.backward_sync(y)
            assert leaf.grad.item() == 1.0
        return g, None


depths: list[tuple[int, int, int]] = []


def test_reentrant_200_deep_from_worker_threads_with_one_worker():
    """Every level's sync backward runs on a worker thread (inline_threshold=0) and calls
    backward_sync; with max_workers=1 the pool is exhausted at once. Must not deadlock."""
    prev = get_engine()
    set_engine(Engine(max_workers=1, inline_threshold=0))
    depths.clear()
    try:
        async def main():
            x = ag.tensor([2.0], requires_grad=True)
            await ag.backward(_Reenter.apply(x, 200).sum())
            return x.grad.item()

        assert anyio.run(main) == 1.0
    finally:
        set_engine(prev)
    assert [d[0] for d in depths] == list(range(200, -1, -1))
    assert [d[2] for d in depths] == list(range(0, 201))  # each level one deeper
    assert len({d[1] for d in depths}) > 1  # handed to fresh threads along the way


class _AsyncReenter(ag.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    async def backward(ctx, g):
        z = ag.tensor([3.0], requires_grad=True)
        with ag.enable_grad():
            inner = (z * z).sum()
        await ag.backward(inner)  # nested GraphTask on the loop, depth + 1
        return g * 2.0 + z.grad.item()


async def test_async_backward_awaiting_a_nested_backward(offload_all):
    x = ag.tensor([1.0], requires_grad=True)
    await ag.backward(_AsyncReenter.apply(x).sum())
    assert x.grad.item() == 2.0 + 6.0


async def test_a_gradient_from_an_executor_that_keeps_its_futures_is_still_taken_over(monkeypatch):
    """The executor's future (and a worker thread's frame, until it next runs) may be
    kept after the loop read the result: the engine still owns the kernel's fresh
    gradient (ownership is explicit, not a reference count) and the commit takes it
    over without a copy."""
    from concurrent.futures import ThreadPoolExecutor

    from asyncgrad.autograd.graph import accumulate
    from asyncgrad.autograd.task import commit
    from asyncgrad.functional import linear

    class Keeping(ThreadPoolExecutor):
        kept: list = []

        def submit(self, *args, **kwargs):
            future = super().submit(*args, **kwargs)
            self.kept.append(future)
            return future

    prev = ag.autograd.get_engine()
    with Keeping(max_workers=2) as executor:
        ag.autograd.set_engine(Engine(executor=executor, inline_threshold=0))
        try:
            stolen: list[bool] = []
            real_take = accumulate._take

            def take(g, dt, owned):
                return stolen.append(owned) or real_take(g, dt, owned)

            monkeypatch.setattr(accumulate, "_take", take)
            monkeypatch.setattr(commit, "_take", take)
            w = ag.tensor(np.ones((3, 4)), requires_grad=True)
            await ag.backward(linear(ag.tensor(np.ones((5, 4))), w).sum())
            assert len(Keeping.kept) >= 2  # the kernel and the commit's sums ran on it
            assert stolen == [True] and w.grad.tolist() == [[5.0] * 4] * 3
        finally:
            ag.autograd.set_engine(prev)
