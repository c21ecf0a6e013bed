"""A backward call that waited in the admission line (Note [Admission] in
autograd/scheduler.py) counts once as a backward call in flight for BLAS (Note [BLAS
threads] in autograd/policy.py): while it waits, and then while it runs, never twice."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, get_engine, set_engine
from asyncgrad.autograd.policy import BLAS
from asyncgrad.autograd.scheduler import LoopScheduler, loop_scheduler

LONG = 3000  # nodes of the backward that holds the runner's role meanwhile


def _chain(n: int) -> tuple[ag.Tensor, ag.Tensor]:
    x = ag.tensor(np.ones(4), requires_grad=True)
    h = x
    for _ in range(n):
        h = h * 1.0001
    return x, h.sum()


@pytest.fixture
def engine():
    prev = get_engine()
    eng = Engine()
    set_engine(eng)
    yield eng
    set_engine(prev)


async def _admitted_call(engine: Engine, seen: list[tuple[int, int]]) -> None:
    _, long_loss = _chain(LONG)
    x, loss = _chain(3)
    base = BLAS._backwards

    def look(g: ag.Tensor) -> None:  # runs inside the admitted call's backward
        seen.append((BLAS._backwards - base, engine.statistics().graph_tasks_running))

    loss.register_hook(look)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ag.backward, long_loss)
        while loop_scheduler().runner is None:  # the long call holds the runner's role
            await anyio.sleep(0)
        tg.start_soon(ag.backward, loss)  # starts in the loop's turn: it waits in line
    np.testing.assert_allclose(x.grad.numpy(), np.full(4, 1.0001 ** 3))
    assert BLAS._backwards == base


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_admitted_call_counts_once_for_blas(backend, engine, monkeypatch):
    lined_up: list[bool] = []
    wait_in_line = LoopScheduler.wait_in_line

    async def spy(self: LoopScheduler, *args: object) -> None:
        lined_up.append(True)
        await wait_in_line(self, *args)

    monkeypatch.setattr(LoopScheduler, "wait_in_line", spy)
    seen: list[tuple[int, int]] = []
    anyio.run(_admitted_call, engine, seen, backend=backend)
    assert lined_up  # the second call did wait in line
    ((counted, running),) = seen
    assert counted == running  # one count per call in flight (the long one, if still running, and this one)
