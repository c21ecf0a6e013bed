"""Each GraphTask runs with its own engine's settings, whoever runs its nodes.

The loop's scheduler is shared by every engine on the loop (Note [One runner per loop]
in autograd/scheduler.py): the runner, a driver of one engine's backward, runs the
queued nodes of every other backward on the loop. Each backward takes a snapshot of its
engine's policy when it is created (``GraphTask.policy``), and the runner runs its
nodes, and decides whether it may complete it, by that snapshot.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.graph_task import GraphTask

LONG, SHORT = 3000, 30  # nodes in the runner's chain and in the other engine's chain


def _chain(n: int) -> tuple[ag.Tensor, ag.Tensor]:
    x = ag.tensor(np.ones(4), requires_grad=True)
    h = x
    for _ in range(n):
        h = h * 1.0001
    return x, h.sum()


async def _backward_on(engine: Engine, loss: ag.Tensor) -> None:
    """``await ag.backward(loss)`` on ``engine`` instead of the default one."""
    task = GraphTask(engine, keep_graph=False, create_graph=False, accumulate=True)
    task.set_roots([loss._gradient_edge()], [np.ones((), loss.data.dtype)])
    await engine.execute(task)


async def _two_engines(inline_all: Engine, offload_all: Engine, runner_first: Engine) -> None:
    x_long, long_loss = _chain(LONG)
    x_short, short_loss = _chain(SHORT)
    other = offload_all if runner_first is inline_all else inline_all
    async with anyio.create_task_group() as tg:
        tg.start_soon(_backward_on, runner_first, long_loss)
        await anyio.sleep(0)  # the long backward has started and holds the runner's role
        tg.start_soon(_backward_on, other, short_loss)
    np.testing.assert_allclose(x_long.grad.numpy(), np.full(4, 1.0001 ** LONG))
    np.testing.assert_allclose(x_short.grad.numpy(), np.full(4, 1.0001 ** SHORT))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_runner_runs_another_engines_nodes_by_that_engines_threshold(backend):
    """The runner's engine runs everything inline; the other engine's nodes still hop."""
    inline_all = Engine(inline_threshold=10**12)
    offload_all = Engine(inline_threshold=0)
    anyio.run(_two_engines, inline_all, offload_all, inline_all, backend=backend)
    assert offload_all.statistics().nodes_inline == 0
    assert offload_all.statistics().nodes_offloaded == SHORT + 1  # its chain and the sum
    assert inline_all.statistics().nodes_offloaded == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_task_keeps_the_threshold_its_engine_had_when_it_was_created(backend):
    engine = Engine(inline_threshold=0)
    x, loss = _chain(SHORT)
    task = GraphTask(engine, keep_graph=False, create_graph=False, accumulate=True)
    task.set_roots([loss._gradient_edge()], [np.ones((), loss.data.dtype)])
    engine.inline_threshold = 10**12  # a later change applies to later calls only
    anyio.run(engine.execute, task, backend=backend)
    assert engine.statistics().nodes_inline == 0
    assert task.policy.inline_threshold == 0
