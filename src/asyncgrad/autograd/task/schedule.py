"""The flat schedule: a plain backward whose every node runs inline, run as one loop over
its nodes in order, with no ready queue, dependency map or input buffers.

Note [The flat schedule]: the ready queue (Note [Ready-queue order] in graph_task.py)
always runs the ready node with the highest ``sequence_nr``. A node's edges lead to nodes
that existed when it was made (its inputs' ``grad_fn``), and sequence numbers come from
one process-wide counter in creation order (Note [Sequence numbers] in graph/__init__.py),
so every edge leads from a higher number to a lower one, or to a leaf. Then the node with
the highest number not yet run is always ready (every node that feeds it has a higher
number, so it ran), and the queue's order is simply the graph's nodes in descending
``sequence_nr``: one sort per backward, and none when the walk found them in that
order (a chain is). Leaves go first whenever one is ready,
in the order they became ready, which is when their last gradient arrives: they are
staged right then (Note [Plain leaves] in step.py).

So where nothing could observe the difference, the engine runs a backward from that
order: the plain backward (Note [Plain backwards and quiet nodes]) of a graph of plain
built-in nodes small enough to run inline (``placement.decide`` would say INLINE for every
one) and quiet leaves. The walk that finds the graph (``walk_flat``, in place of the
dependency count) gives each node a slot, and each gradient is added into its
consumer's slot as it is routed, by ``input_buffer.combine``, in the order the queue
would have added it. A node's step is the core loop's ``plain_step``, written out over
slots (``run_flat`` in sched/flat.py): the fused step for a node whose op has one,
``run_kernel`` for any other, the same ownership records (Note [Owned gradients] in
step.py), the same released nodes. The results, the staging order and the errors are
the dynamic engine's, bit for bit (tests/test_flat_schedule.py runs both and the
reference executor). A chain of small elementwise nodes whose rules are products runs
as one step there (Note [Fused runs] in sched/runs.py), bit for bit as well. The walk
hands over to the dynamic engine at the first node it cannot run (a hook, a custom
Function, a node to offload or a mid-size one that may hop: Note [Mid-size nodes hop
beside another] in sched/placement.py), with the
dependencies counted so far: no node is walked twice. It finds the nodes with start
hooks as the dynamic walk does. An engine can turn the flat schedule off
(``Engine.flat_schedule``; the reference executor does).

This is the replay of a recorded schedule that compiled autograd and graph-reuse JITs
cache per graph shape, without the cache: the schedule of a graph built by its forward is
known from the graph itself, and sorting it costs less than computing a key to look it
up by.
"""

from __future__ import annotations

from collections.abc import Generator
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..graph import ACCUMULATE_GRAD_SEQUENCE_NR, GraphRoot, Node
from ..graph.op_node import OpNode
from .lifecycle import START_HOOKS

if TYPE_CHECKING:
    from .graph_task import GraphTask

_sequence_nr = attrgetter("sequence_nr")
# elements of work: the core loops read the clock every few nodes, and after a node this
# heavy too (it costs far more than reading the clock)
CLOCK_AFTER_WORK = 16_384


class FlatSchedule:
    """A plain backward's nodes in the order they run, and each node's gradient slot."""

    __slots__ = ("order", "index", "slots", "pending", "pos", "heavy")

    def __init__(self, order: list[Node], index: dict[Node, int], pending: list[int], heavy: bool) -> None:
        self.order = order  # every node but the leaves, highest sequence_nr first
        self.index = index  # node -> its slot
        self.slots: list[Any] = [None] * len(pending)  # each node's gradient so far
        self.pending = pending  # the edges each node has yet to hear from
        self.pos = 0  # the next node of ``order`` to run
        # some node's work is at least CLOCK_AFTER_WORK: the core loop reads the clock
        # after each such node, not only every few nodes
        self.heavy = heavy

    def left(self) -> int:
        """Nodes (not leaves) yet to run."""
        return len(self.order) - self.pos


def fits(node: Node, threshold: float) -> bool:
    """Whether the flat schedule can run ``node``: a plain built-in node that runs
    inline (``placement.decide``), or a quiet leaf (Note [Plain backwards and quiet
    nodes] in graph_task.py; the same tests, written out)."""
    t = type(node)
    if t is OpNode:
        return node._hooks is None and node.work < threshold  # type: ignore[attr-defined]
    return node.sequence_nr == ACCUMULATE_GRAD_SEQUENCE_NR and node._hooks is None \
        and not node.variable._hooks  # type: ignore[attr-defined]


def walk_flat(task: GraphTask, root: Node, buf: list[Any], stack: list[Node],
              step: int) -> Generator[None, None, FlatSchedule | None]:
    """Find ``task``'s graph from ``root`` (whose gradients are ``buf``) on ``stack``
    and return its flat schedule (Note [The flat schedule]), yielding every ``step``
    nodes (``GraphTask.setup_steps``'s). At a node the schedule cannot run it returns None, with that
    node back on ``stack`` and ``task.dependencies`` counted for what it walked, for
    the dynamic walk to go on from."""
    threshold = min(task.inline_threshold, task.mid_work)  # (nodes that always run inline)
    if type(root) is GraphRoot:
        first = None
    elif type(root) is OpNode and len(buf) == 1 and fits(root, threshold):
        first = buf[0]
    else:
        return None
    index: dict[Node, int] = {root: 0}
    pending = [0]
    order: list[Node] = [root]
    acc_nr = ACCUMULATE_GRAD_SEQUENCE_NR
    starts = START_HOOKS  # (Note [Backward start hooks]: looked up as the dynamic walk does)
    # an OpNode without hooks whose work is below ``light`` fits and is not heavy (one
    # test for most nodes); ``heavy``: some node's work is at least CLOCK_AFTER_WORK
    light = min(threshold, CLOCK_AFTER_WORK)
    heavy = False
    # the sequence_nr last added to ``order`` while it is in descending order (a chain is
    # found in the order it runs: no sort), -1 once it is not
    last = root.sequence_nr
    countdown = step
    while stack:
        node = stack.pop()
        while True:  # (on to a node's one child at once: see its edge below)
            countdown -= 1
            if not countdown:
                countdown = step
                yield
            # ``fits``, written out (per node of every small backward; the root fits)
            if type(node) is OpNode:
                if node.work >= light or node._hooks is not None:  # type: ignore[attr-defined]
                    work = node.work  # type: ignore[attr-defined]
                    if node._hooks is not None or work >= threshold:
                        _hand_over(task, node, stack, index, pending)
                        return None
                    if work >= CLOCK_AFTER_WORK:
                        heavy = True
            elif not (node is root or node._hooks is None and node.sequence_nr == acc_nr
                      and not node.variable._hooks):  # type: ignore[attr-defined]
                _hand_over(task, node, stack, index, pending)
                return None
            edges = node._edges
            if type(edges) is not tuple:
                # an OpNode's one edge (Note [An OpNode's one edge in its slot] in
                # graph/op_node.py): its child, walked next, with no turn on the stack
                # (it would be pushed, then popped at once)
                k = index.get(edges)
                if k is not None:
                    pending[k] += 1
                    break
                index[edges] = len(pending)
                pending.append(1)
                if starts and id(edges) in starts:
                    task.starting.append(edges)
                nr = edges.sequence_nr
                if nr != acc_nr:
                    order.append(edges)
                    last = -1 if nr > last else nr  # (-1: out of order, sort)
                elif edges._hooks is None and not edges.variable._hooks:
                    break  # (a quiet leaf: it fits and has no edges, nothing to walk)
                node = edges
                continue
            for child, _ in edges:
                if child is None:
                    continue
                k = index.get(child)
                if k is not None:
                    pending[k] += 1
                    continue
                index[child] = len(pending)
                pending.append(1)
                nr = child.sequence_nr
                if nr != acc_nr:
                    order.append(child)
                    stack.append(child)
                    last = -1 if nr > last else nr
                elif child._hooks is not None or child.variable._hooks:  # type: ignore[attr-defined]
                    stack.append(child)  # (a leaf that does not fit: found as such when popped)
                # (else a quiet leaf, as above)
                if starts and id(child) in starts:
                    task.starting.append(child)
            break
    if last < 0:
        order.sort(key=_sequence_nr, reverse=True)
    schedule = FlatSchedule(order, index, pending, heavy)
    schedule.slots[0] = first
    return schedule


def _hand_over(task: GraphTask, node: Node, stack: list[Node], index: dict[Node, int], pending: list[int]) -> None:
    """``walk_flat`` stops at ``node``, which the flat schedule cannot run: it goes back on
    ``stack``, and the dependencies counted so far to ``task``, for the dynamic walk."""
    stack.append(node)
    deps = task.dependencies
    for n, i in index.items():
        if i:
            deps[n] = pending[i]
