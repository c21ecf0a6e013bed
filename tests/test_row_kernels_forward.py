"""layer_norm's compiled forward (``numba_kernels.layer_norm``, Note [Layer norm's forward
loops]) and log_softmax's (its row maximum and ``(x - max) - log(sum)``): against the numpy
path and PyTorch, float32 and float64, on tricky rows (zeros, +-inf, NaN, large
magnitudes, constant rows, rows of one element), non-contiguous input, every affine case
(none, weight only, weight and bias, and the kernel's bias-only loop); gradcheck in
float64 through the compiled path."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import gradcheck
from asyncgrad.ops import kernels
from asyncgrad.ops import nn as N

DTYPES = [np.float32, np.float64]
AFFINE = ["none", "weight", "weight+bias"]


def _tol(dtype: type) -> dict[str, float]:
    return {"rtol": 3e-5, "atol": 3e-5} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-11}


def _rows(dtype: type, n: int = 37) -> np.ndarray:
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((2, 9, n)) * 5).astype(dtype)
    x[0, 0, :] = 0.0  # a constant row: xhat 0, rstd 1/sqrt(eps)
    x[0, 1, :] = -(2.0**600) if dtype == np.float64 else -(2.0**60)  # large magnitude, constant (sums exact)
    x[0, 2, :] += 1e4 if dtype == np.float64 else 64.0  # far from 0 (float32: as far as its rounding allows)
    x[0, 3, 1 % n] = math.inf
    x[0, 4, 2 % n] = -math.inf
    x[0, 5, 3 % n] = math.nan
    x[0, 6, :] = -0.0
    x[0, 7, ::2] = 3e18 if dtype == np.float32 else 1e150  # a huge spread (variance near overflow)
    return x


def _affine(case: str, n: int, dtype: type) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(22)
    w = rng.standard_normal(n).astype(dtype)
    w[0] = 0.0
    b = rng.standard_normal(n).astype(dtype)
    return {"none": (), "weight": (w,), "weight+bias": (w, b)}[case]


def _layer_norm(x: np.ndarray, affine: tuple[np.ndarray, ...]) -> Any:
    with np.errstate(all="ignore"):
        return N._layer_norm(x, *affine, dims=(x.ndim - 1,), eps=1e-5)


def _close(a: np.ndarray, b: np.ndarray, dtype: type) -> None:
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a, b, equal_nan=True, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", AFFINE)
@pytest.mark.parametrize("n", [1, 2, 8, 37, 128])
def test_layer_norm_compiled_forward_equals_numpy_path(on_path, dtype: type, case: str, n: int) -> None:
    x = _rows(dtype, n)
    affine = _affine(case, n, dtype)
    on_path("numpy")
    out_p, (xhat_p, rstd_p) = _layer_norm(x, affine)
    on_path("compiled")
    out_c, (xhat_c, rstd_c) = _layer_norm(x, affine)
    assert out_c.dtype == xhat_c.dtype == rstd_c.dtype == np.dtype(dtype)  # never upcast
    assert out_c.shape == x.shape and xhat_c.shape == (18, n) and rstd_c.shape == (18, 1)
    _close(out_c, out_p, dtype)
    _close(xhat_c, xhat_p, dtype)
    _close(rstd_c, rstd_p, dtype)
    if n == 1:  # one element per row: xhat 0 (NaN where x is not finite), rstd 1/sqrt(eps)
        finite = np.isfinite(x.reshape(-1))
        assert not xhat_c[finite].any()
        np.testing.assert_allclose(rstd_c[finite], 1 / math.sqrt(1e-5), rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_compiled_on_non_contiguous_input(on_path, dtype: type) -> None:
    base = _rows(dtype, 64)
    x = base[:, :, ::2]  # strided
    xt = np.ascontiguousarray(base[:, :, :32]).transpose(1, 0, 2).copy().transpose(1, 0, 2)  # permuted
    assert not x.flags.c_contiguous and not xt.flags.c_contiguous
    affine = _affine("weight+bias", 32, dtype)
    on_path("compiled")
    for arr in (x, xt):
        got = _layer_norm(arr, affine)[0]
        want = _layer_norm(np.ascontiguousarray(arr), affine)[0]
        assert got.tobytes() == want.tobytes()
    on_path("numpy")
    _close(got, _layer_norm(xt, affine)[0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_kernel_bias_only_loop(on_path, dtype: type) -> None:
    on_path("compiled")
    k = kernels.compiled()
    x = _rows(dtype, 16).reshape(-1, 16)
    b = np.linspace(-1, 1, 16).astype(dtype)
    out, xhat, rstd = np.empty_like(x), np.empty_like(x), np.empty((x.shape[0], 1), dtype)
    with np.errstate(all="ignore"):
        k.layer_norm(x, np.empty(0, dtype), b, 1e-5, out, xhat, rstd)
    assert out.tobytes() == (xhat + b).tobytes()
    on_path("numpy")
    _close(xhat, _layer_norm(x, ())[1][0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", AFFINE)
def test_layer_norm_compiled_matches_torch(on_path, dtype: type, case: str) -> None:
    torch = pytest.importorskip("torch")
    on_path("compiled")
    rng = np.random.default_rng(23)
    x = (rng.standard_normal((4, 16, 128)) * 3).astype(dtype)
    x[0, 0] += 1e4 if dtype == np.float64 else 64.0
    x[0, 1] = 0.0
    affine = _affine(case, 128, dtype)
    g = rng.standard_normal(x.shape).astype(dtype)
    leaves = [ag.from_numpy(a.copy()).requires_grad_() for a in (x, *affine)]
    y = AF.layer_norm(leaves[0], (128,), *leaves[1:])
    ag.backward_sync(y, ag.from_numpy(g))
    tleaves = [torch.from_numpy(a.copy()).requires_grad_() for a in (x, *affine)]
    ty = torch.nn.functional.layer_norm(tleaves[0], (128,), *tleaves[1:])
    ty.backward(torch.from_numpy(g))
    tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **tol)
    for ours, theirs in zip(leaves, tleaves):
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), **{**tol, "atol": 1e-3 if
                                   dtype == np.float32 and ours is not leaves[0] else tol["atol"]})


@pytest.mark.parametrize("case", AFFINE)
def test_layer_norm_gradcheck_in_float64_through_the_compiled_path(on_path, case: str) -> None:
    on_path("compiled")
    rng = np.random.default_rng(24)
    x = ag.tensor(rng.standard_normal((3, 2, 5)), requires_grad=True)
    affine = [ag.tensor(a, requires_grad=True) for a in _affine(case, 5, np.float64)]
    assert gradcheck(lambda a, *p: AF.layer_norm(a, (5,), *p), (x, *affine))
    assert gradcheck(lambda a, *p: AF.layer_norm(a, (2, 5), *[q.reshape(1, 5) * ag.ones((2, 1), dtype=np.float64)
                                                              for q in p]), (x, *affine))


# --- log_softmax ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 65, 130])
def test_log_softmax_compiled_equals_numpy_path(on_path, dtype: type, n: int) -> None:
    rng = np.random.default_rng(25)
    x = (rng.standard_normal((12, n)) * 6).astype(dtype)
    x[0, :] = -1e30 if dtype == np.float64 else -1e30  # a large constant row: -log(n), not 0
    x[1, :] = 0.0
    x[2, :] = -0.0
    x[3, n // 2] = 80.0  # one dominant logit
    x[4, :] = 1e4
    x[5, -1] = -math.inf  # a masked logit
    x[6, 0] = math.inf
    x[7, -1] = math.nan
    x[8, :] = -math.inf  # every logit masked: NaN, as PyTorch
    x[9, :] = 3e38 if dtype == np.float32 else 1e300
    xt = np.ascontiguousarray(x.T).T  # non-contiguous
    for arr in (x, xt):
        with np.errstate(all="ignore"):
            on_path("numpy")
            plain = N._log_softmax(arr, dim=1)
            on_path("compiled")
            fast = N._log_softmax(arr, dim=1)
        assert fast.dtype == np.dtype(dtype)
        _close(fast, plain, dtype)
    np.testing.assert_allclose(fast[0], -math.log(n), rtol=1e-6)
    assert np.all(np.isnan(fast[8])) and np.all(np.isnan(fast[6])) and np.all(np.isnan(fast[7]))
    assert np.isneginf(fast[5, -1]) or n == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_compiled_matches_torch(on_path, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    on_path("compiled")
    rng = np.random.default_rng(26)
    x = (rng.standard_normal((64, 65)) * 4).astype(dtype)
    x[0] = -1e30
    x[1] = 1e4
    x[2, 5] = -math.inf
    got = AF.log_softmax(ag.from_numpy(x), -1).numpy()
    want = torch.log_softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_allclose(got, want, **({"rtol": 1e-6, "atol": 2e-6} if dtype == np.float32
                                             else {"rtol": 1e-13, "atol": 1e-13}))


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_max_is_numpys_max_on_tricky_rows(on_path, dtype: type) -> None:
    numba = pytest.importorskip("numba")
    on_path("compiled")
    inner = kernels.compiled()._row_max
    row_max = numba.njit(lambda r: inner(r))  # noqa: PLW0108
    big = float(np.finfo(dtype).max)
    tiny = float(np.finfo(dtype).smallest_subnormal)
    pool = [0.0, -0.0, math.inf, -math.inf, big, -big, tiny, -tiny, 1.0, -1.0, 2.5, -1e-3]
    rng = np.random.default_rng(27)
    for n in [1, 2, 3, 7, 8, 9, 15, 16, 17, 65, 130]:
        for _ in range(40):
            row = np.asarray(rng.choice(pool, n), dtype=dtype)
            got = row_max(row)
            assert got == row.max(), (row, got)
            if dtype == np.float32 and got == 0:  # integer keys: +0.0 wherever +0.0 is in the row
                assert np.signbit(got) == np.all(np.signbit(row[row == 0])), (row, got)
    assert row_max(np.array([-0.0, -1.0], dtype)) == 0 and np.signbit(row_max(np.array([-0.0, -1.0], dtype)))
    assert row_max(np.array([-math.inf] * 9, dtype)) == -math.inf
