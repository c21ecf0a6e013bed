"""The engine's worker threads (autograd/runtime/workers.py): bounded, most-recently-idle first,
lowered priority, idle threads exit, queued calls can be withdrawn."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import wait
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, get_engine, set_engine
from asyncgrad.autograd.runtime.threads import run_in_executor
from asyncgrad.autograd.runtime.workers import WorkerPool, shared_pool

BACKENDS = ["asyncio", pytest.param("trio", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("trio") is None, reason="trio not installed"))]


def _poll(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_at_most_max_workers_run_at_once_and_the_rest_wait_in_order():
    pool = WorkerPool(2)
    running = 0
    peak = 0
    order: list[int] = []
    lock = threading.Lock()
    gate = threading.Event()

    def job(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            order.append(i)
        gate.wait(5)
        with lock:
            running -= 1
        return i * i

    futures = [pool.submit(job, i) for i in range(10)]
    assert _poll(lambda: running == 2)
    assert pool.threads == 2
    gate.set()
    wait(futures, timeout=5)
    assert [f.result() for f in futures] == [i * i for i in range(10)]
    assert peak == 2
    assert sorted(order) == list(range(10))


def test_waiting_calls_start_first_in_first_out():
    pool = WorkerPool(1)
    gate = threading.Event()
    order: list[int] = []
    first = pool.submit(gate.wait, 5)
    futures = [pool.submit(order.append, i) for i in range(8)]
    gate.set()
    wait([first, *futures], timeout=5)
    assert order == list(range(8))


def test_calls_one_after_another_run_on_the_thread_that_went_idle_last():
    pool = WorkerPool(4)
    names = [pool.submit(lambda: threading.current_thread().name).result(timeout=5) for _ in range(20)]
    assert len(set(names)) == 1
    assert pool.threads == 1


def test_exceptions_reach_the_future_and_the_thread_survives():
    pool = WorkerPool(1)

    def boom() -> None:
        raise ValueError("kernel failed")

    with pytest.raises(ValueError, match="kernel failed"):
        pool.submit(boom).result(timeout=5)
    assert pool.submit(lambda a, b=1: a + b, 2, b=3).result(timeout=5) == 5


def test_a_call_cancelled_while_waiting_never_runs():
    pool = WorkerPool(1)
    gate = threading.Event()
    ran: list[str] = []
    first = pool.submit(lambda: (gate.wait(5), ran.append("first")))
    second = pool.submit(lambda: ran.append("second"))
    assert second.cancel()
    gate.set()
    first.result(timeout=5)
    assert pool.submit(lambda: ran.append("third")).result(timeout=5) is None
    assert ran == ["first", "third"]


def test_idle_threads_exit_after_the_idle_timeout():
    pool = WorkerPool(2, idle_timeout=0.05)
    wait([pool.submit(time.sleep, 0.01) for _ in range(2)], timeout=5)
    assert _poll(lambda: pool.threads == 0)
    assert pool.submit(lambda: 7).result(timeout=5) == 7  # and new ones start on demand


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
@pytest.mark.parametrize("nice", [0, 10])
def test_worker_threads_run_at_lowered_priority(nice):
    base = os.getpriority(os.PRIO_PROCESS, 0)
    pool = WorkerPool(1, nice=nice)
    seen = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result(timeout=5)
    assert seen == min(19, base + nice)
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the caller's own is unchanged


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
@pytest.mark.parametrize("nice", [None, 5])
async def test_engine_kernels_run_on_its_threads_niced_only_when_asked(nice):
    """Default, with other processes' load not sampled (as in the suite): the process's
    priority (Note [Niced kernels on the cores others leave] in sched/placement.py)."""
    prev = get_engine()
    engine = Engine(inline_threshold=0) if nice is None else Engine(inline_threshold=0, worker_nice=nice)
    set_engine(engine)
    seen: list[tuple[str, int]] = []

    def unpack(t):
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return t

    try:
        x = ag.tensor(np.linspace(0, 1, 8), requires_grad=True)
        with ag.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            y = x.sin().exp().sum()
        await ag.backward(y)
    finally:
        set_engine(prev)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    expected = base if nice is None else min(19, base + nice)
    assert seen and all(name.startswith("asyncgrad-worker") and got == expected for name, got in seen)


class _Concurrency:
    """Counts calls in flight (from any thread) and the most seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def hold(self, seconds: float, weight: int = 1) -> None:
        """One call in flight for ``seconds``, counting ``weight`` (e.g. its threads)."""
        with self.lock:
            self.active += weight
            self.peak = max(self.peak, self.active)
        time.sleep(seconds)  # (widens the window for overlap; nothing is timed)
        with self.lock:
            self.active -= weight


def _backwards_on_loop_threads(engine: Engine, one_backward, loops: int = 4, each: int = 3) -> None:
    """``each`` awaited ``one_backward()`` calls on each of ``loops`` threads, every
    thread running its own event loop, with ``engine`` as the default engine."""
    import asyncio

    async def main() -> None:
        for _ in range(each):
            await one_backward()

    prev = get_engine()
    set_engine(engine)
    try:
        threads = [threading.Thread(target=asyncio.run, args=(main(),)) for _ in range(loops)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        set_engine(prev)


def test_engines_with_the_same_settings_share_one_bounded_pool():
    assert shared_pool(2, 10) is shared_pool(2, 10)
    assert shared_pool(2, 10) is not shared_pool(1, 10)
    engine = Engine(max_workers=2, inline_threshold=0)
    kernels = _Concurrency()

    def unpack(t):
        kernels.hold(0.002)
        return t

    async def one_backward() -> None:
        x = ag.tensor(np.linspace(0, 1, 8), requires_grad=True)
        with ag.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            y = (x.sin() * x.cos()).exp().sum()
        await ag.backward(y)

    _backwards_on_loop_threads(engine, one_backward)
    assert 1 <= kernels.peak <= 2  # four event loops, one engine: never more than max_workers kernels
    assert engine.statistics().graph_tasks_succeeded == 12


def test_blas_kernels_from_several_loops_share_one_bound():
    """BLAS kernels run threads of their own, so the engine bounds the BLAS threads of
    the kernels running at once process-wide (to the cores), not per event loop; with
    four loops' backward calls in flight BLAS is single-threaded (Note [BLAS threads])."""
    from asyncgrad.autograd.runtime.blas import BLAS, CORES

    engine = Engine(inline_threshold=0)
    matmuls = _Concurrency()
    per_call: list[int] = []

    def unpack(packed):
        kind, t = packed
        if kind == "matmul":
            per_call.append(BLAS.per_call)
            matmuls.hold(0.003, BLAS.per_call)
        return t

    async def one_backward() -> None:
        a = ag.tensor(np.ones((4, 4)), requires_grad=True)
        b = ag.tensor(np.ones((4, 4)))

        def pack(t):
            return ("matmul" if t is b else "other", t)  # only the matmul saves b

        with ag.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = (a @ b).sum()
        await ag.backward(y)

    _backwards_on_loop_threads(engine, one_backward)
    assert engine.statistics().graph_tasks_succeeded == 12
    assert 1 <= matmuls.peak <= max(CORES, max(per_call))


# --- the hop to a worker and back (threads.run_in_executor) ---------------------------------
def _cancel_once_it_runs(backend: str, pool: WorkerPool, kernel: Any, started: threading.Event,
                         events: list[str], after_cancel: Any = None, **kwargs: Any) -> None:
    """Await ``run_in_executor(pool, kernel, (), **kwargs)`` and cancel the await once
    ``started`` is set (then ``after_cancel()``); the await must end cancelled, without a
    result, and then "await returned" joins ``events``."""
    import anyio

    async def main() -> None:
        got: list[str] = []
        with anyio.CancelScope() as scope:
            async def cancel() -> None:
                await anyio.to_thread.run_sync(started.wait)
                scope.cancel()
                if after_cancel is not None:
                    after_cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel)
                got.append(await run_in_executor(pool, kernel, (), **kwargs))
        events.append("await returned")
        assert scope.cancelled_caught and got == []

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_cancelled_while_it_runs_is_waited_for_and_its_result_dropped(backend):
    """A thread cannot be interrupted: the await returns only after the call ended, and
    the cancellation goes on (the result is not returned)."""
    pool = WorkerPool(1)
    started, gate = threading.Event(), threading.Event()
    events: list[str] = []

    def kernel() -> str:
        started.set()
        gate.wait(5)
        events.append("kernel ended")
        return "result"

    # (the gate opens after the cancel: the await must wait for the kernel)
    _cancel_once_it_runs(backend, pool, kernel, started, events, after_cancel=gate.set)
    assert events == ["kernel ended", "await returned"]
    assert pool.threads == 1  # the one worker, idle again (no thread leaked)


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_cancel_runs_as_the_cancellation_arrives_so_a_running_call_can_see_it(backend):
    """``on_cancel`` is called on the loop when the cancellation arrives, before the
    await waits for the started call: the call reads what it set (the serving batcher's
    pass commits nothing then), the await still returns after the call, cancelled."""
    pool = WorkerPool(1)
    started, gate = threading.Event(), threading.Event()
    stop: list[str] = []
    events: list[str] = []

    def kernel() -> str:
        started.set()
        gate.wait(5)  # (opened by on_cancel alone)
        events.append(f"kernel saw {stop}")
        return "result"

    def on_cancel() -> None:
        stop.append("stop")
        gate.set()

    _cancel_once_it_runs(backend, pool, kernel, started, events, on_cancel=on_cancel)
    assert events == ["kernel saw ['stop']", "await returned"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_cancelled_while_queued_never_runs_and_errors_come_back(backend):
    import anyio

    pool = WorkerPool(1)
    gate = threading.Event()
    ran: list[str] = []

    def boom() -> None:
        raise ValueError("kernel failed")

    async def main() -> None:
        blocker = pool.submit(gate.wait, 5)  # holds the only worker
        with anyio.move_on_after(0.01):
            await run_in_executor(pool, ran.append, ("queued",))
        gate.set()
        blocker.result(timeout=5)
        with pytest.raises(ValueError, match="kernel failed"):
            await run_in_executor(pool, boom, ())
        assert await run_in_executor(pool, lambda a, b: a + b, (2, 3)) == 5

    anyio.run(main, backend=backend)
    assert ran == []
    assert pool.threads == 1


def test_submit_does_not_wait_for_a_new_thread_to_start(monkeypatch):
    """Note [A new worker is started elsewhere]: ``Thread.start()`` waits until the new
    thread runs; ``submit`` returns before that (here: while ``start`` is held), and the
    job runs once the thread does."""
    held, entered = threading.Event(), threading.Event()
    real_start = threading.Thread.start

    def held_start(self):
        entered.set()
        assert held.wait(10)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", held_start)
    pool = WorkerPool(1)
    future = pool.submit(lambda: threading.current_thread().name)
    assert entered.wait(10)  # start() is running, on another thread, and submit returned
    assert not future.done()
    held.set()
    assert future.result(10) == "asyncgrad-worker-1"
    assert pool.threads == 1


def test_a_worker_that_cannot_start_fails_its_job(monkeypatch):
    def failing_start(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", failing_start)
    pool = WorkerPool(1)
    future = pool.submit(lambda: 1)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        future.result(10)
    assert pool.threads == 0


def test_outside_asyncio_without_trio_the_error_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """No asyncio loop running and trio not installed: a RuntimeError that says asyncgrad
    needs asyncio or trio, not trio's ModuleNotFoundError."""
    from asyncgrad.autograd.runtime import threads

    monkeypatch.setitem(sys.modules, "trio", None)  # (import trio raises ImportError)
    with pytest.raises(RuntimeError, match="asyncgrad runs on asyncio or trio: no asyncio event loop is running"):
        threads.threadsafe_caller()
