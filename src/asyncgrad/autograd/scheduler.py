"""One fair scheduler per event loop, shared by every GraphTask on it.

Note [One runner per loop]: all backward calls on a loop share one queue of GraphTasks
with nodes ready to run inline, and one *runner* drains it: whichever driver finds no
runner takes the role (the others wait on their own event). The runner runs the queued
GraphTasks' nodes in turn until the current slice of the loop's time ends
(``yield_interval`` after the loop's last turn), then lets the loop run once, and goes
on. So the loop gets a turn at least every
``yield_interval`` whatever the number of backward calls in flight, and a waiting
GraphTask costs the loop nothing (PyTorch likewise shares one ready queue per device
among all GraphTasks). A GraphTask whose time slice ran out goes to the back of the
queue. The runner runs another GraphTask's nodes in that GraphTask's own context, marked
as their owner (Note [Explicit nesting] in threads.py). When its own GraphTask needs its
driver (nothing left to run inline, a node to start elsewhere, an error) the runner
hands the role to the next queued GraphTask's driver.

Everything here runs on the loop's thread: no locks.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque

import anyio
import anyio.lowlevel

from .. import _context
from .execute import run_inline
from .graph_task import GraphTask

_scheduler: anyio.lowlevel.RunVar[LoopScheduler] = anyio.lowlevel.RunVar("asyncgrad_loop_scheduler")
_last = threading.local()  # (loop, its scheduler): a thread runs one loop at a time


def _running_loop() -> object:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        trio = sys.modules.get("trio")
        if trio is None:
            raise
        return trio.lowlevel.current_trio_token()


def loop_scheduler() -> LoopScheduler:
    """The scheduler of the running event loop (created on first use; kept in a RunVar
    so it lives as long as the loop, and cached per thread for the per-call lookup)."""
    loop = _running_loop()
    last = getattr(_last, "pair", None)
    if last is not None and last[0] is loop:
        cached: LoopScheduler = last[1]
        return cached
    try:
        scheduler = _scheduler.get()
    except LookupError:
        scheduler = LoopScheduler()
        _scheduler.set(scheduler)
    _last.pair = (loop, scheduler)
    return scheduler


def wake(task: GraphTask) -> None:
    """Wake ``task``'s driver if it waits (it re-checks its state before waiting)."""
    if task.wakeup is not None:
        task.wakeup.set()


def _run_as(owner: object, task: GraphTask, threshold: float, deadline: float) -> bool:
    _context.node_owner.set(owner)
    return run_inline(task, threshold, deadline)


class LoopScheduler:
    """The queue of GraphTasks with inline work, and who runs it (see the note)."""

    def __init__(self) -> None:
        self.queue: deque[GraphTask] = deque()
        self.queued: set[GraphTask] = set()
        self.runner: GraphTask | None = None  # the GraphTask whose driver runs the queue
        self.slice_end = 0.0  # perf_counter() when the current slice of the loop's time ends

    def add(self, task: GraphTask) -> None:
        """Queue ``task`` (it has ready nodes); without a runner, wake its driver."""
        if task not in self.queued:
            self.queued.add(task)
            self.queue.append(task)
        if self.runner is None:
            wake(task)

    def discard(self, task: GraphTask) -> None:
        if task in self.queued:
            self.queued.discard(task)
            self.queue.remove(task)

    def _drop(self, task: GraphTask) -> None:
        self.queue.popleft()
        self.queued.discard(task)
        if task is not self.runner:
            wake(task)

    async def run(self, me: GraphTask, threshold: float, interval: float) -> None:
        """Be the runner until ``me`` needs its driver; then hand over.

        The slice is the loop's, not the runner's: ``slice_end`` carries over from one
        runner (and one backward call) to the next, and is renewed only after the loop
        had a turn. So a task awaiting many small backward calls in a row, each done
        within a slice, still lets the loop run every ``interval``."""
        self.runner = me
        owner = _context.node_owner.get()  # this driver's task (engine._enter set it)
        clock = time.perf_counter
        try:
            while True:
                if clock() >= self.slice_end:
                    await anyio.lowlevel.checkpoint()  # the loop's turn, then a new slice
                    self.slice_end = clock() + interval
                self._run_slice(owner, threshold, self.slice_end)
                if me not in self.queued or me.to_start or me.error is not None or not self.queue:
                    return
        finally:
            self.runner = None
            if self.queue:
                wake(self.queue[0])

    def _run_slice(self, owner: object, threshold: float, deadline: float) -> None:
        queue = self.queue
        while queue:
            task = queue[0]
            if task.stopping or task.active_children or task.context is None:
                self._drop(task)  # its driver handles it (a nested task wakes it at its end)
                continue
            try:
                more = task.context.run(_run_as, owner, task, threshold, deadline)
            except Exception:  # recorded on the task by run_inline; its driver raises it
                self._drop(task)
                continue
            if task.to_start and task is not self.runner:
                wake(task)
            if not more:
                self._drop(task)
            elif time.perf_counter() >= deadline:
                queue.rotate(-1)  # its slice ran out: to the back
                return
            elif task.to_start and task is self.runner:
                return
