"""The fixed cost of one ``await backward(...)`` on a loop (issue 11): what the per-call
path looks up once per loop instead of on every call, and that the shortcuts keep the
behaviour (an already-cancelled caller starts nothing, a fresh root gradient per call).
Observed through values, events and call counts, never through durations."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.sched import admission as admission_module
from asyncgrad.autograd.sched import loop as scheduler_module


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_back_end_is_looked_up_once_per_loop_not_per_call(backend, monkeypatch):
    """``anyio.lowlevel.checkpoint_if_cancelled`` finds the running back end (sniffio)
    on every call; the engine looks it up once, when the loop's scheduler is made."""
    if backend == "trio":
        pytest.importorskip("trio")
    from anyio._core import _eventloop

    lookups = []
    real = _eventloop.get_async_backend

    def counted(*args, **kwargs):
        lookups.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_eventloop, "get_async_backend", counted)
    monkeypatch.setattr(anyio.lowlevel, "get_async_backend", counted)  # (its own binding)
    w = ag.tensor(np.ones(3), requires_grad=True)

    async def main() -> None:
        await ag.backward((w * 2.0).sum())  # the loop's scheduler is made here
        before = len(lookups)
        for _ in range(20):
            await ag.backward((w * 2.0).sum())
        assert len(lookups) == before  # none per call

    anyio.run(main, backend=backend)
    assert w.grad.tolist() == [42.0] * 3


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_backward_called_in_an_already_cancelled_scope_starts_nothing(backend):
    if backend == "trio":
        pytest.importorskip("trio")
    w = ag.tensor(np.ones(3), requires_grad=True)
    ran = []
    loss = (w * 2.0).sum()
    loss.grad_fn.register_prehook(lambda grads: ran.append("node"))

    async def main() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await ag.backward(loss, retain_graph=True)
            ran.append("returned")  # never: the cancellation is delivered at the call
        assert scope.cancelled_caught
        await ag.backward(loss)  # the saved tensors are still there: nothing ran or was freed

    anyio.run(main, backend=backend)
    assert ran == ["node"]
    assert w.grad.tolist() == [2.0] * 3


async def test_each_call_gets_a_fresh_root_gradient():
    """The implicit root gradient of ``backward(scalar)`` is a new array of ones every
    call (a copy of a kept one): a hook that writes into the one it sees changes that
    backward only, not the next call's."""
    w = ag.tensor(np.ones(2), requires_grad=True)
    seen = []

    def hook(g):
        seen.append((float(np.asarray(g.numpy())), g.dtype, id(g.numpy())))
        g.numpy()[...] = 100.0  # in place: this backward goes on with 100
        return None

    for dtype in (np.float64, np.float32, np.float64):
        loss = (w * 3.0).sum()
        if dtype is np.float32:
            loss = loss.to(np.float32)
        loss.register_hook(hook)
        await ag.backward(loss)
    assert [v for v, _, _ in seen] == [1.0, 1.0, 1.0]
    assert [d for _, d, _ in seen] == [np.float64, np.float32, np.float64]
    assert w.grad.tolist() == [900.0] * 2


async def test_a_caller_that_starts_at_once_and_one_that_waits_in_line_both_commit():
    """The two paths of ``backward``/``grad`` (Note [Admission]): a caller the loop
    admits at once, and callers that wait in line behind a busy runner."""
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine(max_workers=2, yield_interval=1e-6))
    try:
        w = ag.tensor(np.zeros(3), requires_grad=True)
        scheduler = scheduler_module.loop_scheduler()
        assert scheduler.runner is None
        await ag.backward((w * 1.0).sum())  # at once
        held = []
        real = admission_module.Admission.__aenter__

        async def counted(self):
            held.append(1)
            await real(self)

        admission_module.Admission.__aenter__ = counted  # type: ignore[method-assign]
        try:
            results = await asyncio.gather(*(ag.backward((w * float(i)).sum()) for i in range(16)),
                                           *(ag.grad((w * float(i)).sum(), w) for i in range(16)))
        finally:
            admission_module.Admission.__aenter__ = real  # type: ignore[method-assign]
        assert held  # some waited in line
        assert w.grad.tolist() == [1.0 + sum(range(16))] * 3
        assert [r[0].tolist() for r in results[16:]] == [[float(i)] * 3 for i in range(16)]
    finally:
        ag.autograd.set_engine(prev)
