"""Admission: when a new top-level backward call may start on a busy loop.

Note [Admission]: a burst of new backward calls (a gather of 256 tasks, a wave of
requests) would run all their first steps (argument checks, set-up) in one turn of the
loop, unbounded by any slice. So a top-level ``backward``/``grad`` starts at once only
while the loop has time left in the current slice or no runner is active; otherwise the
caller waits in line (``admission``, a ``TaskOrder``: by priority, first come first
served within one, Note [Task order] in runtime/task_order.py) and the runner admits callers at the start
of its slices, each counted like a wake-up: one per slice, more while half of the slice
is left. A caller whose previous backward the runner just completed has a pass (its
wake-up was counted). When the runner role ends with nothing queued, the first caller
in line is admitted and becomes the runner.
"""

from __future__ import annotations

import contextvars
import time


from ..runtime.threads import running_graph_task
from .loop import LoopScheduler, loop_scheduler

# Set when the runner completed the caller's backward: its next backward needs no
# admission (the wake-up that returned it was counted already; Note [Admission]).
_admission_pass: contextvars.ContextVar[bool] = contextvars.ContextVar("asyncgrad_admission_pass", default=False)


class _Unheld:
    """The admission of a caller that starts at once: nothing to do on either side."""

    __slots__ = ()

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


UNHELD = _Unheld()


class Admission:
    """A caller's place in the line of a busy loop (Note [Admission]): waits on entry
    (counted as a backward call in flight for BLAS while it waits, Note [BLAS threads]
    in sched/placement.py; once admitted, the engine counts it); on exit admits the next caller
    if the runner role is free."""

    __slots__ = ("_scheduler", "_priority")

    def __init__(self, scheduler: LoopScheduler, priority: int) -> None:
        self._scheduler = scheduler
        self._priority = priority

    async def __aenter__(self) -> None:
        await self._scheduler.wait_in_line(self._priority)

    async def __aexit__(self, *exc: object) -> None:
        self._scheduler.hand_on()  # (Note [Handing on]: however this caller leaves)


def admission(priority: int = 0) -> Admission | _Unheld:
    """``async with admission(priority):`` around a top-level backward call: a place in
    line (by ``priority``, Note [Task order]) when the loop is busy, else nothing (Note
    [Admission]). A nested backward (started by a node of a running one) is never held
    back."""
    scheduler = loop_scheduler()
    if scheduler.runner is None or (not scheduler.admission and time.perf_counter() < scheduler.slice_end):
        return UNHELD
    if _admission_pass.get():  # the runner just completed this caller's backward
        _admission_pass.set(False)
        return UNHELD
    if running_graph_task() is not None:
        return UNHELD
    return Admission(scheduler, priority)


def grant_admission_pass() -> None:
    """The runner completed this caller's backward: its next one starts at once."""
    _admission_pass.set(True)
