"""The inline loop: ready nodes run on the calling thread (the loop's runner, a
blocking driver), in ready-queue order, each through step.py's sequence.

For the hot case (a built-in node without hooks, in a plain backward, with a defined
gradient) ``run_inline`` does ``run_kernel`` and ``finish`` in place: the same steps,
checked against the reference executor in tests.
"""

from __future__ import annotations

import time
from heapq import heappop, heappush
from typing import Any

from ...backend import xp

from ..graph import ACCUMULATE_GRAD_SEQUENCE_NR, AccumulateGrad, Node
from ..graph.record import OpNode
from ..graph.saved import SavedTensor
from ..graph.validate import fix_gradient
from .graph_task import GraphTask
from .input_buffer import InputBuffer, PendingSum, ReadyInputs, slots_of
from .step import finish, is_fresh, kernel_for, own_if_fresh, prepare, run_kernel, stage_plain

CLOCK_AFTER_WORK = 16_384  # elements: a node this large costs far more than reading the clock


def doubled(task: GraphTask, child: Node, gi: Any, inputs: list[Any], saved: Any) -> Any:
    """``gi + gi`` for a symmetric node's two edges to one slot (Note [A tensor times
    itself]): in place when ``gi`` is the kernel's fresh array, and then the engine's
    own for a leaf (Note [Owned gradients])."""
    if type(gi) is xp.array_type and is_fresh(gi, inputs, None, saved):
        xp.add_into(gi, gi)
        if child.sequence_nr == ACCUMULATE_GRAD_SEQUENCE_NR:
            task.fresh[child] = gi
        return gi
    return gi + gi


def must_go_elsewhere(node: Node, threshold: float) -> bool:
    """Whether a prepared node is not run inline: large (Note [Inline or offload] in
    sched/placement.py) or with an ``async def`` backward."""
    return node.work >= threshold or (node.maybe_async and node.is_async())


# --- the inline loop --------------------------------------------------------------------
def run_inline(task: GraphTask, threshold: float, deadline: float) -> bool:
    """Run ready nodes inline, in ready-queue order, until nothing is ready (returns
    False), ``time.perf_counter()`` passed ``deadline``, or a node must run elsewhere:
    that one is prepared and queued on ``task.to_start`` for the driver (both return
    True). Errors are recorded with ``task.fail`` and raised.

    This loop is most of a small backward's cost, so it keeps everything in locals and,
    for the hot case, does ``run_kernel`` then ``finish`` in place, computing no
    gradient for an edge that leads nowhere needed."""
    heap = task.heap
    leaves = task.ready_leaves
    buffers = task.buffers
    deps = task.dependencies
    math = task.math
    tools = not task.plain_kernels()
    fused = not tools and not task.create_graph
    kernel = kernel_for(task, False) if tools else run_kernel
    plain = task.exec_info is None
    keep, executed, fresh, to_start = task.keep_graph, task.executed, task.fresh, task.to_start
    clock, push, acc_nr = time.perf_counter, heappush, ACCUMULATE_GRAD_SEQUENCE_NR
    count = 0
    node: Node | None = None
    try:
        while True:
            if leaves:
                node, buf = leaves.popleft()
            elif heap:
                _, node, buf = heappop(heap)
            else:
                return False
            if not (plain and type(node) is OpNode and node._hooks is None):
                if plain and type(node) is AccumulateGrad and node._hooks is None \
                        and not node.variable._hooks:
                    g = slots_of(buf)[0]
                    stage_plain(task, node.variable, g, fresh.pop(node, None) is g or type(g) is PendingSum)
                    continue
                inputs = prepare(task, node, buf)
                if inputs is None:
                    continue
                if must_go_elsewhere(node, threshold):
                    to_start.append((node, inputs))
                    return True
                finish(task, node, inputs, kernel(node, inputs, math))
            elif node.work >= threshold:
                to_start.append((node, buf))  # (deferred sums are added on the worker)
                return True
            else:
                if isinstance(buf, InputBuffer):
                    buf = buf.resolve()
                g = buf[0]
                saved = node.saved
                checks = node.checks
                if not fused or g is None or saved is None or not node.spec.fusable or (
                        checks and type(checks[0]) is not SavedTensor):
                    finish(task, node, buf, kernel(node, buf, math))
                else:
                    # --- run_kernel and finish, in place -----------------------------
                    args = node.plain_args()
                    params = node.params
                    spec = node.spec
                    vjps: tuple[Any, ...] = spec.vjps  # (a needed edge has a rule)
                    edges = node.next_edges
                    view = spec.view_vjp  # (Note [Mean's gradient as a view])
                    # x * x: one gradient, added to itself (Note [A tensor times itself])
                    twice = spec.symmetric and edges[0] == edges[1] and args[1] is args[2]
                    i = -1
                    for child, nr in edges:
                        i += 1
                        if child is None:
                            continue
                        d = deps.get(child)
                        if d is None:  # pruned: nothing needed lies behind this edge
                            continue
                        if twice:
                            if i:
                                continue  # (edge 0 carried both, and settled both dependencies)
                            # edge 1's None settled here: no InputBuffer for a slot that gets
                            # one gradient (Note [A tensor times itself])
                            d -= 1
                        rule = vjps[i]
                        if view is not None and not i and type(child) is OpNode \
                                and child._hooks is None and child.spec.takes_views:
                            rule = view  # a read-only view, to a child that only reads it
                        gi = rule(math, g, *args, **params) if params else rule(math, g, *args)
                        if gi is not None:
                            if type(gi) is not xp.array_type or gi.shape != node.input_shapes[i] \
                                    or gi.dtype != node.input_dtypes[i]:
                                gi = fix_gradient(node, i, gi)
                            if twice:
                                gi = doubled(task, child, gi, buf, args)
                        if d == 1 and nr == 0 and child.num_outputs == 1:
                            # the child's last gradient: queue it with its buffer
                            del deps[child]
                            waiting = buffers.pop(child, None)
                            if waiting is None:
                                ready: ReadyInputs = [gi]  # (no buffer: Note [Input buffers])
                            else:
                                if gi is not None:
                                    waiting.add(0, gi)
                                ready = waiting.ready()
                            seq = child.sequence_nr
                            if seq == acc_nr:
                                if waiting is None and type(gi) is xp.array_type:
                                    own_if_fresh(task, child, gi, buf, None, args)
                                leaves.append((child, ready))
                            else:
                                push(heap, (-seq, child, ready))
                        else:
                            task.add_gradient(child, nr, gi, d)
                    if (saved or spec.saves_params) and not keep:
                        executed.append(node)
            count += 1
            # the clock every 8 nodes, or after any node heavy enough to make it cheap
            if (not count & 7 or node.work >= CLOCK_AFTER_WORK) and clock() >= deadline:
                return True
    except Exception as e:
        task.fail(e, node)
        raise
    finally:
        task.nodes_inline += count
