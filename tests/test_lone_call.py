"""A lone flat call runs its own nodes (Note [A lone call runs its own nodes] in
sched/loop.py), and leaves that have a ``.grad`` skip the freshness test (Note [Owned
gradients] in task/step.py): the same gradients, errors and ``.grad`` objects as the
queued path. Observed through values, errors and call counts, never durations."""

from __future__ import annotations

import time

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.sched import loop as loop_module
from asyncgrad.autograd.sched.loop import LoopScheduler, loop_scheduler
from asyncgrad.autograd.task import step as step_module
from asyncgrad.functional import linear


@pytest.fixture
def long_slices():
    """An engine whose slices never run out within a test, and the current slice open:
    whether a call runs alone then depends on the scheduler's state only."""
    old = ag.autograd.get_engine()
    ag.autograd.set_engine(Engine(yield_interval=3600.0))
    yield
    ag.autograd.set_engine(old)


def _open_slice() -> None:
    scheduler = loop_scheduler()
    scheduler.slice_start = time.perf_counter()
    scheduler.slice_end = scheduler.slice_start + 3600.0


def _params(seed: int) -> list[ag.Tensor]:
    rng = np.random.default_rng(seed)
    shapes = [(6, 5), (6,), (4, 6), (4,)]
    return [ag.tensor(rng.standard_normal(s), dtype=ag.float64, requires_grad=True) for s in shapes]


def _loss(ps: list[ag.Tensor], x: np.ndarray) -> ag.Tensor:
    h = linear(ag.tensor(x, dtype=ag.float64), ps[0], ps[1]).relu()
    h = linear(h, ps[2], ps[3])
    return (h * h).mean()


def _spy(monkeypatch, name: str) -> list[bool]:
    """Record what ``LoopScheduler.<name>`` returns at each call."""
    calls: list[bool] = []
    real = getattr(LoopScheduler, name)

    def spied(self, *args):
        result = real(self, *args)
        calls.append(result)
        return result

    monkeypatch.setattr(LoopScheduler, name, spied)
    return calls


async def _two_backwards(ps: list[ag.Tensor]) -> list[np.ndarray]:
    """Two backward calls into ``ps`` (the first into fresh leaves, the second adding
    into their ``.grad``); each parameter's gradient after each."""
    x = np.random.default_rng(7).standard_normal((3, 5))
    out = []
    for _ in range(2):
        _open_slice()
        await ag.backward(_loss(ps, x))
        out.extend(p.grad.numpy().copy() for p in ps)
    return out


async def test_a_lone_call_runs_alone_with_the_queued_paths_gradients(long_slices, monkeypatch):
    alone = _spy(monkeypatch, "run_alone")
    fast = await _two_backwards(_params(0))
    assert alone and all(alone)  # every call ran its nodes itself
    monkeypatch.setattr(LoopScheduler, "run_alone", lambda self, task: False)  # the queued path
    slices = _spy(monkeypatch, "_run_slice")
    slow = await _two_backwards(_params(0))
    assert slices  # (the runner ran them)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and np.array_equal(a, b)  # bit for bit


async def test_a_lone_call_raises_the_queued_paths_error_and_commits_nothing(long_slices, monkeypatch):
    async def failing() -> tuple[BaseException, list[np.ndarray]]:
        ps = _params(1)
        await ag.backward(_loss(ps, np.ones((2, 5))))
        before = [p.grad.numpy().copy() for p in ps]
        x = ag.tensor(np.ones((2, 5)), dtype=ag.float64, requires_grad=True)
        a = x * ps[1][:5]
        loss = a.sin().sum() + (ps[0] * 1.0).sum()  # sin saves its input: modified below
        a.mul_(2.0)
        _open_slice()
        with pytest.raises(RuntimeError) as info:
            await ag.backward(loss)
        for p, b in zip(ps, before):
            assert np.array_equal(p.grad.numpy(), b)  # nothing committed
        return info.value, before

    alone = _spy(monkeypatch, "run_alone")
    fast_error, _ = await failing()
    assert any(alone)
    monkeypatch.setattr(LoopScheduler, "run_alone", lambda self, task: False)
    slow_error, _ = await failing()
    assert type(fast_error) is type(slow_error)
    assert str(fast_error) == str(slow_error)
    def named(error: BaseException) -> list[str]:  # (sequence numbers and task ids differ)
        return [n.split(" (sequence_nr=")[0] for n in getattr(error, "__notes__", [])]

    assert named(fast_error) == named(slow_error) == ["asyncgrad: raised while running SinBackward0"]


async def test_no_lone_run_beside_a_queued_call_or_after_the_slice(monkeypatch):
    """With the slice over (a zero yield interval), or another GraphTask queued, the
    driver runs nothing itself: the runner's path (its turn for the loop first)."""
    alone = _spy(monkeypatch, "run_alone")
    old = ag.autograd.get_engine()
    ag.autograd.set_engine(Engine(yield_interval=0.0))
    try:
        ps = _params(2)
        await ag.backward(_loss(ps, np.ones((2, 5))))
    finally:
        ag.autograd.set_engine(old)
    assert alone and not any(alone)
    scheduler = loop_scheduler()
    other = object.__new__(loop_module.GraphTask)  # (a stand-in entry; never run)
    scheduler.queue.push(other)
    try:
        _open_slice()
        assert scheduler.run_alone(_task_for(_loss(_params(3), np.ones((2, 5))))) is False
    finally:
        scheduler.discard(other)


def _task_for(loss: ag.Tensor):
    from asyncgrad.autograd.api import _prepare_scalar_backward

    task = _prepare_scalar_backward(loss, None, 0)
    for _ in task.setup_steps():
        pass
    assert task.schedule is not None
    return task


async def test_a_leaf_with_a_grad_is_added_into_and_a_fresh_leaf_still_takes_the_kernels_array(monkeypatch):
    tested = []
    real = step_module.is_fresh

    def spied(*args):
        tested.append(1)
        return real(*args)

    monkeypatch.setattr(step_module, "is_fresh", spied)
    w = ag.tensor(np.arange(6.0).reshape(2, 3), dtype=ag.float64, requires_grad=True)
    x = ag.tensor(np.ones((4, 3)), dtype=ag.float64)
    await ag.backward(linear(x, w).sum())  # the fused step's freshness test for the new .grad
    assert tested
    first = w.grad
    array = first.numpy()
    tested.clear()
    await ag.backward(linear(x, w).sum())
    assert not tested  # added into: no test
    assert w.grad is first and w.grad.numpy() is array  # in place
    np.testing.assert_array_equal(array, np.full((2, 3), 8.0))


async def test_the_commit_is_placed_once_per_call(monkeypatch):
    """The runner's test (``completes_at_once``) and the sequence's commit both ask
    where the commit adds up: the staged gradients are weighed once, and both get the
    same answer."""
    from asyncgrad.autograd.sched.inline import run_inline
    from asyncgrad.autograd.task import call, commit

    weighed = []
    real = commit.staged_size

    def spied(task):
        weighed.append(task)
        return real(task)

    monkeypatch.setattr(commit, "staged_size", spied)
    ps = _params(4)
    await ag.backward(_loss(ps, np.ones((2, 5))))  # (each leaf has a .grad: the commit adds)
    weighed.clear()
    task = _task_for(_loss(ps, np.ones((2, 5))))
    assert run_inline(task, float("inf")) is False
    assert call.completes_at_once(task) is True
    assert commit.commit_on_loop(task) is True
    assert weighed == [task]
