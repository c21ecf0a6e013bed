"""Note [ReLU backward by bit mask] (ops/_array_math.py): relu's gradient is the incoming
gradient where the output is positive and +0 elsewhere, bit for bit what PyTorch's
threshold_backward (``where(ans > 0, g, 0)``) gives, also where the incoming gradient
is infinite or NaN (a multiplication by the mask would make those NaN)."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck


def _relu_grad(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    t = ag.from_numpy(x).requires_grad_()
    out = t.relu()
    ag.backward_sync(out, ag.from_numpy(g))
    return t.grad.numpy()


def _tricky(dtype: type) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 7)).astype(dtype)
    g = rng.standard_normal((9, 7)).astype(dtype)
    x.flat[:8] = [-1.0, -2.0, 0.0, -0.0, -5.0, 3.0, 1.0, -np.inf]
    g.flat[:8] = [np.inf, np.nan, -np.inf, np.nan, 5.0, -0.0, np.nan, np.inf]
    return x, g


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_relu_gradient_is_the_plain_rule_bit_for_bit_with_nonfinite_gradients(dtype) -> None:
    x, g = _tricky(dtype)
    plain = np.where(np.maximum(x, 0) > 0, g, dtype(0))  # the rule before Note [ReLU backward by bit mask]
    ours = _relu_grad(x, g)
    assert ours.dtype == plain.dtype
    assert np.array_equal(ours.view(np.uint8), plain.view(np.uint8))  # NaN, inf and the sign of 0 too


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_relu_gradient_is_torch_bit_for_bit_with_nonfinite_gradients(dtype) -> None:
    torch = pytest.importorskip("torch")
    x, g = _tricky(dtype)
    ours = _relu_grad(x, g)
    tx = torch.from_numpy(x.copy()).requires_grad_()
    torch.relu(tx).backward(torch.from_numpy(g.copy()))
    theirs = tx.grad.numpy()
    assert ours.dtype == theirs.dtype
    assert np.array_equal(ours.view(np.uint8), theirs.view(np.uint8))  # NaN, inf and the sign of 0 too


def test_relu_gradient_at_a_nan_input_is_zero() -> None:
    # (as the rule always had it: where(ans > 0, g, 0); PyTorch passes g where its
    # output is NaN, since it tests ans <= 0)
    x = np.array([np.nan, 1.0, -1.0], dtype=np.float32)
    g = np.array([5.0, 6.0, 7.0], dtype=np.float32)
    assert np.array_equal(_relu_grad(x, g), [0.0, 6.0, 0.0])


def test_relu_gradient_of_a_transposed_gradient() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    g = np.asfortranarray(rng.standard_normal((6, 4)).astype(np.float32))  # non-contiguous in C order
    assert np.array_equal(_relu_grad(x, g), np.where(x > 0, g, 0.0))


def test_relu_gradient_leaves_the_incoming_gradient_alone() -> None:
    x = np.array([-1.0, 2.0, -3.0, 4.0])
    g = np.array([10.0, 20.0, 30.0, 40.0])
    before = g.copy()
    assert np.array_equal(_relu_grad(x, g), [0.0, 20.0, 0.0, 40.0])
    assert np.array_equal(g, before)


def test_relu_gradcheck_float64_in_a_chain() -> None:
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((5, 6))
    x0[np.abs(x0) < 0.1] += 0.5  # away from the kink
    w0 = rng.standard_normal((6, 6))
    x = ag.from_numpy(x0).requires_grad_()
    w = ag.from_numpy(w0).requires_grad_()
    assert gradcheck(lambda a, b: ((a @ b).relu() * a.sin()).relu(), (x, w))
