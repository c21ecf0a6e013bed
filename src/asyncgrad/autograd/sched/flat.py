"""The core loop of a flat schedule (Note [The flat schedule] in task/schedule.py): a plain
backward's nodes in order, each gradient added into its consumer's slot."""

from __future__ import annotations

import time
from typing import Any

from ...backend import xp
from ..errors import EngineInternalError
from ..graph import ACCUMULATE_GRAD_SEQUENCE_NR, GraphRoot, Node
from ..graph.op_node import OpNode
from ..graph.saved import SavedTensor
from ..graph.validate import fix_gradient
from ..task.graph_task import GraphTask
from ..task.input_buffer import PendingSum, combine
from ..task.schedule import CLOCK_AFTER_WORK
from ..task.step import doubled, own_fresh_outputs, own_if_fresh, run_kernel, stage_plain
from ...ops.factor_runs import error_modes
from .runs import find_run, run_gradient


def run_flat(task: GraphTask, deadline: float) -> bool:
    """The core loop for a flat schedule (sched/inline.py's ``run_inline``): run its
    nodes in order until none is left (False), or ``perf_counter()`` passed ``deadline``
    with nodes left (True). Errors are recorded with ``task.fail`` and raised."""
    schedule = task.schedule
    assert schedule is not None
    order, index, slots, pending = schedule.order, schedule.index, schedule.slots, schedule.pending
    pos = schedule.pos
    end = len(order)
    clock = time.perf_counter
    math = task.math
    keep = task.keep_graph
    executed = task.executed
    array = xp.array_type  # (read once: Note [One array backend] in backend.py)
    acc_nr = ACCUMULATE_GRAD_SEQUENCE_NR
    heavy = schedule.heavy  # (else no node needs the clock after it)
    node: Node | None = None
    start = pos
    one_by_one = 0  # (no run starts before this position: Note [Fused runs])
    modes: dict[str, Any] | None = None  # (the runs' numpy error modes, read at the first)
    try:
        while pos < end:
            node = order[pos]
            pos += 1
            k = index[node]
            if pending[k]:
                raise EngineInternalError(f"{node.name()} (sequence_nr={node.sequence_nr}) came up in the flat "
                                          f"schedule with {pending[k]} gradients still to come")
            g = slots[k]
            slots[k] = None
            if type(g) is PendingSum:
                g = g.total()
            if type(node) is OpNode and g is not None:
                spec = node.spec
                saved = node.saved
                checks = node._checks  # (one bare: Note [Shared one-entry checks] in graph/saved.py)
                t = type(checks)
                fused = saved is not None and spec.fusable \
                    and (t is SavedTensor or not checks or t is tuple and type(checks[0]) is SavedTensor)
            else:
                fused = False
            run = None
            if fused and node.factor is not None and pos >= one_by_one:  # type: ignore[attr-defined]
                run = find_run(node, g, order, pos, index, slots, pending)
                if run is not None:
                    if modes is None:
                        modes = error_modes()
                    gi = run_gradient(math, g, run, modes)
                    if gi is None:  # numpy reported something: the run's nodes one by one
                        one_by_one = pos + len(run.nodes) - 1
                        run = None
            if not fused:
                # ``run_kernel`` and ``finish`` (step.py), no hooks, no create_graph
                buf = [] if type(node) is GraphRoot else [g]
                outputs = run_kernel(node, buf, math)
                own_fresh_outputs(task, node, buf, outputs)
                if not keep:
                    executed.append(node)
                edges = node._edges
                if type(edges) is not tuple:  # (Note [An OpNode's one edge in its slot] in graph/op_node.py)
                    edges = node.next_edges
                for (child, _), gi in zip(edges, outputs):
                    if child is not None:
                        kc = index[child]
                        old = slots[kc]
                        slots[kc] = gi if old is None else combine(old, gi)
                        pending[kc] -= 1
                        if child.sequence_nr == acc_nr and not pending[kc]:
                            _stage(task, child, slots, kc)
            elif run is not None:
                # a run of nodes as one step (Note [Fused runs] in sched/runs.py)
                # (its inner nodes' counts stay at 1, never read again: the loop goes past
                # them, and a run only starts at a later node)
                nodes = run.nodes
                child = run.child
                if not keep:
                    executed += nodes
                pos += len(nodes) - 1
                node = nodes[-1]
                leaf = child.sequence_nr == acc_nr
                if leaf and gi is not g:
                    own_if_fresh(task, child, gi, (g,), None, ())
                kc = index[child]
                old = slots[kc]
                slots[kc] = gi if old is None else combine(old, gi)
                pending[kc] -= 1
                if leaf and not pending[kc]:
                    _stage(task, child, slots, kc)
                if clock() >= deadline:
                    break
                continue
            else:  # the fused step (step.plain_step's, over slots)
                if t is SavedTensor:
                    if checks.version.value != checks.saved_version:
                        checks.unpack_array(node)  # raises PyTorch's in-place modification error
                else:
                    for e in checks:
                        if e.version.value != e.saved_version:
                            e.unpack_array(node)
                args = saved or spec.no_args
                params = node.params  # type: ignore[attr-defined]
                vjps: tuple[Any, ...] = spec.vjps
                view = spec.view_vjp
                edges = node._edges
                if type(edges) is not tuple:
                    # one edge, input 0's (Note [An OpNode's one edge in its slot] in
                    # graph/op_node.py)
                    edges = ((edges, 0),)
                    twice = False
                else:
                    twice = spec.symmetric and edges[0] == edges[1] and args[1] is args[2]
                i = -1
                for child, _ in edges:
                    i += 1
                    if child is None or (twice and i):
                        continue  # (twice: edge 0 carried both gradients for the slot)
                    rule = vjps[i]
                    if view is not None and not i and type(child) is OpNode and child._hooks is None \
                            and child.spec.takes_views:  # type: ignore[attr-defined]
                        rule = view  # (Note [Mean's gradient as a view] in step.py)
                    gi = rule(math, g, *args, **params) if params else rule(math, g, *args)
                    leaf = child.sequence_nr == acc_nr
                    if gi is not None:
                        if type(gi) is not array or gi.shape != node.input_shapes[i] \
                                or gi.dtype != node.input_dtypes[i]:
                            gi = fix_gradient(node, i, gi)
                        if twice:
                            gi = doubled(task, child, gi, (g,), args)
                        if leaf and type(gi) is array and child.variable._grad is None:  # type: ignore[attr-defined]
                            own_if_fresh(task, child, gi, (g,), None, args)  # (its first test: spares the call)
                    kc = index[child]
                    old = slots[kc]
                    slots[kc] = gi if old is None else combine(old, gi)
                    pending[kc] -= 2 if twice else 1
                    if leaf and not pending[kc]:  # (``_stage``, inlined: once per leaf)
                        gl = slots[kc]
                        slots[kc] = None
                        stage_plain(task, child.variable, gl,  # type: ignore[attr-defined]
                                    task.fresh.pop(child, None) is gl or type(gl) is PendingSum)
                if (saved or spec.saves_params) and not keep:
                    executed.append(node)
            # the clock every 8 nodes, or after a node heavy enough to make it cheap
            if heavy:
                if (not pos & 7 or node.work >= CLOCK_AFTER_WORK) and clock() >= deadline:
                    break
            elif not pos & 7 and clock() >= deadline:
                break
        return pos < end
    except Exception as e:
        if node is not None:
            task.fail(e, node)
        raise
    finally:
        schedule.pos = pos
        task.nodes_inline += pos - start


def _stage(task: GraphTask, leaf: Node, slots: list[Any], k: int) -> None:
    """A quiet leaf's last gradient arrived: stage it (``step.plain_step``'s)."""
    g = slots[k]
    slots[k] = None
    stage_plain(task, leaf.variable, g,  # type: ignore[attr-defined]
                task.fresh.pop(leaf, None) is g or type(g) is PendingSum)
