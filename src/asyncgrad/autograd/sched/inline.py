"""The core loop: the only place nodes run inline, on the calling thread (the loop's
runner, sched/loop.py, or a blocking driver, sched/blocking.py).

Each ready node, in ready-queue order (Note [Ready-queue order] in task/graph_task.py),
goes where ``placement.decide`` says: inline, through the step ``step.step_for`` picked
for its backward (prepare, kernel, finish; or the fused step), or to the driver, which
starts it elsewhere. The loop stops when nothing is ready, when the slice is over, or
when a node must go elsewhere. A plain backward of small nodes runs its flat schedule's
loop instead (sched/flat.py, Note [The flat schedule] in task/schedule.py): the same
steps over slots, in the order this loop would take.
"""

from __future__ import annotations

import time
from heapq import heappop

from ..task.graph_task import GraphTask
from ..task.step import prepare_elsewhere, step_for
from ..task.schedule import CLOCK_AFTER_WORK
from .flat import run_flat
from .placement import INLINE, decide


def run_inline(task: GraphTask, deadline: float) -> bool:
    """Run ``task``'s ready nodes until nothing is ready (False), or ``perf_counter()``
    passed ``deadline`` with nodes still ready or a node must run elsewhere, queued on
    ``task.to_start`` for the driver (both True). Errors are recorded with
    ``task.fail`` and raised. A flat schedule runs its own loop (Note [The flat schedule]
    in task/schedule.py)."""
    if task.schedule is not None:
        return run_flat(task, deadline)
    queue, step, clock = task.ready, step_for(task), time.perf_counter
    ran = 0
    node = None
    try:
        while queue:
            _, _, node, ready = heappop(queue)  # (Note [Ready-queue order])
            if (where := decide(task, node)) is not INLINE:
                if (inputs := prepare_elsewhere(task, node, ready)) is not None:
                    task.to_start.append((node, inputs, where))
                    return True
            elif step(task, node, ready):
                ran += 1
                # the clock every 8 nodes, or after a node heavy enough to make it cheap
                if (not ran & 7 or node.work >= CLOCK_AFTER_WORK) and clock() >= deadline:
                    return task.has_ready()  # (Note [Plain leaves]: maybe nothing is)
        return False
    except Exception as e:
        task.fail(e, node)
        raise
    finally:
        task.nodes_inline += ran
