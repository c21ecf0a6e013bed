"""The fast kernels of ``asyncgrad.ops`` (issue 15) against the plain numpy rules, a
float64 reference and PyTorch where installed, in float32 and float64, with tricky values
(0, -0, +-inf, NaN, huge, subnormal) and sizes that cross the block boundaries.

Every test runs twice: on the numpy kernels and on the compiled ones (``ops/kernels/loader.py``;
skipped without numba), so both paths meet the same checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import gradcheck, gradgradcheck
from asyncgrad.ops.kernels import blockwise as K
from asyncgrad.ops import kernels
from asyncgrad.ops import nn as N
from asyncgrad.ops._array_math import ARRAY_MATH
from asyncgrad.ops.kernels.special import erf, erf_f32_block

TRICKY = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-30, -1e-30, 3.3, -3.3, 4.0, 10.0]
SIZES = [7, 2 * K.BLOCK + 1, 3 * K.BLOCK + 5]  # whole, and blocks with a ragged tail


@pytest.fixture(autouse=True, params=["numpy", "compiled"])
def kernel_path(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The test on one path: the numpy kernels, or the compiled ones, loaded first."""
    prev = kernels.mode()
    if request.param == "compiled":
        pytest.importorskip("numba")
        kernels.set_mode("auto")
        assert kernels.wait(300), kernels.status()
    else:
        kernels.set_mode("numpy")
    yield request.param
    kernels.set_mode(prev)


def _erf_ref(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) if not math.isnan(v) else math.nan for v in x.astype(np.float64).ravel()])


def _values(n: int, dtype: type, scale: float = 3.0) -> np.ndarray:
    x = np.random.default_rng(n).standard_normal(n) * scale
    x[: min(n, len(TRICKY))] = TRICKY[: min(n, len(TRICKY))]
    return x.astype(dtype)


# --- blockwise -------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
def test_blockwise_equals_the_kernel_on_the_whole_array(n: int) -> None:
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.random.default_rng(1).standard_normal(n).astype(np.float32)

    def kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.tanh(a) * b + 1

    np.testing.assert_array_equal(K.blockwise(kernel, x, y), kernel(x, y))


def test_blockwise_keeps_shape_and_reads_non_contiguous_and_0d_input() -> None:
    x = np.random.default_rng(0).standard_normal((3 * K.BLOCK // 64, 128)).astype(np.float32)
    xt = x.T  # not contiguous
    out = K.blockwise(np.exp, xt)
    assert out.shape == xt.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.exp(xt))
    zero_d = K.blockwise(erf_f32_block, np.array(0.5, dtype=np.float32))
    assert isinstance(zero_d, np.ndarray) and zero_d.shape == ()


# --- erf -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
def test_erf_float32_within_7_ulps_of_float64_and_never_upcast(n: int) -> None:
    x = _values(n, np.float32)
    got = erf(x)
    assert got.dtype == np.float32
    want = _erf_ref(x)
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), ~finite)  # NaN in, NaN out
    ulp = np.spacing(np.abs(want[finite]).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[finite] - want[finite]) / ulp) <= 7.5
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=4.5e-7)


def test_erf_float32_tricky_values_exactly() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, 1e30, -1e30, 4.0, -4.0], dtype=np.float32)
    got = erf(x)
    np.testing.assert_array_equal(got, [0.0, -0.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    assert np.signbit(got[1]) and not np.signbit(got[0])
    tiny = np.array([1e-30, -1e-30, 1e-40], dtype=np.float32)  # relative accuracy near 0
    # subnormals carry fewer bits: 1e-43 is 70 steps of the smallest float32
    np.testing.assert_allclose(erf(tiny), tiny.astype(np.float64) * (2 / math.sqrt(math.pi)), rtol=1e-6, atol=1e-43)


def test_erf_float64_matches_math_erf_including_infinities() -> None:
    x = _values(3 * K.BLOCK + 5, np.float64)
    got = erf(x)
    want = _erf_ref(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-15, atol=1e-300)
    np.testing.assert_array_equal(erf(np.array([np.inf, -np.inf, 1e300])), [1.0, -1.0, 1.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_matches_torch(dtype: type) -> None:
    torch = pytest.importorskip("torch")
    x = _values(2 * K.BLOCK + 3, dtype)
    want = torch.erf(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(erf(x), want, rtol=1e-6 if dtype == np.float32 else 1e-14,
                               atol=5e-7 if dtype == np.float32 else 1e-15, equal_nan=True)


# --- gelu ------------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [7, 2 * K.BLOCK + 9])
def test_gelu_fused_backward_equals_the_plain_numpy_rule(approximate: str, dtype: type, n: int) -> None:
    x = _values(n, dtype)
    g = np.random.default_rng(5).standard_normal(n).astype(dtype)
    if approximate == "tanh":
        out = N._gelu_tanh(x, approximate="tanh")
        fast = N._gelu_tanh_rule(ARRAY_MATH, g, out, x, approximate="tanh")
    else:
        out, cdf = N._gelu(x, approximate="none")
        fast = N._gelu_rule(ARRAY_MATH, g, out, x, approximate="none", aux=cdf)
    with np.errstate(all="ignore"):  # the composite rule in float64, rounded to dtype
        x64, g64 = x.astype(np.float64), g.astype(np.float64)
        plain = N._gelu_rule_composite(ARRAY_MATH, g64, None, x64, approximate=approximate).astype(dtype)
    if approximate == "tanh":  # where x^3 overflows in dtype: NaN, as in PyTorch's kernel
        plain[np.abs(x) > np.cbrt(np.finfo(dtype).max)] = np.nan
    assert fast.dtype == np.dtype(dtype) and out.dtype == np.dtype(dtype)
    tol = {"rtol": 2e-6, "atol": 2e-6} if dtype == np.float32 else {"rtol": 1e-13, "atol": 1e-14}
    if dtype == np.float32 and approximate == "tanh":
        # for x << 0 the numpy kernel's 1 + tanh(u) cancels (up to 4e-6 where the gradient
        # is ~0); the compiled one computes it as sigmoid(2u) and does not
        tol["atol"] = 5e-6
    np.testing.assert_allclose(fast, plain, equal_nan=True, **tol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_forward_and_backward_match_torch(approximate: str, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    n = 2 * K.BLOCK + 9
    x = _values(n, dtype)
    x[np.isinf(x)] = 0.0  # +-inf: torch's float32 and float64 kernels disagree with each other
    g = np.random.default_rng(5).standard_normal(n).astype(dtype)
    t = ag.from_numpy(x.copy()).requires_grad_()
    y = AF.gelu(t, approximate=approximate)
    ag.backward_sync(y, ag.from_numpy(g))
    tx = torch.from_numpy(x.copy()).requires_grad_()
    ty = torch.nn.functional.gelu(tx, approximate=approximate)
    ty.backward(torch.from_numpy(g))
    # float32 atol: for x << 0 the tanh form's 1 + tanh cancels; both libraries round
    # differently there, leaving up to 4e-6 where the gradient is ~0
    tol = {"rtol": 2e-6, "atol": 5e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), equal_nan=True, **tol)
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), equal_nan=True, **tol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradcheck_and_gradgradcheck_in_float64(approximate: str) -> None:
    x = ag.tensor(np.linspace(-4.0, 4.0, 11), requires_grad=True)
    assert gradcheck(lambda a: AF.gelu(a, approximate=approximate), (x,))
    assert gradgradcheck(lambda a: AF.gelu(a, approximate=approximate), (x,))


# --- layer_norm: one fused node ---------------------------------------------------------------
def _layer_norm_composite(x: ag.Tensor, dims: tuple[int, ...], w: ag.Tensor | None, b: ag.Tensor | None,
                          eps: float = 1e-5) -> ag.Tensor:
    """The layer norm from primitives (what ``F.layer_norm`` recorded before it was fused)."""
    out = (x - x.mean(dims, keepdim=True)) / (x.var(dims, correction=0, keepdim=True) + eps).sqrt()
    if w is not None:
        out = out * w
    if b is not None:
        out = out + b
    return out


def _ln_inputs(dtype: type, shape: tuple[int, ...], norm: tuple[int, ...], affine: str) -> list[ag.Tensor | None]:
    rng = np.random.default_rng(3)
    x = ag.from_numpy((rng.standard_normal(shape) * 2 + 0.5).astype(dtype)).requires_grad_()
    w = ag.from_numpy(rng.uniform(0.5, 1.5, norm).astype(dtype)).requires_grad_() if affine != "none" else None
    b = ag.from_numpy(rng.standard_normal(norm).astype(dtype)).requires_grad_() if affine == "both" else None
    return [x, w, b]


@pytest.mark.parametrize("affine", ["both", "weight", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,norm", [((4, 6, 16), (16,)), ((3, 5, 4), (5, 4))])
def test_layer_norm_fused_equals_the_composite(affine: str, dtype: type, shape: tuple[int, ...],
                                               norm: tuple[int, ...]) -> None:
    x, w, b = _ln_inputs(dtype, shape, norm, affine)
    dims = tuple(range(len(shape) - len(norm), len(shape)))
    g = ag.from_numpy(np.random.default_rng(4).standard_normal(shape).astype(dtype))
    leaves = [t for t in (x, w, b) if t is not None]
    fused = AF.layer_norm(x, norm, w, b)
    assert fused.grad_fn.name() == "NativeLayerNormBackward0" and fused.dtype == np.dtype(dtype)
    plain = _layer_norm_composite(x, dims, w, b)
    got = ag.grad_sync(fused, leaves, g)
    want = ag.grad_sync(plain, leaves, g)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    np.testing.assert_allclose(fused.numpy(), plain.numpy(), **tol)
    for a, c in zip(got, want):
        assert a.shape == c.shape and a.dtype == c.dtype
        np.testing.assert_allclose(a.numpy(), c.numpy(), **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_matches_torch(dtype: type) -> None:
    torch = pytest.importorskip("torch")
    x, w, b = _ln_inputs(dtype, (8, 16, 32), (32,), "both")
    g = np.random.default_rng(4).standard_normal((8, 16, 32)).astype(dtype)
    y = AF.layer_norm(x, 32, w, b)
    ag.backward_sync(y, ag.from_numpy(g))
    tx, tw, tb = (torch.from_numpy(t.numpy().copy()).requires_grad_() for t in (x, w, b))
    ty = torch.nn.functional.layer_norm(tx, (32,), tw, tb)
    ty.backward(torch.from_numpy(g))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **tol)
    for a, t in ((x, tx), (w, tw), (b, tb)):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), **tol)


@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_gradcheck_and_gradgradcheck(affine: str) -> None:
    x, w, b = _ln_inputs(np.float64, (2, 3, 4), (4,), affine)
    leaves = tuple(t for t in (x, w, b) if t is not None)

    def fn(*ts: ag.Tensor) -> ag.Tensor:
        return AF.layer_norm(ts[0], 4, ts[1] if len(ts) > 1 else None, ts[2] if len(ts) > 2 else None)

    assert gradcheck(fn, leaves)
    assert gradgradcheck(fn, leaves)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_tricky_rows_match_torch_forward_and_backward(dtype: type) -> None:
    """Rows with inf, NaN, a constant row (variance 0: rstd = 1/sqrt(eps)), huge and tiny
    magnitudes, and a non-contiguous input: the gemv/einsum row reductions and the kept
    x-hat give PyTorch's values and gradients, NaN where PyTorch has NaN."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal((6, 8)).astype(dtype)
    x0[0] = 2.5  # constant row
    x0[1, 3] = math.inf
    x0[2, 0] = math.nan
    x0[3] *= 1e15
    x0[4] *= 1e-20
    w0, b0 = rng.uniform(0.5, 1.5, 8).astype(dtype), rng.standard_normal(8).astype(dtype)
    g0 = rng.standard_normal((6, 8)).astype(dtype)
    for view in (False, True):
        src = np.repeat(x0, 2, axis=1)[:, ::2] if view else x0.copy()  # non-contiguous input too
        x = ag.from_numpy(src).requires_grad_()
        w, b = ag.tensor(w0, requires_grad=True), ag.tensor(b0, requires_grad=True)
        with np.errstate(all="ignore"):
            y = AF.layer_norm(x, 8, w, b)
            ag.backward_sync(y, ag.from_numpy(g0))
        tx, tw, tb = (torch.from_numpy(np.ascontiguousarray(a)).requires_grad_() for a in (x0, w0, b0))
        ty = torch.nn.functional.layer_norm(tx, (8,), tw, tb)
        ty.backward(torch.from_numpy(g0))
        tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-11}
        assert y.dtype == np.dtype(dtype) and x.grad.dtype == np.dtype(dtype)
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **tol)
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **tol)
        # dw and db sum over every row: a NaN row makes them NaN in both libraries
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), **tol)
        np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), **tol)


def test_layer_norm_float16_takes_numpys_mean_and_stays_float16() -> None:
    """float16 rows are averaged by numpy's mean (float32 accumulation), not the float32/64
    gemv path: values and gradients agree with the float64 computation to float16's
    precision, in float16."""
    x16, w16, b16 = _ln_inputs(np.float16, (4, 6, 16), (16,), "both")
    x64, w64, b64 = (ag.tensor(t.numpy().astype(np.float64), requires_grad=True) for t in (x16, w16, b16))
    g = np.random.default_rng(5).standard_normal((4, 6, 16))
    for x, w, b in ((x16, w16, b16), (x64, w64, b64)):
        y = AF.layer_norm(x, 16, w, b)
        ag.backward_sync(y, ag.from_numpy(g.astype(x.dtype)))
        assert y.dtype == x.dtype and x.grad.dtype == x.dtype
    np.testing.assert_allclose(AF.layer_norm(x16, 16, w16, b16).numpy(), AF.layer_norm(x64, 16, w64, b64).numpy(),
                               rtol=1e-2, atol=1e-2)
    for a, c in ((x16, x64), (w16, w64), (b16, b64)):
        np.testing.assert_allclose(a.grad.numpy(), c.grad.numpy(), rtol=2e-2, atol=5e-2)


def test_layer_norm_of_empty_input_keeps_its_shape() -> None:
    x = ag.zeros((0, 4), requires_grad=True)
    w = ag.ones(4, requires_grad=True)
    y = AF.layer_norm(x, 4, w, ag.zeros(4, requires_grad=True))
    assert y.shape == (0, 4)
    ag.backward_sync(y.sum())
    assert x.grad.shape == (0, 4)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros(4))


def test_layer_norm_sees_in_place_changes_of_its_input() -> None:
    x, w, b = _ln_inputs(np.float64, (2, 4), (4,), "both")
    h = x * 1.0
    y = AF.layer_norm(h, 4, w, b)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ag.backward_sync(y.sum())


# --- embedding backward: rows summed by sort + reduceat ----------------------------------------
def _add_at(g: np.ndarray, index: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape, dtype=g.dtype)
    np.add.at(out, index, g)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index,shape", [
    (np.array([3, 1, 3, 3, 0, -1, 4]), (5, 3)),            # repeats, and -1 is row 4
    (np.random.default_rng(0).integers(0, 65, (16, 64)), (65, 8)),  # an embedding lookup
    (np.array([[2, 2], [0, 2]], dtype=np.uint8), (3, 2, 4)),  # unsigned, rows of a 3-D array
    (np.array([1]), (2,)),                                  # 1-D: rows are scalars
])
def test_index_add_rows_equals_np_add_at(dtype: type, index: np.ndarray, shape: tuple[int, ...]) -> None:
    from asyncgrad.ops._index import index_add_zeros

    g = np.random.default_rng(1).standard_normal(index.shape + shape[1:]).astype(dtype)
    got = index_add_zeros(g, index, shape, False)
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, _add_at(g, index, shape), rtol=tol, atol=tol)


def test_index_add_other_indices_still_accumulate() -> None:
    from asyncgrad.ops._index import index_add_zeros

    g = np.arange(4.0)
    index = (np.array([0, 0, 1, 1]), np.array([1, 1, 0, 2]))  # a tuple of arrays: np.add.at
    np.testing.assert_array_equal(index_add_zeros(g, index, (2, 3), False), [[0, 1, 0], [2, 0, 3]])
    mask = np.array([True, False, True])
    np.testing.assert_array_equal(index_add_zeros(np.array([1.0, 2.0]), mask, (3,), False), [1, 0, 2])
    empty_rows = index_add_zeros(np.zeros((2, 0)), np.array([1, 1]), (3, 0), False)  # zero-width rows
    assert empty_rows.shape == (3, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_backward_matches_torch(dtype: type) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 33, (8, 20))
    w0 = rng.standard_normal((33, 16)).astype(dtype)
    g = rng.standard_normal((8, 20, 16)).astype(dtype)
    w = ag.from_numpy(w0.copy()).requires_grad_()
    ag.backward_sync(AF.embedding(idx, w), ag.from_numpy(g))
    tw = torch.from_numpy(w0.copy()).requires_grad_()
    torch.nn.functional.embedding(torch.from_numpy(idx), tw).backward(torch.from_numpy(g))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=tol, atol=tol)


def test_embedding_gradcheck_and_gradgradcheck_with_repeated_rows() -> None:
    idx = np.array([[0, 2, 2], [1, 0, 2]])
    w = ag.tensor(np.random.default_rng(3).standard_normal((4, 3)), requires_grad=True)
    assert gradcheck(lambda t: AF.embedding(idx, t) ** 2, (w,))
    assert gradgradcheck(lambda t: AF.embedding(idx, t) ** 2, (w,))


# --- softmax, log_softmax, sigmoid: one buffer per rule ---------------------------------------
def _masked_logits(dtype: type) -> np.ndarray:
    x = (np.random.default_rng(6).standard_normal((3, 4, 9)) * 4).astype(dtype)
    x[..., 5:] = np.where(np.tril(np.ones((4, 4), dtype=bool))[None, :, :], x[..., 5:], -np.inf)  # a causal mask
    x[0, 0, 0] = 80.0  # exp would overflow without the max shift
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "sigmoid"])
def test_softmax_family_equals_the_plain_formulas_and_torch(dtype: type, op: str) -> None:
    x0 = _masked_logits(dtype)
    if op == "sigmoid":
        x0[np.isinf(x0)] = -1e30  # sigmoid(-huge) = 0 exactly
    g = np.random.default_rng(7).standard_normal(x0.shape).astype(dtype)
    fns = {"softmax": lambda t: AF.softmax(t, -1), "log_softmax": lambda t: AF.log_softmax(t, -1),
           "sigmoid": ag.sigmoid}
    x = ag.from_numpy(x0.copy()).requires_grad_()
    y = fns[op](x)
    ag.backward_sync(y, ag.from_numpy(g))
    with np.errstate(all="ignore"):  # the plain formulas, in float64
        xd, gd = x0.astype(np.float64), g.astype(np.float64)
        if op == "sigmoid":
            want = 1 / (1 + np.exp(-xd))
            dwant = gd * want * (1 - want)
        else:
            e = np.exp(xd - xd.max(-1, keepdims=True))
            sm = e / e.sum(-1, keepdims=True)
            want = sm if op == "softmax" else np.log(sm)
            if op == "softmax":
                dwant = sm * (gd - (gd * sm).sum(-1, keepdims=True))
            else:
                dwant = gd - sm * gd.sum(-1, keepdims=True)
    assert y.dtype == np.dtype(dtype) and x.grad.dtype == np.dtype(dtype)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(y.numpy(), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(x.grad.numpy(), dwant, rtol=tol, atol=tol * 10)
    torch = pytest.importorskip("torch")
    tx = torch.from_numpy(x0.copy()).requires_grad_()
    tfn = {"softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(-1), "sigmoid": torch.sigmoid}
    ty = tfn[op](tx)
    ty.backward(torch.from_numpy(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "sigmoid"])
def test_softmax_family_gradcheck_gradgradcheck_and_0d(op: str) -> None:
    fns = {"softmax": lambda t: AF.softmax(t, -1), "log_softmax": lambda t: AF.log_softmax(t, -1),
           "sigmoid": ag.sigmoid}
    x = ag.tensor(np.random.default_rng(8).standard_normal((2, 5)), requires_grad=True)
    assert gradcheck(fns[op], (x,))
    assert gradgradcheck(fns[op], (x,))
    s = ag.tensor(0.3, requires_grad=True)
    (g,) = ag.grad_sync(fns[op](s), s)
    assert g.shape == ()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_row_sums_by_gemv_equal_np_sum(dtype: type, dim: int) -> None:
    """``_sum_keep`` (a gemv over a contiguous last axis, np.sum otherwise) is np.sum with
    keepdims, inf and NaN included, for contiguous and strided input."""
    x = _masked_logits(dtype)
    x[1, 2, 3] = math.nan
    for a in (x, x.transpose(0, 2, 1)):
        with np.errstate(invalid="ignore"):
            got, want = N._sum_keep(a, dim), np.sum(a, axis=dim, keepdims=True)
        assert got.shape == want.shape and got.dtype == want.dtype
        tol = 1e-6 if dtype == np.float32 else 1e-14
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_family_over_a_leading_dim_gradcheck(op: str) -> None:
    """Over a dim that is not the last (np.sum's path, not the gemv): gradients in float64."""
    fn = AF.softmax if op == "softmax" else AF.log_softmax
    x = ag.tensor(np.random.default_rng(9).standard_normal((3, 4, 2)), requires_grad=True)
    assert gradcheck(lambda t: fn(t, 1), (x,))
    assert gradcheck(lambda t: fn(t.transpose(0, 2), -1), (x,))
