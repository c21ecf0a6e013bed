"""Neural-network primitives: softmax, log_softmax, gelu, nll_loss, mse_loss, layer_norm.

Each kernel and plain-backward rule first asks ``ops/kernels/compiled_path.py`` for the compiled path (one
pass, numba; see ``ops/kernels/loader.py``) and runs its numpy form when that returns None: the
numpy forms are the complete fallback and, under create_graph, the differentiable rules."""

from __future__ import annotations

import math

import numpy as np

from .kernels import compiled_path as fast
from .kernels import blockwise as K
from ._quiet import quiet
from ._spec import defop
from .kernels.special import erf, normal_cdf_block

_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def _sum_keep(a, dim):  # type: ignore[no-untyped-def]
    """``np.sum(a, axis=dim, keepdims=True)``; over the last axis of a contiguous float
    array as a BLAS gemv with a vector of ones: numpy reduces a short last axis row by
    row, several times slower than the whole softmax pass around it."""
    if dim == a.ndim - 1 and a.dtype in _FAST and a.size and a.flags.c_contiguous:
        n = a.shape[-1]
        return (a.reshape(-1, n) @ np.ones(n, dtype=a.dtype)).reshape(*a.shape[:-1], 1)
    return np.sum(a, axis=dim, keepdims=True)


# softmax and log_softmax work in one buffer where they can (fewer full-size temporaries);
# 0-d input goes the plain way, as ufuncs return scalars for it and out= needs arrays
def _softmax(x, *, dim):  # type: ignore[no-untyped-def]
    out = fast.softmax(x, dim)
    if out is not None:
        return out
    if x.ndim == 0:
        e = np.exp(x - np.max(x, axis=dim, keepdims=True))
        return e / np.sum(e, axis=dim, keepdims=True)
    out = x - np.max(x, axis=dim, keepdims=True)
    np.exp(out, out=out)
    total = _sum_keep(out, dim)
    np.divide(1, total, out=total)  # one division per row, then a multiply per element
    out *= total
    return out


def _log_softmax(x, *, dim):  # type: ignore[no-untyped-def]
    out = fast.log_softmax(x, dim)
    if out is not None:
        return out
    shifted = x - np.max(x, axis=dim, keepdims=True)
    if x.ndim == 0:
        return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))
    shifted -= np.log(_sum_keep(np.exp(shifted), dim))
    return shifted


def _softmax_rule(m, g, ans, x, *, dim):  # type: ignore[no-untyped-def]
    if m.tensor_mode or ans.ndim == 0:
        return ans * (g - m.sum(g * ans, dim, True))
    d = fast.softmax_backward(g, ans, dim)
    if d is not None:
        return d
    d = g * ans
    np.subtract(g, _sum_keep(d, dim), out=d)
    d *= ans
    return d


def _log_softmax_rule(m, g, ans, x, *, dim):  # type: ignore[no-untyped-def]
    if m.tensor_mode or ans.ndim == 0:
        return g - m.exp(ans) * m.sum(g, dim, True)
    d = fast.log_softmax_backward(g, ans, dim)
    if d is not None:
        return d
    d = np.exp(ans)
    d *= _sum_keep(g, dim)
    np.subtract(g, d, out=d)
    return d


def _gelu(x, *, approximate):  # type: ignore[no-untyped-def]
    """Exact GELU ``x * Phi(x)`` and, as aux, the normal cdf ``Phi(x)``.

    Keeping ``Phi(x)`` (one array of x's size, beside the saved ``x``) spares the backward
    its erf, the costly part: 0.8 against 4.0 ms for 16x64x512 float32 floats here."""
    compiled = fast.gelu(x)
    if compiled is not None:
        return compiled
    with np.errstate(over="ignore", invalid="ignore"):  # -inf * Phi(-inf) = NaN, as PyTorch
        if x.dtype in _FAST:  # fused, block by block, in x's dtype (ops/kernels/blockwise.py)
            cdf = K.blockwise(normal_cdf_block, x)
        else:
            cdf = 0.5 * (1.0 + erf(x / _SQRT_2))
        return np.asarray(x * cdf), cdf


def _gelu_rule(m, g, ans, x, *, approximate, aux):  # type: ignore[no-untyped-def]
    if not m.tensor_mode and x.dtype in _FAST and g.dtype == x.dtype:  # a plain backward: fused
        d = fast.gelu_backward(g, x, aux)
        if d is not None:
            return d
        with np.errstate(over="ignore", invalid="ignore"):
            return K.blockwise(K.gelu_exact_backward_block, g, x, aux)
    return _gelu_rule_composite(m, g, ans, x, approximate=approximate)


def _gelu_tanh(x, *, approximate):  # type: ignore[no-untyped-def]
    out = fast.gelu_tanh(x)
    if out is not None:
        return out
    if x.dtype in _FAST:
        with np.errstate(over="ignore", invalid="ignore"):
            return K.blockwise(K.gelu_tanh_block, x)
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _gelu_tanh_rule(m, g, ans, x, *, approximate):  # type: ignore[no-untyped-def]
    if not m.tensor_mode and x.dtype in _FAST and g.dtype == x.dtype:
        d = fast.gelu_tanh_backward(g, x)
        if d is not None:
            return d
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
    """The loss and, as aux, ``(safe targets, coefficient per row, logp's shape)``: the
    gradient is ``g * coef`` at ``(i, target[i])`` and zero elsewhere. ``target`` is an
    integer array; one out of range (and not ``ignore_index``) raises PyTorch's IndexError.
    An ignored row adds +0.0 to the loss whatever its log-probabilities (PyTorch does not
    read them).

    Note [NLL keeps its targets]: the aux used to be the dense ``(N, C)`` weight array,
    zero but for one entry per row; building it cost the forward a full ``(N, C)``
    allocation and the backward a full multiply. The backward now writes its zeros and
    the ``N`` entries itself."""
    picks = fast.nll_loss(logp, target, ignore_index, reduction == "mean")
    if picks is not None:
        picked, safe, coef, count = picks
    else:
        n, c = logp.shape
        valid = target != ignore_index
        bad = valid & ((target < 0) | (target >= c))
        if bad.any():
            raise IndexError(f"Target {int(target[bad][0])} is out of bounds.")
        safe = np.where(valid, target, 0)
        picked = np.where(valid, -logp[np.arange(n), safe], 0).astype(logp.dtype, copy=False)
        coef = -valid.astype(logp.dtype)
        count = int(valid.sum())
        if reduction == "mean":
            coef /= count if count else 1
    if reduction == "mean":  # (no valid row: NaN, as PyTorch)
        out = np.asarray(picked.sum() / count if count else np.nan, dtype=logp.dtype)
    elif reduction == "sum":
        out = np.asarray(picked.sum(), dtype=logp.dtype)
    else:
        out = picked
    return out, (safe, coef, logp.shape)


def _nll_rule(m, g, ans, x, *, reduction, aux):  # type: ignore[no-untyped-def]
    safe, coef, shape = aux
    rows = np.arange(shape[0])
    if m.tensor_mode:  # differentiable in g: g times the dense weights
        weights = np.zeros(shape, dtype=coef.dtype)
        weights[rows, safe] = coef
        return m.unsqueeze(g, -1) * weights if reduction == "none" else g * weights
    gv = np.asarray(g)
    dtype = np.result_type(gv.dtype, coef.dtype)
    out = np.zeros(shape, dtype=dtype)
    out[rows, safe] = gv * coef  # g is 0-d, or (N,) for reduction="none"
    return out


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
    """``(x - mean) / sqrt(var + eps) * w + b`` over ``dims`` (the trailing ones);
    ``affine`` is ``(w, b)``, ``(w,)`` or ``()``. Returns the output and, as aux,
    ``(xhat, rstd)``: the normalised input as rows ``(N, n)`` and ``1 / std`` as ``(N, 1)``.

    Note [Layer norm keeps x-hat]: PyTorch saves ``(mean, rstd)`` and recomputes x-hat in
    its fused backward; numpy would recompute it in two passes for each of the three
    rules (dx, dw, db each read it). Keeping x-hat costs one array of x's size per node
    and spares the backward four of its passes. The row reductions are matrix-vector
    products and ``einsum`` row dots (``_row_means``), not ``mean`` over a short last
    axis, which numpy reduces row by row.
    """
    n = math.prod(x.shape[x.ndim - len(dims):])
    compiled = fast.layer_norm(x, affine, n, eps)
    if compiled is not None:
        return compiled
    rows = x.reshape(-1, n)  # (a copy only for non-contiguous input)
    with np.errstate(invalid="ignore", divide="ignore"):  # empty rows: NaN, as PyTorch
        xhat = rows - _row_means(rows)
        rstd = _row_means(xhat, xhat)
        rstd += eps
        np.sqrt(rstd, out=rstd)
        np.divide(1, rstd, out=rstd)
    xhat *= rstd
    if not affine:
        return xhat.reshape(x.shape).copy(), (xhat, rstd)
    out = np.empty_like(xhat)
    np.multiply(xhat, affine[0].reshape(-1), out=out)
    if len(affine) > 1:
        out += affine[1].reshape(-1)
    return out.reshape(x.shape), (xhat, rstd)


def _row_means(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """The mean of each row of the 2-D ``a`` (of ``a * b`` when ``b`` is given), as a
    column ``(N, 1)``: a gemv against ``1/n`` (an einsum row dot for ``a * b``) for
    float32/64, numpy's mean otherwise (float16 accumulates in float32 there)."""
    n = a.shape[1]
    if a.dtype not in _FAST or n == 0 or a.shape[0] == 0:
        return np.mean(a if b is None else a * b, axis=1, keepdims=True)
    if b is None:
        return (a @ np.full(n, 1.0 / n, dtype=a.dtype))[:, None]
    dots = np.einsum("ij,ij->i", a, b)
    dots *= 1.0 / n
    return dots[:, None]


def _ln_xhat(m, x, dims, eps, aux):  # type: ignore[no-untyped-def]
    """The normalised input and ``rstd``: the forward's, as rows ``(N, n)``, in a plain
    backward (Note [Layer norm keeps x-hat]); from ``x`` by differentiable ops, in x's
    shape, under create_graph."""
    if not m.tensor_mode:
        return aux
    xc = x - m.mean(x, dims, True)
    rstd = 1.0 / m.sqrt(m.mean(xc * xc, dims, True) + eps)
    return xc * rstd, rstd


def _ln_rule_x(m, g, ans, x, w=None, b=None, *, dims, eps, aux):  # type: ignore[no-untyped-def]
    # dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w
    xhat, rstd = _ln_xhat(m, x, dims, eps, aux)
    if m.tensor_mode:
        gw = g if w is None else g * w
        return rstd * (gw - m.mean(gw, dims, True) - xhat * m.mean(gw * xhat, dims, True))
    dx = fast.layer_norm_backward(g, xhat, rstd, w)
    if dx is not None:
        return dx
    gw = g.reshape(xhat.shape)
    if w is not None:
        gw = gw * w.reshape(-1)
    dx = xhat * _row_means(gw, xhat)
    np.subtract(gw, dx, out=dx)
    dx -= _row_means(gw)
    dx *= rstd
    return _reshaped(dx, g.shape)


def _ln_rule_w(m, g, ans, x, w, b=None, *, dims, eps, aux):  # type: ignore[no-untyped-def]
    xhat, _ = _ln_xhat(m, x, dims, eps, aux)
    if m.tensor_mode:
        return g * xhat  # summed over the leading dims by the engine
    dw = fast.column_dots(g.reshape(xhat.shape), xhat, w.shape)
    if dw is not None:
        return dw
    gx = g.reshape(xhat.shape) * xhat
    return _reshaped(_sum_rows(gx), w.shape)


def _ln_rule_b(m, g, ans, x, w, b, *, dims, eps, aux):  # type: ignore[no-untyped-def]
    return g if m.tensor_mode else _reshaped(_sum_rows(g.reshape(aux[0].shape)), g.shape[g.ndim - len(dims):])


def _ln_joint(g, ans, x, w=None, b=None, *, mask, dims, eps, aux):  # type: ignore[no-untyped-def]
    """dx, dw and db as ``mask`` asks, in one pass over ``g`` and x-hat (Note [Joint
    rules] in ops/_spec.py): the three rules above, computed together."""
    xhat, rstd = aux
    shape = g.shape[g.ndim - len(dims):]
    need = (mask[0], len(mask) > 1 and mask[1], len(mask) > 2 and mask[2])
    grads = fast.layer_norm_backward_joint(g, xhat, rstd, w, need, shape)
    if grads is None:
        grads = _ln_joint_numpy(g.reshape(xhat.shape), xhat, rstd, w, need, g.shape, shape)
    return grads[:len(mask)]


def _ln_joint_numpy(g, xhat, rstd, w, need, g_shape, shape):  # type: ignore[no-untyped-def]
    """``_ln_joint`` in numpy: ``g * xhat`` once serves dw and dx's row dots
    (``rowdot(g * w, xhat) = (g * xhat) @ w``)."""
    gx = g * xhat if need[0] or need[1] else None
    dw = _reshaped(_sum_rows(gx), shape) if need[1] else None
    db = _reshaped(_sum_rows(g), shape) if need[2] else None
    dx = None
    if need[0]:
        n = xhat.shape[1]
        gw = g if w is None else g * w.reshape(-1)
        if g.dtype in _FAST:
            dots = gx @ (np.ones(n, dtype=g.dtype) if w is None else w.reshape(-1))
            dots *= 1.0 / n
            dx = xhat * dots[:, None]
        else:
            dx = xhat * _row_means(gw, xhat)
        np.subtract(gw, dx, out=dx)
        dx -= _row_means(gw)
        dx *= rstd
        dx = _reshaped(dx, g_shape)
    return dx, dw, db


def _reshaped(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` in ``shape``, itself when it has that shape already: a fresh array the rules
    return can become ``.grad`` without the engine's copy, a view (even of the same shape)
    cannot (``commit._take``)."""
    return a if a.shape == shape else a.reshape(shape)


def _sum_rows(a: np.ndarray) -> np.ndarray:
    """The sum of the rows of a 2-D array (a BLAS gemv with a vector of ones)."""
    if a.dtype not in _FAST:
        return a.sum(axis=0)
    return np.ones(a.shape[0], dtype=a.dtype) @ a


# Note [Layer norm's cost factor]: a node's work counts the elements its kernel reads
# (Note [Inline or offload] in autograd/policy.py), and layer_norm's backward reads x's
# size twice (the gradient and x-hat). Its compiled joint pass takes about 0.34 ns per
# counted element at the ops table's large size (4096 rows of 256, 0.71 ms), an elementwise
# backward 0.3-0.65 ns (tanh, sigmoid, exp, GELU) and numpy's binary ones more (mul 0.86,
# where 1.2): so it counts 0.7 of its reads, and a layer norm over ~1M elements (a GPT of
# 256 dims at batch 32, block 128) runs inline like an elementwise node of the same kernel
# time, instead of paying a worker hop (0.3-0.7 ms measured) on a 0.7 ms kernel, 2.45x
# PyTorch's backward. The numpy path (no numba) makes a few passes more.
LAYER_NORM_COST = 0.7

# name ---------- node name ------------- forward ------- derivative ---------------------
# quiet: a row holding inf gives inf - inf = nan, which PyTorch returns without a warning
softmax = defop("SoftmaxBackward0", quiet(_softmax), _softmax_rule, save="ans")
log_softmax = defop("LogSoftmaxBackward0", quiet(_log_softmax), _log_softmax_rule, save="ans")
layer_norm = defop("NativeLayerNormBackward0", _layer_norm, _ln_rule_x, _ln_rule_w, _ln_rule_b,
                   save="x@0,1 y@0,1", has_aux=True, joint=_ln_joint, cost=LAYER_NORM_COST)
layer_norm_weight = defop("NativeLayerNormBackward0", _layer_norm, _ln_rule_x, _ln_rule_w,
                          save="x@0,1 y@0,1", has_aux=True, joint=_ln_joint, cost=LAYER_NORM_COST)
layer_norm_plain = defop("NativeLayerNormBackward0", _layer_norm, _ln_rule_x, save="x", has_aux=True,
                         cost=LAYER_NORM_COST)
gelu = defop("GeluBackward0", _gelu, _gelu_rule, save="x", has_aux=True)
gelu_tanh = defop("GeluBackward0", _gelu_tanh, _gelu_tanh_rule, save="x")
nll_loss = defop("NllLossBackward0", _nll_loss, _nll_rule, has_aux=True)
mse_loss = defop("MseLossBackward0", _mse,
                 _mse_rule_x,
                 lambda m, g, ans, x, y, *, reduction: -_mse_rule_x(m, g, ans, x, y, reduction=reduction),
                 save="x y")
