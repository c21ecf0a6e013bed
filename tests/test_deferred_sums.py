"""Deferred input-buffer sums (Note [Deferred sums] in autograd/task/input_buffer.py): large
gradients meeting at one input are added by the consumer (a worker thread when it is
offloaded, the commit for a leaf), with exactly the result of eager summation."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, set_engine
from asyncgrad.autograd.task import input_buffer

N = input_buffer.LAZY_SUM_MIN + 17  # large enough to be deferred



def _leaves(seed: int):
    rng = np.random.default_rng(seed)
    x = ag.tensor(rng.standard_normal(N), requires_grad=True)
    w = ag.tensor(rng.uniform(0.5, 1.5, N), requires_grad=True)
    return x, w


def _fan_in_loss(x, w, branches: int = 5):
    """``w`` (a leaf) and ``h`` (a non-leaf feeding a heavy node) each get one large
    gradient per branch."""
    h = x * w
    total = None
    for k in range(branches):
        b = ((h * (k + 1.0)).sin() * w).tanh()
        total = b if total is None else total + b
    return (h.exp() * total).sum()


async def _grads(engine: Engine, seed: int, lazy_min: int, monkeypatch) -> tuple[np.ndarray, np.ndarray]:
    monkeypatch.setattr(input_buffer, "LAZY_SUM_MIN", lazy_min)
    set_engine(engine)
    x, w = _leaves(seed)
    await ag.backward(_fan_in_loss(x, w))
    await ag.backward(_fan_in_loss(x, w))  # accumulates into existing .grad
    return x.grad.numpy().copy(), w.grad.numpy().copy()


@pytest.mark.parametrize("seed", [0, 1])
async def test_deferred_sums_equal_eager_sums_bit_for_bit(restore_engine, monkeypatch, seed):
    """On the inline engine gradients arrive in one order, so deferred and eager sums
    must agree exactly; offloaded, arrival order varies run to run (as it would with
    eager sums), so there the results agree to rounding."""
    inline = 2**62
    eager = await _grads(Engine(inline_threshold=inline), seed, 2**62, monkeypatch)
    deferred = await _grads(Engine(inline_threshold=inline), seed, input_buffer.LAZY_SUM_MIN, monkeypatch)
    np.testing.assert_array_equal(deferred[0], eager[0])
    np.testing.assert_array_equal(deferred[1], eager[1])
    for threshold in (1000, 0):
        offloaded = await _grads(Engine(inline_threshold=threshold), seed, input_buffer.LAZY_SUM_MIN, monkeypatch)
        np.testing.assert_allclose(offloaded[0], eager[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(offloaded[1], eager[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threshold", [2**62, 1000, 0])
async def test_offloaded_deferred_sums_are_exact_on_integer_valued_data(restore_engine, threshold):
    """Integer-valued float64 sums are exact in any order: a linear fan-in graph gives
    exactly the closed-form gradient whichever worker finishes first."""
    set_engine(Engine(inline_threshold=threshold))
    rng = np.random.default_rng(5)
    x0, w0 = rng.integers(-4, 5, N).astype(np.float64), rng.integers(-4, 5, N).astype(np.float64)
    x, w = ag.tensor(x0, requires_grad=True), ag.tensor(w0, requires_grad=True)
    h = x * w
    loss = None
    for k in range(6):
        b = (h * float(k + 1)) * w
        loss = b if loss is None else loss + b
    await ag.backward(loss.sum())
    # loss = 21 * x * w^2: dx = 21 w^2, dw = 42 x w
    np.testing.assert_array_equal(x.grad.numpy(), 21.0 * w0 * w0)
    np.testing.assert_array_equal(w.grad.numpy(), 42.0 * x0 * w0)


async def test_large_sums_run_on_worker_threads_when_their_consumer_does(restore_engine, monkeypatch):
    threads: list[str] = []
    total = input_buffer.PendingSum.total

    def recording_total(self):
        threads.append(threading.current_thread().name)
        return total(self)

    monkeypatch.setattr(input_buffer.PendingSum, "total", recording_total)
    set_engine(Engine(inline_threshold=1000))
    x, w = _leaves(0)
    await ag.backward(_fan_in_loss(x, w))
    main = threading.main_thread().name
    assert threads, "no sum was deferred"
    assert main not in threads


async def test_hooks_and_grad_see_the_summed_gradient(restore_engine):
    set_engine(Engine(inline_threshold=1000))
    x, w = _leaves(0)
    seen: list[object] = []
    w.register_hook(lambda g: seen.append(g))
    loss = _fan_in_loss(x, w)
    gx, gw = await ag.grad(loss, [x, w], retain_graph=True)
    assert isinstance(gw, ag.Tensor) and gw.shape == (N,)
    await ag.backward(loss)
    assert len(seen) == 2 and all(isinstance(g, ag.Tensor) and g.shape == (N,) for g in seen)
    np.testing.assert_array_equal(seen[1].numpy(), w.grad.numpy())
    # (two runs: branches may finish in another order, so equal up to rounding)
    np.testing.assert_allclose(gw.numpy(), w.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx.numpy(), x.grad.numpy(), rtol=1e-12, atol=1e-12)


async def test_retain_grad_of_a_non_leaf_with_many_consumers(restore_engine):
    set_engine(Engine(inline_threshold=1000))
    x, w = _leaves(0)
    h = x * w
    h.retain_grad()
    loss = (h.sin() + h.cos() + h * 3.0).sum()
    await ag.backward(loss)
    expected = np.cos(h.numpy()) - np.sin(h.numpy()) + 3.0
    np.testing.assert_allclose(h.grad.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), expected * w.numpy(), rtol=1e-12)


def test_pending_sum_groups_terms_like_eager_addition():
    rng = np.random.default_rng(3)
    a, b, c, d = (rng.standard_normal(N).astype(np.float32) for _ in range(4))
    inner = input_buffer.combine(c, d)
    assert type(inner) is input_buffer.PendingSum
    outer = input_buffer.combine(input_buffer.combine(a, b), inner)
    np.testing.assert_array_equal(input_buffer.value(outer), (a + b) + (c + d))
    small = np.ones(3)
    assert type(input_buffer.combine(small, small)) is np.ndarray
    assert input_buffer.combine(None, a) is a and input_buffer.combine(a, None) is a


# --- the InputBuffer (Note [Input buffers]) -------------------------------------------
def test_input_buffer_adds_in_arrival_order_and_groups_like_eager_sums():
    rng = np.random.default_rng(4)
    a, b, c, d = (rng.standard_normal(N).astype(np.float32) for _ in range(4))
    s, t = rng.standard_normal(3), rng.standard_normal(3)
    buf = input_buffer.InputBuffer(3, 1, a)  # three inputs; the first gradient is for input 1
    buf.add(1, b)
    buf.add(2, s)
    buf.add(1, input_buffer.combine(c, d))  # a pending sum arriving as one term
    buf.add(1, None)  # no gradient: nothing changes
    buf.add(2, t)
    assert buf.deferred and buf.ready() is buf  # queued as is: summed by its consumer
    assert input_buffer.slots_of(buf.ready()) is buf.grads
    out = input_buffer.inputs_of(buf.ready())
    assert out[0] is None
    np.testing.assert_array_equal(out[1], (a + b) + (c + d))
    np.testing.assert_array_equal(out[2], s + t)


def test_input_buffer_of_small_gradients_hands_over_a_plain_list():
    g = np.ones(3)
    buf = input_buffer.InputBuffer(2, 1, g)
    buf.add(1, g)
    ready = buf.ready()
    assert type(ready) is list and ready is buf.grads
    assert input_buffer.inputs_of(ready) is ready
    assert ready[0] is None and ready[1].tolist() == [2.0, 2.0, 2.0]


class _TwoOutputs(ag.autograd.Function):
    """``(x * 2, x * 3)``; its backward records the gradients it receives."""

    seen: list[tuple[object, object]] = []

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2.0, x * 3.0

    @staticmethod
    def backward(ctx, g1, g2):
        _TwoOutputs.seen.append((g1, g2))
        return g1 * 2.0 + (0.0 if g2 is None else g2 * 3.0)


@pytest.mark.parametrize("n", [5, N], ids=["eager", "deferred"])
async def test_a_node_with_several_inputs_gets_summed_slots_and_none(restore_engine, n):
    """Three gradients reach output 0 of a two-output node, none reaches output 1: the
    node sees their sum, added in arrival order (last-created branch first) exactly
    as eager sums group, and None for output 1."""
    set_engine(Engine(inline_threshold=2**62))  # one arrival order: the ready queue's
    _TwoOutputs.seen.clear()
    rng = np.random.default_rng(6)
    x = ag.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True)
    r1, r2, r3 = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    y1, _y2 = _TwoOutputs.apply(x)
    loss = (y1 * ag.tensor(r1)).sum() + (y1 * ag.tensor(r2)).sum() + (y1 * ag.tensor(r3)).sum()
    await ag.backward(loss)
    [(g1, g2)] = _TwoOutputs.seen
    assert g2 is None
    expected = (r3 + r2) + r1
    np.testing.assert_array_equal(g1.numpy(), expected)
    np.testing.assert_array_equal(x.grad.numpy(), expected * np.float32(2.0))
