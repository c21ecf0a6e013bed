"""Note [Niced kernels on the cores others leave] (autograd/sched/placement.py): by
default a backward call's kernels run niced on the engine's ``max_workers`` threads
while other processes were last seen leaving at least that many cores wholly free, and
at the process's priority otherwise (and before the first sample, and while sampling is
off); an explicit ``worker_nice`` fixes the niceness. Other processes' load is simulated
(injected samples); the tests check which pool and niceness the kernels ran on, and that
gradients are the reference executor's either way."""

from __future__ import annotations

import os
import sys
import threading

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.runtime.blas import BLAS, BlasThreads
from asyncgrad.autograd.runtime.cpu_load import INTERVAL, OtherLoad
from asyncgrad.autograd.runtime.workers import shared_pool
from asyncgrad.autograd.sched.placement import QUIET_NICE, worker_niceness
from asyncgrad.autograd.tools.reference import ReferenceEngine

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")


class FakeMachine:
    """Busy seconds of two cores, this process's CPU seconds and a clock, moved by hand."""

    def __init__(self) -> None:
        self.busy, self.own, self.now = 100.0, 5.0, 1000.0

    def advance(self, others_cores: float) -> None:
        self.now += 2 * INTERVAL
        self.busy += others_cores * 2 * INTERVAL

    def load(self, enabled: bool = True) -> OtherLoad:
        # (a requested sample taken at once, on the caller's thread: the order of events alone)
        return OtherLoad(read=lambda _: self.busy, own=lambda: self.own, clock=lambda: self.now,
                         cpus={0, 1}, enabled=enabled, run=lambda job: job())


def test_kernels_are_niced_only_while_the_samples_leave_a_core_per_worker(monkeypatch):
    m = FakeMachine()
    monkeypatch.setattr(BLAS, "load", m.load())
    chosen = [(worker_niceness(1, None), worker_niceness(2, None))]  # no sample yet: nothing known
    BLAS.load.sample()  # a baseline only
    chosen.append((worker_niceness(1, None), worker_niceness(2, None)))
    for others in (0.0, 0.0, 1.0, 1.0, 1.6, 0.0, 0.0, 0.2):
        m.advance(others)
        BLAS.load.sample()
        chosen.append((worker_niceness(1, None), worker_niceness(2, None)))
    # (the larger of the last two samples counts; a fifth of a core's worth is no load):
    # one busy core leaves a core for one worker, not for two
    n = QUIET_NICE
    assert chosen == [(0, 0), (0, 0), (n, n), (n, n), (n, 0), (n, 0), (0, 0), (0, 0), (n, n), (n, n)]


def test_an_explicit_niceness_is_kept_whatever_the_load(monkeypatch):
    m = FakeMachine()
    monkeypatch.setattr(BLAS, "load", m.load())
    BLAS.load.sample()
    for others in (0.0, 1.0, 2.0):
        m.advance(others)
        BLAS.load.sample()
        assert [worker_niceness(2, 0), worker_niceness(2, 5), worker_niceness(1, QUIET_NICE)] == [0, 5, QUIET_NICE]


def test_never_niced_while_sampling_is_off(monkeypatch):
    m = FakeMachine()
    monkeypatch.setattr(BLAS, "load", m.load(enabled=False))
    for _ in range(3):
        m.advance(0.0)
        BLAS.load.sample()
    assert BLAS.spare_cores == 0 and worker_niceness(1, None) == 0


def _kernel_threads_and_grads(engine: Engine, backend: str) -> tuple[list[tuple[str, int]], list[np.ndarray]]:
    """The (thread name, niceness) of every kernel that unpacked a saved tensor, and the
    leaves' gradients, for one backward of a small two-layer net on ``engine``."""
    seen: list[tuple[str, int]] = []

    def unpack(t):
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return t

    rng = np.random.default_rng(3)
    w1 = ag.from_numpy(rng.standard_normal((6, 5))).requires_grad_()
    w2 = ag.from_numpy(rng.standard_normal((5, 3))).requires_grad_()
    x = ag.from_numpy(rng.standard_normal((4, 6)))
    with ag.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        loss = ((x @ w1).tanh() @ w2).sin().sum()
    ag.autograd.set_engine(engine)
    anyio.run(ag.backward, loss, backend=backend)
    return seen, [w1.grad.numpy(), w2.grad.numpy()]


@linux_only
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("spare", [2, 1, 0])
def test_a_backwards_kernels_run_on_the_pool_the_load_chooses(backend, spare, monkeypatch, restore_engine):
    monkeypatch.setattr(BlasThreads, "spare_cores", property(lambda self: spare))
    base = os.getpriority(os.PRIO_PROCESS, 0)
    engine = Engine(max_workers=2, inline_threshold=0)
    seen, grads = _kernel_threads_and_grads(engine, backend)
    niced = spare >= 2  # a core for each of the two workers
    want = min(19, base + QUIET_NICE) if niced else base
    assert seen and all(name.startswith("asyncgrad-worker") and nice == want for name, nice in seen)
    assert engine.worker_executor() is shared_pool(2, QUIET_NICE if niced else 0)
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the loop's thread keeps its own
    _, reference = _kernel_threads_and_grads(ReferenceEngine(), backend)
    for got, expected in zip(grads, reference):
        np.testing.assert_array_equal(got, expected)


@linux_only
def test_the_pool_follows_the_load_from_one_backward_to_the_next(monkeypatch, restore_engine):
    state = {"spare": 2}
    monkeypatch.setattr(BlasThreads, "spare_cores", property(lambda self: state["spare"]))
    base = os.getpriority(os.PRIO_PROCESS, 0)
    engine = Engine(max_workers=2, inline_threshold=0)
    niceness = []
    for spare in (2, 1, 2):
        state["spare"] = spare
        seen, _ = _kernel_threads_and_grads(engine, "asyncio")
        niceness.append({nice for _, nice in seen})
    niced = min(19, base + QUIET_NICE)
    assert niceness == [{niced}, {base}, {niced}]


@linux_only
def test_an_engine_with_a_fixed_niceness_ignores_the_load(monkeypatch, restore_engine):
    monkeypatch.setattr(BlasThreads, "spare_cores", property(lambda self: 2))
    base = os.getpriority(os.PRIO_PROCESS, 0)
    seen, _ = _kernel_threads_and_grads(Engine(inline_threshold=0, worker_nice=0), "asyncio")
    assert seen and {nice for _, nice in seen} == {base}


@pytest.mark.parametrize("bad, error, message", [
    (-1, ValueError, "worker_nice must be from 0 to 19, got -1"),
    (20, ValueError, "worker_nice must be from 0 to 19, got 20"),
    ("10", TypeError, "worker_nice must be None or an int, got str"),
    (True, TypeError, "worker_nice must be None or an int, got bool"),
    (2.5, TypeError, "worker_nice must be None or an int, got float"),
])
def test_a_bad_niceness_is_refused(bad, error, message):
    with pytest.raises(error, match=message):
        Engine(worker_nice=bad)


def test_the_load_is_sampled_with_blas_fixed_too():
    """``Engine(blas_threads=n)`` stops BLAS adapting, not the niceness's samples."""
    m = FakeMachine()
    blas = BlasThreads(2)
    blas.load = m.load()
    blas.fix(1)
    spare = []
    for others in (0.0, 0.0, 1.0):
        m.advance(others)
        blas.backward_started()
        blas.backward_ended()
        spare.append(blas.spare_cores)
    assert spare == [0, 2, 1] and blas.per_call == 1  # (the first call only takes a baseline)
