"""The compiled masked select (``where`` / ``masked_fill`` with an attention-style mask,
Note [Masks broadcast over rows]) and the one-pass Adam step (Note [Adam in one pass]),
each against its numpy rule on the same input, tricky values included, in float32 and
float64, and against PyTorch where it is installed."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck
from asyncgrad.ops.kernels import compiled_path as _fast

pytest.importorskip("numba")

TRICKY = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-30, -1e-30, 3e38, -3e38, 88.0, -104.0]
DTYPES = [np.float32, np.float64]


def _scores(dtype: type, shape: tuple[int, ...] = (3, 2, 16, 16)) -> np.ndarray:
    x = np.random.default_rng(7).standard_normal(shape) * 4
    x.reshape(-1)[: len(TRICKY)] = TRICKY
    return x.astype(dtype)


def _same(a: np.ndarray, b: np.ndarray) -> None:
    """Equal dtypes, and equal bits (signed zeros, infinities) wherever not NaN, NaN in
    the same places (a NaN's sign and payload depend on the order of operands)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    na, nb = np.isnan(a), np.isnan(b)
    np.testing.assert_array_equal(na, nb)
    assert np.array_equal(np.where(na, 0, a).view(np.uint8), np.where(nb, 0, b).view(np.uint8))


CAUSAL = np.tril(np.ones((16, 16), dtype=bool))


# --- the select kernel ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("fill", [0.0, -math.inf, math.nan, 7, "0-d"])
@pytest.mark.parametrize("mask", [CAUSAL, CAUSAL[None], np.ones((1, 1, 16, 16), bool) & CAUSAL,
                                  np.random.default_rng(1).random((3, 2, 16, 16)) > 0.5,
                                  np.random.default_rng(2).random(16) > 0.5], ids=["TT", "1TT", "11TT", "full", "T"])
def test_select_equals_numpy_where_on_tricky_values(on_path, dtype, keep, fill, mask) -> None:
    on_path("compiled")
    x = _scores(dtype)
    f = np.asarray(-2.5, dtype=dtype) if fill == "0-d" else fill
    out = _fast.select(mask, x, f, keep)
    assert out is not None
    _same(out, np.where(mask, x, f) if keep else np.where(mask, f, x))


@pytest.mark.parametrize("mask, x, fill", [
    (np.ones((2, 16, 16), bool), np.zeros((3, 1, 16, 16)), 0.0),  # mask broadcasts over a middle dim
    (np.ones((3, 1, 16, 16), bool), np.zeros((3, 2, 16, 16)), 0.0),  # ... not only over leading ones
    (np.ones((16, 16), bool), np.zeros((3, 16, 16), np.float16), 0.0),  # float16
    (np.ones((16, 16), bool), np.zeros((3, 16, 16)), np.asarray(1.0, np.float32)),  # fill of another dtype
    (np.ones((16, 16), bool), np.zeros((3, 16, 16)), np.zeros(16)),  # fill not a scalar
    (np.ones((16, 16), np.int8), np.zeros((3, 16, 16)), 0.0),  # mask not bool
])
def test_select_declines_what_it_does_not_cover(on_path, mask, x, fill) -> None:
    on_path("compiled")
    assert _fast.select(mask, x, fill) is None


def test_select_declines_on_the_numpy_path(on_path) -> None:
    on_path("numpy")
    assert _fast.select(CAUSAL, _scores(np.float32), 0.0) is None


def _attention_where(path_fn, on_path, path: str, dtype: type, op: str) -> list[np.ndarray]:
    on_path(path)
    x = _scores(dtype)
    g = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
    g.reshape(-1)[-len(TRICKY):] = TRICKY
    t = ag.from_numpy(x.copy()).requires_grad_()
    if op == "where":
        y = ag.where(CAUSAL, t, -math.inf)
    elif op == "where_left":
        y = ag.where(CAUSAL, 0.5, t)
    else:
        y = ag.masked_fill(t, ~CAUSAL, -math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ag.backward_sync(y, ag.from_numpy(g))
    return [y.numpy(), t.grad.numpy()]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["where", "where_left", "masked_fill"])
def test_where_and_masked_fill_compiled_equal_numpy_path(on_path, dtype, op) -> None:
    plain = _attention_where(None, on_path, "numpy", dtype, op)
    fast = _attention_where(None, on_path, "compiled", dtype, op)
    for a, b in zip(fast, plain):
        _same(a, b)


def test_where_takes_the_compiled_kernel_for_an_attention_mask(on_path, monkeypatch) -> None:
    on_path("compiled")
    calls = []
    real = _fast.select
    monkeypatch.setattr(_fast, "select", lambda *a: calls.append(a[1].shape) or real(*a))
    t = ag.from_numpy(_scores(np.float32)).requires_grad_()
    ag.backward_sync(ag.where(CAUSAL, t, -math.inf).sum())
    assert calls == [(3, 2, 16, 16), (3, 2, 16, 16)]  # forward and backward


@pytest.mark.parametrize("op", ["where", "masked_fill"])
def test_gradcheck_in_float64_through_the_compiled_select(on_path, op) -> None:
    on_path("compiled")
    mask = np.tril(np.ones((4, 4), dtype=bool))
    x = ag.tensor(np.random.default_rng(5).standard_normal((2, 4, 4)), requires_grad=True)
    if op == "where":
        assert gradcheck(lambda a: ag.where(mask, a, 0.0) * a, (x,))
    else:
        assert gradcheck(lambda a: ag.masked_fill(a, ~mask, 1.5) * a, (x,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_where_compiled_matches_torch_masked_fill(on_path, dtype) -> None:
    torch = pytest.importorskip("torch")
    on_path("compiled")
    x = np.random.default_rng(4).standard_normal((3, 2, 16, 16)).astype(dtype)
    g = np.random.default_rng(5).standard_normal(x.shape).astype(dtype)
    t = ag.from_numpy(x.copy()).requires_grad_()
    y = ag.where(CAUSAL, t, -math.inf).softmax(-1)
    ag.backward_sync(y, ag.from_numpy(g))
    tx = torch.from_numpy(x.copy()).requires_grad_()
    ty = tx.masked_fill(~torch.from_numpy(CAUSAL), float("-inf")).softmax(-1)
    ty.backward(torch.from_numpy(g))
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **tol)
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), **tol)


# --- Adam in one pass ----------------------------------------------------------------------------
ADAM_CASES = [("Adam", {}), ("Adam", {"weight_decay": 0.1}), ("Adam", {"maximize": True, "weight_decay": 0.1}),
              ("AdamW", {}), ("AdamW", {"weight_decay": 0.0}), ("AdamW", {"maximize": True}),
              ("AdamW", {"betas": (0.2, 0.5)}), ("AdamW", {"lr": 0.5, "eps": 0.0})]


def _adam_run(on_path, path: str, name: str, kwargs: dict, dtype: type, steps: int = 3) -> list[np.ndarray]:
    on_path(path)
    x0 = _scores(dtype, (40, 50))
    p = ag.from_numpy(x0.copy()).requires_grad_()
    opt = getattr(ag.optim, name)([p], **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in range(steps):
            p.grad = ag.from_numpy((x0[::-1] * (s + 1)).copy())
            opt.step()
    st = opt.state[p]
    return [p.numpy().copy(), st["exp_avg"].numpy().copy(), st["exp_avg_sq"].numpy().copy()]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", ADAM_CASES)
def test_adam_compiled_step_equals_numpy_rule_bit_for_bit(on_path, dtype, name, kwargs) -> None:
    plain = _adam_run(on_path, "numpy", name, kwargs, dtype)
    fast = _adam_run(on_path, "compiled", name, kwargs, dtype)
    for a, b in zip(fast, plain):
        _same(a, b)


def test_adam_takes_the_compiled_step_unless_amsgrad_or_strided(on_path, monkeypatch) -> None:
    on_path("compiled")
    calls = []
    real = _fast.adam_step
    monkeypatch.setattr(_fast, "adam_step", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    p = ag.zeros((4, 5), requires_grad=True)
    p.grad = ag.ones((4, 5))
    ag.optim.AdamW([p]).step()
    q = ag.zeros((5, 4), requires_grad=True)
    q.grad = ag.ones((4, 5)).T  # a strided gradient: the numpy rule
    ag.optim.AdamW([q]).step()
    r = ag.zeros((4, 5), requires_grad=True)
    r.grad = ag.ones((4, 5))
    ag.optim.AdamW([r], amsgrad=True).step()  # amsgrad: the numpy rule, never asked
    assert calls == [True, False]
    np.testing.assert_array_equal(p.numpy(), q.numpy().T)
    np.testing.assert_array_equal(p.numpy(), r.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", [c for c in ADAM_CASES if c[1].get("eps", 1) != 0])
def test_adam_compiled_step_matches_torch(on_path, dtype, name, kwargs) -> None:
    torch = pytest.importorskip("torch")
    on_path("compiled")
    rng = np.random.default_rng(9)
    x0 = rng.standard_normal((40, 50)).astype(dtype)
    p = ag.from_numpy(x0.copy()).requires_grad_()
    tp = torch.from_numpy(x0.copy()).requires_grad_()
    opt = getattr(ag.optim, name)([p], **kwargs)
    topt = getattr(torch.optim, name)([tp], foreach=False, **kwargs)
    for _ in range(4):
        g = rng.standard_normal(x0.shape).astype(dtype)
        p.grad, tp.grad = ag.from_numpy(g.copy()), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-14}
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), **tol)
