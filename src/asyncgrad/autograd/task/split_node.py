"""A large built-in node's gradients as separate kernels on worker threads, and which
may be routed as soon as each is computed.

Note [Input gradient first]: a large node split into one kernel per gradient
(``Policy.splits``: several needed gradients, no BLAS threads of its own) submits the
gradients for other nodes first (a linear layer's dx before its dW and db) and routes
them as soon as they are computed, not when the whole node is: the next layer's
backward then starts while dW still runs on the other worker. dx is the critical path,
dW fills the gaps (the loop's inline nodes, the hops). PyTorch computes all three in one
``AddmmBackward`` and runs the leaves' AccumulateGrad first; a leaf's tensor hooks would
see the difference, so the order changes only when no such observer exists: no hooks on
the node, none on the leaves it feeds, a plain backward (no ``inputs=``/``grad()``
pruning, no ``create_graph``, no tool wrapping kernels). The gradients for other nodes
are routed together, once all of them are computed, so those nodes become ready at once
and start in priority order, as in PyTorch (API.md §5); only the leaves' staging moves.

While BLAS runs threads of its own (one backward alone) a product already uses every
core, so a layer is not split: dx and dW in one kernel. Running them as two kernels in
turn, dx handed to the loop in between, was slower on the MLP benchmark (the loop's
inline work then competes with the BLAS threads for the cores), and two
single-threaded products side by side finish no sooner than one two-threaded one after
the other.

Note [One kernel for a product's leaves]: a linear layer's bias gradient is a column
sum of the incoming gradient, a few microseconds beside dW's GEMM; a kernel of its own
cost it a hop (a submit, a wake-up, the route back on the loop), 16 of the GPT-small
step's 67 hops with BLAS at one thread. So a product's leaf gradients (dW and db) are one
kernel, after its input gradient's. Leaves alone (a product of two leaves, a first layer)
still get a kernel each: they may be two large products.

Note [The loop takes a small split's first part]: a split node whose halves are each
below ``inline_threshold`` (``Policy.first_part_here``), with nothing else ready or in
flight in its GraphTask, computes its first group (the input gradient, else the first
leaf's) on the loop, after handing the others to workers. With both parts on workers
the second part waits for a second thread to wake on the core the loop still holds,
while the loop's warm core sits idle; with the first part on the loop the two kernels
run side by side on both cores after one hop, and the loop is blocked no longer than
by a node below the threshold (docs/benchmarks.md, "Figures behind the Notes"). Its
gradients are routed as the part ends,
as a worker's would be (``part_arrival``); no BLAS slot is taken, as for an inline
product. Not while other nodes are ready or in flight: their arrivals and starts would
wait behind the loop's part.
"""

from __future__ import annotations

from typing import Any

from .step import own_if_fresh
from ..graph import ACCUMULATE_GRAD_SEQUENCE_NR, Node
from .graph_task import GraphTask, is_quiet_leaf
from .input_buffer import ReadyInputs, inputs_of
from ..graph.record import OpNode


def split_groups(node: Node, splits: bool, needed: frozenset[int] | None = None) -> list[list[int]] | None:
    """The edges of a split node, grouped into its kernels, the input gradients (edges
    to nodes that are not leaves) first (Note [Input gradient first]); None: one
    kernel. ``splits``: placement's decision (Policy.splits), one kernel per gradient (a product's
    leaves together: Note [One kernel for a product's leaves]). ``needed``: in a pruned
    backward, the edges whose gradients it takes (``step.needed_edges``), the others not computed."""
    if type(node) is not OpNode or node.spec.variadic:
        return None
    inner: list[int] = []
    leaves: list[int] = []
    for i, (child, _) in enumerate(node.next_edges):
        if child is not None and (needed is None or i in needed):
            (leaves if child.sequence_nr == ACCUMULATE_GRAD_SEQUENCE_NR else inner).append(i)
    if not splits or len(inner) + len(leaves) < 2:
        return None
    if node.spec.blas and inner and len(leaves) > 1:
        # a layer's leaves (its dW and db) in one kernel after its input gradient's
        # (Note [One kernel for a product's leaves])
        return [[i] for i in inner] + [leaves]
    return [[i] for i in inner + leaves]


def is_leaf_edge(node: Node, i: int) -> bool:
    """Whether edge ``i`` of ``node`` leads to a leaf's AccumulateGrad."""
    child = node.next_edges[i][0]
    return child is not None and child.sequence_nr == ACCUMULATE_GRAD_SEQUENCE_NR


def routes_early(task: GraphTask, node: Node) -> bool:
    """Whether a split node's gradients may be routed as each kernel ends (Note [Input
    gradient first]): a plain backward, the node without hooks and each leaf it feeds
    quiet (Note [Plain backwards and quiet nodes] in task/graph_task.py)."""
    if not task.is_plain() or node._hooks is not None:
        return False
    return all(child is None or not is_leaf_edge(node, i) or is_quiet_leaf(child)
               for i, (child, _) in enumerate(node.next_edges))


def route_edges(task: GraphTask, node: Node, group: list[int], part: list[Any], grads: list[Any]) -> None:
    """Route the gradients of edges ``group`` of ``node`` (the rest follow later),
    recording which of those for leaves the engine owns first (Note [Owned gradients]
    in task/step.py)."""
    saved = getattr(node, "saved", None)
    for i, g in zip(group, part):
        if g is not None and is_leaf_edge(node, i):
            own_if_fresh(task, node.next_edges[i][0], g, grads, None, saved)  # type: ignore[arg-type]
    task.route(node, part, edges=group)


def unpack(node: OpNode, inputs: ReadyInputs, math: Any) -> tuple[list[Any], tuple[Any, Any]]:
    """On a worker: a split node's incoming gradients (deferred sums added) and its
    rules' arguments (unpack hooks may be slow)."""
    return inputs_of(inputs), node.rule_args(math)


def apply_edges(node: OpNode, group: list[int], grads: list[Any], math: Any,
                 unpacked: tuple[Any, Any]) -> list[Any]:
    """On a worker: the gradients of edges ``group`` of a split node."""
    return [node.apply_edge(i, grads, math, unpacked) for i in group]

