"""The engine: its drivers carry each GraphTask's sequence (Note [One driver skeleton]
in task/call.py) from its set-up to its final callbacks.

The walk of one ``await backward(loss)`` (docs/architecture.md has it in full):
``api.backward`` builds a GraphTask and awaits ``Engine.execute``, which drives
``call_steps``: the set-up walk, start hooks, then at ``DRAIN`` ``_drain`` and
``_serve``: the loop's runner (sched/loop.py) runs ready nodes in the core loop
(sched/inline.py); nodes that go elsewhere are started here (sched/offload.py's
``WorkerKernels``, whose arrivals route their gradients on the loop); then the sequence
checks, runs pre-commit functions, commits (task/commit.py) and runs final callbacks,
unless the loop's runner took it on for this driver (Note [The runner completes small
backward calls] in sched/loop.py). ``execute_sync`` drives the same sequence blocking.

Note [Reentrant backwards]: a backward started while a node of another backward runs,
in that node's own task or thread (Note [Explicit nesting] in runtime/threads.py), is *nested*:
depth + 1, and its parent starts no new node until it finished. ``await ag.backward``
from an ``async def backward`` runs the nested GraphTask on the loop like any other. A
synchronous ``backward_sync`` cannot await, so it drains the nested GraphTask on the
calling thread, every node inline; it never waits for a worker slot, so an exhausted
pool cannot deadlock it. Every ``REENTRANT_HANDOFF_DEPTH`` levels the nested drain moves
to a fresh thread so deep nesting never hits Python's recursion limit (PyTorch does the
same every 60 levels).

Note [A task group only for async nodes]: kernels on worker threads come back as
callbacks (Note [Completion by callback] in sched/offload.py) and need no task of their own;
only a node with an ``async def`` backward runs as a task, in a task group the driver
opens when the first such node is to start. A large backward of built-in nodes then
pays no task group, whose cancel scope's entry and exit lie on the critical path before
the hop and after it (docs/benchmarks.md, "Figures behind the Notes").

Cancellation: cancelling the awaiting task stops starting nodes at once; kernels already
on worker threads run to their end (a thread cannot be interrupted) and the ``await``
returns only after they have, with their results dropped. Nothing is committed and no
saved tensor is freed, so the same backward can be run again.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import replace
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from .errors import EngineInternalError
from .task.call import (
    DONE, DRAIN, SHIELDED_TURN, TURN, Offload, Raised, Steps, abort_steps, advance, call_steps,
)
from .task.graph_task import GraphTask, TaskPolicy
from .sched.offload import WorkerKernels, run_async_node
from .runtime.blas import BLAS
from .sched.placement import ASYNC, MID_WORK, Policy, worker_niceness
from .sched.admission import grant_admission_pass
from .sched.loop import LoopScheduler, loop_scheduler
from .task.statistics import EngineStatistics
from .sched.blocking import drive_blocking, drain_sync, enter_task, exit_task
from .runtime.threads import (
    as_owner, redeliver_cancellation, run_in_executor, run_on_fresh_thread,
    running_graph_task,
)
from .runtime.workers import WorkerPool, shared_pool

REENTRANT_HANDOFF_DEPTH = 40
DEFAULT_INLINE_THRESHOLD = 1_500_000  # Note [Inline or offload] in sched/placement.py
YIELD_INTERVAL = 0.0005


class Engine:
    """Runs backward passes. ``max_workers`` bounds the engine's kernel threads,
    ``inline_threshold`` (elements) decides which nodes run inline, ``executor``
    replaces the engine's own worker threads with any ``concurrent.futures.Executor``,
    ``worker_nice`` fixes those threads' niceness (default None: lowered on the cores no
    other process keeps busy, Note [Niced kernels on the cores others leave] in
    sched/placement.py; 0: never lowered), ``yield_interval``
    is the longest the loop goes without a turn (Note [One runner per loop] in
    sched/loop.py)."""

    #: whether a plain backward may run as a flat schedule (Note [The flat schedule] in
    #: task/schedule.py); the reference executor's engine turns it off
    flat_schedule = True

    def __init__(self, *, max_workers: int | None = None, inline_threshold: int | None = None,
                 executor: Executor | None = None, yield_interval: float = YIELD_INTERVAL,
                 blas_threads: int | None = None, tune_malloc: bool = True,
                 worker_nice: int | None = None) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        if worker_nice is not None and type(worker_nice) is not int:
            raise TypeError(f"worker_nice must be None or an int, got {type(worker_nice).__name__}")
        if worker_nice is not None and not 0 <= worker_nice <= 19:
            raise ValueError(f"worker_nice must be from 0 to 19, got {worker_nice}")
        self.max_workers = max_workers or os.cpu_count() or 1
        threshold = DEFAULT_INLINE_THRESHOLD if inline_threshold is None else inline_threshold
        self.executor = executor
        self.worker_nice = worker_nice
        self.blas_threads = blas_threads
        self.tune_malloc = tune_malloc
        self.policy = Policy(self.max_workers, threshold, blas_threads, tune_malloc)
        # what each new GraphTask takes (Note [Each call runs by its engine's policy])
        # (an explicit threshold is a hard rule: Note [Mid-size nodes hop beside another])
        mid = MID_WORK if inline_threshold is None and self.max_workers >= 2 else math.inf
        self.task_policy = TaskPolicy(threshold, yield_interval, self.flat_schedule, mid)
        # by niceness (Note [Niced kernels on the cores others leave] in sched/placement.py)
        self._pools: dict[int, WorkerPool] = {}
        self._lock = threading.Lock()  # guards the counters below (any thread reads statistics)
        self._started = self._succeeded = self._failed = self._cancelled = 0
        self._nodes_inline = self._nodes_offloaded = self._thread_hops = 0
        self._running: set[GraphTask] = set()  # its calls in progress (their nodes in flight count)

    # --- public ---------------------------------------------------------------------------
    @property
    def inline_threshold(self) -> int:
        """Nodes whose ``work`` (elements) is below this run inline on the loop."""
        return self.policy.inline_threshold

    @inline_threshold.setter
    def inline_threshold(self, value: int) -> None:
        self.policy.inline_threshold = value
        self.task_policy = replace(self.task_policy, inline_threshold=value, mid_work=math.inf)

    @property
    def yield_interval(self) -> float:
        """The longest (seconds) this engine's backward calls keep the loop from a turn."""
        return self.task_policy.yield_interval

    @yield_interval.setter
    def yield_interval(self, value: float) -> None:
        self.task_policy = replace(self.task_policy, yield_interval=value)

    def statistics(self) -> EngineStatistics:
        with self._lock:
            return EngineStatistics(
                self._started, self._succeeded, self._failed, self._cancelled,
                self._started - self._succeeded - self._failed - self._cancelled,
                self._nodes_inline, self._nodes_offloaded, sum(t.in_flight for t in self._running),
                self.max_workers, self.inline_threshold, self._thread_hops,
            )

    async def execute(self, task: GraphTask) -> None:
        """Run ``task`` to completion on the current event loop: its sequence (Note [One
        driver skeleton] in task/call.py), each request awaited."""
        await loop_scheduler().check_cancelled()  # an already-cancelled caller starts nothing
        policy = self.policy
        if not policy.setup_started:
            policy.start_setup(self._warm)
        parent = self._begin(task)
        outcome = "cancelled"
        tokens = enter_task(task)
        try:
            steps = task.steps = call_steps(task)
            request = advance(steps)
            while request is not DONE:
                request = await self._carry_out(task, steps, request)
            outcome = "succeeded"
        except anyio.get_cancelled_exc_class() as e:
            await self._abort(task, e)
            raise
        except BaseException as e:
            outcome = "failed"
            await self._abort(task, e)
            raise
        finally:
            task.steps = None
            exit_task(tokens)
            self._end(task, parent, outcome)

    async def _carry_out(self, task: GraphTask, steps: Steps, request: Any) -> Any:
        """Await one request of ``task``'s sequence and resume it with the result (or
        throw in what the wait raised); returns its next request."""
        try:
            if request is DRAIN:
                await self._drain(task)
                taken = task.request  # the loop's runner took the sequence on from here
                if taken is not None:
                    task.request = None
                    if type(taken) is Raised:
                        raise taken.error  # (as if this driver had completed the call)
                    return taken
                value = None
            elif request is TURN:
                await anyio.lowlevel.checkpoint()
                value = None
            elif request is SHIELDED_TURN:
                with anyio.CancelScope(shield=True):  # (bookkeeping after the commit)
                    await anyio.lowlevel.checkpoint()
                value = None
            elif type(request) is Offload:
                with anyio.CancelScope(shield=True):  # (the commit: entirely or not at all)
                    value = await self.offload(request.fn, *request.args, priority=task.priority)
            else:
                value = await request  # a hook's or a callback's awaitable
        except BaseException as e:  # (thrown into an ended sequence, it is raised as it is)
            return advance(steps, error=e)
        return advance(steps, value)

    async def _abort(self, task: GraphTask, error: BaseException) -> None:
        """The abort's steps, shielded (Note [Abort functions] in task/lifecycle.py)."""
        with anyio.CancelScope(shield=True):
            steps = abort_steps(task, error)
            request = advance(steps)
            while request is not DONE:
                try:
                    value = await request
                except Exception as e:
                    request = advance(steps, error=e)
                else:
                    request = advance(steps, value)

    def execute_sync(self, task: GraphTask) -> None:
        """Drain ``task`` on this thread, every node inline (sync forms, reentrancy)."""
        parent = running_graph_task()
        if parent is not None and (parent.depth + 1) % REENTRANT_HANDOFF_DEPTH == 0:
            # the fresh thread runs this nested backward as the node's owner
            run_on_fresh_thread(as_owner, self._execute_here, task)
        else:
            self._execute_here(task)

    def _execute_here(self, task: GraphTask) -> None:
        """``task``'s sequence on this thread, blocking (sched/blocking.py)."""
        self.policy.start_setup(self._warm)
        parent = self._begin(task)
        outcome = "failed"
        tokens = enter_task(task)
        task.inline_threshold = task.mid_work = math.inf  # (placement.decide: every node inline, here)
        try:
            drive_blocking(call_steps(task), lambda: self._drain_sync(task))
            outcome = "succeeded"
        except BaseException as e:
            drive_blocking(abort_steps(task, e), None)
            raise
        finally:
            exit_task(tokens)
            self._end(task, parent, outcome)

    # --- drivers --------------------------------------------------------------------------
    def _drain_sync(self, task: GraphTask) -> None:
        """Every node inline on this thread (sched/blocking.py; the reference engine
        replaces it)."""
        drain_sync(task)

    async def _drain(self, task: GraphTask) -> None:
        """Until every node ran. Small graphs run inline only; the worker kernels are
        set up when the first node that goes elsewhere appears, and a task group only
        when a node with an ``async def`` backward does (Note [A task group only for
        async nodes]). The loop's runner may complete the call meanwhile (it then sets
        ``task.request``, Note [One driver skeleton] in task/call.py)."""
        scheduler = loop_scheduler()
        if await self._serve(task, scheduler, None):
            return
        kernels = WorkerKernels(task, self.policy, self.worker_executor())
        try:
            if not await self._serve(task, scheduler, None, kernels):  # an async node: it needs a task group
                async with anyio.create_task_group() as tg:
                    await self._serve(task, scheduler, tg, kernels)
        except BaseException:
            task.stopping = True  # cancelled: chains on worker threads stop early
            raise
        finally:
            await kernels.settle()  # (Note [Completion by callback] in sched/offload.py)

    async def _serve(self, task: GraphTask, scheduler: LoopScheduler, tg: anyio.abc.TaskGroup | None,
                     kernels: WorkerKernels | None = None) -> bool:
        """Drive ``task``: start its nodes that go elsewhere (on ``kernels``' workers,
        an async backward as a task in ``tg``), be the loop's
        runner when there is none, else wait to be woken. Returns True when every node
        ran (or it failed, or the runner completed the call: Note [The runner completes
        small backward calls] in sched/loop.py), False when a node must start and there
        are no ``kernels``, or it has an async backward and there is no ``tg``."""
        try:
            while True:
                if task.error is not None:
                    if tg is not None:
                        tg.cancel_scope.cancel()
                    if kernels is not None:  # (its kernels are settled first)
                        return True
                    raise task.error
                if task.to_start:
                    if kernels is None:
                        return False
                    to_start = task.to_start
                    while to_start:
                        node, inputs, where = to_start[0]
                        if where is ASYNC:
                            if tg is None:
                                return False
                            to_start.popleft()
                            task.in_flight += 1
                            tg.start_soon(run_async_node, task, tg, node, inputs)
                        else:
                            to_start.popleft()
                            task.in_flight += 1
                            kernels.start(node, inputs)
                    if task.error is not None:  # (a start failed: handled at the top)
                        continue
                if not task.nodes_left():
                    scheduler.discard(task)  # (Note [Plain leaves] in task/step.py)
                    return True
                if task.schedule is not None and scheduler.run_alone(task):
                    continue  # (Note [A lone call runs its own nodes] in sched/loop.py)
                if task.has_ready():
                    if not task.active_children:
                        scheduler.add(task)
                elif task in scheduler.queue:  # nothing left to run inline: no runner's turn
                    scheduler.discard(task)  # for it (Note [Start the hop before the turn])
                if scheduler.runner is None and task in scheduler.queue:
                    await scheduler.run(task)
                    continue
                if task.stopping and not task.in_flight:
                    # a kernel's task was cancelled and its gradients dropped: the
                    # cancellation that did it reaches this driver at its next wait
                    await anyio.lowlevel.checkpoint()
                    raise EngineInternalError(f"graph task {task.id} stopped without an error or a cancellation")
                waiting = task.wakeup = scheduler.wakeup()
                try:
                    await waiting.wait()
                except anyio.get_cancelled_exc_class() as cancelled:
                    if task.request is None:
                        raise
                    redeliver_cancellation(cancelled)  # it came after the runner's commit
                finally:
                    task.wakeup = None
                if task.request is not None:  # the runner completed the call
                    grant_admission_pass()
                    return True
        except BaseException:  # failed or cancelled at any await: hand the runner role on
            scheduler.discard(task)
            scheduler.hand_on()  # (Note [Handing on] in sched/loop.py)
            raise

    # --- worker threads -------------------------------------------------------------------
    async def offload(self, fn: Callable[..., Any], *args: Any, priority: int = 0) -> Any:
        """``fn(*args)`` on a worker thread, queued by ``priority`` (see
        threads.run_in_executor)."""
        return await run_in_executor(self.worker_executor(), fn, args, priority)

    def worker_executor(self) -> Executor:
        """Where kernels run now: the ``executor`` given, else the engine's worker threads
        at the niceness ``worker_niceness`` chooses (Note [Niced kernels on the cores
        others leave] in sched/placement.py)."""
        if self.executor is not None:
            return self.executor
        nice = worker_niceness(self.max_workers, self.worker_nice)
        return self._pools.get(nice) or self._start_pool(nice)

    def _start_pool(self, nice: int) -> WorkerPool:
        """The worker threads at niceness ``nice``: a pool of ``max_workers`` threads
        shared by every event loop and thread that uses the engine (and by engines with
        the same settings)."""
        pool = self._pools[nice] = shared_pool(self.max_workers, nice)
        return pool

    def _warm(self) -> None:
        """On the set-up thread: start a first worker thread (Note [No one-time stall]);
        not waited for (a busy pool runs it when a thread is free)."""
        if self.executor is None:
            self.worker_executor().submit(int)

    # --- bookkeeping ----------------------------------------------------------------------
    def _begin(self, task: GraphTask) -> GraphTask | None:
        parent = running_graph_task()
        if parent is not None:
            task.nest_in(parent)
        with self._lock:
            self._started += 1
            self._running.add(task)
        if parent is None:  # a nested backward runs for its parent's node: no second call (Note [BLAS threads])
            BLAS.backward_started()
        return parent

    def _end(self, task: GraphTask, parent: GraphTask | None, outcome: str) -> None:
        if parent is None:
            BLAS.backward_ended()
        elif task.leave_parent():  # the parent may go on: queue it
            try:
                loop_scheduler().add(parent)
            except RuntimeError:  # (a synchronous drain off any loop: its own driver goes on)
                pass
        with self._lock:
            self._running.discard(task)
            self._nodes_inline += task.nodes_inline
            self._nodes_offloaded += task.nodes_offloaded
            self._thread_hops += task.thread_hops
            if outcome == "succeeded":
                self._succeeded += 1
            elif outcome == "failed":
                self._failed += 1
            else:
                self._cancelled += 1


_default_engine: Engine | None = None
_default_lock = threading.Lock()


def get_engine() -> Engine:
    """The process-wide default engine."""
    global _default_engine
    if _default_engine is None:
        with _default_lock:
            if _default_engine is None:
                _default_engine = Engine()
    return _default_engine


def set_engine(engine: Engine) -> None:
    """Replace the process-wide default engine."""
    global _default_engine
    if not isinstance(engine, Engine):
        raise TypeError(f"set_engine expects an Engine, got {type(engine).__name__}")
    _default_engine = engine
