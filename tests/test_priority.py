"""``priority=`` on backward calls (API.md §3; Note [Task order] in
autograd/task_order.py): higher-priority calls' ready nodes run first, equal priorities
share the loop round robin, a lower-priority call is slowed but never starved, a nested
backward inherits its parent's priority, and the worker threads' queue honours it.
Every test asserts an order of events, never a duration."""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, get_engine, set_engine
from asyncgrad.autograd.task_order import TURNS_PER_PRIORITY, TaskOrder
from asyncgrad.autograd.workers import WorkerPool

BACKENDS = ["asyncio", "trio"]


@pytest.fixture
def engine():
    prev = get_engine()
    eng = Engine()
    set_engine(eng)
    yield eng
    set_engine(prev)


def _chain(n: int) -> tuple[ag.Tensor, list[ag.Tensor]]:
    """A chain of ``n`` small inline nodes; returns the leaf and every intermediate."""
    x = ag.tensor(np.ones(4), requires_grad=True)
    hs = [x]
    for _ in range(n):
        hs.append(hs[-1] * 1.0001)
    return x, hs


# --- the order itself -----------------------------------------------------------------
def test_equal_priorities_are_first_come_first_served_and_rotate():
    order: TaskOrder[str] = TaskOrder()
    for name in "abc":
        order.push(name)
    assert list(order) == ["a", "b", "c"]
    order.requeue_first()  # a's turn ran out: behind the others
    assert [order.pop(), order.pop(), order.pop()] == ["b", "c", "a"]
    assert order.pop() is None and not order


def test_a_higher_priority_overtakes_and_removal_keeps_the_rest_in_order():
    order: TaskOrder[str] = TaskOrder()
    order.push("low1")
    order.push("low2")
    order.push("high", 1)
    order.push("low1", 5)  # already queued: nothing changes
    assert list(order) == ["high", "low1", "low2"]
    assert order.remove("low1") and not order.remove("low1")
    assert "low1" not in order and len(order) == 2
    assert list(order) == ["high", "low2"]


def test_a_waiting_low_priority_entry_ages_past_a_stream_of_high_ones():
    """However many higher-priority entries keep joining, the low one is served within
    ``TURNS_PER_PRIORITY * difference`` joins (aging)."""
    order: TaskOrder[str] = TaskOrder()
    order.push("low", 0)
    served = []
    for i in range(100):
        order.push(f"high{i}", 2)
        served.append(order.pop())
        if served[-1] == "low":
            break
    assert served[-1] == "low"
    assert len(served) <= 2 * TURNS_PER_PRIORITY + 1
    assert len(served) > 1  # it was overtaken first


def test_bad_priorities_raise_a_type_error_and_run_nothing(engine):
    x, hs = _chain(3)
    loss = hs[-1].sum()
    for bad in (1.5, "1", None, True):
        with pytest.raises(TypeError, match="priority must be an int"):
            ag.backward_sync(loss, retain_graph=True, priority=bad)
        with pytest.raises(TypeError, match="priority must be an int"):
            anyio.run(lambda: ag.backward(loss, retain_graph=True, priority=bad))  # noqa: B023
    assert x.grad is None
    ag.backward_sync(loss, priority=3)
    np.testing.assert_allclose(x.grad.numpy(), np.full(4, 1.0001 ** 3))


# --- the worker threads ---------------------------------------------------------------
def test_the_worker_queue_serves_higher_priorities_first():
    pool = WorkerPool(1)
    gate = threading.Event()
    ran: list[str] = []
    busy = pool.submit(gate.wait)  # the one thread is busy: the rest wait in its queue
    futures = [pool.submit_at(p, ran.append, name)
               for name, p in [("low1", 0), ("high1", 3), ("low2", 0), ("high2", 3), ("mid", 1)]]
    gate.set()
    busy.result(10)
    for f in futures:
        f.result(10)
    assert ran == ["high1", "high2", "mid", "low1", "low2"]


# --- backward calls on a loop ---------------------------------------------------------
async def _race(lows: int, highs: int, nodes: int, finished: list[str]) -> None:
    chains = [_chain(nodes) for _ in range(lows + highs)]

    started: list[str] = []

    async def run(name: str, hs: list[ag.Tensor], priority: int) -> None:
        hs[-2].register_hook(lambda g: started.append(name))  # its first node ran
        await ag.backward(hs[-1].sum(), priority=priority)
        finished.append(name)

    async with anyio.create_task_group() as tg:
        for i in range(lows):
            tg.start_soon(run, f"low{i}", chains[i][1], 0)
        while len(started) < lows:  # the low calls have started
            await anyio.sleep(0)
        for i in range(highs):
            tg.start_soon(run, f"high{i}", chains[lows + i][1], 100)
    for x, _ in chains:
        np.testing.assert_allclose(x.grad.numpy(), np.full(4, 1.0001 ** nodes))


@pytest.mark.parametrize("backend", BACKENDS)
def test_high_priority_calls_started_later_finish_first(backend, engine):
    finished: list[str] = []
    anyio.run(_race, 4, 4, 3000, finished, backend=backend)
    assert sorted(finished[:4]) == [f"high{i}" for i in range(4)], finished


async def _interleave(calls: int, nodes: int, marks: list[tuple[str, int]]) -> None:
    async def run(i: int) -> None:
        _, hs = _chain(nodes)
        # the backward reaches hs[-20] early and hs[20] late
        hs[-20].register_hook(lambda g: marks.append(("early", i)))
        hs[20].register_hook(lambda g: marks.append(("late", i)))
        await ag.backward(hs[-1].sum())

    async with anyio.create_task_group() as tg:
        for i in range(calls):
            tg.start_soon(run, i)


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_priorities_interleave(backend, engine):
    """Each call of equal priority gets a turn before any of them gets far: every call
    passes its early mark before any passes its late one."""
    marks: list[tuple[str, int]] = []
    anyio.run(_interleave, 4, 1500, marks, backend=backend)
    kinds = [kind for kind, _ in marks]
    assert sorted(i for kind, i in marks if kind == "early") == [0, 1, 2, 3]
    assert kinds.index("late") > max(j for j, k in enumerate(kinds) if k == "early"), marks


async def _stream(low_nodes: int, limit: int, events: list[str]) -> None:
    """Four high-priority callers each start a new call as soon as their last one
    returned (at most ``limit`` in all), so high-priority calls are always in flight;
    the low-priority call starts once they are going."""
    _, low_chain = _chain(low_nodes)
    low_done = anyio.Event()
    highs_started = anyio.Event()
    started = [0]

    async def low() -> None:
        await ag.backward(low_chain[-1].sum(), priority=0)
        events.append("low")
        low_done.set()

    async def high_caller() -> None:
        while not low_done.is_set() and started[0] < limit:
            started[0] += 1
            _, hs = _chain(50)
            highs_started.set()
            await ag.backward(hs[-1].sum(), priority=1)
            events.append("high")

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(high_caller)
        await highs_started.wait()
        tg.start_soon(low)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_low_priority_call_finishes_while_high_ones_keep_arriving(backend, engine):
    events: list[str] = []
    anyio.run(_stream, 300, 2000, events, backend=backend)
    assert "low" in events
    assert events.count("high") < 2000  # it finished before the stream ran out
    assert events.index("low") > 0  # (premise: high ones went first)


async def _nested(seen: list[tuple[int, int]]) -> None:
    w = ag.tensor(np.ones(3), requires_grad=True)

    def inner_hook(g: ag.Tensor) -> None:
        stats = ag.autograd.current_graph_task_statistics()
        seen.append((stats.depth, stats.priority))

    def outer_hook(g: ag.Tensor) -> None:
        stats = ag.autograd.current_graph_task_statistics()
        seen.append((stats.depth, stats.priority))
        with ag.enable_grad():
            inner = w * 2.0
            inner.register_hook(inner_hook)
            loss = inner.sum()
        ag.grad_sync(loss, [w])  # nested: started by a node of the outer backward

    x = ag.tensor(np.ones(3), requires_grad=True)
    y = x * 3.0
    y.register_hook(outer_hook)
    await ag.backward(y.sum(), priority=7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nested_backward_inherits_its_parents_priority(backend, engine):
    seen: list[tuple[int, int]] = []
    anyio.run(_nested, seen, backend=backend)
    assert seen == [(0, 7), (1, 7)]
