"""Note [A tensor times itself] (autograd/task/step.py): ``x * x`` in the fused inline step
computes its one gradient once and adds it to itself, bit for bit what the two rules
and the buffer's sum give; hooks and ``create_graph`` still see two gradients."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.ops import elementwise


@pytest.fixture(autouse=True)
def _an_engine():
    """These tests check the Engine's fused step: on an Engine, also under
    ``--reference-engine`` (the reference executor runs both rules)."""
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine())
    yield
    ag.autograd.set_engine(prev)


@pytest.fixture
def mul_rule_calls(monkeypatch):
    """Which of mul's two rules ran, in order (the spec's rules wrapped, values kept)."""
    calls: list[int] = []
    spec = elementwise.mul
    real = spec.vjps

    def counted(i, rule):
        def run(*args, **kwargs):
            calls.append(i)
            return rule(*args, **kwargs)
        return run

    object.__setattr__(spec, "vjps", tuple(counted(i, r) for i, r in enumerate(real)))
    yield calls
    object.__setattr__(spec, "vjps", real)


def _data(shape=(300, 400), seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("shape", [(7,), (300, 400)], ids=["small", "deferred-sum-size"])
async def test_a_square_runs_one_rule_and_gives_the_sum_of_both_bit_for_bit(mul_rule_calls, adopted, shape):
    x0 = _data(shape)
    x = ag.from_numpy(x0.copy()).requires_grad_()
    await ag.backward((x * x).mean())
    g = np.float32(1) / np.float32(x0.size)
    assert mul_rule_calls == [0]
    np.testing.assert_array_equal(x.grad.numpy(), g * x0 + g * x0)
    assert x0.dtype == x.grad.numpy().dtype
    assert adopted == [True]  # the doubled array is the engine's own: it becomes .grad
    np.testing.assert_array_equal(x.numpy(), x0)  # the input was not written


async def test_a_square_of_a_non_leaf_feeds_its_producer_the_doubled_gradient(mul_rule_calls):
    a0 = _data((64, 32), seed=1)
    a = ag.from_numpy(a0.copy()).requires_grad_()
    h = a.relu()
    await ag.backward((h * h).sum())
    assert mul_rule_calls == [0]
    np.testing.assert_array_equal(a.grad.numpy(), np.where(a0 > 0, a0 + a0, np.float32(0)))


async def test_a_second_backward_adds_into_the_adopted_gradient(mul_rule_calls):
    x0 = _data((50, 40), seed=2)
    x = ag.from_numpy(x0.copy()).requires_grad_()
    await ag.backward((x * x).sum())
    first = x.grad.numpy().copy()
    await ag.backward((x * x).sum())
    np.testing.assert_array_equal(x.grad.numpy(), first + first)
    np.testing.assert_array_equal(x.numpy(), x0)


async def test_a_product_of_two_tensors_runs_both_rules(mul_rule_calls):
    x0, y0 = _data((20, 30), seed=3), _data((20, 30), seed=4)
    x = ag.from_numpy(x0.copy()).requires_grad_()
    y = ag.from_numpy(y0.copy()).requires_grad_()
    await ag.backward((x * y).sum())
    assert sorted(mul_rule_calls) == [0, 1]
    np.testing.assert_array_equal(x.grad.numpy(), y0)
    np.testing.assert_array_equal(y.grad.numpy(), x0)


async def test_a_post_hook_on_the_product_sees_both_gradients(mul_rule_calls):
    """A node with hooks takes the general path: PyTorch's two gradients."""
    x0 = _data((10, 10), seed=5)
    x = ag.from_numpy(x0.copy()).requires_grad_()
    y = x * x
    seen: list[list[np.ndarray]] = []
    y.grad_fn.register_hook(lambda grads_in, grads_out: seen.append([g.numpy().copy() for g in grads_in]))
    await ag.backward(y.sum())
    assert sorted(mul_rule_calls) == [0, 1]
    assert len(seen) == 1 and len(seen[0]) == 2
    np.testing.assert_array_equal(seen[0][0], x0)
    np.testing.assert_array_equal(seen[0][1], x0)
    np.testing.assert_array_equal(x.grad.numpy(), x0 + x0)


async def test_a_tensor_hook_sees_the_sum_once():
    x0 = _data((10, 10), seed=6)
    x = ag.from_numpy(x0.copy()).requires_grad_()
    seen: list[np.ndarray] = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    await ag.backward((x * x).sum())
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], x0 + x0)


def test_second_derivatives_of_a_square_are_unchanged():
    x = ag.tensor(np.random.default_rng(7).standard_normal((4, 3)), requires_grad=True)
    assert ag.autograd.gradcheck(lambda t: t * t, (x,))
    assert ag.autograd.gradgradcheck(lambda t: t * t, (x,))


def test_an_mlp_loss_written_as_a_product_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x0 = rng.standard_normal((32, 64)).astype(np.float32)
    w0 = (rng.standard_normal((48, 64)) * 0.1).astype(np.float32)
    b0 = (rng.standard_normal(48) * 0.1).astype(np.float32)
    from asyncgrad.functional import linear

    w, b = ag.from_numpy(w0.copy()).requires_grad_(), ag.from_numpy(b0.copy()).requires_grad_()
    h = linear(ag.from_numpy(x0), w, b).relu()
    ag.backward_sync((h * h).mean())
    tw, tb = torch.from_numpy(w0.copy()).requires_grad_(), torch.from_numpy(b0.copy()).requires_grad_()
    th = torch.relu(torch.nn.functional.linear(torch.from_numpy(x0), tw, tb))
    (th * th).mean().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-7)
