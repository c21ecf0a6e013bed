"""The rest of PyTorch's ``torch.*`` operations that model code reaches for (issue 32).

Elementwise functions with rules of their own are rows in ``ops/elementwise.py``; the
others are built from differentiable primitives (``logsumexp`` from ``amax``, ``exp``,
``sum`` and ``log``; ``roll`` and ``repeat_interleave`` from indexing; ``addmm`` from
``matmul``), so their gradients, and gradients of gradients, are those of the
primitives. Queries (``isnan``, ``nonzero``, ``unique`` ...) are outside the graph, as in
PyTorch. Each is an ``ag.*`` function and, where PyTorch has one, a ``Tensor`` method.
"""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import return_types
from ._aliases import numpy_aliases
from ._dtype import as_array, get_default_dtype
from .creation import _check_device, _finish, randint, randn
from .functional import (
    _binary, _dim, _reduction_dims, _tensor, _unary, add, amax, cat, clamp, clone, cos, div, exp, gather, getitem,
    index_put, log, matmul, sin, maximum, mul, narrow, permute, pow, record, repeat, reshape, sqrt, squeeze, sub, sum,
    to_dtype, transpose, unsqueeze, where,
)
from .functional import broadcast_to as _broadcast_to
from .functional import diagonal as _diagonal
from .functional import index_add as add_at
from .ops import elementwise as E
from .ops import reductions as R
from .tensor import Tensor

def _wrap(arr: Any) -> Tensor:
    return Tensor._wrap(np.asarray(arr))


def _data(x: Any) -> Any:
    return x.data if isinstance(x, Tensor) else x


# --- elementwise (rows in ops/elementwise.py) -------------------------------------------------
def rsqrt(x: Tensor) -> Tensor:
    """``1 / sqrt(x)``."""
    return _unary(E.rsqrt, x)


def log1p(x: Tensor) -> Tensor:
    """``log(1 + x)``, accurate for small ``x``."""
    return _unary(E.log1p, x)


def expm1(x: Tensor) -> Tensor:
    """``exp(x) - 1``, accurate for small ``x``."""
    return _unary(E.expm1, x)


def log2(x: Tensor) -> Tensor:
    """The base-2 logarithm."""
    return _unary(E.log2, x)


def log10(x: Tensor) -> Tensor:
    """The base-10 logarithm."""
    return _unary(E.log10, x)


def exp2(x: Tensor) -> Tensor:
    """``2 ** x``."""
    return _unary(E.exp2, x)


def sinh(x: Tensor) -> Tensor:
    """The hyperbolic sine."""
    return _unary(E.sinh, x)


def cosh(x: Tensor) -> Tensor:
    """The hyperbolic cosine."""
    return _unary(E.cosh, x)


def asin(x: Tensor) -> Tensor:
    """The inverse sine."""
    return _unary(E.asin, x)


def acos(x: Tensor) -> Tensor:
    """The inverse cosine."""
    return _unary(E.acos, x)


def atan(x: Tensor) -> Tensor:
    """The inverse tangent."""
    return _unary(E.atan, x)


def atan2(y: Any, x: Any) -> Tensor:
    """The angle of the point ``(x, y)``, elementwise, broadcast."""
    return _binary(E.atan2, y, x)


def reciprocal(x: Tensor) -> Tensor:
    """``1 / x``."""
    return _unary(E.reciprocal, x)


def erfc(x: Tensor) -> Tensor:
    """The complementary error function ``1 - erf(x)``."""
    return _unary(E.erfc, x)


def floor(x: Tensor) -> Tensor:
    """Round down (a zero gradient, as PyTorch)."""
    return _unary(E.floor, x)


def ceil(x: Tensor) -> Tensor:
    """Round up (a zero gradient)."""
    return _unary(E.ceil, x)


def round(x: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001  (PyTorch's name)
    """Round half to even (to ``decimals`` places); a zero gradient."""
    if decimals:
        scale = 10.0 ** decimals
        return div(_unary(E.round_, mul(x, scale)), scale)
    return _unary(E.round_, x)


def trunc(x: Tensor) -> Tensor:
    """Round towards zero (a zero gradient)."""
    return _unary(E.trunc, x)


fix = trunc


def frac(x: Tensor) -> Tensor:
    """The fractional part ``x - trunc(x)``."""
    return _unary(E.frac, x)


def sign(x: Tensor) -> Tensor:
    """-1, 0 or 1 by the sign of each element (a zero gradient)."""
    return _unary(E.sign, x)


def square(x: Tensor) -> Tensor:
    """``x * x``."""
    return pow(x, 2)


def _integers(x: Any, y: Any) -> bool:
    return bool(np.asarray(_data(x)).dtype.kind in "iub" and np.asarray(_data(y)).dtype.kind in "iub")


def remainder(x: Any, y: Any) -> Tensor:
    """Python's modulus (the sign of ``y``): ``x - floor(x / y) * y`` (integers stay integers)."""
    if _integers(x, y):
        return _wrap(np.remainder(_data(x), _data(y)))
    return sub(x, mul(floor(div(x, y)), y))


def fmod(x: Any, y: Any) -> Tensor:
    """C's remainder (the sign of ``x``): ``x - trunc(x / y) * y`` (integers stay integers)."""
    if _integers(x, y):
        return _wrap(np.fmod(_data(x), _data(y)))
    return sub(x, mul(trunc(div(x, y)), y))


def floor_divide(x: Any, y: Any) -> Tensor:
    """``floor(x / y)`` (a zero gradient; integers stay integers)."""
    if _integers(x, y):
        return _wrap(np.floor_divide(_data(x), _data(y)))
    return floor(div(x, y))


true_divide = div


def clamp_min(x: Tensor, min: Any) -> Tensor:  # noqa: A002
    """``max(x, min)``."""
    return clamp(x, min=min)


def clamp_max(x: Tensor, max: Any) -> Tensor:  # noqa: A002
    """``min(x, max)``."""
    return clamp(x, max=max)


def lerp(start: Any, end: Any, weight: Any) -> Tensor:
    """``start + weight * (end - start)``."""
    return add(start, mul(weight, sub(end, start)))


def addcmul(x: Tensor, t1: Any, t2: Any, *, value: float = 1) -> Tensor:
    """``x + value * t1 * t2``."""
    return add(x, mul(mul(t1, t2), value))


def addcdiv(x: Tensor, t1: Any, t2: Any, *, value: float = 1) -> Tensor:
    """``x + value * t1 / t2``."""
    return add(x, mul(div(t1, t2), value))


def hypot(x: Any, y: Any) -> Tensor:
    """``sqrt(x**2 + y**2)``."""
    return sqrt(add(mul(x, x), mul(y, y)))


def logaddexp(x: Any, y: Any) -> Tensor:
    """``log(exp(x) + exp(y))`` without overflow."""
    top = maximum(x, y).detach()
    top = where(np.isfinite(top.data), top, 0.0)
    return add(top, log(add(exp(sub(x, top)), exp(sub(y, top)))))


def xlogy(x: Any, y: Any) -> Tensor:
    """``x * log(y)``, 0 where ``x == 0``."""
    return where(_data(x) == 0, 0.0, mul(x, log(y)))


def nan_to_num(x: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN, +inf and -inf replaced (by 0 and the dtype's largest and smallest values by
    default); the gradient passes where ``x`` was finite."""
    x = _tensor(x)
    info = np.finfo(x.dtype) if x.dtype.kind == "f" else None
    hi = posinf if posinf is not None else (info.max if info is not None else 0)
    lo = neginf if neginf is not None else (info.min if info is not None else 0)
    d = x.data
    fill = np.where(np.isnan(d), nan, np.where(d > 0, hi, lo)).astype(x.dtype)
    return where(np.isfinite(d), x, _wrap(fill))


# --- reductions and scans ------------------------------------------------------------------
@numpy_aliases
def logsumexp(x: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(x), dim))`` without overflow."""
    x = _tensor(x)
    top = amax(x, dim, keepdim=True).detach()
    top = where(np.isfinite(top.data), top, 0.0)
    out = add(log(sum(exp(sub(x, top)), dim, keepdim=True)), top)
    if not keepdim:
        dims = _reduction_dims(dim, x.ndim)
        for d in sorted(dims or range(x.ndim), reverse=True):
            out = squeeze(out, d)
    return out


def cumsum(x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    """The running sum along ``dim``."""
    x = _tensor(x)
    if dtype is not None:
        x = to_dtype(x, dtype)
    d = _dim(dim, builtins.max(x.ndim, 1))
    if x.ndim == 0:
        return clone(x)
    out = np.cumsum(x.data, axis=d, dtype=x.dtype if x.dtype.kind == "f" else np.int64)
    return record(R.cumsum, (x,), out, params={"dim": d})


def diff(x: Tensor, n: int = 1, dim: int = -1) -> Tensor:
    """Differences of neighbours along ``dim``, ``n`` times."""
    x = _tensor(x)
    d = _dim(dim, x.ndim)
    for _ in range(n):
        length = x.shape[d]
        x = sub(narrow(x, d, 1, length - 1), narrow(x, d, 0, length - 1))
    return x


def trace(x: Tensor) -> Tensor:
    """The sum of the main diagonal of a matrix."""
    x = _tensor(x)
    if x.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {x.ndim}")
    return sum(_diagonal(x))


# --- shapes and order --------------------------------------------------------------------------
def flip(x: Tensor, dims: Any) -> Tensor:
    """A copy with the order of ``dims`` reversed."""
    x = _tensor(x)
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    index = [slice(None)] * x.ndim
    for d in dims:
        index[_dim(d, x.ndim)] = slice(None, None, -1)
    return clone(getitem(x, tuple(index)))


def fliplr(x: Tensor) -> Tensor:
    """``flip(x, 1)``."""
    return flip(x, 1)


def flipud(x: Tensor) -> Tensor:
    """``flip(x, 0)``."""
    return flip(x, 0)


def roll(x: Tensor, shifts: Any, dims: Any = None) -> Tensor:
    """Elements shifted by ``shifts`` along ``dims`` (of the flattened tensor when None),
    wrapping around."""
    x = _tensor(x)
    if dims is None:
        return reshape(roll(reshape(x, (-1,)), shifts, 0), x.shape)
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    for s, d in zip(shifts, dims):
        d = _dim(d, x.ndim)
        n = x.shape[d]
        k = int(s) % n if n else 0
        if k:  # the last k elements first: two slices, concatenated
            x = cat([narrow(x, d, n - k, k), narrow(x, d, 0, n - k)], d)
    return x


def movedim(x: Tensor, source: Any, destination: Any) -> Tensor:
    """The dims ``source`` moved to ``destination``, the others in order."""
    x = _tensor(x)
    src = [_dim(d, x.ndim) for d in ((source,) if isinstance(source, int) else source)]
    dst = [_dim(d, x.ndim) for d in ((destination,) if isinstance(destination, int) else destination)]
    order = [d for d in range(x.ndim) if d not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute(x, order)


moveaxis = movedim


def unflatten(x: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """Dim ``dim`` split into ``sizes`` (one may be -1)."""
    x = _tensor(x)
    d = _dim(dim, x.ndim)
    return reshape(x, (*x.shape[:d], *sizes, *x.shape[d + 1:]))


def tile(x: Tensor, dims: Sequence[int]) -> Tensor:
    """``repeat`` with leading 1s added to ``dims`` as needed."""
    x = _tensor(x)
    dims = tuple(dims)
    return repeat(x, (1,) * (x.ndim - len(dims)) + dims)


def repeat_interleave(x: Tensor, repeats: Any, dim: int | None = None) -> Tensor:
    """Each element repeated ``repeats`` times (an int, or one count per element) along
    ``dim`` (of the flattened tensor when None)."""
    x = _tensor(x)
    if dim is None:
        x, d = reshape(x, (-1,)), 0
    else:
        d = _dim(dim, x.ndim)
    order = np.repeat(np.arange(x.shape[d]), np.asarray(_data(repeats)))
    return getitem(x, (slice(None),) * d + (order,))


def take_along_dim(x: Tensor, indices: Any, dim: int | None = None) -> Tensor:
    """``gather`` with the index broadcast against ``x`` (over the flattened tensor when
    ``dim`` is None), as numpy's ``take_along_axis``."""
    x = _tensor(x)
    idx = np.asarray(_data(indices))
    if dim is None:
        return gather(reshape(x, (-1,)), 0, _wrap(idx.reshape(-1)))
    d = _dim(dim, x.ndim)
    shape = list(np.broadcast_shapes(tuple(1 if k == d else n for k, n in enumerate(x.shape)),
                                     tuple(1 if k == d else n for k, n in enumerate(idx.shape))))
    xs = list(shape)
    xs[d] = x.shape[d]
    shape[d] = idx.shape[d]
    return gather(_broadcast_to(x, xs), d, _wrap(np.broadcast_to(idx, shape)))


def masked_select(x: Tensor, mask: Any) -> Tensor:
    """The elements where ``mask`` (broadcast) is true, as a 1-D tensor."""
    x = _tensor(x)
    m = np.asarray(_data(mask), dtype=bool)
    shape = np.broadcast_shapes(x.shape, m.shape)
    full = x if x.shape == shape else _broadcast_to(x, shape)
    return getitem(full, np.broadcast_to(m, shape))


def broadcast_tensors(*tensors: Any) -> tuple[Tensor, ...]:
    """The tensors broadcast to their common shape."""
    ts = [_tensor(t) for t in tensors]
    shape = np.broadcast_shapes(*(t.shape for t in ts))
    return tuple(t if t.shape == shape else _broadcast_to(t, shape) for t in ts)


def meshgrid(*tensors: Any, indexing: str | None = None) -> tuple[Tensor, ...]:
    """Coordinate grids of 1-D tensors (``"ij"`` indexing unless ``indexing="xy"``)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        warnings.warn("asyncgrad.meshgrid: in an upcoming release, it will be required to pass the indexing "
                      "argument.", UserWarning, stacklevel=2)
        indexing = "ij"
    ts = [reshape(_tensor(t), (-1,)) for t in tensors]
    if indexing == "xy" and len(ts) >= 2:
        ts[0], ts[1] = ts[1], ts[0]
    n = len(ts)
    shape = tuple(t.shape[0] for t in ts)
    grids = [_broadcast_to(reshape(t, tuple(-1 if k == i else 1 for k in range(n))), shape)
             for i, t in enumerate(ts)]
    if indexing == "xy" and n >= 2:  # the first two inputs were swapped: swap their grids back
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def hstack(tensors: Sequence[Any]) -> Tensor:
    """Concatenate along dim 1 (dim 0 for 1-D tensors)."""
    ts = [_tensor(t) for t in tensors]
    return cat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Any]) -> Tensor:
    """Concatenate along dim 0, 1-D tensors as rows."""
    return cat([reshape(t, (1, -1)) if _tensor(t).ndim == 1 else _tensor(t) for t in tensors], 0)


def column_stack(tensors: Sequence[Any]) -> Tensor:
    """1-D tensors as columns, concatenated along dim 1."""
    return cat([reshape(t, (-1, 1)) if _tensor(t).ndim <= 1 else _tensor(t) for t in tensors], 1)


def dstack(tensors: Sequence[Any]) -> Tensor:
    """Concatenate along dim 2 (tensors made at least 3-D)."""
    def three(t: Tensor) -> Tensor:
        t = _tensor(t)
        return reshape(t, (1, -1, 1)) if t.ndim <= 1 else reshape(t, (*t.shape, 1)) if t.ndim == 2 else t
    return cat([three(t) for t in tensors], 2)


def t(x: Tensor) -> Tensor:
    """The transpose of a matrix (a vector unchanged)."""
    x = _tensor(x)
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return x if x.ndim < 2 else transpose(x, 0, 1)


# --- products ------------------------------------------------------------------------------
def outer(x: Tensor, y: Tensor) -> Tensor:
    """The outer product of two vectors."""
    return mul(unsqueeze(_tensor(x), 1), unsqueeze(_tensor(y), 0))


ger = outer


def dot(x: Tensor, y: Tensor) -> Tensor:
    """The inner product of two vectors."""
    x, y = _tensor(x), _tensor(y)
    if x.ndim != 1 or y.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {x.ndim}D and {y.ndim}D tensors")
    return matmul(x, y)


inner = dot


def bmm(x: Tensor, y: Tensor) -> Tensor:
    """Batched matrix product of two 3-D tensors."""
    x, y = _tensor(x), _tensor(y)
    if x.ndim != 3 or y.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor" if x.ndim != 3 else "batch2 must be a 3D tensor")
    return matmul(x, y)


def mv(x: Tensor, v: Tensor) -> Tensor:
    """Matrix times vector."""
    return matmul(x, v)


def addmm(x: Any, m1: Tensor, m2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * x + alpha * (m1 @ m2)``."""
    prod = matmul(m1, m2)
    return add(x if beta == 1 else mul(x, beta), prod if alpha == 1 else mul(prod, alpha))


def baddbmm(x: Any, b1: Tensor, b2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * x + alpha * bmm(b1, b2)``."""
    prod = bmm(b1, b2)
    return add(x if beta == 1 else mul(x, beta), prod if alpha == 1 else mul(prod, alpha))


def addmv(x: Any, mat: Tensor, vec: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * x + alpha * (mat @ vec)``."""
    return addmm(x, mat, vec, beta=beta, alpha=alpha)


def diag(x: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002  (PyTorch's argument name)
    """A vector's diagonal matrix, or a matrix's diagonal as a vector."""
    x = _tensor(x)
    if x.ndim == 2:
        return clone(_diagonal(x, diagonal))
    if x.ndim != 1:
        raise RuntimeError("diag(): Supports 1D or 2D tensors. Got " + f"{x.ndim}D")
    n = x.shape[0] + builtins.abs(diagonal)
    k = np.arange(x.shape[0])
    rows, cols = (k, k + diagonal) if diagonal >= 0 else (k - diagonal, k)
    return add_at(x, (rows, cols), (n, n), False)


def diag_embed(x: Tensor) -> Tensor:
    """Each last-dim vector of ``x`` as a diagonal matrix."""
    x = _tensor(x)
    n = x.shape[-1]
    return mul(reshape(x, (*x.shape, 1)), _wrap(np.eye(n, dtype=x.dtype)))


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0) -> Tensor:
    """The ``p``-norm distance between each row of ``x1`` and each row of ``x2``."""
    diffs = sub(unsqueeze(_tensor(x1), -2), unsqueeze(_tensor(x2), -3))
    if p == 2.0:
        return sqrt(sum(mul(diffs, diffs), -1))
    return pow(sum(pow(diffs.abs(), p), -1), 1.0 / p)


# --- queries (outside the graph) -------------------------------------------------------------
def isnan(x: Any) -> Tensor:
    """A bool tensor, True where ``x`` is NaN."""
    return _wrap(np.isnan(_data(x)))


def isneginf(x: Any) -> Tensor:
    """True where ``x`` is -inf."""
    return _wrap(np.isneginf(_data(x)))


def isposinf(x: Any) -> Tensor:
    """True where ``x`` is +inf."""
    return _wrap(np.isposinf(_data(x)))


def isclose(x: Any, y: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    """Elementwise ``|x - y| <= atol + rtol * |y|``."""
    return _wrap(np.isclose(_data(x), _data(y), rtol=rtol, atol=atol, equal_nan=equal_nan))


def allclose(x: Any, y: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    """Whether every element is close (a Python bool)."""
    return bool(np.allclose(_data(x), _data(y), rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(x: Any, y: Any) -> bool:
    """Whether the shapes and elements are equal (a Python bool)."""
    return bool(np.array_equal(_data(x), _data(y)))


def logical_and(x: Any, y: Any) -> Tensor:
    """Elementwise ``and`` of the truth values."""
    return _wrap(np.logical_and(_data(x), _data(y)))


def logical_or(x: Any, y: Any) -> Tensor:
    """Elementwise ``or`` of the truth values."""
    return _wrap(np.logical_or(_data(x), _data(y)))


def logical_xor(x: Any, y: Any) -> Tensor:
    """Elementwise ``xor`` of the truth values."""
    return _wrap(np.logical_xor(_data(x), _data(y)))


def logical_not(x: Any) -> Tensor:
    """Elementwise ``not`` of the truth values."""
    return _wrap(np.logical_not(_data(x)))


@numpy_aliases
def argmax(x: Any, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The index of the largest element (of the flattened tensor, or along ``dim``)."""
    return _wrap(np.argmax(_data(x), axis=dim, keepdims=keepdim))


@numpy_aliases
def argmin(x: Any, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The index of the smallest element (of the flattened tensor, or along ``dim``)."""
    return _wrap(np.argmin(_data(x), axis=dim, keepdims=keepdim))


@numpy_aliases
def all(x: Any, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """Whether every element (along ``dim``) is nonzero."""
    return _wrap(np.all(_data(x), axis=None if dim is None else dim, keepdims=keepdim))


@numpy_aliases
def any(x: Any, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """Whether some element (along ``dim``) is nonzero."""
    return _wrap(np.any(_data(x), axis=None if dim is None else dim, keepdims=keepdim))


@numpy_aliases
def count_nonzero(x: Any, dim: Any = None) -> Tensor:
    """The number of nonzero elements (along ``dim``)."""
    return _wrap(np.asarray(np.count_nonzero(_data(x), axis=dim), dtype=np.int64))


def nonzero(x: Any, *, as_tuple: bool = False) -> Any:
    """The indices of the nonzero elements: an ``(n, ndim)`` int64 tensor, or one index
    tensor per dim with ``as_tuple``."""
    where_ = np.nonzero(np.atleast_1d(_data(x)))
    if as_tuple:
        return tuple(_wrap(w.astype(np.int64)) for w in where_)
    return _wrap(np.stack(where_, axis=1).astype(np.int64))


def argwhere(x: Any) -> Tensor:
    """``nonzero(x)``."""
    return nonzero(x)


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
    """``(values, indices)`` sorted along ``dim`` (a stable sort; NaN last, or first when
    ``descending``); the gradient reaches each value's place."""
    x = _tensor(x)
    if x.ndim == 0:
        return return_types.sort(clone(x), _wrap(np.zeros((), dtype=np.int64)))
    d = _dim(dim, x.ndim)
    order = argsort(x, d, descending=descending)
    return return_types.sort(gather(x, d, order), order)


def argsort(x: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The indices that sort ``x`` along ``dim``, equal elements in their order (NaN
    last ascending, first descending, as PyTorch)."""
    d = np.asarray(_data(x))
    if d.ndim == 0:
        return _wrap(np.zeros((), dtype=np.int64))
    if not descending:
        return _wrap(np.argsort(d, axis=dim, kind="stable").astype(np.int64))
    # ascending over the reversed elements, reversed: equal ones keep their order
    n = d.shape[dim]
    order = np.flip(np.argsort(np.flip(d, dim), axis=dim, kind="stable"), dim)
    return _wrap((n - 1 - order).astype(np.int64))


def unique(x: Any, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False,  # noqa: A002
           dim: int | None = None) -> Any:
    """The distinct elements (sorted), with the inverse indices and counts if asked."""
    out = np.unique(_data(x), return_inverse=return_inverse, return_counts=return_counts,  # type: ignore[call-overload]
                    axis=dim)
    if not isinstance(out, tuple):
        return _wrap(out)
    values, *rest = out
    parts = [_wrap(values)]
    if return_inverse:
        inverse = np.asarray(rest.pop(0), dtype=np.int64)
        parts.append(_wrap(inverse.reshape(np.shape(_data(x))) if dim is None else inverse.reshape(-1)))
    parts += [_wrap(np.asarray(r, dtype=np.int64)) for r in rest]
    return tuple(parts)


def bucketize(x: Any, boundaries: Any, *, right: bool = False, out_int32: bool = False) -> Tensor:
    """The index of the bucket of ``boundaries`` each element falls in."""
    idx = np.searchsorted(_data(boundaries), _data(x), side="right" if right else "left")
    return _wrap(idx.astype(np.int32 if out_int32 else np.int64))


def searchsorted(sorted_sequence: Any, values: Any, *, right: bool = False, side: str | None = None,
                 out_int32: bool = False) -> Tensor:
    """Where ``values`` would be inserted to keep the last dim of ``sorted_sequence`` sorted."""
    seq = np.asarray(_data(sorted_sequence))
    vals = np.asarray(_data(values))
    how = side or ("right" if right else "left")
    if seq.ndim <= 1:
        idx = np.searchsorted(seq, vals, side=how)  # type: ignore[call-overload]
    else:
        idx = np.stack([np.searchsorted(s, v, side=how)  # type: ignore[call-overload]
                        for s, v in zip(seq.reshape(-1, seq.shape[-1]), vals.reshape(-1, vals.shape[-1]))])
        idx = idx.reshape(vals.shape)
    return _wrap(np.asarray(idx).astype(np.int32 if out_int32 else np.int64))


def histc(x: Any, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """A histogram of ``bins`` equal bins over ``[min, max]`` (the data's range when both are 0)."""
    d = np.asarray(_data(x))
    lo, hi = (float(d.min()), float(d.max())) if min == max == 0 else (min, max)
    counts, _ = np.histogram(d, bins=bins, range=(lo, hi))
    return _wrap(counts.astype(d.dtype))


def triu_indices(row: int, col: int, offset: int = 0, *, dtype: Any = np.int64) -> Tensor:
    """The ``(2, n)`` indices of the upper triangle of a ``row x col`` matrix."""
    return _wrap(np.stack(np.triu_indices(row, offset, col)).astype(dtype))


def tril_indices(row: int, col: int, offset: int = 0, *, dtype: Any = np.int64) -> Tensor:
    """The ``(2, n)`` indices of the lower triangle of a ``row x col`` matrix."""
    return _wrap(np.stack(np.tril_indices(row, offset, col)).astype(dtype))


# --- factories -----------------------------------------------------------------------------
def empty_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """An uninitialised tensor of ``t``'s shape and dtype."""
    _check_device(device)
    return _finish(np.empty(t.shape, dtype=dtype or t.dtype), requires_grad)


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """``data`` as a Tensor, without a copy when it already is one (or a matching ndarray)."""
    _check_device(device)
    if isinstance(data, Tensor):
        return data if dtype is None or data.dtype == np.dtype(dtype) else to_dtype(data, dtype)
    return Tensor._wrap(as_array(data, dtype))


def logspace(start: float, end: float, steps: int, base: float = 10.0, *, dtype: Any = None) -> Tensor:
    """``steps`` values from ``base**start`` to ``base**end``, evenly spaced in exponent."""
    return _wrap(np.logspace(start, end, steps, base=base).astype(dtype or get_default_dtype()))


def normal(mean: Any, std: Any = 1.0, size: Any = None, *, generator: Any = None) -> Tensor:
    """Normal samples with ``mean`` and ``std`` (tensors or floats; with ``size`` for floats)."""
    m, s = _data(mean), _data(std)
    shape = tuple(size) if size is not None else np.broadcast_shapes(np.shape(m), np.shape(s))
    z = randn(*shape, generator=generator)
    return add(mul(z, std), mean)


def randint_like(t: Tensor, low: int, high: int | None = None, *, dtype: Any = None, generator: Any = None) -> Tensor:
    """Random integers in ``[low, high)`` of ``t``'s shape."""
    if high is None:
        low, high = 0, low
    out = randint(low, high, t.shape, generator=generator)
    return to_dtype(out, dtype or t.dtype)




# --- a few more (issue 32) -------------------------------------------------------------------
def tan(x: Tensor) -> Tensor:
    """The tangent (``sin / cos``)."""
    return div(sin(x), cos(x))


def index_add(x: Tensor, dim: int, index: Any, source: Any, *, alpha: float = 1) -> Tensor:
    """A copy of ``x`` with ``alpha * source`` added at ``index`` (a vector) along ``dim``."""
    x, src = _tensor(x), _tensor(source)
    d = _dim(dim, builtins.max(x.ndim, 1))
    idx = np.asarray(_data(index)).reshape(-1).astype(np.intp)
    part = src if alpha == 1 else mul(src, alpha)
    return add(x, add_at(part, (slice(None),) * d + (idx,), x.shape, False))


def index_fill(x: Tensor, dim: int, index: Any, value: Any) -> Tensor:
    """A copy of ``x`` with ``value`` at ``index`` (a vector) along ``dim``."""
    x = _tensor(x)
    d = _dim(dim, builtins.max(x.ndim, 1))
    idx = np.asarray(_data(index)).reshape(-1).astype(np.intp)
    return index_put(x, (slice(None),) * d + (idx,), value)


@numpy_aliases
def nansum(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """The sum, NaN counted as 0."""
    x = _tensor(x)
    return sum(where(np.isnan(x.data), 0.0, x), dim, keepdim)


@numpy_aliases
def nanmean(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """The mean of the non-NaN elements."""
    x = _tensor(x)
    count = np.sum(~np.isnan(x.data), axis=dim, keepdims=keepdim).astype(x.dtype)
    return div(nansum(x, dim, keepdim), _wrap(count))


def ravel(x: Tensor) -> Tensor:
    """The elements as a 1-D tensor."""
    return reshape(x, (-1,))


def tensor_split(x: Tensor, indices_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into ``n`` nearly equal parts (the first ones larger), or at the given indices."""
    x = _tensor(x)
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        bounds = np.cumsum([0, *sizes])
    else:
        bounds = np.array([0, *[builtins.min(int(i), n) for i in indices_or_sections], n])
    return tuple(narrow(x, d, int(a), builtins.max(int(b) - int(a), 0)) for a, b in zip(bounds[:-1], bounds[1:]))


divide = div
multiply = mul
subtract = sub


__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == __name__]
__all__ += ["fix", "true_divide", "moveaxis", "ger", "inner", "divide", "multiply", "subtract"]
