"""The engine's own worker threads: a small pool that hands each kernel to the thread
that went idle last, optionally at a lowered scheduling priority.

Note [Worker threads yield the CPU to the loop]: kernels use every core, and a BLAS call
adds threads of its own, so with the loop's thread at the same priority the OS scheduler
lets the loop wait behind them. Two means keep the loop served:

* the workers can run at a lowered priority, niceness ``nice`` (Linux: each thread has
  its own), so a woken loop thread gets a core at once. By default a backward call's
  kernels run niced while other processes leave a core for each worker thread, where it
  costs no speed, and at the process's priority otherwise, where a niced kernel would
  get a small share of a core it shares with them (Note [Niced kernels on the cores
  others leave] in sched/placement.py decides; ``Engine(worker_nice=n)`` fixes it). A
  thread's niceness cannot be raised back without privileges, which is why these
  threads are the engine's own and not anyio's, which the application shares, and why
  each niceness has a pool of its own (``shared_pool``);
* the thread that finished the last kernel takes the next one: a worker goes back on a
  stack of idle threads *before* its result wakes the loop, and the loop's next kernel
  goes to the top of that stack. When kernels come one after another, one thread then
  runs them all; with a FIFO hand-off (``ThreadPoolExecutor``), or a worker that goes
  idle only after reporting, the workers take turns, each waking from a sleep, and the
  loop waits behind them.

Note [A new worker is started elsewhere]: ``threading.Thread.start()`` returns only once
the new thread has run, so the submitting thread (the event loop, at a backward's first
offloaded kernel) would wait until the OS schedules the new thread and it gets the GIL,
a long stall while the kernels' loader imports numba (``python -m bench.first_backward
--profile`` shows it). So ``submit_at`` hands ``start()`` to a
bare ``_thread`` thread that does only that (it runs no code that would register it
with ``threading``) and returns; the worker itself is a named, registered daemon
``Thread``. Its job is already assigned, so it runs as soon as the worker does.

When every thread is busy, a submitted kernel waits in the pool's queue, served in
priority order with aging, as the loop's runner serves backward calls (``submit_at``;
Note [Task order] in runtime/task_order.py): a higher-priority call's kernels start first, and
a lower one's still start after a bounded number of later submissions.

Engines with the same ``max_workers`` share one pool per niceness (``shared_pool``):
each thread has its own malloc arena, and a fresh thread's arena page-faults every array
it hands out, so new threads per engine would make an engine created after others
slower on large kernels. Idle threads exit after ``idle_timeout`` seconds, so a process
that stops using the engine holds no threads.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from heapq import heappop, heappush
from typing import Any

from ... import _bare_thread
from .task_order import TURNS_PER_PRIORITY

IDLE_TIMEOUT = 10.0


class _Worker:
    __slots__ = ("wake", "job")

    def __init__(self, job: tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]) -> None:
        self.wake = threading.Event()
        self.job: tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None = job


class WorkerPool(Executor):
    """At most ``max_workers`` threads; a submitted call goes to the thread that went
    idle last, else to a new thread, else waits (by priority, first in first out within
    one: Note [Task order] in runtime/task_order.py)."""

    def __init__(self, max_workers: int, *, nice: int = 0, name: str = "asyncgrad-worker",
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.max_workers = max_workers
        self.nice = nice
        self.name = name
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        # (key, seq, job) of the calls waiting for a thread, a heap (Note [Task order])
        self._waiting: list[tuple[int, int, tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]] = []
        self._seq = itertools.count()
        self._threads = 0
        self._count = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """``fn(*args, **kwargs)`` on a worker thread, at priority 0."""
        if kwargs:
            fn, args = functools.partial(fn, *args, **kwargs), ()
        return self.submit_at(0, fn, *args)

    def submit_at(self, priority: int, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        """``fn(*args)`` on a worker thread; when every thread is busy it waits behind
        the calls of its priority submitted before it (Note [Task order])."""
        future: Future[Any] = Future()
        job = (future, fn, args)
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
                worker.job = job
                worker.wake.set()
                return future
            if self._threads >= self.max_workers:
                seq = next(self._seq)
                heappush(self._waiting, (seq - priority * TURNS_PER_PRIORITY, seq, job))
                return future
            self._threads += 1
            self._count += 1
            n = self._count
        thread = threading.Thread(target=self._run, args=(_Worker(job),), name=f"{self.name}-{n}", daemon=True)
        # (Note [A new worker is started elsewhere]; Note [A bare thread is never half-started at exit])
        if not _bare_thread.start(self._start, thread, future):
            self._not_started(future, RuntimeError("asyncgrad: no new worker thread: the process is exiting"))
        return future

    def _start(self, thread: threading.Thread, future: Future[Any]) -> None:
        """On a bare thread of its own: ``thread.start()``, which waits until the new
        thread runs (Note [A new worker is started elsewhere]). If the thread cannot
        start, its first job fails with the error."""
        try:
            thread.start()
        except BaseException as e:
            self._not_started(future, e)

    def _not_started(self, future: Future[Any], error: BaseException) -> None:
        """A new worker could not start: its first job fails with ``error``."""
        with self._lock:
            self._threads -= 1
        if future.set_running_or_notify_cancel():
            future.set_exception(error)

    @property
    def threads(self) -> int:
        """Threads alive now (idle or busy)."""
        return self._threads

    def _run(self, worker: _Worker) -> None:
        lower_priority(self.nice)
        job = worker.job
        while True:
            assert job is not None
            future, fn, args = job
            ok = future.set_running_or_notify_cancel()  # (False: cancelled while waiting)
            result: Any = None
            error: BaseException | None = None
            if ok:
                try:
                    result = fn(*args)
                except BaseException as e:
                    error = e
            # Back on the idle stack *before* the result wakes the loop: the next kernel
            # the loop submits then goes to this same thread (see the note).
            with self._lock:
                if self._waiting:
                    job = heappop(self._waiting)[2]
                else:
                    job = worker.job = None
                    worker.wake.clear()
                    self._idle.append(worker)
            if ok:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
            del future, fn, args, result, error  # drop references before sleeping
            if job is not None:
                continue
            if not worker.wake.wait(self.idle_timeout):
                with self._lock:
                    if worker.job is None:  # still idle: leave
                        self._idle.remove(worker)
                        self._threads -= 1
                        return
            job = worker.job


_shared: dict[tuple[int, int], WorkerPool] = {}
_shared_lock = threading.Lock()


def shared_pool(max_workers: int, nice: int) -> WorkerPool:
    """The process's pool of ``max_workers`` threads at niceness ``nice``."""
    with _shared_lock:
        pool = _shared.get((max_workers, nice))
        if pool is None:
            pool = _shared[(max_workers, nice)] = WorkerPool(max_workers, nice=nice)
        return pool


def submit(executor: Executor, priority: int, fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``executor.submit(fn, *args)``, in ``priority`` order when it is a WorkerPool."""
    if type(executor) is WorkerPool:
        return executor.submit_at(priority, fn, *args)
    return executor.submit(fn, *args)


def lower_priority(nice: int) -> None:
    """Lower the calling thread's scheduling priority by ``nice`` (Linux: a thread is a
    task with its own niceness; elsewhere, or without permission, nothing happens)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError:
        pass
