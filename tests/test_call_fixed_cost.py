"""The per-call path of ``await backward`` (Note [The fixed cost of a call] in engine.py):
the commit without a coroutine, final callbacks only when queued, the set-up steps
within the slice, the BLAS call counters. Order of events, not durations."""

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.task import graph_task as graph_task_module
from asyncgrad.autograd.task.graph_task import GraphTask
from asyncgrad.autograd.runtime.blas import BLAS


def _graph(events):
    w = ag.tensor([1.0, 2.0, 3.0], dtype=ag.float64, requires_grad=True)
    w.register_hook(lambda g: events.append("leaf hook"))
    loss = (w * w).sum()

    def queue(g):
        events.append("node")

        def first():
            events.append(("callback", w.grad.numpy().tolist()))
            ag.autograd.queue_callback(lambda: events.append("queued by a callback"))

        ag.autograd.queue_callback(first)

    loss.grad_fn.register_prehook(queue)
    return w, loss


@pytest.mark.parametrize("threshold", [None, 1])  # inline commit / commit summed on a worker
async def test_callbacks_after_the_commit_on_either_commit_path(threshold):
    engine = Engine(inline_threshold=threshold)
    events = []
    w, loss = _graph(events)
    task_engine = ag.autograd.get_engine()
    ag.autograd.set_engine(engine)
    try:
        await ag.backward(loss)
    finally:
        ag.autograd.set_engine(task_engine)
    assert events == ["node", "leaf hook", ("callback", [2.0, 4.0, 6.0]), "queued by a callback"]
    with pytest.raises(RuntimeError):  # saved tensors released after the commit
        await ag.backward(loss)


async def test_no_callback_queued_commits_and_releases():
    w = ag.tensor([1.0, -2.0], dtype=ag.float64, requires_grad=True)
    loss = (w * w * w).sum()
    await ag.backward(loss, retain_graph=True)
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 12.0])
    await ag.backward(loss)  # retained: runs again, accumulates
    np.testing.assert_allclose(w.grad.numpy(), [6.0, 24.0])


async def test_setup_longer_than_a_slice_lets_the_loop_run_and_completes(monkeypatch):
    """With a zero yield interval and a step per node, the set-up steps leave the slice
    at once: the rest runs in ``run_steps``, which gives the loop turns (a task started
    before the call runs before the call returns), and the gradients are those of the
    whole graph."""
    monkeypatch.setattr(graph_task_module, "SETUP_STEP", 1)
    ran: list[str] = []
    w = await _long_chain_backward_beside_another_task(ran)
    assert ran == ["other task", "backward returned"]
    np.testing.assert_allclose(w.grad.numpy(), np.ones(4))


async def _long_chain_backward_beside_another_task(events: list[str]) -> ag.Tensor:
    """The backward of a 60-node chain on an engine with a zero yield interval, in a task
    group where another task was started just before; "other task" and "backward
    returned" go to ``events`` as they happen. Returns the chain's leaf."""
    engine = Engine(yield_interval=0.0)
    old = ag.autograd.get_engine()
    ag.autograd.set_engine(engine)
    try:
        w = ag.tensor(np.arange(4.0), dtype=ag.float64, requires_grad=True)
        h = w
        for _ in range(30):
            h = h * 1.0 + 0.0
        loss = h.sum()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _note(events))
            await ag.backward(loss)
            events.append("backward returned")
    finally:
        ag.autograd.set_engine(old)
    return w


async def _note(ran):
    ran.append("other task")


async def test_blas_call_counter_back_to_zero_after_success_error_and_cancellation():
    start = BLAS._backwards
    w = ag.tensor([1.0, 2.0], dtype=ag.float64, requires_grad=True)
    await ag.backward((w * 2).sum())
    assert BLAS._backwards == start
    loss = (w * 3).sum()
    loss.grad_fn.register_prehook(lambda g: (_ for _ in ()).throw(ValueError("boom")))
    with pytest.raises(ValueError, match="boom"):
        await ag.backward(loss)
    assert BLAS._backwards == start
    with anyio.CancelScope() as scope:
        scope.cancel()
        await ag.backward((w * 4).sum())  # already cancelled: starts nothing
    assert BLAS._backwards == start
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 2.0])


async def test_first_call_starts_the_setup_once():
    engine = Engine()
    assert not engine.policy.setup_started
    old = ag.autograd.get_engine()
    ag.autograd.set_engine(engine)
    try:
        w = ag.tensor([1.0], dtype=ag.float64, requires_grad=True)
        await ag.backward((w * 2).sum())
        assert engine.policy.setup_started
        await ag.backward((w * 2).sum())
    finally:
        ag.autograd.set_engine(old)
    np.testing.assert_allclose(w.grad.numpy(), [4.0])


async def test_setup_that_outruns_its_slice_gives_the_loop_its_turn_before_the_next_step(monkeypatch):
    """With a zero yield interval and a step per node, the slice ends after the first
    set-up step: the loop's turn (another task) comes before the second step, not after
    one more step of a fresh interval in ``run_steps``."""
    monkeypatch.setattr(graph_task_module, "SETUP_STEP", 1)
    events: list[str] = []
    real_setup = GraphTask.setup_steps

    def counted_setup(self):
        for step in real_setup(self):
            events.append("step")
            yield step

    monkeypatch.setattr(GraphTask, "setup_steps", counted_setup)
    await _long_chain_backward_beside_another_task(events)
    assert events.count("step") >= 2, events  # (a set-up of more than one step)
    assert events[:2] == ["step", "other task"], events
