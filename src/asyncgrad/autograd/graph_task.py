"""One backward call: its dependencies, input buffers, ready queue and staged gradients.

Note [GraphTask bookkeeping lives on one thread]: every field is read and written by
the thread that drives the GraphTask: the event loop's thread (the GraphTask's driver
task, or the loop's runner running its nodes, scheduler.py), or the caller's thread for
a synchronous drain. Kernels on worker threads get their inputs and return outputs;
they never touch these fields (a worker chain only reads ``stopping``). That is what
lets the per-node path run without locks. The comment on each field says who writes it.

Note [Ready-queue order]: ready nodes run in order of ``sequence_nr``, highest first (the
node created last in forward), as in PyTorch. AccumulateGrad nodes are kept in their own
FIFO and always run before any other ready node, which is what PyTorch's
``sequence_nr == UINT64_MAX`` achieves. Reentrant depth is handled one level up: a
GraphTask starts no new node while one of its nested (reentrant) GraphTasks is running,
so the deeper task's work always goes first (PyTorch's depth-then-sequence order).
"""

from __future__ import annotations

import contextvars
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from .. import _context
from .._tensor_math import TENSOR_MATH
from ..ops._array_math import ARRAY_MATH
from .exec_info import ExecMap, plan_targets
from .graph import ACCUMULATE_GRAD_SEQUENCE_NR, Edge, GraphRoot, Node
from .input_buffer import add_to_buffer
from .lifecycle import START_HOOKS
from .statistics import GraphTaskStatistics, graph_task_statistics
from .validation import validate_outputs  # noqa: F401  (anomaly_mode imports it from here)

if TYPE_CHECKING:
    from ..tensor import Tensor
    from .engine import Engine

_graph_task_ids = itertools.count(1)
SETUP_STEP = 1024  # nodes walked between two chances to yield


class GraphTask:
    """The state of one ``backward``/``grad`` call (see the notes above).

    Unless a field says otherwise it is written only by the thread driving the task
    (Note [GraphTask bookkeeping lives on one thread]) and needs no lock."""

    def __init__(self, engine: Engine, *, keep_graph: bool, create_graph: bool,
                 accumulate: bool) -> None:
        # -- set at creation, read-only afterwards (any thread may read) ---------------
        self.id = next(_graph_task_ids)
        self.engine = engine
        self.keep_graph = keep_graph  # retain_graph: keep saved tensors
        self.create_graph = create_graph  # record the backward (math on Tensors)
        self.accumulate = accumulate  # backward() writes .grad; grad() only captures
        self.math: Any = TENSOR_MATH if create_graph else ARRAY_MATH
        self.profiler: Any = _context.profiler.get()  # read once: kernels wrapped iff set
        # -- set by the driver when it starts (engine.Engine._begin) ------------------
        self.depth = 0  # reentrant depth: parent's + 1
        self.parent: GraphTask | None = None  # the backward this one is nested in
        self.context: contextvars.Context | None = None  # the driver's context, nodes run in it
        # -- the plan: set_roots, then setup_steps ------------------------------------
        self.exec_info: ExecMap | None = None  # None: every reachable node runs (exec_info.py)
        self.captured: list[Any] = []  # grad(): one result per target, filled by prepare
        self._root: tuple[Node, list[Any]] | None = None
        # -- the walk: dependencies, buffers, ready queue (driver / runner) -----------
        self.dependencies: dict[Node, int] = {}  # edges each waiting node has yet to hear from
        # input buffers of nodes still waiting for gradients; a node that becomes ready
        # takes its buffer into its ready-queue entry (make_ready)
        self.buffers: dict[Node, list[Any]] = {}
        self.heap: list[tuple[int, Node, list[Any]]] = []  # ready nodes, by -sequence_nr
        self.ready_leaves: deque[tuple[Node, list[Any]]] = deque()  # ready AccumulateGrads, FIFO
        self.to_start: deque[tuple[Node, list[Any]]] = deque()  # prepared nodes for the driver to offload
        self.active_children = 0  # nested GraphTasks running (they start and end on this thread)
        self.in_flight = 0  # kernels started elsewhere and not yet finished (driver)
        # -- results ------------------------------------------------------------------
        self.staged: dict[Tensor, Any] = {}  # leaf -> gradient for .grad (commit.py)
        self.retained: dict[Tensor, Any] = {}  # retain_grad() non-leaf -> gradient
        self.executed: list[Node] = []  # nodes that ran and whose saved tensors go at commit
        self.callbacks: list[Callable[[], Any]] = []  # queue_callback
        self.pre_commits: list[Callable[[dict[Tensor, Tensor]], Any]] = []  # queue_pre_commit
        self.pre_commit_state: Any = None  # commit.pre_commit_view's (view, original)
        # -- lifecycle (lifecycle.py) ----------------------------------------------------
        self.starting: list[Node] = []  # nodes with start hooks found by setup_steps
        # queue_on_abort functions; None once the commit started or the abort ran
        self.aborts: list[Callable[[BaseException], Any]] | None = []
        # -- errors and stopping -------------------------------------------------------
        self.error: BaseException | None = None  # the first error (fail), re-raised by the driver
        # set on error or cancellation; also read by worker chains (a plain bool: a racy
        # read only makes a chain run one node more)
        self.stopping = False
        self.wakeup: Any = None  # an anyio.Event while the driver waits (scheduler.py)
        # -- counters (statistics) -----------------------------------------------------
        self.nodes_inline = 0
        self.nodes_offloaded = 0
        self.thread_hops = 0

    # ------------------------------------------------------------------------------------
    # Setup: roots, pruning, dependencies. Iterative walks only (no recursion anywhere).
    # ------------------------------------------------------------------------------------
    def set_roots(self, roots: list[Edge], grads: list[Any], targets: list[Edge] | None = None,
                  *, plan: ExecMap | None = None) -> None:
        """The root edges and their gradients; ``targets`` prune the graph to them (see
        exec_info.py), or ``plan`` gives the ExecInfo map directly (the capture seam:
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
        """Count dependencies and queue the root. A generator that yields every
        ``SETUP_STEP`` nodes, so the async driver can let the loop run during the walk
        of a huge graph (the sync driver just exhausts it)."""
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
        while stack:
            node = stack.pop()
            walked += 1
            if not walked % SETUP_STEP:
                yield
            if info is not None and node is not root:
                entry = info.get(node)
                if entry is None or not entry.needed:
                    continue  # a target reached only to capture its gradient
            for child, _ in node.next_edges:
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
    def make_ready(self, node: Node, buf: list[Any]) -> None:
        """Queue a node whose every incoming gradient has arrived, with its buffer."""
        if node.sequence_nr == ACCUMULATE_GRAD_SEQUENCE_NR:
            self.ready_leaves.append((node, buf))
        else:
            heappush(self.heap, (-node.sequence_nr, node, buf))

    def add_gradient(self, child: Node, nr: int, g: Any, d: int) -> None:
        """Route ``g`` (or None) to input ``nr`` of ``child``, which had ``d`` edges
        left to hear from: sum it into the child's buffer (input_buffer.py), and queue
        the child when this was its last one."""
        buffers = self.buffers
        if d == 1:
            del self.dependencies[child]
            buf = buffers.pop(child, None)
            if buf is None:
                buf = [None] * child.num_outputs
                buf[nr] = g
            elif g is not None:
                buf = add_to_buffer(buf, nr, g)
            self.make_ready(child, buf)
            return
        self.dependencies[child] = d - 1
        if g is not None:
            buf = buffers.get(child)
            if buf is None:
                buf = buffers[child] = [None] * child.num_outputs
                buf[nr] = g
            else:
                buffers[child] = add_to_buffer(buf, nr, g)

    def route(self, node: Node, outputs: list[Any], skip: int = -1) -> None:
        """Send each of ``node``'s gradients along its edge. The gradient of edge ``skip``
        already fed the next node of a worker chain, so that dependency is settled."""
        deps = self.dependencies
        if not self.keep_graph:
            self.executed.append(node)
        add = self.add_gradient
        for i, ((child, nr), g) in enumerate(zip(node.next_edges, outputs)):
            if child is None:
                continue
            if i == skip:
                del deps[child]
                self.buffers.pop(child, None)
                continue
            d = deps.get(child)
            if d is not None:  # (None: pruned, nothing needed lies behind this edge)
                add(child, nr, g, d)

    def has_ready(self) -> bool:
        return bool(self.ready_leaves or self.heap)

    def pop_ready(self) -> tuple[Node, list[Any]]:
        """The next ready node and its buffer (Note [Ready-queue order]); execute.run_inline
        does the same in its locals."""
        if self.ready_leaves:
            return self.ready_leaves.popleft()
        _, node, buf = heappop(self.heap)
        return node, buf

    def nodes_left(self) -> bool:
        """Whether some node has yet to run: ready, waiting, to start or in flight."""
        return bool(self.ready_leaves or self.heap or self.to_start or self.in_flight or self.dependencies)

    def plain_kernels(self) -> bool:
        """Whether kernels run unwrapped (no profiler, no anomaly mode)."""
        return self.profiler is None and _context.anomaly_mode.get() is None

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
