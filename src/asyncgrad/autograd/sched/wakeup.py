"""One driver's wait for the loop's runner: a one-shot wake-up.

Note [Per-driver wake-ups]: each waiting driver has its own ``Wakeup``, woken by name
(no broadcast), built on the back end's cheapest primitive: a bare future on asyncio,
``wait_task_rescheduled`` on trio. Both let the runner see *synchronously* whether the
waiting caller was cancelled (asyncio cancels the future the task waits on; trio calls
the abort function at once), which is what allows the runner to commit a backward for
its caller only while that caller has not been cancelled (Note [The runner completes
small backward calls] in sched/loop.py).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


class Wakeup:
    """A driver's one wait (what the runner did for it meanwhile is on its GraphTask:
    ``GraphTask.request``)."""

    __slots__ = ("_future", "_trio_task", "_woken", "_aborted")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._future: asyncio.Future[None] | None = None if loop is None else loop.create_future()
        self._trio_task: Any = None
        self._woken = False
        self._aborted = False

    @property
    def cancelled(self) -> bool:
        """Whether the waiting task was cancelled (it will raise, not resume normally)."""
        return self._future.cancelled() if self._future is not None else self._aborted

    @property
    def waiting(self) -> bool:
        """Not yet woken nor cancelled: the driver will run only when woken."""
        return not self._woken and not self.cancelled

    def set(self) -> None:
        """Wake the driver (at most once; nothing when it was cancelled)."""
        if self._woken:
            return
        self._woken = True
        if self._future is not None:
            if not self._future.done():
                self._future.set_result(None)
        elif self._trio_task is not None and not self._aborted:
            sys.modules["trio"].lowlevel.reschedule(self._trio_task)

    async def wait(self) -> None:
        """Until ``set`` (a checkpoint: a cancellation ends it)."""
        if self._future is not None:
            await self._future
            return
        trio = sys.modules["trio"]
        if self._woken:  # (set before the wait began: still a checkpoint)
            await trio.lowlevel.checkpoint()
            return
        self._trio_task = trio.lowlevel.current_task()

        def abort(_: Any) -> Any:
            self._aborted = True
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
