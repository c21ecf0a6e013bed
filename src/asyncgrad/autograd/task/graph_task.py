"""One backward call: its dependencies, input buffers, ready queue and staged gradients.

Note [GraphTask bookkeeping lives on one thread]: every field is read and written by
the thread that drives the GraphTask: the event loop's thread (the GraphTask's driver
task, or the loop's runner running its nodes, sched/loop.py), or the caller's thread for
a synchronous drain. Kernels on worker threads get their inputs and return outputs;
they never touch these fields (a worker chain only reads ``stopping``). That is what
lets the per-node path run without locks. The comment on each field says who writes it.

Note [Ready-queue order]: ready nodes run in order of ``sequence_nr``, highest first (the
node created last in forward), as in PyTorch. AccumulateGrad nodes always run before any
other ready node, in the order they became ready, as PyTorch's ``sequence_nr ==
UINT64_MAX`` achieves: one heap of ``(key, turn, node, inputs)``, the key ``-sequence_nr``
(a leaf's is the smallest, ``LEAF_KEY``) and the turn a counter among leaves (0 for other
nodes, whose keys are unique). Reentrant depth is handled one level up: a
GraphTask starts no new node while one of its nested (reentrant) GraphTasks is running,
so the deeper task's work always goes first (PyTorch's depth-then-sequence order).

Note [One router]: a node's gradients reach the nodes they feed through one function,
``GraphTask.add_gradient``: the dependency count, the input buffer, the ready queue.
The inline steps (task/step.py), a worker's arrival, a split node's parts and a worker
chain's results all call it, one edge at a time (``route`` loops over a node's edges).
The fused inline step computes each edge's gradient just before routing it, so no
gradient is computed for an edge that leads nowhere needed.

Note [Plain backwards and quiet nodes]: the fast paths apply where nothing could observe
the difference, and what "nothing" means is declared here, once. A *plain backward*
(``GraphTask.is_plain``) runs every reachable node, records nothing and has no tool
wrapping kernels. A *plain node* (``is_plain_node``) is a built-in node without hooks;
a *quiet leaf* (``is_quiet_leaf``) is a leaf's AccumulateGrad that no hook watches, on
the node or on its tensor.
"""

from __future__ import annotations

import contextvars
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from heapq import heappop, heappush
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ... import _context
from ..._tensor_math import TENSOR_MATH
from ...backend import xp
from .exec_info import ExecMap, plan_targets
from ..graph import ACCUMULATE_GRAD_SEQUENCE_NR, AccumulateGrad, Edge, GraphRoot, Node
from ..graph.record import OpNode
from .input_buffer import InputBuffer, ReadyInputs
from .lifecycle import START_HOOKS
from .schedule import FlatSchedule, walk_flat
from .statistics import GraphTaskStatistics, graph_task_statistics

if TYPE_CHECKING:
    from ...tensor import Tensor

_graph_task_ids = itertools.count(1)
LEAF_KEY = -ACCUMULATE_GRAD_SEQUENCE_NR  # a ready leaf's key: before every other node


@dataclass(frozen=True, slots=True)
class TaskPolicy:
    """The settings one backward call runs by, taken from its engine when the call's
    GraphTask is created (Note [Each call runs by its engine's policy] in
    sched/placement.py): whoever runs its nodes (its own driver, or the loop's runner,
    the driver of a call on another engine) decides by these."""

    inline_threshold: int  # nodes whose work is below it run inline (Note [Inline or offload])
    yield_interval: float  # the longest its nodes keep the loop from a turn (sched/loop.py)
    flat_schedule: bool = True  # a plain backward may run flat (Note [The flat schedule] in task/schedule.py)
    # mid-size nodes of at least this much work hop beside another ready or in flight (Note
    # [Mid-size nodes hop beside another] in sched/placement.py); infinite: never
    mid_work: float = float("inf")


class Driver(Protocol):
    """What a GraphTask knows of the engine that drives it (engine.py's ``Engine``)."""

    task_policy: TaskPolicy

    async def execute(self, task: GraphTask) -> None: ...

    def execute_sync(self, task: GraphTask) -> None: ...


def is_plain_node(node: Node) -> bool:
    """A built-in node without hooks (Note [Plain backwards and quiet nodes])."""
    return type(node) is OpNode and node._hooks is None


def is_quiet_leaf(node: Node) -> bool:
    """A leaf's AccumulateGrad no hook watches (Note [Plain backwards and quiet nodes])."""
    return type(node) is AccumulateGrad and node._hooks is None and not node.variable._hooks

SETUP_STEP = 1024  # nodes walked between two chances to yield


class GraphTask:
    """The state of one ``backward``/``grad`` call (see the notes above).

    Each field's comment says who writes it and on which thread. "The task's thread" is
    the event loop's thread for an async backward (its driver, the loop's runner, the
    tasks of sched/offload.py) or the caller's thread for a synchronous one. No field is
    guarded by a lock (Note [GraphTask bookkeeping lives on one thread]); the few that
    other threads touch say why that is safe."""

    def __init__(self, engine: Driver, *, keep_graph: bool, create_graph: bool,
                 accumulate: bool, priority: int = 0) -> None:
        # -- written here by the creating thread, read-only afterwards (any thread reads)
        self.id = next(_graph_task_ids)
        self.engine = engine
        self.policy = engine.task_policy  # its engine's settings now (Note [Each call runs by its engine's policy])
        # nodes whose work is below it run inline (placement.decide); the blocking driver
        # sets it to infinity: every node inline on the caller's thread
        self.inline_threshold: float = self.policy.inline_threshold
        self.mid_work: float = self.policy.mid_work  # (the blocking driver's is infinite too)
        self.keep_graph = keep_graph  # retain_graph: keep saved tensors
        self.create_graph = create_graph  # record the backward (math on Tensors)
        self.accumulate = accumulate  # backward() writes .grad; grad() only captures
        self.math: Any = TENSOR_MATH if create_graph else xp.math  # the rules' ``m``
        self.profiler: Any = _context.profiler.get()  # read once: kernels wrapped iff set
        # a tool wraps every kernel (the profiler, anomaly mode): read once, here
        self.tools = self.profiler is not None or _context.anomaly_mode.get() is not None
        # -- written by the driver as it starts (Engine._begin, engine._enter), on the
        # task's thread, before any node runs; read-only afterwards
        # the order of its turns (Note [Task order] in runtime/task_order.py): the caller's, a
        # nested backward's parent's (Engine._begin)
        self.priority = priority
        self.depth = 0  # reentrant depth: parent's + 1
        self.parent: GraphTask | None = None  # the backward this one is nested in
        # the driver's context, nodes run in it; None again once the backward ended (Note
        # [A finished GraphTask is freed at once] in sched/blocking.py)
        self.context: contextvars.Context | None = None
        # -- the plan: written by set_roots (creating thread, before execute), read-only
        # once the driver starts
        self.exec_info: ExecMap | None = None  # None: every reachable node runs (task/exec_info.py)
        # grad(): one result per target; its slots are written by step.prepare /
        # stage_leaf on the task's thread
        self.captured: list[Any] = []
        self._root: tuple[Node, list[Any]] | None = None  # read once by setup_steps
        # -- the walk: written on the task's thread only (setup_steps, inline.run_inline,
        # route/add_gradient, sched/offload.py's tasks); worker threads never see these
        # a plain backward run flat (Note [The flat schedule] in task/schedule.py): then the
        # four fields below stay empty
        self.schedule: FlatSchedule | None = None
        self.dependencies: dict[Node, int] = {}  # edges each waiting node has yet to hear from
        # InputBuffers of nodes still waiting for gradients; a node that becomes ready
        # takes its inputs into its ready-queue entry (make_ready; Note [Input buffers])
        self.buffers: dict[Node, InputBuffer] = {}
        # the ready queue, a heap of (key, turn, node, inputs) (Note [Ready-queue order])
        self.ready: list[tuple[int, int, Node, ReadyInputs]] = []
        self.leaf_turns = itertools.count()  # the order ready leaves arrived in
        # prepared nodes the core loop hands to the driver to run elsewhere, with where
        # (sched/placement.py's decide)
        self.to_start: deque[tuple[Node, ReadyInputs, Any]] = deque()
        # nested GraphTasks running: written by their Engine._begin/_end, which run on
        # this task's thread (a nested backward is started by one of its nodes)
        self.active_children = 0
        self.in_flight = 0  # nodes started elsewhere, not yet finished (offload.WorkerKernels, run_async_node)
        # -- results: written on the task's thread (step.stage_leaf, graph/hooks.py's
        # retain_grad, route); task/commit.py reads them on that thread, or commit.sum_fresh
        # on one worker thread while the driver awaits it (nobody writes meanwhile)
        self.staged: dict[Tensor, Any] = {}  # leaf -> gradient for .grad (task/commit.py)
        # leaves whose staged array the engine owns, and each leaf's last fresh kernel
        # output (Note [Owned gradients] in task/step.py)
        self.owned: set[Tensor] = set()
        self.fresh: dict[Node, Any] = {}
        self.retained: dict[Tensor, Any] = {}  # retain_grad() non-leaf -> gradient
        self.executed: list[Node] = []  # nodes that ran and whose saved tensors go at commit
        # queue_callback / queue_pre_commit: appended by code a node runs (a hook, a
        # Function's backward, possibly on a worker thread: list.append is atomic);
        # the driver reads them only once every node has finished
        self.callbacks: list[Callable[[], Any]] = []
        self.pre_commits: list[Callable[[dict[Tensor, Tensor]], Any]] = []
        self.pre_commit_state: Any = None  # commit.pre_commit_view's (view, original); driver
        # how the commit adds up: on the loop or on a worker (commit.commit_on_loop,
        # decided once, right before the commit, by the driver or the runner); None: not yet
        self.commit_on_loop: bool | None = None
        # -- lifecycle (task/lifecycle.py): written on the task's thread (setup_steps,
        # queue_on_abort from a node's code, the driver)
        self.starting: list[Node] = []  # nodes with start hooks found by setup_steps
        # queue_on_abort functions; None once the commit started or the abort ran
        self.aborts: list[Callable[[BaseException], Any]] | None = []
        # -- errors and stopping: written on the task's thread (fail, the driver) -------
        self.error: BaseException | None = None  # the first error (fail), re-raised by the driver
        # set on error or cancellation; also read, without a lock, by worker chains (a
        # plain bool: a stale read only makes a chain run one node more)
        self.stopping = False
        self.wakeup: Any = None  # an anyio.Event while the driver waits; set by sched/loop.py
        # -- the call's sequence (Note [One driver skeleton] in task/call.py): written by
        # the async driver; ``request`` by the loop's runner when it took the sequence on
        # from DRAIN (its next request, DONE, or Raised), read and cleared by the driver
        self.steps: Any = None
        self.request: Any = None
        # -- counters for statistics: written on the task's thread; a snapshot taken
        # from another thread may be one node behind
        self.nodes_inline = 0
        self.nodes_offloaded = 0
        self.thread_hops = 0

    # ------------------------------------------------------------------------------------
    # Setup: roots, pruning, dependencies. Iterative walks only (no recursion anywhere).
    # ------------------------------------------------------------------------------------
    def set_roots(self, roots: list[Edge], grads: list[Any], targets: list[Edge] | None = None,
                  *, plan: ExecMap | None = None) -> None:
        """The root edges and their gradients; ``targets`` prune the graph to them (see
        task/exec_info.py), or ``plan`` gives the ExecInfo map directly (the capture seam:
        ``exec_info.plan_capture``)."""
        buf: list[Any] = []
        if len(roots) == 1:
            root, nr = roots[0]
            if root is None:
                raise ValueError("a root edge must lead to a node")
            buf = [None] * max(root.num_outputs, nr + 1)
            buf[nr] = grads[0]
        else:
            root = GraphRoot(tuple(roots), grads)
        if plan is not None:
            self.exec_info = plan
            self.captured = [None] * (len(targets) if targets is not None else 0)
        elif targets is not None:
            self.exec_info = plan_targets(root, targets, run_targets=self.accumulate)
            self.captured = [None] * len(targets)
        self._root = (root, buf)

    def setup_steps(self) -> Iterator[None]:
        """Count dependencies and queue the root, or make a plain backward's flat
        schedule (Note [The flat schedule] in task/schedule.py). A generator that yields
        every ``SETUP_STEP`` nodes, so the async driver can let the loop run during the
        walk of a huge graph (the sync driver just exhausts it)."""
        if self._root is None:
            raise ValueError("set_roots() first")
        root, buf = self._root
        deps = self.dependencies
        info = self.exec_info
        stack = [root]
        walked = 0
        starts = START_HOOKS  # Note [Backward start hooks]: usually empty
        if starts and id(root) in starts:
            self.starting.append(root)
        if self.policy.flat_schedule and self.is_plain():
            self.schedule = yield from walk_flat(self, root, buf, stack, SETUP_STEP)
            if self.schedule is not None:
                return
            # (else it stopped at a node only the dynamic engine runs: go on from there)
        while stack:
            node = stack.pop()
            walked += 1
            if not walked % SETUP_STEP:
                yield
            if info is not None and node is not root:
                entry = info.get(node)
                if entry is None or not entry.needed:
                    continue  # a target reached only to capture its gradient
            edges = node._edges
            if type(edges) is not tuple:  # (Note [An OpNode's one edge in its slot] in graph/op_node.py)
                edges = ((edges, 0),)
            for child, _ in edges:
                if child is None or (info is not None and child not in info):
                    continue
                if child in deps:
                    deps[child] += 1
                else:
                    deps[child] = 1
                    stack.append(child)
                    if starts and id(child) in starts:
                        self.starting.append(child)
        self.make_ready(root, buf)

    # ------------------------------------------------------------------------------------
    # Routing gradients and the ready queue
    # ------------------------------------------------------------------------------------
    def make_ready(self, node: Node, buf: ReadyInputs) -> None:
        """Queue a node whose every incoming gradient has arrived, with its inputs."""
        seq = node.sequence_nr
        if seq == ACCUMULATE_GRAD_SEQUENCE_NR:
            heappush(self.ready, (LEAF_KEY, next(self.leaf_turns), node, buf))
        else:
            heappush(self.ready, (-seq, 0, node, buf))

    def add_gradient(self, child: Node, nr: int, g: Any, d: int) -> None:
        """THE router (Note [One router]): send ``g`` (or None) to input ``nr`` of
        ``child``, which had ``d`` edges left to hear from: add it into the child's
        InputBuffer (Note [Input buffers]), and queue the child when this was its last
        one. Every path routes through here: the core loop's steps, a worker's arrival,
        a split node's parts, a worker chain's results."""
        if d == 1:
            del self.dependencies[child]
            buf = self.buffers.pop(child, None)
            if buf is None:  # its one gradient: passed through, no buffer
                if child.num_outputs == 1:
                    inputs: list[Any] = [g]
                else:
                    inputs = [None] * child.num_outputs
                    inputs[nr] = g
                ready: ReadyInputs = inputs
            else:
                if g is not None:
                    buf.add(nr, g)
                ready = buf.ready()
            seq = child.sequence_nr  # (make_ready, inlined: this is the hot path)
            if seq == ACCUMULATE_GRAD_SEQUENCE_NR:
                heappush(self.ready, (LEAF_KEY, next(self.leaf_turns), child, ready))
            else:
                heappush(self.ready, (-seq, 0, child, ready))
            return
        self.dependencies[child] = d - 1
        if g is not None:
            buf = self.buffers.get(child)
            if buf is None:
                self.buffers[child] = InputBuffer(child.num_outputs, nr, g)
            else:
                buf.add(nr, g)

    def route(self, node: Node, outputs: list[Any], internal: tuple[int, ...] = (),
              edges: list[int] | None = None) -> None:
        """Send each of ``node``'s gradients along its edge (``add_gradient``), or only
        those of ``edges`` (a split node's part; ``outputs`` then holds theirs, in that
        order, and the node is not done yet). The gradients of the edges ``internal``
        stayed in a worker chain (Note [Worker chains] in sched/placement.py): the node
        they feed ran in it, so its dependencies are settled."""
        deps = self.dependencies
        next_edges = node._edges
        if type(next_edges) is not tuple:
            # an OpNode's one edge, input 0's (Note [An OpNode's one edge in its slot] in
            # graph/op_node.py); the others lead nowhere
            if edges is None and outputs:
                if not self.keep_graph:
                    self.executed.append(node)
                if 0 in internal:
                    if deps.pop(next_edges, None) is not None:
                        self.buffers.pop(next_edges, None)
                    return
                d = deps.get(next_edges)
                if d is not None:
                    self.add_gradient(next_edges, 0, outputs[0], d)
                return
            next_edges = node.next_edges
        if edges is None:
            edges = range(len(outputs))  # type: ignore[assignment]
            if not self.keep_graph:
                self.executed.append(node)
        add = self.add_gradient
        for i, g in zip(edges, outputs):  # type: ignore[arg-type]
            child, nr = next_edges[i]
            if child is None:
                continue
            if i in internal:
                if deps.pop(child, None) is not None:
                    self.buffers.pop(child, None)
                continue
            d = deps.get(child)
            if d is not None:  # (None: pruned, nothing needed lies behind this edge)
                add(child, nr, g, d)

    def nest_in(self, parent: GraphTask) -> None:
        """Note [Reentrant backwards] in engine.py: this backward runs for a node of
        ``parent``: one level deeper, at the parent's priority (Note [Task order] in
        runtime/task_order.py); the parent starts no new node until it ends."""
        self.parent = parent
        self.depth = parent.depth + 1
        self.priority = parent.priority
        parent.active_children += 1

    def leave_parent(self) -> bool:
        """Undo ``nest_in`` as this backward ends; True when the parent has no nested
        backward left and ready nodes to go on with."""
        parent = self.parent
        assert parent is not None and parent.active_children > 0
        parent.active_children -= 1
        return not parent.active_children and parent.context is not None and parent.has_ready()

    def has_ready(self) -> bool:
        return bool(self.ready) or (self.schedule is not None and self.schedule.left() > 0)

    def leaf_waits(self) -> bool:
        """Whether a ready leaf waits in the queue (it runs before any other node)."""
        ready = self.ready
        return bool(ready) and ready[0][0] == LEAF_KEY

    def pop_ready(self) -> tuple[int, int, Node, ReadyInputs] | None:
        """The next ready node's entry ``(key, turn, node, inputs)`` (Note [Ready-queue
        order]), or None when nothing is ready (the core loop pops the heap itself: one
        C call per node)."""
        return heappop(self.ready) if self.ready else None

    def nodes_left(self) -> bool:
        """Whether some node has yet to run: ready, waiting, to start or in flight."""
        return bool(self.ready or self.to_start or self.in_flight or self.dependencies) \
            or (self.schedule is not None and self.schedule.left() > 0)

    def is_plain(self) -> bool:
        """A *plain backward* (Note [Plain backwards and quiet nodes]): every reachable
        node runs (no ``inputs=``/``grad()`` pruning), nothing is recorded
        (no ``create_graph``), and no tool wraps the kernels."""
        return self.exec_info is None and not self.create_graph and not self.tools

    def fail(self, error: BaseException, node: Node | None) -> None:
        """Record the first error (first error wins) with a note naming the node."""
        if node is not None and hasattr(error, "add_note"):
            error.add_note(f"asyncgrad: raised while running {node.name()} "
                           f"(sequence_nr={node.sequence_nr}) in graph task {self.id}")
            anomaly = _context.anomaly_mode.get()
            if anomaly is not None:
                anomaly.annotate_error(error, node)
        if self.error is None:
            self.error = error
        self.stopping = True

    def queue_callback(self, fn: Callable[[], Any]) -> None:
        self.callbacks.append(fn)

    def statistics(self) -> GraphTaskStatistics:
        """A frozen snapshot of this backward's progress."""
        return graph_task_statistics(self)
