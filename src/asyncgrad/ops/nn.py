"""Neural-network primitives: softmax, log_softmax, gelu, nll_loss, mse_loss."""

from __future__ import annotations

import math

import numpy as np

from . import _kernels as K
from ._quiet import quiet
from ._spec import defop
from ._special import erf

_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# softmax and log_softmax work in one buffer where they can (fewer full-size temporaries);
# 0-d input goes the plain way, as ufuncs return scalars for it and out= needs arrays
def _softmax(x, *, dim):  # type: ignore[no-untyped-def]
    if x.ndim == 0:
        e = np.exp(x - np.max(x, axis=dim, keepdims=True))
        return e / np.sum(e, axis=dim, keepdims=True)
    out = x - np.max(x, axis=dim, keepdims=True)
    np.exp(out, out=out)
    out /= np.sum(out, axis=dim, keepdims=True)
    return out


def _log_softmax(x, *, dim):  # type: ignore[no-untyped-def]
    shifted = x - np.max(x, axis=dim, keepdims=True)
    if x.ndim == 0:
        return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))
    shifted -= np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))
    return shifted


def _softmax_rule(m, g, ans, x, *, dim):  # type: ignore[no-untyped-def]
    if m.tensor_mode or ans.ndim == 0:
        return ans * (g - m.sum(g * ans, dim, True))
    d = g * ans
    np.subtract(g, d.sum(axis=dim, keepdims=True), out=d)
    d *= ans
    return d


def _log_softmax_rule(m, g, ans, x, *, dim):  # type: ignore[no-untyped-def]
    if m.tensor_mode or ans.ndim == 0:
        return g - m.exp(ans) * m.sum(g, dim, True)
    d = np.exp(ans)
    d *= g.sum(axis=dim, keepdims=True)
    np.subtract(g, d, out=d)
    return d


_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def _gelu(x, *, approximate):  # type: ignore[no-untyped-def]
    """Exact GELU ``x * Phi(x)`` and, as aux, the normal cdf ``Phi(x)``.

    Keeping ``Phi(x)`` (one array of x's size, beside the saved ``x``) spares the backward
    its erf, the costly part: 0.8 against 4.0 ms for 16x64x512 float32 floats here."""
    with np.errstate(over="ignore", invalid="ignore"):  # -inf * Phi(-inf) = NaN, as PyTorch
        if x.dtype in _FAST:  # fused, block by block, in x's dtype (ops/_kernels.py)
            cdf = K.blockwise(K.normal_cdf_block, x)
        else:
            cdf = 0.5 * (1.0 + erf(x / _SQRT_2))
        return np.asarray(x * cdf), cdf


def _gelu_rule(m, g, ans, x, *, approximate, aux):  # type: ignore[no-untyped-def]
    if not m.tensor_mode and x.dtype in _FAST and g.dtype == x.dtype:  # a plain backward: fused
        with np.errstate(over="ignore", invalid="ignore"):
            return K.blockwise(K.gelu_exact_backward_block, g, x, aux)
    return _gelu_rule_composite(m, g, ans, x, approximate=approximate)


def _gelu_tanh(x, *, approximate):  # type: ignore[no-untyped-def]
    if x.dtype in _FAST:
        with np.errstate(over="ignore", invalid="ignore"):
            return K.blockwise(K.gelu_tanh_block, x)
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _gelu_tanh_rule(m, g, ans, x, *, approximate):  # type: ignore[no-untyped-def]
    if not m.tensor_mode and x.dtype in _FAST and g.dtype == x.dtype:
        with np.errstate(over="ignore", invalid="ignore"):
            return K.blockwise(K.gelu_tanh_backward_block, g, x)
    return _gelu_rule_composite(m, g, ans, x, approximate=approximate)


def _gelu_rule_composite(m, g, ans, x, *, approximate):  # type: ignore[no-untyped-def]
    """The GELU derivative from ``m``'s functions: differentiable again under create_graph,
    and the reference the fused kernels are tested against."""
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = m.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
        return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)
    cdf = 0.5 * (1.0 + m.erf(x / _SQRT_2))
    pdf = m.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return g * (cdf + x * pdf)


def _nll_loss(logp, *, target, reduction, ignore_index):  # type: ignore[no-untyped-def]
    n = logp.shape[0]
    valid = target != ignore_index
    safe = np.where(valid, target, 0)
    picked = -logp[np.arange(n), safe] * valid
    weights = np.zeros_like(logp)
    weights[np.arange(n), safe] = -valid.astype(logp.dtype)
    if reduction == "mean":
        count = max(int(valid.sum()), 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(picked.sum() / count, dtype=logp.dtype)
        weights /= count if count else 1
    elif reduction == "sum":
        out = np.asarray(picked.sum(), dtype=logp.dtype)
    else:
        out = picked.astype(logp.dtype, copy=False)
    return out, weights


def _nll_rule(m, g, ans, x, *, reduction, aux):  # type: ignore[no-untyped-def]
    if reduction == "none":
        return m.unsqueeze(g, -1) * aux
    return g * aux


def _mse(x, y, *, reduction):  # type: ignore[no-untyped-def]
    d = (x - y) ** 2
    if reduction == "mean":
        return np.asarray(d.mean(), dtype=d.dtype)
    if reduction == "sum":
        return np.asarray(d.sum(), dtype=d.dtype)
    return d


def _mse_rule_x(m, g, ans, x, y, *, reduction):  # type: ignore[no-untyped-def]
    scale = 2.0 / int(np.prod(np.broadcast_shapes(x.shape, y.shape))) if reduction == "mean" else 2.0
    return g * scale * (x - y)


def _layer_norm(x, *affine, dims, eps):  # type: ignore[no-untyped-def]
    """``(x - mean) / sqrt(var + eps) * w + b`` over ``dims``; ``affine`` is ``(w, b)``,
    ``(w,)`` or ``()``. Returns the output and, as aux, ``(mean, rstd)`` for the backward
    (PyTorch's ``native_layer_norm`` saves the same)."""
    mean = x.mean(axis=dims, keepdims=True)
    out = x - mean
    var = np.mean(out * out, axis=dims, keepdims=True)
    rstd = 1 / np.sqrt(var + eps)
    out *= rstd
    if affine:
        out *= affine[0]
    if len(affine) > 1:
        out += affine[1]
    return out, (mean, rstd)


def _ln_xhat(m, x, dims, eps, aux):  # type: ignore[no-untyped-def]
    """The normalised input and ``rstd``: from the forward's aux in a plain backward, from
    ``x`` by differentiable ops under create_graph."""
    if not m.tensor_mode:
        mean, rstd = aux
        xhat = x - mean
        xhat *= rstd
        return xhat, rstd
    xc = x - m.mean(x, dims, True)
    rstd = 1.0 / m.sqrt(m.mean(xc * xc, dims, True) + eps)
    return xc * rstd, rstd


def _ln_rule_x(m, g, ans, x, w=None, b=None, *, dims, eps, aux):  # type: ignore[no-untyped-def]
    # dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w
    xhat, rstd = _ln_xhat(m, x, dims, eps, aux)
    gw = g if w is None else g * w
    if m.tensor_mode:
        return rstd * (gw - m.mean(gw, dims, True) - xhat * m.mean(gw * xhat, dims, True))
    proj = np.mean(gw * xhat, axis=dims, keepdims=True)
    dx = gw - np.mean(gw, axis=dims, keepdims=True)
    xhat *= proj
    dx -= xhat
    dx *= rstd
    return dx


def _ln_rule_w(m, g, ans, x, w, b=None, *, dims, eps, aux):  # type: ignore[no-untyped-def]
    xhat, _ = _ln_xhat(m, x, dims, eps, aux)
    if m.tensor_mode:
        return g * xhat  # summed over the leading dims by the engine
    xhat *= g
    return _sum_rows(xhat, dims)


def _ln_rule_b(m, g, ans, x, w, b, *, dims, eps, aux):  # type: ignore[no-untyped-def]
    return g if m.tensor_mode else _sum_rows(g, dims)


def _sum_rows(a: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """Sum over the dims before the normalised ones (one reduction over a 2-D view)."""
    return a.reshape(-1, *a.shape[a.ndim - len(dims):]).sum(axis=0)


# name ---------- node name ------------- forward ------- derivative ---------------------
# quiet: a row holding inf gives inf - inf = nan, which PyTorch returns without a warning
softmax = defop("SoftmaxBackward0", quiet(_softmax), _softmax_rule, save="ans")
log_softmax = defop("LogSoftmaxBackward0", quiet(_log_softmax), _log_softmax_rule, save="ans")
layer_norm = defop("NativeLayerNormBackward0", _layer_norm, _ln_rule_x, _ln_rule_w, _ln_rule_b,
                   save="x@0,1 y@0,1", has_aux=True)
layer_norm_weight = defop("NativeLayerNormBackward0", _layer_norm, _ln_rule_x, _ln_rule_w,
                          save="x@0,1 y@0,1", has_aux=True)
layer_norm_plain = defop("NativeLayerNormBackward0", _layer_norm, _ln_rule_x, save="x", has_aux=True)
gelu = defop("GeluBackward0", _gelu, _gelu_rule, save="x", has_aux=True)
gelu_tanh = defop("GeluBackward0", _gelu_tanh, _gelu_tanh_rule, save="x")
nll_loss = defop("NllLossBackward0", _nll_loss, _nll_rule, has_aux=True)
mse_loss = defop("MseLossBackward0", _mse,
                 _mse_rule_x,
                 lambda m, g, ans, x, y, *, reduction: -_mse_rule_x(m, g, ans, x, y, reduction=reduction),
                 save="x y")
