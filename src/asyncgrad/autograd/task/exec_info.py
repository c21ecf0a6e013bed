"""What a pruned backward runs and captures: one map, as PyTorch's ``exec_info_``.

``backward()`` without ``inputs=`` has no map (``None``): every reachable node runs.
``grad()`` and ``backward(inputs=)`` have one entry per node that runs (``needed``) or
whose input is captured. A capture ``(input_nr, result index)`` records the node's
summed input after tensor pre-hooks and retain_grad (PyTorch 2.7), or, for a ``raw``
capture (the checkpoint seam below), as it arrives, before any hook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..graph import Edge, Node


@dataclass(slots=True)
class ExecInfo:
    """How a pruned backward treats one node."""

    needed: bool = False  # the node runs (it leads to a target, or is one under backward(inputs=))
    captures: list[tuple[int, int]] = field(default_factory=list)  # (input_nr, result index)
    raw: bool = False  # captures are taken before hooks, and the node never runs


ExecMap = dict[Node, ExecInfo]


def _edges(node: Node) -> tuple[Edge, ...]:
    """``node.next_edges`` for a walk that reads only each edge's node: an OpNode's one
    child as the edge of input 0, its other inputs' empty edges left out (Note [An
    OpNode's one edge in its slot] in graph/op_node.py)."""
    edges = node._edges
    return edges if type(edges) is tuple else ((edges, 0),)


def _post_order(root: Node) -> list[Node]:
    """Nodes reachable from ``root``, children before parents (an explicit stack)."""
    out: list[Node] = []
    visited: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.append(node)
            continue
        if node in visited:
            continue
        visited.add(node)
        stack.append((node, True))
        for child, _ in _edges(node):
            if child is not None and child not in visited:
                stack.append((child, False))
    return out


def plan_targets(root: Node, targets: list[Edge], *, run_targets: bool) -> ExecMap:
    """``grad()`` (``run_targets=False``: targets are captured, and run only when they
    lead to another target) and ``backward(inputs=)`` (``run_targets=True``: the target
    nodes themselves run, AccumulateGrad or a non-leaf input's grad_fn)."""
    info: ExecMap = {}
    for i, (node, nr) in enumerate(targets):
        if node is not None:
            entry = info.setdefault(node, ExecInfo())
            if run_targets:
                entry.needed = True
            else:
                entry.captures.append((nr, i))
    for node in _post_order(root):  # children come before their parents
        if node in info and (run_targets or info[node].needed):
            continue
        for child, _ in _edges(node):
            if child is not None and child in info:
                info.setdefault(node, ExecInfo()).needed = True
                break
    return info


def plan_capture(root: Node, targets: list[Edge], expand: Callable[[Node], None]) -> ExecMap:
    """The public seam for a backward that only collects gradients (reentrant
    checkpointing): every node reached from ``root`` before a target runs, and each
    target edge's gradient is captured raw, without hooks, in the first slot naming it.
    ``expand(node)`` is called for each node about to be added and may raise."""
    info: ExecMap = {}
    for i, (node, nr) in enumerate(targets):
        if node is None:
            continue
        entry = info.setdefault(node, ExecInfo(raw=True))
        if all(n != nr for n, _ in entry.captures):  # a repeated edge: first slot only
            entry.captures.append((nr, i))
    info[root] = ExecInfo(needed=True)
    stack = [root]
    while stack:
        for child, _ in _edges(stack.pop()):
            if child is None or child in info:
                continue
            expand(child)
            info[child] = ExecInfo(needed=True)
            stack.append(child)
    return info

