"""Note [A woken loop's next timer] (asyncgrad/autograd/runtime/timer_wake.py): after a
worker's result woke the loop, a timer descriptor the loop watches is set to the loop's
next timer, so the loop wakes then whatever its selector's rounding. Observed through
the descriptor and what the loop watches, never by timing."""

from __future__ import annotations

import asyncio
import gc
import heapq
import os
import time

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, get_engine, set_engine
from asyncgrad.autograd.runtime import loop_idle, timer_wake

linux_only = pytest.mark.skipif(timer_wake._LIBC is None, reason="timerfd: Linux")


class _Timer:
    def __init__(self, when: float) -> None:
        self._when = when
        self._cancelled = False

    def __lt__(self, other: _Timer) -> bool:
        return self._when < other._when


def _heap(now: float, *delays: float) -> list[_Timer]:
    heap: list[_Timer] = []
    for d in delays:
        heapq.heappush(heap, _Timer(now + d))
    return heap


def test_the_next_timer_is_the_earliest_live_one_due_later():
    now = time.monotonic()
    heap = _heap(now, -0.001, 0.0, 0.004, 0.002, 0.003)
    assert timer_wake._next_timer(heap, now)._when == now + 0.002
    for t in heap:
        if t._when == now + 0.002:
            t._cancelled = True
    assert timer_wake._next_timer(heap, now)._when == now + 0.003
    assert timer_wake._next_timer(_heap(now, -0.002, -0.001), now) is None


def test_nothing_off_asyncio_or_without_timers():
    timer_wake.after_wake(None)  # trio: nothing to read

    async def main() -> tuple[int, ...]:
        loop = asyncio.get_running_loop()
        timer_wake.after_wake(loop)  # no timer: nothing armed, no descriptor
        far = loop.call_later(timer_wake.HORIZON * 20, lambda: None)
        timer_wake.after_wake(loop)  # one too far away: the same
        far.cancel()
        return timer_wake.own_fds(loop)

    assert asyncio.run(main()) == ()


def _timer_fd_of(loop: asyncio.AbstractEventLoop) -> int:
    fds = timer_wake.own_fds(loop)
    assert len(fds) == 1
    return fds[0]


@linux_only
def test_the_loop_watches_one_descriptor_that_fires_for_its_next_timer():
    async def main() -> tuple[int, bool, bool]:
        loop = asyncio.get_running_loop()
        fired = asyncio.Event()
        loop.call_later(0.005, fired.set)
        for _ in range(3):  # (several arrivals re-arm the one descriptor)
            timer_wake.after_wake(loop)
        fd = _timer_fd_of(loop)
        watched = fd in {key.fd for key in loop._selector.get_map().values()}
        idle_before = loop_idle.loop_is_idle()  # (a timer is pending: not idle)
        await fired.wait()
        await asyncio.sleep(0.01)  # the descriptor's reader emptied it
        try:
            os.read(fd, 8)
            emptied = False
        except BlockingIOError:
            emptied = True
        return fd, watched and not idle_before, emptied

    fd, watched, emptied = asyncio.run(main())
    assert watched and emptied


@linux_only
def test_the_descriptor_does_not_make_the_loop_busy_and_closes_with_it():
    async def main() -> tuple[int, bool]:
        loop = asyncio.get_running_loop()
        handle = loop.call_later(0.01, lambda: None)
        timer_wake.after_wake(loop)
        handle.cancel()
        await asyncio.sleep(0)  # (asyncio drops the cancelled timer)
        return _timer_fd_of(loop), loop_idle.loop_is_idle()

    fd, idle = asyncio.run(main())
    assert idle  # the engine's own descriptor is no one else wanting the loop
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once the loop was collected


@pytest.fixture
def offloading():
    prev = get_engine()
    engine = Engine(inline_threshold=4096)
    set_engine(engine)
    yield engine
    set_engine(prev)


def test_an_offloaded_backward_arms_the_loops_next_timer(offloading, monkeypatch):
    from asyncgrad.autograd.runtime import threads
    from asyncgrad.autograd.sched import offload

    armed: list[object] = []
    monkeypatch.setattr(offload, "after_wake", armed.append)
    monkeypatch.setattr(threads, "after_wake", armed.append)

    async def main() -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        x = ag.tensor(np.linspace(-1, 1, 8192), requires_grad=True)
        await ag.backward((x.sin() * 2.0).sum())
        return loop

    loop = asyncio.run(main())
    assert offloading.statistics().thread_hops >= 1
    assert armed and all(a is loop for a in armed)
