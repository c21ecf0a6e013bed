"""Reductions: sum, mean, max/min (with and without ``dim``), var, and ``sum_to``.

``dim`` arrives normalised to a tuple of non-negative axes (or None for all axes), and
the input's shape is passed to the rule as ``shape``. max/min save a constant weight
array as ``aux``: for a full reduction the gradient is split evenly among ties (PyTorch's
``evenly_distribute_backward``), with ``dim`` it goes to the returned index.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from ._spec import defop
from .kernels import compiled


def _expand_back(m: Any, g: Any, dim: tuple[int, ...] | None, keepdim: bool,
                 shape: tuple[int, ...]) -> Any:
    """Broadcast the gradient of a reduction back to the reduced input's shape."""
    if dim is not None and not keepdim:
        for d in sorted(dim):
            g = m.unsqueeze(g, d)
    return m.broadcast_to(g, shape)


def _count(shape: tuple[int, ...], dim: tuple[int, ...] | None) -> int:
    # (math.prod: np.prod is a Python-level function, ~5 us a call, on every mean's backward)
    if dim is None:
        return math.prod(shape)
    return math.prod([shape[d] for d in dim])


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# Below this many elements a sum over the last axis keeps numpy's reduction: a call into a
# compiled kernel costs ~1-2 us more (as ``compiled_path.ELEMENTWISE_MIN``).
ROW_SUMS_MIN = 4096
# From this many bytes a sum over the last axis reads one row at a time (the array comes
# from memory, not a core's cache: Note [Row sums from memory] in numba_kernels.py).
ROW_SUMS_STREAM_BYTES = 1 << 20


def _row_sums(x: np.ndarray, dim: tuple[int, ...] | None, keepdim: bool) -> np.ndarray | None:
    """``np.add.reduce(x, axis=dim, keepdims=keepdim)`` by the compiled ``row_sums``, the
    same bits (Note [Row sums in numpy's order] in numba_kernels.py), when ``dim`` is the
    last axis of a C-contiguous, writeable float32/float64 ``x`` of at least
    ``ROW_SUMS_MIN`` elements (and one) and the compiled kernels are in use and sum as
    this numpy does (checked at their load); else None. From ``ROW_SUMS_STREAM_BYTES``
    one row at a time (Note [Row sums from memory] in numba_kernels.py), the same bits."""
    if (x.size < ROW_SUMS_MIN or not x.size or x.dtype not in _FLOATS or dim is None or len(dim) != 1
            or dim[0] != x.ndim - 1):
        return None
    k = compiled()
    if k is None or not k.ROW_SUMS_MATCH_NUMPY or not x.flags.c_contiguous or not x.flags.writeable:
        return None
    n = x.shape[-1]
    out = np.empty(x.shape[:-1] + ((1,) if keepdim else ()), dtype=x.dtype)
    kernel = k.row_sums_streamed if x.nbytes >= ROW_SUMS_STREAM_BYTES else k.row_sums
    kernel(x.reshape(-1, n), out.reshape(-1))
    return out


def _sum(x, *, dim, keepdim):  # type: ignore[no-untyped-def]
    out = _row_sums(x, dim, keepdim)
    if out is not None:
        return out
    return np.asarray(np.sum(x, axis=dim, keepdims=keepdim))


# Note [A whole-array mean in Python floats]: numpy's ``_mean`` of a whole float32 or
# float64 array divides its scalar sum by the count as numpy scalars: float32 / intp
# promotes to float64, then the quotient is cast back to the array's dtype. Python's
# float division is that same float64 division (``float(total)`` is exact, and so is a
# count below 2**53), and ``np.array(q, dtype)`` that same cast: the same bits, without
# numpy's scalar arithmetic, which costs more than the sum of a small loss's elements.
def _mean(x, *, dim, keepdim):  # type: ignore[no-untyped-def]
    """``np.mean``. For float32/float64 it is numpy's own ``_mean`` written out (the
    sum with ``np.add.reduce``, then the division by the count as an ``intp``, so the
    same bits), without its Python-level wrappers: about half of its ~7 us on a small
    array, once per loss of every forward. Over the last axis the sum is ``_row_sums``'s
    (the same bits); over the whole array the division is in Python floats (Note [A
    whole-array mean in Python floats])."""
    if dim is None and not keepdim and x.dtype in _FLOATS and x.size:
        return np.array(float(np.add.reduce(x, axis=None)) / x.size, dtype=x.dtype)
    if x.dtype in _FLOATS and x.size:
        total = _row_sums(x, dim, keepdim)
        if total is None:
            total = np.add.reduce(x, axis=dim, keepdims=keepdim)
        count = np.intp(_count(x.shape, dim))
        if type(total) is np.ndarray:
            return np.true_divide(total, count, out=total, casting="unsafe")
        return np.asarray(total.dtype.type(total / count))
    return np.asarray(np.mean(x, axis=dim, keepdims=keepdim))


def _var(x, *, dim, keepdim, correction):  # type: ignore[no-untyped-def]
    n = _count(x.shape, dim)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.var(x, axis=dim, keepdims=keepdim, ddof=0) * float(np.divide(n, max(n - correction, 0))))


def _extreme_all(reduce: Any):  # type: ignore[no-untyped-def]
    def forward(x):  # type: ignore[no-untyped-def]
        ans = np.asarray(reduce(x))
        # a NaN result: the gradient is split among the NaN elements, as PyTorch's
        mask = np.isnan(x) if ans.dtype.kind == "f" and np.isnan(ans) else x == ans
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


# elements: below this, a sum's or mean's gradient over the whole input is copied out into
# a new array rather than made a zero-stride view by np.broadcast_to, whose Python-level
# bookkeeping costs more than the copy (docs/benchmarks.md, "Figures behind the Notes")
SMALL_EXPANDED_GRAD = 65_536


def _sum_all_rule(m, g, ans, x, *, dim, keepdim, shape):  # type: ignore[no-untyped-def]
    """``g`` at every position of the input: a read-only zero-stride view of it, as
    PyTorch's ``expand``; a numpy one below SMALL_EXPANDED_GRAD elements a new array
    (writeable, as mean's), the same values."""
    if m.tensor_mode or type(g) is not np.ndarray or math.prod(shape) >= SMALL_EXPANDED_GRAD:
        return m.broadcast_to(g, shape)
    out = np.empty(shape, dtype=g.dtype)
    out[...] = g
    return out


# name ---------- node name ------- forward ---------- derivative ------------------------
sum = defop("SumBackward1", _sum,
            lambda m, g, ans, x, *, dim, keepdim, shape: _expand_back(m, g, dim, keepdim, shape))
sum_all = defop("SumBackward0", _sum, _sum_all_rule)


def _mean_rule(m, g, ans, x, *, dim, keepdim, shape):  # type: ignore[no-untyped-def]
    """Note [Mean's gradient in one pass]: ``g / n`` at every position of the input.
    Dividing the broadcast gradient element by element (PyTorch's ``sum_backward(...) /
    n``) is a float division per element: 0.3 ms for a 256 x 1024 float32 gradient, the
    MLP benchmark's whole loss node. So ``g`` is divided once, in its own (reduced)
    shape, and copied out: one write pass (about 0.04 ms there), the same bits (each
    element is ``g / n`` either way). The result is a fresh, writeable array, as
    PyTorch's: a custom Function or hook may write into it, which a zero-stride view
    (a large sum's gradient) refuses. Under ``create_graph`` the rule stays as PyTorch's. (The
    engine's fused step may take ``_mean_view_rule``'s view instead, for a child that
    only reads it: Note [Mean's gradient as a view] in autograd/task/step.py.)"""
    n = _count(shape, dim)
    if m.tensor_mode:
        return _expand_back(m, g, dim, keepdim, shape) / n
    q = np.true_divide(g, n)
    if n * q.size >= SMALL_EXPANDED_GRAD:
        return np.array(_expand_back(m, q, dim, keepdim, shape), order="C")
    # a small gradient (a loss's mean): copied out into a new C-ordered array without
    # np.broadcast_to's Python-level view, ~5 us of a small mean's ~12 us backward
    if dim is not None and not keepdim:  # (_expand_back's unsqueeze, as one reshape)
        q = q.reshape(tuple(1 if d in dim else s for d, s in enumerate(shape)))
    out = np.empty(shape, dtype=q.dtype)
    out[...] = q
    return out


def _mean_view_rule(m, g, ans, x, *, dim, keepdim, shape):  # type: ignore[no-untyped-def]
    """``_mean_rule`` as a read-only broadcast view of ``g / n`` (strides 0): no write
    pass over the input's shape, for the engine's fused step only, which hands it to a
    built-in child that reads it and keeps nothing (Note [Mean's gradient as a view] in
    autograd/task/step.py). A small gradient takes ``_mean_rule``'s own path."""
    n = _count(shape, dim)
    if n * g.size < SMALL_EXPANDED_GRAD:
        return _mean_rule(m, g, ans, x, dim=dim, keepdim=keepdim, shape=shape)
    return _expand_back(m, np.true_divide(g, n), dim, keepdim, shape)


mean = defop("MeanBackward1", _mean, _mean_rule, view_vjp=_mean_view_rule)
mean_all = defop("MeanBackward0", _mean, _mean_rule, view_vjp=_mean_view_rule)
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


# --- reductions added for PyTorch parity ----------------------------------------------------
def _prod(x, *, dim, keepdim):  # type: ignore[no-untyped-def]
    out = np.asarray(np.prod(x, axis=dim, keepdims=keepdim))
    return out.astype(np.int64) if x.dtype.kind in "biu" else out


def _prod_others(x, *, dim):  # type: ignore[no-untyped-def]
    """For each element, the product of all the others along ``dim`` (all elements when
    None), from exclusive cumulative products: exact where the input has zeros, where
    ``prod / x`` is not."""
    y = x.reshape(-1) if dim is None else np.moveaxis(x, dim[0], -1)
    ones = np.ones(y.shape[:-1] + (1,), dtype=y.dtype)
    left = np.cumprod(np.concatenate([ones, y[..., :-1]], -1), -1)
    right = np.cumprod(np.concatenate([ones, y[..., :0:-1]], -1), -1)[..., ::-1]
    out = left * right
    return out.reshape(x.shape) if dim is None else np.moveaxis(out, -1, dim[0])


def _prod_rule(m, g, ans, x, *, dim, keepdim, shape):  # type: ignore[no-untyped-def]
    g = _expand_back(m, g, dim, keepdim, shape)
    if np.asarray(x).all():  # no zeros: the product of the others is prod / x (PyTorch's fast path)
        return g * _expand_back(m, ans, dim, keepdim, shape) / x
    return g * m.prod_others(x, dim)


def _prod_others_rule(m, g, ans, x, *, dim):  # type: ignore[no-untyped-def]
    # d(others_i)/dx_k = prod of x over j not in {i, k} (k != i): row i of a pairwise table
    # holds the products of the others of x with x_i replaced by 1, with its diagonal zeroed
    shape = x.shape
    if dim is None:
        x, g, axis = m.reshape(x, (-1,)), m.reshape(g, (-1,)), 0
    else:
        axis = dim[0]
    perm = tuple(k for k in range(len(x.shape)) if k != axis) + (axis,)
    xl, gl = m.permute(x, perm), m.permute(g, perm)
    eye = np.eye(x.shape[axis], dtype=bool)
    rows = m.where(eye, 1.0, m.unsqueeze(xl, -2))
    pair = m.where(eye, 0.0, m.prod_others(rows, (len(rows.shape) - 1,)))
    out = m.permute(m.sum(m.unsqueeze(gl, -1) * pair, -2), tuple(int(i) for i in np.argsort(perm)))
    return m.reshape(out, shape)


def _std(x, *, dim, keepdim, correction):  # type: ignore[no-untyped-def]
    return np.sqrt(_var(x, dim=dim, keepdim=keepdim, correction=correction))


def _std_rule(m, g, ans, x, *, dim, keepdim, correction, shape):  # type: ignore[no-untyped-def]
    # var's rule with g / (2 std); zero where std == 0 (PyTorch's std_backward). The
    # divisor is made safe first so that a second derivative has no 0 * inf either.
    zero = ans == 0
    g = m.where(zero, 0.0, g / m.where(zero, 1.0, ans))
    return _expand_back(m, g, dim, keepdim, shape) * (x - m.mean(x, dim, True)) / max(
        _count(shape, dim) - correction, 0)


def _median_all(skip_nan: bool):  # type: ignore[no-untyped-def]
    def forward(x):  # type: ignore[no-untyped-def]
        # the lower of the two middle values, as PyTorch; NaN if any (median) or all (nanmedian)
        flat = np.sort(x.reshape(-1))
        nan = np.isnan(flat)
        n = int(flat.size - nan.sum()) if skip_nan else flat.size
        if skip_nan or not nan.any():
            ans = np.asarray(flat[(n - 1) // 2] if n else np.nan, dtype=x.dtype)
        else:
            ans = np.asarray(np.nan, dtype=x.dtype)
        mask = np.isnan(x) if np.isnan(ans) else x == ans
        with np.errstate(invalid="ignore", divide="ignore"):
            weights = mask / np.asarray(mask.sum(), dtype=x.dtype) if mask.any() else np.zeros_like(x)
        return ans, weights.astype(x.dtype, copy=False)
    return forward


def median_position(x: np.ndarray, dim: int, skip_nan: bool) -> np.ndarray:
    """The index along ``dim`` (kept, size 1) of the lower median of each slice: of the
    non-NaN values for nanmedian, and of a NaN where the slice holds one for median."""
    order = np.argsort(x, axis=dim, kind="stable")  # NaNs sort last
    count = np.sum(~np.isnan(x), axis=dim, keepdims=True)
    if skip_nan:
        pos = np.maximum((count - 1) // 2, 0)
    else:
        pos = np.where(count < x.shape[dim], count, (x.shape[dim] - 1) // 2)
    return np.take_along_axis(order, pos, dim)


def along_index(shape: tuple[int, ...], dim: int, idx: np.ndarray, keepdim: bool) -> tuple[np.ndarray, ...]:
    """The advanced index into an array of ``shape`` picking ``idx`` (indices along
    ``dim``, laid out as the output) in every other position: ``x[index]`` is the
    selected values, and no element is picked twice when ``idx`` has no repeats per slice."""
    out_ndim = idx.ndim
    index = []
    for k, n in enumerate(shape):
        if k == dim:
            index.append(idx)
            continue
        pos = k if keepdim or k < dim else k - 1
        index.append(np.arange(n).reshape([-1 if j == pos else 1 for j in range(out_ndim)]))
    return tuple(index)


def _select_rule(m, g, ans, x, *, index, shape):  # type: ignore[no-untyped-def]
    return m.index_add(g, index, shape, True)


def _norm(x, *, p, dim, keepdim):  # type: ignore[no-untyped-def]
    a = np.abs(x)
    if p == 0:
        return np.asarray(np.sum(a != 0, axis=dim, keepdims=keepdim), dtype=x.dtype)
    if p == 1:
        return np.asarray(np.sum(a, axis=dim, keepdims=keepdim))
    if p == 2:
        return np.asarray(np.sqrt(np.sum(a * a, axis=dim, keepdims=keepdim)))
    with np.errstate(divide="ignore", over="ignore"):
        return np.asarray(np.sum(a ** p, axis=dim, keepdims=keepdim) ** (1.0 / p))


def _norm_rule(m, g, ans, x, *, p, dim, keepdim, shape):  # type: ignore[no-untyped-def]
    # PyTorch's linalg_vector_norm_backward: zero gradient where the norm is zero
    g = _expand_back(m, g, dim, keepdim, shape)
    if p == 0:
        return g * 0.0
    if p == 1:
        return g * m.sign(x)
    ans = _expand_back(m, ans, dim, keepdim, shape)
    zero = ans == 0
    safe = m.where(zero, 1.0, ans)
    if p == 2:
        return x * m.where(zero, 0.0, g / safe)
    sign = m.sign(x)
    with np.errstate(divide="ignore", invalid="ignore"):  # |x| ** (p - 1) at x == 0, masked for p < 1
        scaled = m.where(x == 0, 0.0, sign * (x * sign) ** (p - 1))
    return scaled * m.where(zero, 0.0, g / safe ** (p - 1))


def _norm_inf(x, *, p, dim, keepdim):  # type: ignore[no-untyped-def]
    a = np.abs(x)
    ans = np.asarray((np.max if p > 0 else np.min)(a, axis=dim, keepdims=True))
    mask = (a == ans) | np.isnan(a)  # the gradient is split among the extreme elements
    weights = (mask / np.sum(mask, axis=dim, keepdims=True)).astype(x.dtype, copy=False)
    if not keepdim:
        ans = ans.reshape(()) if dim is None else np.squeeze(ans, dim)
    return ans, weights


def _norm_inf_rule(m, g, ans, x, *, p, dim, keepdim, shape, aux):  # type: ignore[no-untyped-def]
    return m.sign(x) * _expand_back(m, g, dim, keepdim, shape) * aux


prod_all = defop("ProdBackward0", _prod, _prod_rule, save="x ans")
prod = defop("ProdBackward1", _prod, _prod_rule, save="x ans")
prod_others = defop("ProdOthersBackward0", _prod_others, _prod_others_rule, save="x")
std = defop("StdBackward0", _std, _std_rule, save="x ans")
median_all = defop("MedianBackward0", _median_all(False), lambda m, g, ans, x, *, aux: g * aux, has_aux=True)
nanmedian_all = defop("NanmedianBackward0", _median_all(True), lambda m, g, ans, x, *, aux: g * aux, has_aux=True)
# value-selecting reductions along a dim: the gradient goes to the selected elements
topk = defop("TopkBackward0", lambda x, *, index: x[index], _select_rule)
median_dim = replace(topk, node_name="MedianBackward1")
nanmedian_dim = replace(topk, node_name="NanmedianBackward1")
# var_mean / std_mean: one node per output, both named as PyTorch's shared node
var_of_var_mean = replace(var, node_name="VarMeanBackward0")
mean_of_var_mean = replace(mean, node_name="VarMeanBackward0")
std_of_std_mean = replace(std, node_name="StdMeanBackward0")
mean_of_std_mean = replace(mean, node_name="StdMeanBackward0")
norm = defop("LinalgVectorNormBackward0", _norm, _norm_rule, save="x ans")
norm_inf = defop("LinalgVectorNormBackward0", _norm_inf, _norm_inf_rule, save="x", has_aux=True)


# --- amax / amin (PyTorch's: several dims; ties and NaN as its amax_backward) ---------------
def _extreme_dims(reduce: Any):  # type: ignore[no-untyped-def]
    def forward(x, *, dim, keepdim):  # type: ignore[no-untyped-def]
        ans = reduce(x, axis=dim, keepdims=True)
        mask = x == ans
        with np.errstate(invalid="ignore", divide="ignore"):  # a NaN result: NaN weights, as PyTorch
            weights = mask / np.sum(mask, axis=dim, keepdims=True, dtype=x.dtype)
        values = ans if keepdim else np.squeeze(ans, axis=dim if dim is not None else None)
        return np.asarray(values), weights.astype(x.dtype, copy=False)
    return forward


def _extreme_dims_rule(m, g, ans, x, *, dim, keepdim, shape, aux):  # type: ignore[no-untyped-def]
    return _expand_back(m, g, dim, keepdim, shape) * aux


amax = defop("AmaxBackward0", _extreme_dims(np.max), _extreme_dims_rule, has_aux=True)
amin = defop("AminBackward0", _extreme_dims(np.min), _extreme_dims_rule, has_aux=True)
cumsum = defop("CumsumBackward0", lambda x, *, dim: np.cumsum(x, axis=dim),
               # each input feeds every later output: the reversed running sum of g
               lambda m, g, ans, x, *, dim: m.sum(g, dim, True) - m.cumsum(g, dim) + g)
