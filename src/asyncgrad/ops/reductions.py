"""Reductions: sum, mean, max/min (with and without ``dim``), var, and ``sum_to``.

``dim`` arrives normalised to a tuple of non-negative axes (or None for all axes), and
the input's shape is passed to the rule as ``shape``. max/min save a constant weight
array as ``aux``: for a full reduction the gradient is split evenly among ties (PyTorch's
``evenly_distribute_backward``), with ``dim`` it goes to the returned index.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._spec import defop


def _expand_back(m: Any, g: Any, dim: tuple[int, ...] | None, keepdim: bool,
                 shape: tuple[int, ...]) -> Any:
    """Broadcast the gradient of a reduction back to the reduced input's shape."""
    if dim is not None and not keepdim:
        for d in sorted(dim):
            g = m.unsqueeze(g, d)
    return m.broadcast_to(g, shape)


def _count(shape: tuple[int, ...], dim: tuple[int, ...] | None) -> int:
    if dim is None:
        return int(np.prod(shape, dtype=np.int64))
    return int(np.prod([shape[d] for d in dim], dtype=np.int64))


def _sum(x, *, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.asarray(np.sum(x, axis=dim, keepdims=keepdim))


def _mean(x, *, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.asarray(np.mean(x, axis=dim, keepdims=keepdim))


def _var(x, *, dim, keepdim, correction):  # type: ignore[no-untyped-def]
    n = _count(x.shape, dim)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.var(x, axis=dim, keepdims=keepdim, ddof=0) * float(np.divide(n, max(n - correction, 0))))


def _extreme_all(reduce: Any):  # type: ignore[no-untyped-def]
    def forward(x):  # type: ignore[no-untyped-def]
        ans = np.asarray(reduce(x))
        mask = x == ans
        weights = mask / np.asarray(mask.sum(), dtype=x.dtype)
        return ans, weights.astype(x.dtype, copy=False)
    return forward


def _extreme_dim(arg: Any):  # type: ignore[no-untyped-def]
    def forward(x, *, dim, keepdim):  # type: ignore[no-untyped-def]
        idx = np.expand_dims(arg(x, axis=dim), dim)
        values = np.take_along_axis(x, idx, dim)
        onehot = np.zeros_like(x)
        np.put_along_axis(onehot, idx, 1, dim)
        if not keepdim:
            values = np.squeeze(values, dim)
            idx = np.squeeze(idx, dim)
        return values, (onehot, idx)
    return forward


def _extreme_dim_rule(m, g, ans, x, *, dim, keepdim, aux):  # type: ignore[no-untyped-def]
    if not keepdim:
        g = m.unsqueeze(g, dim)
    return g * aux


# name ---------- node name ------- forward ---------- derivative ------------------------
sum = defop("SumBackward1", _sum,
            lambda m, g, ans, x, *, dim, keepdim, shape: _expand_back(m, g, dim, keepdim, shape))
sum_all = defop("SumBackward0", _sum,
                lambda m, g, ans, x, *, dim, keepdim, shape: m.broadcast_to(g, shape))
mean = defop("MeanBackward1", _mean,
             lambda m, g, ans, x, *, dim, keepdim, shape:
                 _expand_back(m, g, dim, keepdim, shape) / _count(shape, dim))
mean_all = defop("MeanBackward0", _mean,
                 lambda m, g, ans, x, *, dim, keepdim, shape:
                     m.broadcast_to(g, shape) / _count(shape, None))
var = defop("VarBackward0", _var,
            lambda m, g, ans, x, *, dim, keepdim, correction, shape:
                _expand_back(m, g, dim, keepdim, shape) * 2.0
                * (x - m.mean(x, dim, True)) / max(_count(shape, dim) - correction, 0),
            save="x")
max_all = defop("MaxBackward1", _extreme_all(np.max),
                lambda m, g, ans, x, *, aux: g * aux, has_aux=True)
min_all = defop("MinBackward1", _extreme_all(np.min),
                lambda m, g, ans, x, *, aux: g * aux, has_aux=True)
max_dim = defop("MaxBackward0", _extreme_dim(np.argmax), _extreme_dim_rule, has_aux=True)
min_dim = defop("MinBackward0", _extreme_dim(np.argmin), _extreme_dim_rule, has_aux=True)
