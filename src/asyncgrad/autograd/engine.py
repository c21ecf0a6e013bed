"""The engine: drives GraphTasks on the event loop and offloads large kernels.

Note [Inline or offload]: a node whose ``work`` (elements its kernel touches) is below
``inline_threshold`` runs inline on the event loop: a thread hop costs ~100 us, a tiny
node ~1 us. Larger kernels run on the engine's worker threads (numpy releases the GIL),
at most ``max_workers`` of them (workers.py), so independent branches overlap; a
large node takes the large nodes that only it feeds along on the same hop (Note [Worker
chains] in graph_task.py). Inline work yields to the loop at least every
``yield_interval`` seconds, so the loop stays responsive whatever the graph.

Note [Reentrant backwards]: a backward started while a node of another backward runs
(a hook, a custom Function's backward, a callback) is *nested*: depth + 1, and its
parent starts no new node until it finished. ``await ag.backward`` from an
``async def backward`` runs the nested GraphTask on the loop like any other. A
synchronous ``backward_sync`` cannot await, so it drains the nested GraphTask on the
calling thread, every node inline; it never waits for a worker slot, so an exhausted
pool cannot deadlock it. Every ``REENTRANT_HANDOFF_DEPTH`` levels the nested drain moves
to a fresh thread so deep nesting never hits Python's recursion limit (PyTorch does the
same every 60 levels).

Cancellation: cancelling the awaiting task stops starting nodes at once; kernels already
on worker threads run to their end (a thread cannot be interrupted) and the ``await``
returns only after they have, with their results dropped. Nothing is committed and no
saved tensor is freed, so the same backward can be run again.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Coroutine

import anyio
import anyio.lowlevel

from .. import _context
from .graph import Node
from .graph_task import RELEASE_STEP, GraphTask, validate_outputs
from .input_buffer import LazyBuffer, combine, resolve, value
from .kernel import _anomaly_mode, run_kernel
from .recording import OpNode
from .workers import WorkerPool, shared_pool

REENTRANT_HANDOFF_DEPTH = 40
_INF = float("inf")
DEFAULT_INLINE_THRESHOLD = 131_072
YIELD_INTERVAL = 0.0005
WORKER_NICE = 10


@dataclass(frozen=True)
class EngineStatistics:
    """A snapshot of an engine's counters (for debugging, tests and the profiler)."""

    graph_tasks_started: int
    graph_tasks_succeeded: int
    graph_tasks_failed: int
    graph_tasks_cancelled: int
    graph_tasks_running: int
    nodes_inline: int
    nodes_offloaded: int
    kernels_in_flight: int
    max_workers: int
    inline_threshold: int
    thread_hops: int = 0  # kernels sent to worker threads (a worker chain is one)


@dataclass(frozen=True)
class GraphTaskStatistics:
    """A snapshot of one running GraphTask."""

    id: int
    depth: int
    nodes_inline: int
    nodes_offloaded: int
    in_flight: int
    ready: int
    pending: int
    thread_hops: int = 0


async def run_async_kernel(node: Node, inputs: list[Any], math: Any) -> list[Any]:
    """``run_kernel`` for a node whose backward is ``async def``, awaited on the loop."""
    anomaly = _anomaly_mode.get()
    if anomaly is not None:
        return await anomaly.run_node_async(node, inputs, math)  # type: ignore[no-any-return]
    return validate_outputs(node, await node.apply_async(inputs, math))  # type: ignore[attr-defined]


def async_kernel_for(task: GraphTask) -> Callable[[Node, list[Any], Any], Any]:
    """``run_async_kernel``, or the profiler's timed wrapper of it while profiling."""
    if task.profiler is None:
        return run_async_kernel
    return task.profiler.wrap_async_kernel(run_async_kernel, task)  # type: ignore[no-any-return]


def kernel_for(task: GraphTask, offloaded: bool) -> Callable[[Node, list[Any], Any], list[Any]]:
    """``run_kernel``, or the profiler's timed wrapper of it while a profile is recording."""
    if task.profiler is None:
        return run_kernel
    return task.profiler.wrap_kernel(run_kernel, task, offloaded)  # type: ignore[no-any-return]


class Engine:
    """Runs backward passes. ``max_workers`` bounds the engine's kernel threads,
    ``inline_threshold`` (elements) decides which nodes run inline, ``executor``
    replaces the engine's own worker threads with any ``concurrent.futures.Executor``,
    ``worker_nice`` lowers those threads' scheduling priority (Note [Worker threads
    yield the CPU to the loop] in workers.py)."""

    def __init__(self, *, max_workers: int | None = None, inline_threshold: int | None = None,
                 executor: Executor | None = None, yield_interval: float = YIELD_INTERVAL,
                 blas_threads: int | None = None, tune_malloc: bool = True,
                 worker_nice: int = WORKER_NICE) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.max_workers = max_workers or os.cpu_count() or 1
        self.inline_threshold = DEFAULT_INLINE_THRESHOLD if inline_threshold is None else inline_threshold
        self.executor = executor
        self.worker_nice = worker_nice
        self._pool: WorkerPool | None = None
        self._blas_gate: threading.BoundedSemaphore | None = None
        self.yield_interval = yield_interval
        self.blas_threads = blas_threads
        self.tune_malloc = tune_malloc
        self._blas_done = False
        self._blas_limits: Any = None
        self._blas_threads_per_call = 1
        self._blas_limiter_var: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
            f"asyncgrad_engine_blas_limiter_{id(self)}")
        self._lock = threading.Lock()
        self._started = self._succeeded = self._failed = self._cancelled = 0
        self._nodes_inline = self._nodes_offloaded = self._thread_hops = 0
        self._in_flight = 0

    # --- public ---------------------------------------------------------------------------
    def statistics(self) -> EngineStatistics:
        with self._lock:
            return EngineStatistics(
                self._started, self._succeeded, self._failed, self._cancelled,
                self._started - self._succeeded - self._failed - self._cancelled,
                self._nodes_inline, self._nodes_offloaded, self._in_flight,
                self.max_workers, self.inline_threshold, self._thread_hops,
            )

    async def execute(self, task: GraphTask) -> None:
        """Run ``task`` to completion on the current event loop (see module notes)."""
        await anyio.lowlevel.checkpoint_if_cancelled()  # an already-cancelled caller starts nothing
        if not self._blas_done:
            self._coordinate_blas()
        parent = _context.current_graph_task.get()
        self._begin(task, parent)
        outcome = "cancelled"
        tokens = _enter(task)
        try:
            await self._run_steps(task.setup_steps())
            await self._drain(task)
            if task.error is not None:
                raise task.error
            if task.dependencies:  # an invariant: a finished GraphTask ran every node
                raise RuntimeError(f"asyncgrad: internal error: graph task {task.id} ended with "
                                   f"{len(task.dependencies)} nodes that never became ready")
            if task.pre_commits:
                await self._run_pre_commits(task)
            await self._commit(task)
            await self._run_callbacks(task)
            outcome = "succeeded"
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException:
            outcome = "failed"
            raise
        finally:
            _exit(tokens)
            self._end(task, parent, outcome)

    def execute_sync(self, task: GraphTask) -> None:
        """Drain ``task`` on this thread, every node inline (sync forms, reentrancy)."""
        parent = _context.current_graph_task.get()
        if parent is not None and (parent.depth + 1) % REENTRANT_HANDOFF_DEPTH == 0:
            _run_on_fresh_thread(self._execute_sync_here, task)
        else:
            self._execute_sync_here(task)

    # --- drivers --------------------------------------------------------------------------
    def _execute_sync_here(self, task: GraphTask) -> None:
        if not self._blas_done:
            self._coordinate_blas()
        parent = _context.current_graph_task.get()
        self._begin(task, parent)
        outcome = "failed"
        tokens = _enter(task)
        try:
            for _ in task.setup_steps():
                pass
            kernel = self._inline_kernel(task)
            while True:
                ready = task.run_inline(kernel, _INF, _INF)
                if ready is None:
                    break
                node, inputs = ready  # type: ignore[misc]  # an async backward: run it to completion here
                try:
                    outputs = block_on(async_kernel_for(task), node, inputs, task.math)
                    task.nodes_inline += 1
                    task.finish(node, inputs, outputs)
                except BaseException as e:
                    task.fail(e, node)
                    raise
            if task.pre_commits:
                _call_each(task.pre_commits, _await_blocking, task.pre_commit_view())
                task.end_pre_commit()
            task.commit()
            _call_each(task.callbacks, _await_blocking)
            outcome = "succeeded"
        finally:
            _exit(tokens)
            self._end(task, parent, outcome)

    async def _drain(self, task: GraphTask) -> None:
        """Run inline until a node must go elsewhere; only then open a task group."""
        first = await self._drain_inline(task)
        if first is None:
            return
        async with anyio.create_task_group() as tg:
            try:
                self._start(task, tg, *first)
                await self._drain_concurrent(task, tg)
            except BaseException:
                task.stopping = True  # cancelled: chains on worker threads stop early
                raise

    async def _drain_inline(self, task: GraphTask) -> tuple[Node, list[Any]] | None:
        """Run nodes inline (yielding every ``yield_interval``) until done, or until a
        node must run elsewhere: that one is returned, prepared."""
        kernel = self._inline_kernel(task)
        interval = self.yield_interval
        while True:
            ready = task.run_inline(kernel, self.inline_threshold, time.perf_counter() + interval)
            if ready is not True:
                return ready  # type: ignore[return-value]
            await anyio.lowlevel.checkpoint()

    async def _drain_concurrent(self, task: GraphTask, tg: anyio.abc.TaskGroup) -> None:
        """Start large and async nodes as tasks, run the rest inline, until all are done.
        Starts nothing while a nested (reentrant) GraphTask of this one runs."""
        kernel = self._inline_kernel(task)
        interval = self.yield_interval
        while task.error is None:
            try:
                ready = None if task.active_children else task.run_inline(
                    kernel, self.inline_threshold, time.perf_counter() + interval)
            except Exception:
                tg.cancel_scope.cancel()
                return
            if ready is True:
                await anyio.lowlevel.checkpoint()
            elif ready is None:
                if task.in_flight == 0:  # (a nested task only runs inside an in-flight node)
                    if task.stopping and task.error is None:
                        await _let_pending_cancellation_land()
                    return
                task.wakeup = anyio.Event()
                await task.wakeup.wait()
            else:
                node, inputs = ready  # type: ignore[misc]
                self._start(task, tg, node, inputs)

    @staticmethod
    def _inline_kernel(task: GraphTask) -> Callable[[Node, list[Any], Any], list[Any]] | None:
        """None (GraphTask.run_inline's fused path) unless a tool wraps kernels."""
        if task.profiler is not None or _anomaly_mode.get() is not None:
            return kernel_for(task, False)
        return None

    def _start(self, task: GraphTask, tg: anyio.abc.TaskGroup, node: Node, inputs: list[Any]) -> None:
        task.in_flight += 1
        tg.start_soon(self._run_elsewhere, task, tg, node, inputs)

    async def _run_elsewhere(self, task: GraphTask, tg: anyio.abc.TaskGroup, node: Node,
                             inputs: list[Any]) -> None:
        try:
            if node.maybe_async and node.is_async():
                outputs = await async_kernel_for(task)(node, inputs, task.math)
            else:
                if self.tune_malloc and not _malloc_tuned:
                    _keep_large_allocations()
                with self._lock:
                    self._in_flight += 1
                try:
                    if type(node) is OpNode and node.spec.blas:
                        # Note [BLAS threads]: at most cores // BLAS-threads BLAS kernels at once
                        async with self._blas_limiter():
                            outputs = await self._offload_kernel(task, node, inputs, blas=True)
                    elif self._chains(task, node):
                        await self._offload_chain(task, node, inputs)
                        if task.error is not None:
                            tg.cancel_scope.cancel()
                        return
                    else:
                        outputs = await self._offload_kernel(task, node, inputs)
                finally:
                    with self._lock:
                        self._in_flight -= 1
            task.nodes_offloaded += 1
            if task.error is None:
                task.finish(node, inputs, outputs)
        except Exception as e:
            task.fail(e, node)
            tg.cancel_scope.cancel()
        except BaseException:  # cancelled: this node's gradients are dropped, so the
            task.stopping = True  # GraphTask can no longer complete
            raise
        finally:
            task.in_flight -= 1
            if task.wakeup is not None:
                task.wakeup.set()

    def _chains(self, task: GraphTask, node: Node) -> bool:
        """Whether ``node`` may head a worker chain (Note [Worker chains] in
        graph_task.py): a plain backward of built-in nodes, no tool wrapping kernels,
        and a node that is not split into per-input kernels."""
        return (type(node) is OpNode and task.captures is None and not task.create_graph
                and task.profiler is None and _anomaly_mode.get() is None
                and not self._splits(task, node))

    async def _offload_chain(self, task: GraphTask, head: Node, inputs: list[Any]) -> None:
        """Run ``head`` and the nodes chained after it on one worker thread, then route
        their gradients on the loop (Note [Worker chains])."""
        chain, edges, partials = task.plan_chain(head, self.inline_threshold, self._blas_threads_per_call == 1)
        if not chain:
            outputs = await self._offload_kernel(task, head, inputs)
            task.nodes_offloaded += 1
            if task.error is None:
                task.finish(head, inputs, outputs)
            return
        task.thread_hops += 1
        nodes = [head, *chain]
        results, error = await self._offload(_run_chain, task, nodes, edges, partials, inputs)
        task.nodes_offloaded += len(results)
        if error is not None:
            task.fail(error, nodes[len(results)])
            return
        if task.error is not None or len(results) < len(nodes):  # stopped: drop it all
            return
        for k, (node, outputs) in enumerate(zip(nodes, results)):
            task.finish_chained(node, edges[k] if k < len(edges) else -1, outputs)

    async def _offload_kernel(self, task: GraphTask, node: Node, inputs: list[Any],
                              blas: bool = False) -> list[Any]:
        task.thread_hops += 1
        if self._splits(task, node):
            if type(inputs) is LazyBuffer:
                task.thread_hops += 1
                inputs = await self._offload(resolve, inputs)
            return await self._offload_per_input(task, node, inputs)
        kernel = kernel_for(task, True)
        offload = self._offload_blas if blas else self._offload
        if type(inputs) is LazyBuffer:  # add up the deferred sums on the worker too
            return await offload(_resolved_kernel, kernel, node, inputs, task.math)  # type: ignore[no-any-return]
        return await offload(kernel, node, inputs, task.math)  # type: ignore[no-any-return]

    def _splits(self, task: GraphTask, node: Node) -> bool:
        """Whether to compute a node's input gradients as separate parallel kernels: a
        large built-in node with several needed gradients, and no tool wrapping kernels.
        Not for BLAS kernels while BLAS runs threads of its own (it parallelises them)."""
        if self.max_workers < 2 or type(node) is not OpNode or task.profiler is not None:
            return False
        if node.spec.blas and self._blas_threads_per_call > 1:
            return False
        if _anomaly_mode.get() is not None or node.spec.variadic:
            return False
        needed = 0
        for child, _ in node.next_edges:
            if child is not None:
                needed += 1
        return needed > 1

    async def _offload_per_input(self, task: GraphTask, node: Node, inputs: list[Any]) -> list[Any]:
        math = task.math
        outputs: list[Any] = [None] * len(node.next_edges)
        # unpack the saved values once (unpack hooks may be slow: on a worker thread)
        unpacked = await self._offload(node.rule_args, math)  # type: ignore[attr-defined]

        async def one(i: int) -> None:
            task.thread_hops += 1
            outputs[i] = await self._offload(node.apply_edge, i, inputs, math, unpacked)  # type: ignore[attr-defined]

        async with anyio.create_task_group() as parts:
            for i, (child, _) in enumerate(node.next_edges):
                if child is not None:
                    parts.start_soon(one, i)
        return outputs

    def _coordinate_blas(self) -> None:
        """Note [BLAS threads]: BLAS runs threads of its own inside each call. Several
        BLAS kernels on worker threads at once multiply those threads and oversubscribe
        the cores (measured here: 964 vs 8,707 small-MLP passes/s). So the engine runs at
        most ``cores // BLAS-threads-per-call`` BLAS kernels (matmul, linear) at once,
        counted over every loop using the engine (a per-loop limiter and shared slots),
        and splits a BLAS node's input gradients into parallel kernels only when BLAS is
        single-threaded. BLAS's own setting is left
        alone by default: for one large backward, one kernel with BLAS's two threads beats
        two single-threaded kernels (7.6 vs 8.3-9.4 ms for a 256x1024x1024 linear layer
        here). ``Engine(blas_threads=n)`` sets BLAS to ``n`` threads per call process-wide
        through threadpoolctl (``1`` favours many concurrent backward calls: inter-op
        parallelism instead of BLAS's own)."""
        # Under the lock, and marked done only at the end: several event loops (threads)
        # may start their first backward at once, and none may go on with the default.
        with self._lock:
            if self._blas_done:
                return
            self._blas_threads_per_call = self._blas_threads_per_call_now()
            self._blas_done = True

    def _blas_threads_per_call_now(self) -> int:
        cores = os.cpu_count() or 1
        n = self.blas_threads
        try:
            from threadpoolctl import threadpool_info, threadpool_limits
        except ImportError:  # optional: without it, assume BLAS uses every core
            return cores if not n else n
        if n:
            self._blas_limits = threadpool_limits(limits=n, user_api="blas")
            return n
        counts = [lib.get("num_threads", 1) for lib in threadpool_info() if lib.get("user_api") == "blas"]
        return max(counts, default=1)

    def _blas_limiter(self) -> anyio.CapacityLimiter:
        try:
            return self._blas_limiter_var.get()
        except LookupError:
            slots = max(1, (os.cpu_count() or 1) // max(1, self._blas_threads_per_call))
            limiter = anyio.CapacityLimiter(min(slots, self.max_workers))
            self._blas_limiter_var.set(limiter)
            return limiter

    async def _offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await _run_in_executor(self.executor or self._pool or self._start_pool(), fn, args)

    async def _offload_blas(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``_offload`` for a BLAS kernel, which on its worker thread first takes one of
        ``cores // BLAS-threads`` slots shared by every event loop using the engine, so
        several loops (threads) cannot oversubscribe the cores with BLAS's threads either
        (Note [BLAS threads]; the per-loop limiter orders a loop's own BLAS kernels, so a
        worker waits on a slot only when another loop holds it). Measured: 4 loops each
        running MLP backwards made 20.5-21 backwards/s in all with a per-loop bound only,
        22-23 with the shared slots, against ~29 for one loop. (A separate pool of BLAS
        threads bounds them as well, but then kernels alternate between two threads, and
        the loop's lag grew back from 1.1 to 3.9 ms: see workers.py.)"""
        gate = self._blas_gate
        if gate is None:
            with self._lock:
                if self._blas_gate is None:
                    slots = max(1, (os.cpu_count() or 1) // max(1, self._blas_threads_per_call))
                    self._blas_gate = threading.BoundedSemaphore(min(slots, self.max_workers))
                gate = self._blas_gate
        return await self._offload(_gated, gate, fn, *args)

    def _start_pool(self) -> WorkerPool:
        """The worker threads: a pool of ``max_workers`` threads shared by every event
        loop and thread that uses the engine (and by engines with the same settings),
        so ``max_workers`` bounds them all (Note [Worker threads yield the CPU to the
        loop] in workers.py)."""
        self._pool = shared_pool(self.max_workers, self.worker_nice)
        return self._pool

    async def _commit(self, task: GraphTask) -> None:
        """Commit on success. Large commits (adding big gradients into ``.grad``) run on
        a worker thread so the loop keeps serving; the commit is shielded from
        cancellation, because it must happen entirely or not at all."""
        if task.create_graph or task.staged_size() < self.inline_threshold:
            task.write_grads()
        else:
            with anyio.CancelScope(shield=True):
                await self._offload(task.write_grads)
        try:
            task.after_commit()
        finally:
            if len(task.executed) <= RELEASE_STEP:  # one step: nothing to wait for
                for _ in task.release_steps():
                    pass
            else:
                with anyio.CancelScope(shield=True):  # bookkeeping after the commit: finish it
                    await self._run_steps(task.release_steps())

    async def _run_steps(self, steps: Any) -> None:
        """Exhaust a GraphTask step generator, yielding to the loop every yield_interval."""
        interval = self.yield_interval
        deadline = time.perf_counter() + interval
        for _ in steps:
            if time.perf_counter() >= deadline:
                await anyio.lowlevel.checkpoint()
                deadline = time.perf_counter() + interval

    async def _run_callbacks(self, task: GraphTask) -> None:
        i = 0
        while i < len(task.callbacks):  # a callback may queue more
            result = task.callbacks[i]()
            if _is_awaitable(result):
                await result
            i += 1

    async def _run_pre_commits(self, task: GraphTask) -> None:
        """Note [Pre-commit]: after every node finished, before the commit. Not shielded:
        a cancellation or an error here commits nothing."""
        view = task.pre_commit_view()
        i = 0
        while i < len(task.pre_commits):  # a function may queue more
            result = task.pre_commits[i](view)
            if _is_awaitable(result):
                await result
            i += 1
        task.end_pre_commit()

    # --- bookkeeping ----------------------------------------------------------------------
    def _begin(self, task: GraphTask, parent: GraphTask | None) -> None:
        if parent is not None:
            task.parent = parent
            task.depth = parent.depth + 1
            parent.active_children += 1
        with self._lock:
            self._started += 1

    def _end(self, task: GraphTask, parent: GraphTask | None, outcome: str) -> None:
        if parent is not None:
            parent.active_children -= 1
        with self._lock:
            self._nodes_inline += task.nodes_inline
            self._nodes_offloaded += task.nodes_offloaded
            self._thread_hops += task.thread_hops
            if outcome == "succeeded":
                self._succeeded += 1
            elif outcome == "failed":
                self._failed += 1
            else:
                self._cancelled += 1


def _is_awaitable(result: Any) -> bool:
    return asyncio.iscoroutine(result) or hasattr(result, "__await__")


def _await_blocking(result: Any) -> None:
    """From the sync driver: run an awaitable that a callback returned to completion."""
    if _is_awaitable(result):
        async def wait() -> None:
            await result

        block_on(wait)


def _call_each(fns: list[Callable[..., Any]], finish: Callable[[Any], None], *args: Any) -> None:
    """Call ``fns`` in order, including any appended while iterating (a callback may
    queue more), passing each result to ``finish``."""
    i = 0
    while i < len(fns):
        finish(fns[i](*args))
        i += 1


def _gated(gate: threading.BoundedSemaphore, fn: Callable[..., Any], *args: Any) -> Any:
    """On a worker thread: ``fn(*args)`` holding one of ``gate``'s slots."""
    with gate:
        return fn(*args)


def _resolved_kernel(kernel: Callable[[Node, list[Any], Any], list[Any]], node: Node,
                     inputs: list[Any], math: Any) -> list[Any]:
    """``kernel`` after adding up a LazyBuffer's pending sums (Note [Deferred sums])."""
    return kernel(node, resolve(inputs), math)


async def _let_pending_cancellation_land() -> None:
    """A kernel's task was cancelled and its gradients dropped, so the GraphTask cannot
    complete. The cancellation that did it covers the driver too (it is the task
    group's, or an enclosing scope's), but may not have reached it yet (anyio delivers
    it only to a task that is waiting): a checkpoint lets it land. The driver must never
    go on to commit a GraphTask with nodes that did not run."""
    for _ in range(100):
        await anyio.lowlevel.checkpoint()
    raise RuntimeError("asyncgrad: a kernel of this backward was cancelled, but the backward was not")


def _run_chain(task: GraphTask, nodes: list[Node], edges: list[int], partials: list[Any],
               inputs: list[Any]) -> tuple[list[list[Any]], BaseException | None]:
    """On a worker thread: run a chain of nodes, each fed the gradient its predecessor
    computed for it (added to what its buffer already held: ``partials``). Returns the
    outputs of the nodes that ran and the exception of the one that raised, if any (that
    one is ``nodes[len(outputs)]``); stops early once the GraphTask stops (an error
    elsewhere, or a cancellation)."""
    math = task.math
    results: list[list[Any]] = []
    for k, node in enumerate(nodes):
        if k and task.stopping:
            break
        try:
            if k:  # what the buffer held, plus the predecessor's gradient
                prev = results[-1]
                inputs = [value(combine(partials[k - 1], prev[edges[k - 1]]))]
                # dropped from the results (finish_chained skips that edge), so a long
                # chain holds one gradient at a time, not one per node
                prev[edges[k - 1]] = None
                del prev
            elif type(inputs) is LazyBuffer:
                inputs = resolve(inputs)
            results.append(run_kernel(node, inputs, math))
        except Exception as e:
            return results, e
    return results, None


def graph_task_statistics(task: GraphTask) -> GraphTaskStatistics:
    return GraphTaskStatistics(task.id, task.depth, task.nodes_inline, task.nodes_offloaded,
                               task.in_flight, len(task.heap) + len(task.ready_leaves),
                               len(task.dependencies), task.thread_hops)


def _enter(task: GraphTask) -> tuple[Any, Any]:
    return (_context.current_graph_task.set(task), _context.grad_enabled.set(task.create_graph))


def _exit(tokens: tuple[Any, Any]) -> None:
    _context.grad_enabled.reset(tokens[1])
    _context.current_graph_task.reset(tokens[0])


_malloc_tuned = False


def _keep_large_allocations() -> None:
    """Note [Page faults]: numpy allocates every result afresh. glibc serves large blocks
    with mmap and returns them to the OS on free, so each new 4 MB array is faulted in
    page by page again (~8 us a page on this project's VMs: ~8 ms per array), and arrays
    made on worker threads and freed on the loop thread fault every time. That cost ate
    the whole gain of running branches in parallel. At its first offloaded kernel the
    engine therefore raises glibc's mmap and trim thresholds (mallopt, process-wide, once)
    so freed blocks are reused: the process keeps up to ~128 MB of freed memory per arena
    instead of returning it at once. ``Engine(tune_malloc=False)`` leaves malloc alone; it
    is a no-op off glibc."""
    global _malloc_tuned
    _malloc_tuned = True
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)  # glibc's maximum on 64-bit
        libc.mallopt(m_trim_threshold, 128 * 1024 * 1024)
    except (OSError, AttributeError):  # not glibc
        return


def _threadsafe_caller() -> Callable[[Callable[[], Any]], None]:
    try:
        loop = asyncio.get_running_loop()

        def call_soon(fn: Callable[[], Any]) -> None:
            loop.call_soon_threadsafe(fn)

        return call_soon
    except RuntimeError:
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon


async def _run_in_executor(executor: Executor, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run ``fn`` on ``executor`` in a copy of this context. If cancelled meanwhile, a
    call that has not started is withdrawn; one that has is waited for (a thread
    cannot be interrupted), then the cancellation goes on."""
    ctx = contextvars.copy_context()
    done = anyio.Event()
    call_soon = _threadsafe_caller()
    future = executor.submit(ctx.run, fn, *args)
    future.add_done_callback(lambda _: call_soon(done.set))
    try:
        await done.wait()
    except anyio.get_cancelled_exc_class():
        if not future.cancel():
            with anyio.CancelScope(shield=True):
                await done.wait()
        raise
    return future.result()


def _in_event_loop_thread() -> bool:
    """Whether this *thread* is running an event loop. Not sniffio's context variable:
    contexts are copied into worker threads, threads are not."""
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        pass
    # trio is an optional back end: only a thread running it can have imported it already.
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_trio_token()
        return True
    except RuntimeError:
        return False


def block_on(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    """Run the coroutine ``fn(*args)`` to completion from synchronous code, with this
    context's variables. On a thread that runs an event loop (which we must not block
    re-entrantly) it runs on a fresh thread with its own loop."""
    ctx = contextvars.copy_context()
    if not _in_event_loop_thread():
        return ctx.run(asyncio.run, fn(*args))
    return _run_on_fresh_thread(lambda: asyncio.run(fn(*args)), ctx=ctx)


def _run_on_fresh_thread(fn: Callable[..., Any], *args: Any, ctx: contextvars.Context | None = None) -> Any:
    ctx = ctx or contextvars.copy_context()
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(ctx.run(fn, *args))
        except BaseException as e:  # re-raised on the calling thread
            error.append(e)

    thread = threading.Thread(target=target, name="asyncgrad-reentrant")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0] if result else None


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


def queue_callback(fn: Callable[[], Any]) -> None:
    """Run ``fn`` (sync or async) when the current GraphTask's nodes have all finished,
    before its ``await`` returns. Only valid while a backward is running."""
    task = _context.current_graph_task.get()
    if task is None:
        raise RuntimeError("Final callbacks can only be installed during backward pass.")
    task.queue_callback(fn)


def queue_pre_commit(fn: Callable[[dict[Any, Any]], Any]) -> None:
    """Run ``fn(staged)`` (sync or async) after every node of the current backward has
    finished and before its commit (Note [Pre-commit] in graph_task.py). ``staged`` maps
    each tensor whose ``.grad`` will change to its staged gradient (a Tensor); ``fn`` may
    replace entries with Tensors of the same shape. Only valid while a backward runs.

    Errors: if ``fn`` raises, nothing is committed and the exception propagates from
    the backward call. Cancellation: an ``async`` ``fn`` may be cancelled with the
    backward; nothing is committed then either."""
    task = _context.current_graph_task.get()
    if task is None:
        raise RuntimeError("Pre-commit functions can only be installed during backward pass.")
    task.pre_commits.append(fn)


def current_graph_task_statistics() -> GraphTaskStatistics | None:
    """Statistics of the GraphTask running in this context (from a hook, a Function's
    backward or a callback), or None outside backward."""
    task = _context.current_graph_task.get()
    return None if task is None else graph_task_statistics(task)


def current_graph_task_id() -> int | None:
    """The id of the GraphTask running in this context, or None outside backward."""
    task = _context.current_graph_task.get()
    return None if task is None else task.id


def in_event_loop_thread() -> bool:
    return _in_event_loop_thread()
