"""Whether anything but the running code wants the event loop: a ready callback or task,
a timer, a watched file descriptor, a callback queued from another thread. Knows no
graph; sched/placement.py asks it (Note [A lone kernel on an idle loop] there).

Answered from the loop's own bookkeeping: on asyncio's own loops (the selector loop and
the proactor's base) from their ready queue, timer heap and selector map, the loop's
self-pipe apart; on trio from ``trio.lowlevel.current_statistics()``. Any other loop
(uvloop, a loop this module does not know) is never idle: the answer must err towards
"someone may want the loop", since an idle answer lets a kernel hold it. (trio's
statistics do not show the tasks of the batch it is running that have not run yet: such
a task waits for an inline kernel, as it would behind any inline node.)
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Any

from .timer_wake import own_fds


def loop_is_idle() -> bool:
    """Whether the running event loop has nothing else to run now and nothing scheduled
    (no ready callback or task, no live timer, no watched file descriptor but its own
    wake-up pipe and the engine's timer descriptor, nothing queued from another
    thread). False off a loop, or on a loop whose state cannot be read."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return _asyncio_idle(loop)
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        stats = trio.lowlevel.current_statistics()
    except RuntimeError:  # (not inside trio.run)
        return False
    if stats.tasks_runnable or stats.run_sync_soon_queue_size or stats.seconds_to_next_deadline != math.inf:
        return False
    io = stats.io_statistics
    readers = getattr(io, "tasks_waiting_read", None)
    writers: Any = getattr(io, "tasks_waiting_write", None)
    if readers is None or writers is None or writers:
        return False
    return readers <= _trio_own_readers(trio)


def _trio_own_readers(trio: Any) -> int:
    """1 while trio's own task that runs ``run_sync_soon`` callbacks waits on the run's
    wake-up socket (as asyncio's loop watches its self-pipe), else 0; -1 (never idle)
    when trio's state cannot be read (its private layout moved)."""
    try:
        runner = trio._core._run.GLOBAL_RUN_CONTEXT.runner
        fd = runner.entry_queue.wakeup.wakeup_sock.fileno()
        waiters = runner.io_manager._registered.get(fd)
        return int(waiters is not None and waiters.read_task is not None)
    except AttributeError:
        return -1


def _asyncio_idle(loop: Any) -> bool:
    if type(loop).__module__.split(".")[0] != "asyncio":  # (uvloop and others: unknown)
        return False
    ready = getattr(loop, "_ready", None)
    scheduled = getattr(loop, "_scheduled", None)
    selector = getattr(loop, "_selector", None)
    if ready is None or scheduled is None or selector is None:
        return False
    if ready:
        return False
    for timer in scheduled:  # (cancelled timers stay in the heap until asyncio drops them)
        if not timer._cancelled:
            return False
    try:
        watched = selector.get_map()
    except (AttributeError, RuntimeError):
        return False
    own = getattr(loop, "_ssock", None)  # the self-pipe that call_soon_threadsafe writes to
    own_fd = own.fileno() if own is not None else -1
    engine_fds = own_fds(loop)  # (the engine's timer descriptor: Note [A woken loop's next timer])
    return all(key.fd == own_fd or key.fd in engine_fds for key in watched.values())
