"""Note [Mid-size nodes hop beside another] (asyncgrad/autograd/sched/placement.py): a node
below the inline threshold but of at least MID_WORK elements of work goes to a worker
while another node of its backward is ready, and runs inline when nothing else is ready,
on an engine with one worker, or under the blocking driver. Results are the reference
executor's either way."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.runtime.blas import BLAS
from asyncgrad.autograd.sched.placement import MID_WORK
from asyncgrad.autograd.tools.reference import ReferenceEngine

N = MID_WORK // 2 + 1000  # a sin node reads its gradient and its input: just above MID_WORK


@pytest.fixture
def two_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other processes' load is off in the suite; the rule also needs two cores."""
    monkeypatch.setattr(type(BLAS), "free_cores", property(lambda self: 2))


def _branches(k: int) -> tuple[ag.Tensor, list[ag.Tensor]]:
    rng = np.random.default_rng(k)
    xs = [ag.from_numpy(rng.standard_normal(N)).requires_grad_() for _ in range(k)]
    loss = sum((((x * 1.5).sin() * 0.5).tanh().sum() for x in xs), ag.tensor(0.0))
    return loss, xs


def _grads(engine: Engine, k: int, backend: str, sync: bool = False) -> tuple[list[np.ndarray], Any]:
    ag.autograd.set_engine(engine)
    loss, xs = _branches(k)
    if sync:
        ag.backward_sync(loss)
    else:
        anyio.run(ag.backward, loss, backend=backend)
    return [x.grad.numpy() for x in xs], engine.statistics()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_mid_size_branches_run_on_workers_beside_each_other(backend, two_free_cores, restore_engine):
    got, stats = _grads(Engine(max_workers=2), 4, backend)
    want, _ = _grads(ReferenceEngine(), 4, backend)
    assert stats.thread_hops >= 3 and stats.nodes_offloaded >= 3  # (the last branch may run inline)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_lone_mid_size_chain_runs_inline(backend, two_free_cores, restore_engine):
    got, stats = _grads(Engine(max_workers=2), 1, backend)
    assert stats.thread_hops == 0 and stats.nodes_offloaded == 0
    np.testing.assert_array_equal(got[0], _grads(ReferenceEngine(), 1, backend)[0][0])


@pytest.mark.parametrize("how", ["one worker", "blocking driver", "one free core"])
def test_mid_size_nodes_stay_inline_without_a_second_core(how, monkeypatch, two_free_cores, restore_engine):
    if how == "one free core":
        monkeypatch.setattr(type(BLAS), "free_cores", property(lambda self: 1))
    engine = Engine(max_workers=1 if how == "one worker" else 2)
    got, stats = _grads(engine, 4, "asyncio", sync=how == "blocking driver")
    assert stats.thread_hops == 0 and stats.nodes_offloaded == 0
    for a, b in zip(got, _grads(ReferenceEngine(), 4, "asyncio")[0]):
        np.testing.assert_array_equal(a, b)
