"""Waking an event loop on time for its next timer after a worker's result woke it
between two (Note [A woken loop's next timer]). Knows no graph; sched/offload.py and
runtime/threads.py call ``after_wake`` on the loop as a worker's result arrives.

Note [A woken loop's next timer]: asyncio's loop sleeps in its selector until its next
timer, and on Linux that is ``epoll_wait``, whose timeout CPython rounds *up* to whole
milliseconds. A loop left alone sleeps from one timer to the next, a whole number of
milliseconds for a periodic timer, and wakes on time. A worker's result wakes it in
between, at a random moment: the loop runs the arrival, then sleeps again until the
timer with a timeout of a fraction of a millisecond, rounded up to one, and the timer
fires that fraction late, up to a millisecond (bench/workloads/loop_lag.py, its "idle
loop, woken" row: a loop woken from another thread a hundred times a second has a p99
lag of about one millisecond with no work at all). The engine's arrivals are such
wake-ups, one or two per hop. So after the loop ran an arrival, ``after_wake`` finds
its earliest timer due later (within ``HORIZON``) and sets a timer file descriptor of
the kernel's (``timerfd``, nanosecond deadlines on the loop's own clock, CLOCK_MONOTONIC)
to that moment; the descriptor is one the loop watches, so its ``epoll_wait`` returns
then, whatever its rounding, with no other thread involved (a waker thread would have
to get a core and the GIL first, and on a loaded machine came later than the rounded
wake). One descriptor per loop, re-armed by each arrival; when the loop woke by itself
meanwhile the descriptor fires once more, harmlessly, and its reader only empties it.
It is not something else that wants the loop (runtime/loop_idle.py skips it), and it
is closed when the loop is collected. Linux, asyncio's own selector loops only (their
timer heap is read as loop_idle.py reads it); elsewhere, trio included (whose run loop
sleeps with sub-millisecond timeouts of its own), nothing changes.
"""

from __future__ import annotations

import ctypes
import heapq
import math
import os
import sys
import weakref
from typing import Any

HORIZON = 0.05  # seconds: a timer due later than this is left to the loop's own wait

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # (the process's own symbols: libc's; no library search)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
_fds: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # loop -> its timerfd (-1: none)


def own_fds(loop: Any) -> tuple[int, ...]:
    """The descriptors this module has ``loop`` watch (runtime/loop_idle.py skips them)."""
    fd = _fds.get(loop, -1)
    return (fd,) if fd >= 0 else ()


def after_wake(loop: Any) -> None:
    """On ``loop``'s thread, as it runs a worker's result: have it woken when its
    earliest timer due later falls due, if that is within ``HORIZON`` (asyncio's own
    selector loops on Linux; None, trio, other loops: nothing)."""
    if loop is None or _LIBC is None:
        return
    scheduled = getattr(loop, "_scheduled", None)
    if not scheduled:
        return
    now = loop.time()
    timer = _next_timer(scheduled, now)
    if timer is None or timer._when - now > HORIZON:
        return
    fd = _fds.get(loop)
    if fd is None:
        fd = _fds[loop] = _open(loop)
    if fd < 0:
        return
    frac, whole = math.modf(timer._when)
    spec = _Itimerspec(_Timespec(0, 0), _Timespec(int(whole), max(1, int(frac * 1e9))))
    _LIBC.timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None)


def _open(loop: Any) -> int:
    """A timerfd that ``loop`` watches, closed with the loop (-1 when it cannot be had:
    not asyncio's own selector loop, or the call failed)."""
    if type(loop).__module__.split(".")[0] != "asyncio" or not hasattr(loop, "_selector") \
            or not hasattr(loop, "add_reader"):
        return -1
    fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
    if fd < 0:
        return -1
    try:
        loop.add_reader(fd, _drain, fd)
    except (NotImplementedError, RuntimeError, ValueError, OSError):
        os.close(fd)
        return -1
    weakref.finalize(loop, os.close, fd)
    return int(fd)


def _drain(fd: int) -> None:
    """The descriptor's reader: empty it (its expiry count); the wake-up was the point."""
    try:
        os.read(fd, 8)
    except OSError:  # (BlockingIOError: re-armed for later before the loop read it)
        pass


def _next_timer(scheduled: list[Any], now: float, steps: int = 8) -> Any:
    """The earliest live timer of asyncio's heap ``scheduled`` due after ``now`` (the
    loop runs those due already without sleeping), looking at most ``steps`` entries
    in heap order; None if there is none or it lies deeper."""
    frontier = [(scheduled[0]._when, 0)]
    n = len(scheduled)
    for _ in range(steps):
        if not frontier:
            return None
        when, i = heapq.heappop(frontier)
        timer = scheduled[i]
        if when > now and not timer._cancelled:
            return timer
        for j in (2 * i + 1, 2 * i + 2):
            if j < n:
                heapq.heappush(frontier, (scheduled[j]._when, j))
    return None
