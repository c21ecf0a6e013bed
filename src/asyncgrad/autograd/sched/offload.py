"""Running a node elsewhere than inline: on worker threads (one kernel, a worker chain,
or one kernel per group of input gradients), or as its own task for an ``async def``
backward. Which one is sched/placement.py's decision; this module carries it out for one
GraphTask and routes the results back through the same steps as an inline node.

Note [Completion by callback]: a kernel on a worker comes back as one callback on the
loop (``call_soon_threadsafe``, trio's ``run_sync_soon``), which routes its gradients
and queues what they made ready on the loop's scheduler directly: no task per offloaded
node, whose start and second wake-up would lie on the critical path of every large
node; a busy runner picks the new ready nodes up without waking this driver at all.
The driver still owns the kernels' lifetime (structured concurrency):
``WorkerKernels.settle``, run before its task group closes, withdraws kernels no worker
started and waits, shielded, for the others (a thread cannot be interrupted), whose
results are dropped once the GraphTask stops. So a cancelled or failed backward returns
after its last kernel, and nothing outlives it. (A split node routes its input
gradients as each is computed: Note [Input gradient first] in task/split_node.py.)
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import anyio
import anyio.abc

from ... import _context
from ..task.step import (async_kernel_for, finish, fresh_leaf_edges, kernel_for, needed_edges, own_leaf_edges,
                      pruned, resolved_kernel, run_kernel)
from ..graph import Node
from ..task.graph_task import GraphTask
from ..task.input_buffer import InputBuffer, ReadyInputs, combine, inputs_of, value
from .placement import ChainPlan, Policy
from ..graph.record import OpNode
from ..graph.saved import SavedTensor
from .loop import loop_scheduler, node_done
from ..task.split_node import apply_edges, is_leaf_edge, route_edges, routes_early, split_groups, unpack
from ..runtime.threads import boxed_call, current_owner, threadsafe_caller
from ..runtime.timer_wake import after_wake
from ..runtime.workers import submit
from .wakeup import Wakeup

Arrive = Callable[[Any, "BaseException | None"], None]


class Withdrawn(Exception):
    """A kernel withdrawn before a worker started it (its GraphTask stopped)."""


class WorkerKernels:
    """The kernels one driver has on worker threads for its GraphTask (Note [Completion
    by callback]). Lives on the loop's thread; ``pending`` are the futures whose
    completion has not been handled on the loop yet."""

    __slots__ = ("policy", "task", "executor", "call_soon", "pending", "settled", "loop", "scheduler")

    def __init__(self, task: GraphTask, policy: Policy, executor: Executor) -> None:
        self.policy = policy  # the engine's: how a node runs on workers (sched/placement.py)
        self.task = task
        self.executor = executor
        self.call_soon, self.loop = threadsafe_caller()
        self.pending: set[Future[Any]] = set()
        self.settled: Wakeup | None = None
        self.scheduler = loop_scheduler()

    # --- starting ---------------------------------------------------------------------
    def start(self, node: Node, inputs: ReadyInputs) -> None:
        """Start a prepared, synchronous node on worker threads (the driver counted it in
        ``task.in_flight``; its completion uncounts it)."""
        task = self.task
        policy = self.policy
        run = _NodeRun(self, node, inputs)
        try:
            blas = type(node) is OpNode and node.spec.blas
            if policy.chains(task, node):
                plan = policy.plan_chain(task, node)
                if plan is not None:
                    self._start_chain(run, plan)
                    return
            groups = split_groups(node, policy.splits(task, node), needed_edges(task, node))
            if groups is not None:
                self._start_parts(run, groups, blas)
            else:
                self._start_kernel(run, blas)
        except Exception as e:  # (a version check failed, or the executor refused it)
            run.fail(e)
            if not run.parts:  # (else its submitted parts finish it)
                run.part_done()

    def _start_kernel(self, run: _NodeRun, blas: bool) -> None:
        task, node, inputs = self.task, run.node, run.inputs
        kernel = pruned(task, node, kernel_for(task, True))
        fn: Callable[..., Any] = kernel
        args: tuple[Any, ...] = (node, inputs, task.math)
        if isinstance(inputs, InputBuffer):  # add up the deferred sums on the worker too
            fn, args = resolved_kernel, (kernel, *args)
        if blas:
            fn, args = self.policy.run_blas, (fn, *args)

        def arrive(outputs: Any, error: BaseException | None) -> None:
            task.nodes_offloaded += 1
            if error is not None:
                run.fail(error)
            elif run.live():
                finish(task, node, inputs, outputs)

        self.submit(run, fn, args, arrive)

    def _start_chain(self, run: _NodeRun, plan: ChainPlan) -> None:
        """A worker chain (Note [Worker chains] in sched/placement.py): one hop for the chain, its
        gradients routed on the loop."""
        task = self.task
        inputs = run.inputs
        nodes = plan.nodes

        def arrive(outcome: Any, error: BaseException | None) -> None:
            if error is not None:  # (withdrawn)
                run.fail(error)
                return
            results, fresh, raised = outcome
            task.nodes_offloaded += len(results)
            if raised is not None:
                run.fail(raised, nodes[len(results)])
                return
            if not run.live() or len(results) < len(nodes):  # stopped: drop it all
                return
            for node, outputs, owned, internal in zip(nodes, results, fresh, plan.internal):
                own_leaf_edges(task, node, outputs, owned)  # Note [Owned gradients] in task/step.py
                task.route(node, outputs, internal)

        fn: Callable[..., Any] = _run_chain
        args: tuple[Any, ...] = (task, plan, inputs)
        if any(type(n) is OpNode and n.spec.blas for n in nodes):  # (BLAS slots: Note [BLAS threads])
            fn, args = self.policy.run_blas, (fn, *args)
        self.submit(run, fn, args, arrive)

    def _start_parts(self, run: _NodeRun, groups: list[list[int]], blas: bool) -> None:
        """One kernel per group of input gradients, the first group's first (Note [Input
        gradient first]); unpacking saved values or adding deferred sums comes first,
        on a worker, when it is more than a lookup."""
        task, node, inputs = self.task, run.node, run.inputs
        assert isinstance(node, OpNode)
        math = task.math
        plain = not math.tensor_mode and node.saved is not None and all(type(e) is SavedTensor for e in node.checks)
        if plain and not isinstance(inputs, InputBuffer):  # (plain_args: version checks only)
            self._submit_parts(run, groups, blas, inputs, (node.plain_args(), node.params))
            return

        def prepared(outcome: Any, error: BaseException | None) -> None:
            if error is not None:
                run.fail(error)
            elif run.live():
                grads, unpacked = outcome
                self._submit_parts(run, groups, blas, grads, unpacked)

        self.submit(run, unpack, (node, inputs, math), prepared)

    def _submit_parts(self, run: _NodeRun, groups: list[list[int]], blas: bool, grads: list[Any],
                      unpacked: tuple[Any, Any]) -> None:
        """A kernel per group, in parallel, the input gradients' first (Note [Input
        gradient first] in task/split_node.py)."""
        task, node = self.task, run.node
        assert isinstance(node, OpNode)
        early = routes_early(task, node)
        run.outputs = [None] * len(node.next_edges)
        run.grads = grads
        run.inner = [i for group in groups for i in group if not is_leaf_edge(node, i)]
        run.inner_left = sum(1 for group in groups if any(i in run.inner for i in group))
        policy = self.policy
        # the loop computes the first group itself? (Note [The loop takes a small split's
        # first part] in task/split_node.py)
        here = policy.first_part_here(task, node, len(groups))
        run_blas = policy.run_blas
        for group in groups[1:] if here else groups:
            fn: Callable[..., Any] = apply_edges
            args: tuple[Any, ...] = (node, group, grads, task.math, unpacked)
            if blas:  # (each part holds BLAS slots)
                fn, args = run_blas, (fn, *args)
            self.submit(run, fn, args, run.part_arrival(group, early))
        if here:
            run.parts += 1
            part: Any = None
            error: BaseException | None = None
            try:
                part = apply_edges(node, groups[0], grads, task.math, unpacked)
            except Exception as e:
                error = e
            run.deliver(run.part_arrival(groups[0], early), part, error)

    def submit(self, run: _NodeRun, fn: Callable[..., Any], args: tuple[Any, ...], arrive: Arrive) -> None:
        """``fn(*args)`` on a worker thread, in a copy of this context (the worker is
        the owner of what runs there), as one part of ``run``; ``arrive(result,
        error)`` then runs on the loop."""
        ctx = contextvars.copy_context()
        future = submit(self.executor, self.task.priority, ctx.run, boxed_call, fn, *args)
        self.task.thread_hops += 1
        run.parts += 1
        self.pending.add(future)
        on_loop = run.arrival(arrive)
        call_soon = self.call_soon
        future.add_done_callback(lambda f: call_soon(self._arrived, f, on_loop))

    # --- coming back (on the loop) ----------------------------------------------------
    def _arrived(self, future: Future[Any], arrive: Callable[[Future[Any]], None]) -> None:
        # the loop is right after a turn (Note [A turn the loop just had] in sched/loop.py)
        self.scheduler.turn_at = time.perf_counter()
        self.pending.discard(future)
        try:
            arrive(future)
        finally:
            if not self.pending and self.settled is not None:
                self.settled.set()
            after_wake(self.loop)  # (Note [A woken loop's next timer] in runtime/timer_wake.py)

    async def settle(self) -> None:
        """The driver's last step with kernels out (Note [Completion by callback]):
        withdraw those not started, wait for the others, shielded. A cancellation that
        arrives meanwhile is raised once they are all back."""
        if not self.pending:
            return
        for future in list(self.pending):
            future.cancel()  # (False for a started one: it is waited for)
        cancelled: BaseException | None = None
        with anyio.CancelScope(shield=True):
            while self.pending:
                self.settled = waiting = Wakeup(self.loop)
                try:
                    await waiting.wait()
                except anyio.get_cancelled_exc_class() as e:  # (asyncio's own, past the shield)
                    cancelled = e
        self.settled = None
        if cancelled is not None:
            raise cancelled


class _NodeRun:
    """One node's kernels on workers: counts its parts, and when the last is back
    uncounts the node (``task.in_flight``) and queues what it made ready."""

    __slots__ = ("kernels", "node", "inputs", "parts", "outputs", "grads", "inner", "inner_left", "failed")

    def __init__(self, kernels: WorkerKernels, node: Node, inputs: ReadyInputs) -> None:
        self.kernels = kernels
        self.node = node
        self.inputs = inputs
        self.parts = 0  # submitted kernels not back yet
        self.outputs: list[Any] | None = None  # gradients of a split node, by edge
        self.grads: list[Any] = []  # a split node's incoming gradients
        self.inner: list[int] = []  # a split node's edges to nodes that are not leaves
        self.inner_left = 0  # its kernels computing some of those, not back yet
        self.failed = False

    def live(self) -> bool:
        """Whether the GraphTask still wants results (no error, not cancelled)."""
        task = self.kernels.task
        return task.error is None and not task.stopping and not self.failed

    def fail(self, error: BaseException, node: Node | None = None) -> None:
        self.failed = True
        if type(error) is Withdrawn:  # the GraphTask stopped already: nothing to record
            return
        self.kernels.task.fail(error, node or self.node)

    def arrival(self, arrive: Arrive) -> Callable[[Future[Any]], None]:
        """The loop-side handler of one kernel's future (``deliver``)."""

        def on_loop(future: Future[Any]) -> None:
            if future.cancelled():
                self.deliver(arrive, None, Withdrawn())
                return
            error = future.exception()
            self.deliver(arrive, None if error is not None else future.result().pop(), error)

        return on_loop

    def deliver(self, arrive: Arrive, result: Any, error: BaseException | None) -> None:
        """On the loop: ``arrive(result, error)`` in the GraphTask's context, as this
        node's owner (Note [Explicit nesting] in runtime/threads.py); then one part is back."""
        try:
            context = self.kernels.task.context
            ctx = context.copy() if context is not None else contextvars.copy_context()
            ctx.run(_as_owner, arrive, result, error)
        except Exception as e:  # (a post-hook or a routing step raised)
            self.fail(e)
        finally:
            self.part_done()

    def part_arrival(self, group: list[int], early: bool) -> Arrive:
        """The handler of one group of a split node's gradients: routed at once when
        that may go first (Note [Input gradient first]), else kept until the last."""
        task = self.kernels.task
        node = self.node

        def arrive(part: Any, error: BaseException | None) -> None:
            if error is not None:
                self.fail(error)
                return
            outputs = self.outputs
            assert outputs is not None
            for i, g in zip(group, part):
                outputs[i] = g
            if not early or not self.live():
                return
            routed = group
            if any(i in self.inner for i in group):
                self.inner_left -= 1
                if self.inner_left:  # the other nodes' gradients too first: they become
                    return  # ready together and start in priority order
                routed = self.inner
            route_edges(task, node, routed, [outputs[i] for i in routed], self.grads)
            for i in routed:
                outputs[i] = None  # (routed: held by its next node only)
            if self.parts > 1:  # (the last part's end queues them anyway)
                node_done(task)

        return arrive

    def part_done(self) -> None:
        self.parts -= 1
        if self.parts > 0:
            return
        kernels = self.kernels
        task = kernels.task
        try:
            if self.outputs is not None and self.live():  # a split node's last part
                task.nodes_offloaded += 1
                if routes_early(task, self.node):
                    if not task.keep_graph:
                        task.executed.append(self.node)
                else:
                    finish(task, self.node, self.grads, self.outputs)
        except Exception as e:
            self.fail(e)
        finally:
            self.outputs = None
            task.in_flight -= 1
            node_done(task)


def _as_owner(arrive: Arrive, result: Any, error: BaseException | None) -> None:
    _context.node_owner.set(current_owner())  # hooks run here belong to this node
    arrive(result, error)


async def run_async_node(task: GraphTask, tg: anyio.abc.TaskGroup, node: Node, inputs: ReadyInputs) -> None:
    """The task that runs a node with an ``async def`` backward on the loop, then
    finishes it."""
    try:
        _context.node_owner.set(current_owner())  # this task runs the node (explicit nesting)
        outputs = await async_kernel_for(task)(node, inputs_of(inputs), task.math)
        task.nodes_offloaded += 1
        if task.error is None:
            finish(task, node, inputs, outputs)
    except Exception as e:
        task.fail(e, node)
        tg.cancel_scope.cancel()
    except BaseException:  # cancelled: this node's gradients are dropped, so the
        task.stopping = True  # GraphTask can no longer complete
        raise
    finally:
        task.in_flight -= 1
        node_done(task)


def _run_chain(task: GraphTask, plan: ChainPlan, inputs: ReadyInputs
               ) -> tuple[list[list[Any]], list[tuple[int, ...]], BaseException | None]:
    """On a worker thread: run a chain of nodes (Note [Worker chains] in sched/placement.py), each
    fed what its buffer held plus the gradients earlier nodes of the chain computed for
    it, added in the order the loop would add them (``plan.feeds``). Returns the outputs
    of the nodes that ran, for each the edges to leaves whose gradient is a fresh array
    (Note [Owned gradients] in task/step.py, judged here against the node's own inputs),
    and the exception of the one that raised, if any (that one is
    ``plan.nodes[len(outputs)]``); stops early once the GraphTask stops."""
    math = task.math
    results: list[list[Any]] = []
    fresh: list[tuple[int, ...]] = []
    for k, node in enumerate(plan.nodes):
        if k and task.stopping:
            break
        try:
            if k:
                held = plan.buffered[k - 1]
                grads = [None] * node.num_outputs if held is None else list(held)
                for slot, j, i in plan.feeds[k - 1]:
                    out = results[j]
                    grads[slot] = combine(grads[slot], out[i])
                    # dropped from the results (route skips that edge), so a long chain
                    # holds only the gradients still on their way
                    out[i] = None
                args = [value(g) for g in grads]
            else:
                args = inputs_of(inputs)
            outputs = run_kernel(node, args, math)
            fresh.append(fresh_leaf_edges(node, args, outputs))
            results.append(outputs)
        except Exception as e:
            return results, fresh, e
    return results, fresh, None
