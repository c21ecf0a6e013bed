"""A stack times a matrix (``(B, T, k) @ (k, m)``: a GPT's logits) as one GEMM over all
rows, forward and both gradients (Note [A stack times a matrix] in ``ops/linalg.py``),
against numpy's per-matrix ``matmul``, gradcheck in float64, and PyTorch where installed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck
from asyncgrad.ops import linalg

DTYPES = [np.float32, np.float64]


def _operands(dtype: type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 8)).astype(dtype)
    w = rng.standard_normal((8, 6)).astype(dtype)
    g = rng.standard_normal((3, 5, 6)).astype(dtype)
    return x, w, g


def _run(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> list[np.ndarray]:
    tx, tw = ag.from_numpy(x.copy()).requires_grad_(), ag.from_numpy(w.copy()).requires_grad_()
    y = tx @ tw
    ag.backward_sync(y, ag.from_numpy(g.copy()))
    return [y.numpy(), tx.grad.numpy(), tw.grad.numpy()]


@pytest.mark.parametrize("dtype", DTYPES)
def test_stack_times_matrix_equals_numpy_matmul(dtype) -> None:
    x, w, g = _operands(dtype)
    y, gx, gw = _run(x, w, g)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    np.testing.assert_allclose(y, np.matmul(x, w), **tol)
    np.testing.assert_allclose(gx, np.matmul(g, w.T), **tol)
    np.testing.assert_allclose(gw, np.matmul(x.swapaxes(-1, -2), g).sum(0), **tol)
    assert y.dtype == gx.dtype == gw.dtype == dtype
    assert y.shape == (3, 5, 6) and gx.shape == x.shape and gw.shape == w.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_stack_times_matrix_propagates_tricky_values_as_numpy(dtype) -> None:
    x, w, g = _operands(dtype)
    x[0, 0, :4] = [math.inf, -math.inf, math.nan, 0.0]
    x[1, 2, 3] = 1e30
    g[2, 4, :2] = [math.nan, math.inf]
    with np.errstate(all="ignore"):
        y, gx, gw = _run(x, w, g)
        refs = [np.matmul(x, w), np.matmul(g, w.T), np.matmul(x.swapaxes(-1, -2), g).sum(0)]
    for ours, ref in zip((y, gx, gw), refs):
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(ours), np.isinf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(ours[fin], ref[fin], rtol=1e-4 if dtype == np.float32 else 1e-12)


def test_stack_times_matrix_runs_one_gemm_each_way(monkeypatch) -> None:
    x, w, g = _operands(np.float64)
    flat = []
    real = linalg._flat_product
    monkeypatch.setattr(linalg, "_flat_product", lambda a, b: flat.append(a.shape) or real(a, b))
    _run(x, w, g)
    assert flat == [(3, 5, 8), (3, 5, 6)]  # the forward and x's gradient (w's: one GEMM inline)


def test_strided_stacks_and_mixed_dtypes_keep_numpys_matmul() -> None:
    x, w, _ = _operands(np.float64)
    assert linalg._flat_product(x.swapaxes(0, 1), w) is None
    assert linalg._flat_product(x, w.astype(np.float32)) is None
    assert linalg._flat_product(x.astype(np.int64), w.astype(np.int64)) is None
    np.testing.assert_array_equal(linalg._matmul(x.swapaxes(0, 1), w), np.matmul(x.swapaxes(0, 1), w))


def test_gradcheck_stack_times_matrix_in_float64() -> None:
    x, w, _ = _operands(np.float64)
    assert gradcheck(lambda a, b: a @ b, (ag.tensor(x, requires_grad=True), ag.tensor(w, requires_grad=True)))
    assert gradcheck(lambda a, b: a @ b.transpose(0, 1),
                     (ag.tensor(x, requires_grad=True), ag.tensor(w.T.copy(), requires_grad=True)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_stack_times_matrix_matches_torch(dtype) -> None:
    torch = pytest.importorskip("torch")
    x, w, g = _operands(dtype)
    y, gx, gw = _run(x, w, g)
    tx, tw = torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(w.copy()).requires_grad_()
    ty = tx @ tw
    ty.backward(torch.from_numpy(g.copy()))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    for ours, theirs in zip((y, gx, gw), (ty.detach(), tx.grad, tw.grad)):
        np.testing.assert_allclose(ours, theirs.numpy(), **tol)


@pytest.mark.parametrize("sa, sb", [((2, 3, 0), (0, 4)), ((2, 0, 5), (5, 4)), ((0, 3, 5), (5, 4)),
                                    ((2, 3, 5), (5, 0))])
async def test_empty_stacks_and_matrices_multiply_as_numpy(sa, sb) -> None:
    # an empty dimension: numpy's matmul (zeros of the product's shape), gradients of
    # the inputs' shapes (the one-GEMM path cannot reshape(-1, 0), so it steps aside)
    a = ag.tensor(np.ones(sa, np.float32), requires_grad=True)
    b = ag.tensor(np.ones(sb, np.float32), requires_grad=True)
    out = a @ b
    want = np.matmul(np.ones(sa, np.float32), np.ones(sb, np.float32))
    assert out.shape == want.shape
    np.testing.assert_array_equal(out.numpy(), want)
    await ag.backward(out.sum())
    assert a.grad.shape == sa and b.grad.shape == sb
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros(sa, np.float32) + sb[1] * (sa[1] > 0))
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros(sb, np.float32) + sa[0] * sa[1] * (sb[1] > 0))
