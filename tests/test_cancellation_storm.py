"""Cancelling some backward calls never stalls the others (Note [Handing on] in
autograd/sched/loop.py).

The storm from the report: 20 concurrent backward calls on a 3-layer MLP, every third
cancelled 3 ms after it starts. Then the same hole at each wait of the scheduler, hit
exactly: a caller cancelled at the moment it is chosen (woken to start or to take the
runner's role) and before it takes over, and the runner cancelled while it gives the
loop its turn. In every case the survivors finish, their gradients are exactly the sum
of one backward each, and the scheduler is left empty.
"""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.sched.loop import LoopScheduler, loop_scheduler
from asyncgrad.autograd.sched.wakeup import Wakeup

CALLS = 20
WIDTH, BATCH = 256, 64
GUARD = 20.0  # seconds a survivor may take before the test calls it a stall


def _mlp() -> list[ag.Tensor]:
    rng = np.random.default_rng(0)
    return [ag.tensor(rng.standard_normal((WIDTH, WIDTH)) * 0.05, requires_grad=True) for _ in range(3)]


def _inputs() -> list[ag.Tensor]:
    rng = np.random.default_rng(1)
    return [ag.tensor(rng.standard_normal((BATCH, WIDTH))) for _ in range(CALLS)]


def _loss(ws: list[ag.Tensor], x: ag.Tensor) -> ag.Tensor:
    h = x
    for w in ws:
        h = (h @ w).tanh()
    return h.pow(2).mean()


async def _one(ws: list[ag.Tensor], x: ag.Tensor, kind: str) -> tuple[np.ndarray, ...] | None:
    loss = _loss(ws, x)
    if kind == "grad":
        return tuple(g.numpy().copy() for g in await ag.grad(loss, ws))
    await ag.backward(loss)
    return None


def _expected(ws: list[ag.Tensor], xs: list[ag.Tensor], which: list[int]) -> list[np.ndarray]:
    """The sum of one plain backward per call in ``which``, run one by one (blocking, on
    a thread without a loop)."""
    def run() -> list[np.ndarray]:
        fresh = [ag.tensor(w.numpy().copy(), requires_grad=True) for w in ws]
        for i in which:
            _loss(fresh, xs[i]).backward()
        return [w.grad.numpy() if w.grad is not None else np.zeros_like(w.numpy()) for w in fresh]

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _assert_scheduler_empty() -> None:
    scheduler = loop_scheduler()
    assert scheduler.runner is None
    assert not scheduler.queue
    assert not scheduler.admission


async def _storm(kind: str, canceller: str, victim: callable) -> None:
    """Run CALLS calls at once; ``victim(i)`` says which are cancelled, and how, by
    returning an async context manager that cancels the call (or None)."""
    ws, xs = _mlp(), _inputs()
    finished: list[int] = []
    cancelled: list[int] = []
    results: dict[int, tuple[np.ndarray, ...] | None] = {}

    async def call(i: int) -> None:
        doomed = victim(i)
        if doomed is None:
            with anyio.fail_after(GUARD):  # a stall fails the test instead of hanging it
                results[i] = await _one(ws, xs[i], kind)
            finished.append(i)
            return
        try:
            if canceller == "wait_for":
                results[i] = await asyncio.wait_for(_one(ws, xs[i], kind), doomed)
            else:
                with anyio.fail_after(doomed):
                    results[i] = await _one(ws, xs[i], kind)
            finished.append(i)  # (it finished before its deadline)
        except TimeoutError:
            cancelled.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(CALLS):
            tg.start_soon(call, i)

    survivors = [i for i in range(CALLS) if victim(i) is None]
    assert set(survivors) <= set(finished)
    assert sorted(finished + cancelled) == list(range(CALLS))
    expected = _expected(ws, xs, sorted(finished))
    if kind == "backward":
        for w, e in zip(ws, expected):
            np.testing.assert_allclose(w.grad.numpy(), e, rtol=1e-10, atol=1e-12)
    else:
        for w in ws:
            assert w.grad is None
        for i in finished:
            np.testing.assert_allclose(results[i][0], _expected(ws, xs, [i])[0], rtol=1e-10, atol=1e-12)
    _assert_scheduler_empty()


BACKENDS = [("asyncio", "fail_after"), ("asyncio", "wait_for"), ("trio", "fail_after")]


@pytest.mark.parametrize("kind", ["backward", "grad"])
@pytest.mark.parametrize("backend,canceller", BACKENDS)
def test_every_third_call_cancelled_after_3ms_the_others_finish(backend, canceller, kind):
    def victim(i: int) -> float | None:
        return 0.003 if i % 3 == 0 else None

    anyio.run(_storm, kind, canceller, victim, backend=backend)


# --- the same hole at each wait, hit exactly -----------------------------------------------
# Each call runs in its own cancel scope. The victims are chosen by the scheduler's own
# actions, up to MAX_VICTIMS of them: a call is cancelled when a wake-up of it is set (it
# was chosen) or, as the runner, when it gives the loop its turn.

MAX_VICTIMS = 7
_call: contextvars.ContextVar[tuple[int, anyio.CancelScope] | None] = contextvars.ContextVar("call", default=None)


def _make_victim(call: tuple[int, anyio.CancelScope] | None, victims: set[int]) -> None:
    """Cancel ``call`` (once), if fewer than MAX_VICTIMS were."""
    if call is not None and call[0] not in victims and len(victims) < MAX_VICTIMS:
        victims.add(call[0])
        call[1].cancel()


class _ChosenThenCancelled(Wakeup):
    """A call's wake-up. Every third wake-up set on the loop (the ``nth``, the
    ``nth + 3``-th, ...) cancels the call it wakes at once, before that call resumes."""

    __slots__ = ("call", "nth", "victims")

    def set(self) -> None:
        first = not self._woken
        super().set()
        if first and self.call is not None:
            _wakes.append(self.call[0])
            if len(_wakes) % 3 == self.nth % 3:
                _make_victim(self.call, self.victims)


_wakes: list[int] = []  # the call each wake-up set woke, in order


async def _exact_storm(kind: str, victims: set[int]) -> None:
    ws, xs = _mlp(), _inputs()
    finished: list[int] = []

    async def call(i: int) -> None:
        with anyio.CancelScope() as scope:
            _call.set((i, scope))
            with anyio.fail_after(GUARD):
                await _one(ws, xs[i], kind)
            finished.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(CALLS):
            tg.start_soon(call, i)

    assert set(range(CALLS)) - victims <= set(finished)
    if kind == "backward":
        for w, e in zip(ws, _expected(ws, xs, sorted(finished))):
            np.testing.assert_allclose(w.grad.numpy(), e, rtol=1e-10, atol=1e-12)
    _assert_scheduler_empty()


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("kind", ["backward", "grad"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_caller_cancelled_when_chosen_hands_on(backend, kind, nth, monkeypatch, restore_engine):
    """Calls are cancelled right as a wake-up of theirs is set (every third on the loop,
    from the ``nth``): chosen to start (admission), to take the runner's role, or to
    start kernels, and cancelled before they take over. (On an Engine: under
    ``--reference-engine`` the default one runs no scheduler, so there would be no wait
    to hit.)"""
    ag.autograd.set_engine(ag.autograd.Engine())
    _wakes.clear()
    victims: set[int] = set()

    def wakeup(self: LoopScheduler) -> Wakeup:
        w = _ChosenThenCancelled(self.loop)
        w.call, w.nth, w.victims = _call.get(), nth, victims
        return w

    monkeypatch.setattr(LoopScheduler, "wakeup", wakeup)
    anyio.run(_exact_storm, kind, victims, backend=backend)
    assert victims, f"{len(_wakes)} wake-ups: the test did not reach the scheduler's waits"


@pytest.mark.parametrize("kind", ["backward", "grad"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_runner_cancelled_in_the_loops_turn_hands_on(backend, kind, monkeypatch, restore_engine):
    """The first runners to give the loop a turn are cancelled as they do (slices of no
    length: every runner gives the loop a turn before it runs anything)."""
    ag.autograd.set_engine(ag.autograd.Engine(yield_interval=0.0))
    victims: set[int] = set()
    loop_turn = LoopScheduler.loop_turn

    async def cancelled_turn(self: LoopScheduler) -> None:
        _make_victim(_call.get(), victims)  # (the runner's own call)
        await loop_turn(self)

    monkeypatch.setattr(LoopScheduler, "loop_turn", cancelled_turn)
    anyio.run(_exact_storm, kind, victims, backend=backend)
    assert victims, "no runner gave the loop a turn"


@pytest.mark.anyio
async def test_a_slice_ending_as_the_last_leaf_is_staged_leaves_the_queue_empty(restore_engine):
    """Note [Plain leaves]: a call's last leaf staged by the fused step (outside the ready
    queue) while its slice ends right then leaves nothing queued, and every call
    completes with its gradient. yield_interval=0: every clock check ends the slice."""
    ag.autograd.set_engine(ag.autograd.Engine(yield_interval=0.0))
    w = ag.tensor(np.linspace(-1.0, 1.0, 16), requires_grad=True)

    async def one() -> None:
        y = w
        for _ in range(7):  # with the sum, eight nodes: the core loop reads the clock
            y = y * 1.5  # after the eighth, which stages the leaf
        await ag.backward(y.sum())

    async with anyio.create_task_group() as tg:
        for _ in range(CALLS):
            tg.start_soon(one)
    np.testing.assert_allclose(w.grad.numpy(), np.full(16, CALLS * 1.5 ** 7))
    _assert_scheduler_empty()
