"""nll_loss's one-pass forward (``numba_kernels.nll_pick``, Note [NLL in one pass]) and the
``nn.functional`` forms of ``nll_loss``/``cross_entropy`` that use it: the compiled path
gives the numpy path's bits (loss, safe targets, coefficients) on tricky log-probabilities,
ignored rows add +0.0 whatever they hold, out-of-range targets raise PyTorch's error on
both paths, the graph stays PyTorch's (LogSoftmaxBackward0 then NllLossBackward0),
values and gradients match PyTorch, and gradcheck passes in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import gradcheck
from asyncgrad.ops import kernels
from asyncgrad.ops.kernels import compiled_path as _fast
from asyncgrad.ops import nn as N

DTYPES = [np.float32, np.float64]
REDUCTIONS = ["mean", "sum", "none"]


def _logp(dtype: type, rows: int = 40, classes: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    logp = (rng.standard_normal((rows, classes)) * 3).astype(dtype)
    logp.reshape(-1)[:9] = [0.0, -0.0, -math.inf, math.inf, math.nan, 1e30, -1e30, 3e38, -3e38]
    target = rng.integers(0, classes, rows)
    target[0], target[1], target[2] = 0, 2, 1  # picks 0.0, -inf and -0.0 (row 0: 0.0, -0.0, -inf, ...)
    target[5], target[9], target[-1] = -100, -100, -100
    logp[5, 0] = -math.inf  # an ignored row holding -inf at its safe index 0
    logp[9, :] = math.nan  # an ignored row of NaN
    return logp, target


def _both(on_path, fn):  # type: ignore[no-untyped-def]
    on_path("numpy")
    plain = fn()
    on_path("compiled")
    return plain, fn()


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_compiled_nll_gives_the_numpy_paths_bits(on_path, dtype: type, reduction: str) -> None:
    logp, target = _logp(dtype)
    logp = logp[1:][np.abs(logp[1:, 0]) < 1e29]  # rows of finite picks and NaN/inf ones
    target = target[1:][: logp.shape[0]]
    run = lambda: N._nll_loss(logp, target=target, reduction=reduction, ignore_index=-100)  # noqa: E731
    with np.errstate(invalid="ignore", over="ignore"):
        (out_p, (safe_p, coef_p, shape_p)), (out_c, (safe_c, coef_c, shape_c)) = _both(on_path, run)
    assert out_c.dtype == out_p.dtype == np.dtype(dtype) and coef_c.dtype == np.dtype(dtype)
    assert _bits(out_c) == _bits(out_p)
    assert _bits(safe_c) == _bits(safe_p) and safe_c.dtype == np.int64
    assert _bits(coef_c) == _bits(coef_p)
    assert shape_c == shape_p == logp.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_ignored_rows_add_positive_zero_whatever_they_hold(on_path, dtype: type) -> None:
    logp = np.array([[-math.inf, -1.0], [math.nan, math.nan], [-0.5, -2.0], [0.0, -3.0]], dtype=dtype)
    target = np.array([7, 7, 0, 1])
    for path in ("numpy", "compiled"):
        on_path(path)
        out, (safe, coef, _) = N._nll_loss(logp, target=target, reduction="none", ignore_index=7)
        assert _bits(out) == _bits(np.array([0.0, 0.0, 0.5, 3.0], dtype=dtype)), path
        assert list(safe) == [0, 0, 0, 1], path
        assert list(coef) == [0, 0, -1, -1] and list(np.signbit(coef)) == [True] * 4, path
        mean, (_, coef, _) = N._nll_loss(logp, target=target, reduction="mean", ignore_index=7)
        assert mean.dtype == np.dtype(dtype) and mean == np.asarray(3.5, dtype=dtype) / 2, path
        assert list(coef) == [0, 0, -0.5, -0.5], path
        total, _ = N._nll_loss(logp, target=target, reduction="sum", ignore_index=7)
        assert total == 3.5, path


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_ignored_gives_nan_mean_and_zero_gradient(on_path, dtype: type) -> None:
    for path in ("numpy", "compiled"):
        on_path(path)
        x = ag.tensor(np.ones((3, 4), dtype=dtype), requires_grad=True)
        loss = AF.cross_entropy(x, np.array([-100, -100, -100]))
        assert loss.dtype == np.dtype(dtype) and math.isnan(loss.item()), path
        ag.backward_sync(loss)
        assert not x.grad.numpy().any(), path
        assert AF.nll_loss(x, np.array([-100] * 3), reduction="sum").item() == 0, path


@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_out_of_range_targets_raise_pytorchs_error(on_path, path: str) -> None:
    on_path(path)
    x = ag.tensor(np.zeros((4, 3), dtype=np.float32), requires_grad=True)
    for bad, value in (([0, 1, 3, 2], 3), ([0, -1, 5, 2], -1), ([0, 1, 2, -100], None)):
        if value is None:  # -100 is the default ignore_index, but not when another is given
            with pytest.raises(IndexError, match=r"^Target -100 is out of bounds\.$"):
                AF.cross_entropy(x, np.array(bad), ignore_index=1)
            continue
        with pytest.raises(IndexError, match=rf"^Target {value} is out of bounds\.$"):
            AF.cross_entropy(x, np.array(bad))
        with pytest.raises(IndexError, match=rf"^Target {value} is out of bounds\.$"):
            AF.nll_loss(x, np.array(bad))
    with pytest.raises(ValueError, match=r"Expected input of shape \(N, C\) and target of shape \(N,\)"):
        AF.nll_loss(x, np.array([0, 1]))
    with pytest.raises(RuntimeError, match="expected scalar type Long but found float64"):
        AF.nll_loss(x, np.array([0.0, 1.0, 2.0, 0.0]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_targets_of_other_integer_types_and_odd_layouts_take_a_path_that_agrees(on_path, dtype: type) -> None:
    logp, target = _logp(dtype, rows=30, classes=12)
    logp = np.abs(logp) * -1
    logp[~np.isfinite(logp)] = -2.0
    wide = np.repeat(logp, 2, axis=1)[:, ::2]  # not C-contiguous
    assert not wide.flags.c_contiguous
    on_path("compiled")
    want, (safe, coef, _) = N._nll_loss(np.ascontiguousarray(wide), target=target, reduction="mean",
                                        ignore_index=-100)
    got, (safe2, coef2, _) = N._nll_loss(wide, target=target[::-1][::-1].copy(), reduction="mean",
                                         ignore_index=-100)
    assert _bits(got) == _bits(want) and _bits(coef2) == _bits(coef)
    frozen = target.copy()
    frozen.flags.writeable = False
    for t in (target.astype(np.int32), target.astype(np.int16), frozen, target.reshape(-1, 1)[:, 0]):
        got, (safe3, coef3, _) = N._nll_loss(wide, target=t, reduction="mean", ignore_index=-100)
        assert _bits(got) == _bits(want) and list(safe3) == list(safe) and _bits(coef3) == _bits(coef)
    on_path("numpy")
    plain, _ = N._nll_loss(wide, target=target, reduction="mean", ignore_index=-100)
    assert _bits(plain) == _bits(want)


def test_the_kernel_applies_only_where_it_should(on_path) -> None:
    on_path("compiled")
    logp = np.zeros((2, 3), dtype=np.float32)
    t = np.array([0, 1])
    assert _fast.nll_loss(logp, t, -100, True) is not None
    assert _fast.nll_loss(logp, t.astype(np.int32), -100, True) is None  # numpy path
    assert _fast.nll_loss(logp.astype(np.float16), t, -100, True) is None
    assert _fast.nll_loss(np.zeros((0, 3), dtype=np.float32), t[:0], -100, True) is None
    assert _fast.nll_loss(logp, t, 2**64, True) is None  # an ignore_index beyond int64
    on_path("numpy")
    assert _fast.nll_loss(logp, t, -100, True) is None and kernels.compiled() is None


@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_empty_batch_and_one_row(on_path, path: str) -> None:
    on_path(path)
    x = ag.tensor(np.zeros((0, 5), dtype=np.float32), requires_grad=True)
    assert math.isnan(AF.cross_entropy(x, np.zeros(0, dtype=np.int64)).item())
    assert AF.cross_entropy(x, np.zeros(0, dtype=np.int64), reduction="none").shape == (0,)
    one = ag.tensor(np.array([[2.0, -1.0, 0.5]]), requires_grad=True)
    loss = AF.cross_entropy(one, np.array([2]))
    want = -(0.5 - math.log(math.exp(2.0) + math.exp(-1.0) + math.exp(0.5)))
    assert loss.item() == pytest.approx(want, rel=1e-14)
    single_class = ag.tensor(np.array([[3.0], [-4.0]], dtype=np.float32), requires_grad=True)
    assert AF.cross_entropy(single_class, np.array([0, 0])).item() == 0


@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_cross_entropy_keeps_pytorchs_graph(on_path, path: str) -> None:
    on_path(path)
    x = ag.tensor(np.random.default_rng(1).standard_normal((5, 4)), requires_grad=True)
    loss = AF.cross_entropy(x, np.array([0, 3, -100, 1, 2]))
    assert loss.grad_fn.name() == "NllLossBackward0"
    assert [f.name() for f, _ in loss.grad_fn.next_functions] == ["LogSoftmaxBackward0"]
    assert ag.nn.CrossEntropyLoss()(x, np.array([0, 3, -100, 1, 2])).item() == loss.item()


@pytest.mark.parametrize("path", ["numpy", "compiled"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_and_nll_match_torch(on_path, path: str, dtype: type, reduction: str) -> None:
    torch = pytest.importorskip("torch")
    on_path(path)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 65)) * 4).astype(dtype)
    x[3, :] = -1e30  # large magnitudes
    x[4, 7] = 80.0
    x[6, 2] = -math.inf  # a masked logit, not the target
    t = rng.integers(0, 65, 64)
    t[[6, 10, 11]] = [5, -100, -100]
    g = np.asarray(rng.standard_normal(64) if reduction == "none" else 0.7, dtype=dtype)
    tol = {"rtol": 2e-5, "atol": 2e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    for ours, theirs in ((AF.cross_entropy, torch.nn.functional.cross_entropy),
                         (lambda a, *r, **k: AF.nll_loss(AF.log_softmax(a, 1), *r, **k),
                          lambda a, *r, **k: torch.nn.functional.nll_loss(torch.log_softmax(a, 1), *r, **k))):
        xa = ag.from_numpy(x.copy()).requires_grad_()
        y = ours(xa, t, reduction=reduction)
        ag.backward_sync(y, ag.from_numpy(g.copy()))
        xt = torch.from_numpy(x.copy()).requires_grad_()
        yt = theirs(xt, torch.from_numpy(t), reduction=reduction)
        yt.backward(torch.from_numpy(g.copy()))
        assert y.dtype == np.dtype(dtype) and xa.grad.dtype == np.dtype(dtype)
        np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), **tol)
        np.testing.assert_allclose(xa.grad.numpy(), xt.grad.numpy(), **tol)


@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_gradcheck_in_float64(on_path, path: str) -> None:
    on_path(path)
    x = ag.tensor(np.random.default_rng(6).standard_normal((5, 4)), requires_grad=True)
    t = np.array([0, 3, -100, 1, 3])
    for r in REDUCTIONS:
        assert gradcheck(lambda a, r=r: AF.cross_entropy(a, t, reduction=r), (x,))
        assert gradcheck(lambda a, r=r: AF.nll_loss(a, np.array([0, 3, 2, 1, 3]), reduction=r, ignore_index=3), (x,))
        assert gradcheck(lambda a, r=r: ag.functional.cross_entropy(a, t, r), (x,))
