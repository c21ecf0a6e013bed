"""Note [A task group only for async nodes] (engine.py): a backward whose large nodes
run on worker threads opens no task group; one with an ``async def`` backward opens
one when that node is to start. Both give the same gradients, and an error or a
cancellation still waits for the kernels on workers (Note [Completion by callback])."""

from __future__ import annotations

import asyncio
import threading

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Function


@pytest.fixture
def groups(monkeypatch):
    """Counts the task groups opened (anyio.create_task_group calls)."""
    opened: list[int] = []
    real = anyio.create_task_group

    def counted():
        opened.append(1)
        return real()

    monkeypatch.setattr(anyio, "create_task_group", counted)
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine(max_workers=2, inline_threshold=0))
    yield opened
    ag.autograd.set_engine(prev)


class AsyncDouble(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    async def backward(ctx, g):
        await asyncio.sleep(0)
        return g * 2


class Boom(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        raise ValueError("boom in backward")


def test_worker_kernels_open_no_task_group(groups):
    w = ag.tensor(np.arange(6.0), requires_grad=True)
    before = ag.autograd.get_engine().statistics().nodes_offloaded
    asyncio.run(ag.backward(((w * w).relu() * 3.0).sum()))
    assert ag.autograd.get_engine().statistics().nodes_offloaded > before  # they ran on workers
    assert groups == []
    assert w.grad.tolist() == (6.0 * np.arange(6.0)).tolist()


def test_an_async_node_gets_a_task_group_when_it_starts(groups):
    w = ag.tensor(np.arange(4.0), requires_grad=True)
    loss = (AsyncDouble.apply(w * 3.0) + w * w).sum()
    asyncio.run(ag.backward(loss))
    assert groups == [1]
    assert w.grad.tolist() == (6.0 + 2.0 * np.arange(4.0)).tolist()


def test_an_error_on_a_worker_raises_after_the_other_kernels_without_a_task_group(groups):
    w = ag.tensor(np.ones(3), requires_grad=True)
    v = ag.tensor(np.ones(3), requires_grad=True)
    loss = Boom.apply(w * 2.0).sum() + (v * 3.0).sum()
    with pytest.raises(ValueError, match="boom in backward"):
        asyncio.run(ag.backward(loss))
    assert groups == []
    assert w.grad is None and v.grad is None  # nothing committed


def test_cancelled_while_a_kernel_runs_without_a_task_group(groups):
    started, release, events = threading.Event(), threading.Event(), []

    class Gate(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            started.set()
            assert release.wait(10.0)
            events.append("kernel ended")
            return g

    w = ag.tensor(np.ones(3), requires_grad=True)
    loss = Gate.apply(w * 2.0).sum()

    async def main() -> None:
        task = asyncio.create_task(ag.backward(loss, retain_graph=True))
        assert await asyncio.to_thread(started.wait, 10.0)
        task.cancel()
        await asyncio.sleep(0.01)
        events.append("release")
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        events.append("returned")  # only after its kernel ended (settled)
        await ag.backward(loss)  # nothing was committed or freed by the cancelled one

    asyncio.run(main())
    assert events[:3] == ["release", "kernel ended", "returned"]
    assert groups == []
    assert w.grad.tolist() == [2.0] * 3
