"""Note [A turn the loop just had] (sched/loop.py): a driver resuming right after its
worker kernel's arrival runs in a slice renewed from that arrival, without one more
loop turn; an arrival older than the yield interval renews nothing. Time is a fake
clock (the real one plus an offset the test moves), so nothing depends on durations.
Note [Start the hop before the turn]: when the slice has ended and the next ready node
goes to a worker as it is, it is submitted before the loop's turn."""

from __future__ import annotations

import asyncio
import time
import types

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.sched import inline as execute_module
from asyncgrad.autograd.sched import offload as offload_module
from asyncgrad.autograd.sched import loop as scheduler_module

INTERVAL = 5.0  # far longer than any real stall of the test
JUMP = 2 * INTERVAL  # what a "long kernel" moves the fake clock by


class FakeTime:
    """``time`` for the engine's modules: ``perf_counter`` is the real clock plus
    ``offset``."""

    def __init__(self) -> None:
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset


@pytest.fixture
def clock(monkeypatch):
    fake = FakeTime()
    ns = types.SimpleNamespace(perf_counter=fake.perf_counter, monotonic=time.monotonic)
    for module in (scheduler_module, offload_module, execute_module):
        monkeypatch.setattr(module, "time", ns, raising=False)
    return fake


@pytest.fixture
def events(monkeypatch):
    """The order of events; each loop turn the scheduler gives is recorded as "turn"."""
    events: list[str] = []
    real_turn = scheduler_module.LoopScheduler.loop_turn

    async def counted_turn(self):
        events.append("turn")
        await real_turn(self)

    monkeypatch.setattr(scheduler_module.LoopScheduler, "loop_turn", counted_turn)
    return events


def _run(clock, monkeypatch, events, *, stale_arrival: bool) -> list[str]:
    """One backward whose nodes run on a worker, each taking (on the fake clock) longer
    than the yield interval; the leaf is staged inline after the last one. Returns the
    order of events: kernels, the last one's arrival (a post-hook on its node, run on
    the loop as its result arrives), loop turns."""
    real_boxed = offload_module.boxed_call

    def long_kernel(fn, *args):
        result = real_boxed(fn, *args)
        clock.offset += JUMP  # the kernel took longer than a slice
        events.append("kernel")
        return result

    monkeypatch.setattr(offload_module, "boxed_call", long_kernel)
    w = ag.tensor(np.arange(4.0), requires_grad=True)

    def post_hook(grad_inputs, grad_outputs):
        events.append("arrival")
        if stale_arrival:  # the driver resumes longer than an interval after the arrival
            clock.offset += JUMP

    async def main() -> None:
        prev = ag.autograd.get_engine()
        ag.autograd.set_engine(ag.autograd.Engine(max_workers=1, inline_threshold=1, yield_interval=INTERVAL))
        try:
            loss = (w * w).sum()
            loss.grad_fn.next_functions[0][0].register_hook(post_hook)  # the last node (w * w)
            events.append("call")
            await ag.backward(loss)
            events.append("returned")
        finally:
            ag.autograd.set_engine(prev)

    asyncio.run(main())
    assert w.grad.tolist() == [0.0, 2.0, 4.0, 6.0]
    return events


def test_a_driver_resuming_right_after_its_kernel_arrived_takes_no_extra_loop_turn(clock, monkeypatch, events):
    events = _run(clock, monkeypatch, events, stale_arrival=False)
    after = events[events.index("arrival"):]
    assert "turn" not in after, events  # the slice was renewed from the arrival's turn
    assert events[0] == "call" and events[-1] == "returned"


def test_an_arrival_older_than_the_interval_renews_nothing(clock, monkeypatch, events):
    events = _run(clock, monkeypatch, events, stale_arrival=True)
    after = events[events.index("arrival"):]
    assert after.count("turn") >= 1, events  # the loop gets its turn first


def test_a_node_for_a_worker_is_submitted_before_the_loop_turn(monkeypatch, events):
    """With a zero yield interval every slice has ended when the runner starts; the
    root goes to a worker as it is, so it is submitted first, and the turn follows."""
    real_submit = offload_module.WorkerKernels.submit

    def submit(self, run, fn, args, arrive):
        events.append("submit")
        return real_submit(self, run, fn, args, arrive)

    monkeypatch.setattr(offload_module.WorkerKernels, "submit", submit)
    w = ag.tensor(np.arange(4.0), requires_grad=True)

    async def main() -> None:
        prev = ag.autograd.get_engine()
        ag.autograd.set_engine(ag.autograd.Engine(max_workers=1, inline_threshold=1, yield_interval=0.0))
        try:
            await ag.backward((w * w).sum())
        finally:
            ag.autograd.set_engine(prev)

    asyncio.run(main())
    assert w.grad.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert events and events[0] == "submit", events


def test_a_hooked_node_for_a_worker_waits_for_the_loop_turn(events):
    """A node with a hook is prepared by ``run_inline`` (its hooks run there), so it is
    not handed over ahead of the turn."""
    w = ag.tensor(np.arange(4.0), requires_grad=True)

    async def main() -> None:
        prev = ag.autograd.get_engine()
        ag.autograd.set_engine(ag.autograd.Engine(max_workers=1, inline_threshold=1, yield_interval=0.0))
        try:
            loss = (w * w).sum()
            loss.grad_fn.register_prehook(lambda grads: events.append("pre-hook"))
            await ag.backward(loss)
        finally:
            ag.autograd.set_engine(prev)

    asyncio.run(main())
    assert events[:2] == ["turn", "pre-hook"], events
