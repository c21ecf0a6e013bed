"""Batch normalisation in training mode: each channel (dim 1) normalised by the mean and
biased variance over the batch and every spatial position, then scaled and shifted.

The forward makes one pass for the means, one for the variances and one for the output,
and keeps the centred input and ``1 / std`` (as layer norm keeps x-hat: Note [Layer norm
keeps x-hat] in ops/nn.py); the backward's joint rule makes one pass for the two channel sums it needs
(``sum g`` and ``sum g * x-hat``, which are also ``db`` and ``dw``) and one for ``dx``:

    dx = w * rstd * (g - mean(g) - x-hat * mean(g * x-hat))

Under ``create_graph`` the rules recompute x-hat from ``x`` with ``m``'s functions, so the
result is differentiable again. Evaluation mode (running statistics) is an affine map per
channel, made of elementwise ops by the caller.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._spec import defop
from .kernels import compiled_path as fast


def _as_channels(a: np.ndarray) -> np.ndarray:
    """``a`` (N, C, *spatial) as (N, C, R)."""
    return a.reshape(a.shape[0], a.shape[1], -1)


def _channel_sums(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """The sum over (N, R) of ``a`` (N, C, R), or of ``a * b``, per channel: row sums by a
    product with ones (BLAS) or row dots, then over the batch."""
    if b is None:
        if a.dtype.kind == "f" and a.shape[2] > 1:
            return (a @ np.ones(a.shape[2], dtype=a.dtype)).sum(axis=0)  # type: ignore[no-any-return]
        return a.sum(axis=(0, 2))  # type: ignore[no-any-return]
    return np.einsum("ncr,ncr->nc", a, b).sum(axis=0)  # type: ignore[no-any-return]


def _column(v: np.ndarray) -> np.ndarray:
    return v.reshape(1, -1, 1)


def _batch_norm(x: np.ndarray, *affine: np.ndarray, eps: float) -> tuple[np.ndarray, tuple[Any, ...]]:
    """The normalised output and, as aux, ``(xc, rstd, mean, var)``: the centred input
    ``x - mean`` as (N, C, R), ``1 / sqrt(var + eps)``, and the batch's mean and biased
    variance per channel (x-hat is ``xc * rstd``; keeping ``xc`` spares the forward a pass).
    The compiled kernel: Note [Batch norm per channel] in ops/kernels/numba_kernels.py."""
    compiled = fast.batch_norm(x, affine, eps)
    if compiled is not None:
        return compiled
    x3 = _as_channels(x)
    n = x3.shape[0] * x3.shape[2]
    mean = _channel_sums(x3) / n
    xc = x3 - _column(mean)
    var = _channel_sums(xc, xc) / n
    rstd = 1.0 / np.sqrt(var + eps)
    w, b = affine if affine else (None, None)
    out = xc * _column(rstd if w is None else w * rstd)
    if b is not None:
        out += _column(b)
    return out.reshape(x.shape), (xc, rstd, mean, var)


def _dims(x: Any) -> tuple[int, ...]:
    return (0, *range(2, x.ndim))


def _m_xhat(m: Any, x: Any, eps: float) -> Any:
    """x-hat from ``x`` by ``m``'s (differentiable) functions, in x's shape."""
    dims = _dims(x)
    xc = x - m.mean(x, dims, True)
    return xc * (1.0 / m.sqrt(m.mean(xc * xc, dims, True) + eps)), dims


def _bn_rule_x(m: Any, g: Any, ans: Any, x: Any, w: Any = None, b: Any = None, *, eps: float, aux: Any) -> Any:
    if m.tensor_mode:
        xhat, dims = _m_xhat(m, x, eps)
        xc = x - m.mean(x, dims, True)
        rstd = 1.0 / m.sqrt(m.mean(xc * xc, dims, True) + eps)
        gw = g if w is None else g * m.reshape(w, (1, -1, *(1,) * (x.ndim - 2)))
        return rstd * (gw - m.mean(gw, dims, True) - xhat * m.mean(gw * xhat, dims, True))
    return _bn_joint(g, ans, x, w, b, mask=(True,), eps=eps, aux=aux)[0]


def _bn_rule_w(m: Any, g: Any, ans: Any, x: Any, w: Any, b: Any = None, *, eps: float, aux: Any) -> Any:
    if m.tensor_mode:
        xhat, dims = _m_xhat(m, x, eps)
        return m.sum(g * xhat, dims)
    return _bn_joint(g, ans, x, w, b, mask=(False, True), eps=eps, aux=aux)[1]


def _bn_rule_b(m: Any, g: Any, ans: Any, x: Any, w: Any, b: Any, *, eps: float, aux: Any) -> Any:
    return m.sum(g, _dims(g)) if m.tensor_mode else _channel_sums(_as_channels(g))


def _bn_joint(g: np.ndarray, ans: Any, x: Any, w: Any = None, b: Any = None, *, mask: tuple[bool, ...],
              eps: float, aux: Any) -> tuple[np.ndarray | None, ...]:
    """dx, dw and db as ``mask`` asks, from the two channel sums (Note [Joint rules])."""
    xc, rstd = aux[0], aux[1]
    compiled = fast.batch_norm_backward(g, xc, rstd, w, mask[0])
    if compiled is not None:
        return (compiled[0], compiled[1] if len(mask) > 1 and mask[1] else None,
                compiled[2] if len(mask) > 2 and mask[2] else None)[:len(mask)]
    g3 = _as_channels(g)
    n = g3.shape[0] * g3.shape[2]
    gsum = _channel_sums(g3)
    gx = _channel_sums(g3, xc) * rstd  # sum g * x-hat
    dx = None
    if mask[0]:
        dx = xc * _column(gx * rstd / n)
        np.subtract(g3, dx, out=dx)
        dx -= _column(gsum / n)
        dx *= _column(rstd if w is None else w * rstd)
        dx = dx.reshape(g.shape)
    dw = gx if len(mask) > 1 and mask[1] else None
    db = gsum if len(mask) > 2 and mask[2] else None
    return (dx, dw, db)[:len(mask)]


# name ---------- node name ------------- forward ------- derivative per input -------------------
batch_norm = defop("NativeBatchNormBackward0", _batch_norm, _bn_rule_x, _bn_rule_w, _bn_rule_b,
                   save="x@0,1 y@0", has_aux=True, joint=_bn_joint)
batch_norm_plain = defop("NativeBatchNormBackward0", _batch_norm, _bn_rule_x, save="x", has_aux=True)
