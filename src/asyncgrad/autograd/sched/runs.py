"""Runs of elementwise nodes in a flat schedule, computed with a few calls (their
arithmetic: ops/factor_runs.py).

Note [Fused runs]: a chain of tiny elementwise ops (``sin``, ``* c``, ``tanh``, ``+ d``,
... on a few floats: scalar-heavy models, small batches, a deep recurrence unrolled)
costs the flat schedule's loop (sched/flat.py) a Python step per node, several times the
arithmetic. Where each of those rules is a product (Note [Gradient factors] in
ops/_spec.py: ``g_out = g * factor``, the factor read from what the node saved), a run
of them multiplies one gradient by one factor after another:

    g_k = (...((g_0 * d_1) * d_2) ...) * d_k

The factors do not depend on the gradient, so the run computes each op type's factors
for all its nodes at once, on their saved values stacked (one ``cos`` for every ``sin``
node), into the rows of one buffer headed by ``g_0``, and ``np.multiply.accumulate``
takes the products row after row: each row is the previous one times a factor, the
same multiplication the rules do one by one, in the same order, so every gradient is
the one the one-by-one step computes, bit for bit. Nodes whose rule passes ``g`` on as
it is (``add``) have no row. Only the run's last gradient is kept: inside a run nothing
can see a gradient (the flat schedule runs no hooks), and each node's only consumer is
the next.

A run is nodes that follow each other in the schedule's order, each with one edge that
needs a gradient, leading to the next (which hears from nobody else), of one shape and
dtype, every value its factor reads an array of that dtype and shape, or 0-d (so no
rule casts, or broadcasts but a number), saved values unmodified (a node whose version
check fails ends the run before it, and raises in its own step as it would have), at
most ``FACTOR_MAX_ELEMENTS`` elements. It is at least ``RUN_MIN_NODES`` long (shorter, the
stacking costs more than it saves) and at most ``RUN_MAX_NODES`` (the buffers stay
small and the core loop reads the clock between runs). The stacked arithmetic ignores
the floating-point events the caller's ``np.errstate`` ignores (an underflow, by
default) and raises on the others; one raised makes the run fall back to its nodes one
by one, which report it as the caller asked, from the node that met it.
"""

from __future__ import annotations

from typing import Any

from ...ops.factor_runs import Groups, run_product
from ..graph.op_node import OpNode
from ..graph.saved import SavedTensor

RUN_MIN_NODES = 8
RUN_MAX_NODES = 256


class Run:
    """A run's nodes in order, the child its last node sends the gradient to, and its
    rows (one per node whose rule multiplies, numbered from 1 in node order), by
    factor: the rows each factor fills and the values it reads for them."""

    __slots__ = ("nodes", "child", "rows", "groups")

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.child: Any = None
        self.rows = 0
        self.groups: Groups = {}


def find_run(node: Any, g: Any, order: list[Any], pos: int, index: dict[Any, int], slots: list[Any],
             pending: list[int]) -> Run | None:
    """The run that starts at ``node`` (its gradient ``g``; the schedule's next nodes
    from ``order[pos]``), or None if none of ``RUN_MIN_NODES`` starts here."""
    # a run is consecutive nodes of the order, each with a factor: the next node and the
    # one that would make it RUN_MIN_NODES long first (most nodes start no run)
    last = pos + RUN_MIN_NODES - 2
    if last >= len(order):
        return None
    for k in (pos, last):
        member = order[k]
        if type(member) is not OpNode or member.factor is None:
            return None
    run = Run()
    groups = run.groups
    rows = 0
    first = pos - 1  # (``node``'s place in the order: the run is ``order[first:stop]``)
    end = min(len(order), pos + RUN_MAX_NODES - 1)
    while True:
        # can ``node`` be in the run? (its factor: the conditions of Note [Fused runs]
        # that hold from its recording on; here, the rest). It is an OpNode: the first
        # is the caller's, each next one is in the order after the root (Note [The flat
        # schedule] in task/schedule.py: nothing else is)
        factor = node.factor
        saved = node.saved
        if factor is None or saved is None:
            stop = pos - 1
            break  # (released: its step raises)
        checks = node._checks  # (hooked: its step unpacks; modified: its step raises)
        if type(checks) is SavedTensor:  # (one, bare: Note [Shared one-entry checks] in graph/saved.py)
            if checks.version.value != checks.saved_version:
                stop = pos - 1
                break
        elif type(checks) is not tuple or checks and (
                type(checks[0]) is not SavedTensor or checks[0].version.value != checks[0].saved_version
                or len(checks) > 1):
            stop = pos - 1
            break
        child = node._edges
        if type(child) is tuple:  # (else the one child: Note [An OpNode's one edge in its slot])
            child = child[0][0]
            if child is None:
                child = node._edges[1][0]
        # it is: its row
        read = factor.read
        if read is not None:
            rows += 1
            group = groups.get(factor)
            if group is None:
                groups[factor] = group = ([], [])
            group[0].append(rows)
            group[1].append(saved[read])
        # and the next node, if the run can go on to it
        stop = pos
        if pos >= end or order[pos] is not child:
            break
        k = index[child]
        if pending[k] != 1 or slots[k] is not None:
            break
        node = child
        pos += 1
    if stop - first < RUN_MIN_NODES:
        return None
    run.nodes = order[first:stop]
    run.child = child
    run.rows = rows
    return run


def run_gradient(math: Any, g: Any, run: Run, modes: dict[str, Any]) -> Any:
    """The gradient the run's last node sends on, from ``g`` (``g`` itself when every
    rule passes it on); None if the run must fall back to its nodes one by one
    (``factor_runs.run_product``)."""
    return run_product(math, g, run.rows, run.groups, modes)
