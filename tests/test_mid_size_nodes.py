"""Note [Mid-size nodes hop beside another] (asyncgrad/autograd/sched/placement.py): a node
below the inline threshold but of at least MID_WORK elements of work goes to a worker
while another node of its backward is ready, and runs inline when nothing else is ready,
on an engine with one worker, or under the blocking driver. Results are the reference
executor's either way."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from conftest import cancel_while_blocked
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
    assert stats.thread_hops == 4 and stats.nodes_offloaded >= 4  # (the last one too: its siblings are in flight)
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


# --- the last branch beside its siblings' chains (the node beside one in flight) ------------
M = MID_WORK + 1000  # with saved-tensor hooks a node's work counts its gradient only: still mid-size


def _hooked_branches(k: int, record: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    """``k`` branches of two sin/tanh cycles each; every saved value is unpacked through
    ``record(branch)``, which runs on the thread that runs the node."""
    rng = np.random.default_rng(k)
    xs = [ag.from_numpy(rng.standard_normal(M)).requires_grad_() for _ in range(k)]
    total = ag.tensor(0.0)
    for b, x in enumerate(xs):
        def unpack(t: Any, b: int = b) -> Any:
            record(b)
            return t

        with ag.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            y = x
            for _ in range(2):
                y = (y.sin() * 0.5).tanh() * 1.5
        total = total + y.sum()
    return total, xs


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_every_branch_runs_whole_on_a_worker_the_last_one_too(backend, two_free_cores, restore_engine):
    """With its siblings' chains in flight, the last branch goes to a worker too: one hop
    per branch, no branch's node on the loop, each branch on one thread, and a thread
    runs branches one after another (never two interleaved); gradients are the
    all-inline engine's, bit for bit (each leaf gets one gradient)."""
    k = 4
    seen: list[tuple[str, int]] = []

    def record(b: int) -> None:
        seen.append((threading.current_thread().name, b))

    engine = Engine(max_workers=2)
    ag.autograd.set_engine(engine)
    loss, xs = _hooked_branches(k, record)
    anyio.run(ag.backward, loss, backend=backend)
    stats = engine.statistics()
    assert stats.thread_hops == k
    assert len(seen) == 4 * k  # (two sins and two tanhs per branch)
    assert all(name != threading.main_thread().name for name, _ in seen)
    threads = {b: {name for name, c in seen if c == b} for b in range(k)}
    assert all(len(names) == 1 for names in threads.values())
    for name in {n for n, _ in seen}:
        order = [b for n, b in seen if n == name]
        runs = [b for i, b in enumerate(order) if i == 0 or order[i - 1] != b]
        assert len(runs) == len(set(runs))  # each branch once, whole
    ag.autograd.set_engine(Engine(inline_threshold=2**62))
    loss2, xs2 = _hooked_branches(k, lambda b: None)
    anyio.run(ag.backward, loss2, backend=backend)
    for a, b in zip(xs, xs2):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())


def test_branches_beside_each_other_match_finite_differences(two_free_cores, restore_engine):
    """The offloaded branches' gradients are the function's (float64 gradcheck on a few
    entries, central differences), not only the inline engine's."""
    ag.autograd.set_engine(Engine(max_workers=2))
    loss, xs = _hooked_branches(3, lambda b: None)
    anyio.run(ag.backward, loss)
    eps = 1e-6

    def f(v: float) -> float:  # one element's term of the loss (the branches are elementwise)
        for _ in range(2):
            v = math.tanh(math.sin(v) * 0.5) * 1.5
        return v

    for x in xs:
        x0 = x.detach().numpy()
        for i in (0, M // 2, M - 1):
            v = float(x0[i])
            assert abs((f(v + eps) - f(v - eps)) / (2 * eps) - x.grad.numpy()[i]) < 1e-8


async def test_cancelling_in_the_middle_of_a_worker_branch(two_free_cores, restore_engine):
    """A saved value's unpack in the second branch to run blocks on its worker until the
    test has cancelled the backward: the await returns only after that worker is back,
    the branches no worker started never run, no ``.grad`` is written, no kernel is left
    in flight, and the same backward then runs again to the inline engine's gradients."""
    k = 4
    calls: list[int] = []
    blocking = threading.Event()
    release = threading.Event()
    lock = threading.Lock()

    def record(b: int) -> None:
        with lock:
            calls.append(b)
            first = calls[0]
        if b != first and not release.is_set() and not blocking.is_set():
            blocking.set()
            release.wait(10)

    engine = Engine(max_workers=2)
    ag.autograd.set_engine(engine)
    loss, xs = _hooked_branches(k, record)
    await cancel_while_blocked(ag.backward(loss), blocking, release)
    ran = len(calls)
    assert ran < 4 * k  # the queued branches were withdrawn, the blocked one stopped early
    assert all(x.grad is None for x in xs)
    stats = engine.statistics()
    assert stats.kernels_in_flight == 0 and stats.graph_tasks_cancelled == 1
    await asyncio.sleep(0.05)
    assert len(calls) == ran  # no worker still runs a node of it
    release.set()
    await ag.backward(loss)
    ag.autograd.set_engine(Engine(inline_threshold=2**62))
    loss2, xs2 = _hooked_branches(k, lambda b: None)
    await ag.backward(loss2)
    for a, b in zip(xs, xs2):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
