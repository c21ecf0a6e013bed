"""The differentiable operations, as ``ag.*`` functions (Tensor methods delegate here).

Each function normalises its arguments, runs the primitive's numpy kernel and hands the
result to :func:`asyncgrad.autograd.recording.record`. Derivative rules live in
``asyncgrad.ops``; nothing here knows about the engine.
"""

from __future__ import annotations

import builtins
from weakref import ref as _weakref
from typing import Any, NoReturn
from collections.abc import Callable, Sequence

import numpy as np

from . import _context
from ._aliases import numpy_aliases
from ._dtype import as_array, get_default_dtype
from ._dtype import scalar_type_name as _scalar_type_name
from .autograd.recording import record, record_views
from .ops import copies as C
from .ops import elementwise as E
from .ops import linalg as L
from .ops import nn as N
from .ops import reductions as R
from .ops import shape as S
from .ops import contraction as K
from .ops._spec import OpSpec
from .tensor import VIEW_DEFAULT, VIEW_MULTI_OUTPUT, VIEW_NO_GRAD, MinMax, Tensor, _append_view, view_creation_meta
from . import return_types

_py_max = builtins.max
_grad_enabled = _context.grad_enabled
_py_min = builtins.min


# --- operands ------------------------------------------------------------------------------
def _const(value: Any, other: Any) -> np.ndarray:
    """A non-Tensor operand as an array. Python scalars take the other operand's dtype
    when it is floating (PyTorch's wrapped-number rule)."""
    if isinstance(value, np.ndarray):
        return value
    od = other.data.dtype if type(other) is Tensor else None
    if isinstance(value, bool):
        return np.asarray(value)
    if isinstance(value, (int, float)) and od is not None:
        if od.kind == "f" or (isinstance(value, int) and od.kind in "iu"):
            return np.asarray(value, dtype=od)
    return as_array(value)


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _promote(a: np.ndarray, b: np.ndarray) -> np.dtype | None:
    """PyTorch's promotion where it differs from numpy's: int op float keeps the float, and
    a 0-d operand of the same category does not widen a dimensioned one (f32[n] * f64[] -> f32)."""
    da, db = a.dtype, b.dtype
    if da == db:
        return None
    if da.kind == "f" and db.kind != "f":
        return da
    if db.kind == "f" and da.kind != "f":
        return db
    if _CATEGORY[da.kind] == _CATEGORY[db.kind] and (a.ndim == 0) != (b.ndim == 0):
        return db if a.ndim == 0 else da
    return None


def _binary(spec: OpSpec, x: Any, y: Any) -> Tensor:
    # (the hot path reads the array slot ``_data`` directly: ``data`` is a property)
    tx = type(x) is Tensor
    ty = type(y) is Tensor
    if tx and not ty and type(y) in _SCALARS and x._data.dtype.kind == "f":
        # A Python scalar with a float tensor takes the tensor's dtype (PyTorch's
        # wrapped-number rule), as a shared read-only 0-d array: numpy multiplies by a
        # 0-d array 3x faster than by a Python float, and the graph stores no copy.
        c = _scalar_const(y, x._data.dtype)
        return record(spec, (x, c), spec.forward(x._data, c))
    if ty and not tx and type(x) in _SCALARS and y._data.dtype.kind == "f":
        c = _scalar_const(x, y._data.dtype)
        return record(spec, (c, y), spec.forward(c, y._data))
    a = x._data if tx else _const(x, y)
    b = y._data if ty else _const(y, x)
    if a.dtype != b.dtype:
        want = _promote(a, b)
        if want is not None:
            a = a.astype(want, copy=False)
            b = b.astype(want, copy=False)
    try:
        out = spec.forward(a, b)
    except ValueError:
        _raise_broadcast_error(a.shape, b.shape)
    return record(spec, (x if tx else a, y if ty else b), out)


def _raise_broadcast_error(sa: tuple[int, ...], sb: tuple[int, ...]) -> NoReturn:
    """PyTorch's message for shapes that do not broadcast."""
    for i in range(1, _py_max(len(sa), len(sb)) + 1):
        m = sa[-i] if i <= len(sa) else 1
        n = sb[-i] if i <= len(sb) else 1
        if m != n and m != 1 and n != 1:
            raise RuntimeError(
                f"The size of tensor a ({m}) must match the size of tensor b ({n}) at non-singleton "
                f"dimension {_py_max(len(sa), len(sb)) - i}"
            )
    raise RuntimeError(f"shapes {list(sa)} and {list(sb)} cannot be broadcast together")


_SCALARS = (float, int)
_SCALAR_CACHE: dict[tuple[Any, ...], np.ndarray] = {}


def _scalar_const(value: float, dtype: np.dtype) -> np.ndarray:
    key = (value, type(value), dtype)
    arr = _SCALAR_CACHE.get(key)
    if arr is None:
        arr = np.asarray(value, dtype=dtype)
        arr.flags.writeable = False
        if len(_SCALAR_CACHE) < 4096:
            _SCALAR_CACHE[key] = arr
    return arr


def _unary(spec: OpSpec, x: Tensor) -> Tensor:
    # (no ``**params``: collecting none would still allocate a dict on every call)
    if type(x) is not Tensor:
        x = Tensor(x)
    return record(spec, (x,), spec.forward(x._data))


def _unary_params(spec: OpSpec, x: Tensor, **params: Any) -> Tensor:
    x = _tensor(x)
    return record(spec, (x,), spec.forward(x._data, **params), params=params)


def _tensor(x: Any) -> Tensor:
    return x if type(x) is Tensor else Tensor(x)


def _dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    out = []
    for d in dims:
        d = int(d)
        if not -_py_max(ndim, 1) <= d < _py_max(ndim, 1):  # a 0-d tensor accepts 0 and -1
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-_py_max(ndim, 1)}, "
                f"{_py_max(ndim, 1) - 1}], but got {d})"
            )
        out.append(d % ndim if ndim else 0)
    return tuple(out)


def _reduction_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """``_dims`` for a reduction: reducing a 0-d tensor over dim 0 (or -1) reduces nothing."""
    dims = _dims(dim, ndim)
    return () if dims is not None and ndim == 0 else dims


def _dim(dim: int, ndim: int) -> int:
    r = _dims(dim, ndim)
    assert r is not None
    return r[0]


# --- arithmetic ---------------------------------------------------------------------------
def add(x: Any, y: Any, *, alpha: float = 1) -> Tensor:
    """``x + alpha * y`` with broadcasting."""
    return _binary(E.add, x, y if alpha == 1 else mul(y, alpha))


def sub(x: Any, y: Any, *, alpha: float = 1) -> Tensor:
    """``x - alpha * y`` with broadcasting."""
    spec = E.rsub if not isinstance(x, Tensor) and isinstance(y, Tensor) else E.sub
    return _binary(spec, x, y if alpha == 1 else mul(y, alpha))


def mul(x: Any, y: Any) -> Tensor:
    """Elementwise product with broadcasting."""
    return _binary(E.mul, x, y)


def div(x: Any, y: Any) -> Tensor:
    """True division with broadcasting (integer inputs give the default float dtype)."""
    if not _is_floating_operand(x) and not _is_floating_operand(y):
        if type(x) is Tensor:
            x = to_dtype(x, get_default_dtype())
        else:
            y = to_dtype(_tensor(y), get_default_dtype())
    return _binary(E.div, x, y)


def _is_floating_operand(v: Any) -> bool:
    if isinstance(v, (Tensor, np.ndarray, np.generic)):
        return bool(np.asarray(v.data if isinstance(v, Tensor) else v).dtype.kind in "fc")
    return isinstance(v, (float, complex))


def pow(x: Any, exponent: Any) -> Tensor:
    """``x ** exponent``; node PowBackward0 (scalar exponent), 1 (tensors), 2 (scalar base)."""
    if type(x) is Tensor and type(exponent) is Tensor:
        return _binary(E.pow_tensor, x, exponent)
    if type(x) is Tensor:
        return _binary(E.pow_scalar, x, exponent)
    return _binary(E.rpow, x, exponent)


def neg(x: Tensor) -> Tensor:
    """``-x``, elementwise."""
    return _unary(E.neg, x)


def abs(x: Tensor) -> Tensor:
    """The absolute value, elementwise."""
    return _unary(E.abs_, x)


def exp(x: Tensor) -> Tensor:
    """``e ** x``, elementwise."""
    return _unary(E.exp, x)


def log(x: Tensor) -> Tensor:
    """The natural logarithm, elementwise."""
    return _unary(E.log, x)


def sqrt(x: Tensor) -> Tensor:
    """The square root, elementwise."""
    return _unary(E.sqrt, x)


def sin(x: Tensor) -> Tensor:
    """The sine, elementwise."""
    return _unary(E.sin, x)


def cos(x: Tensor) -> Tensor:
    """The cosine, elementwise."""
    return _unary(E.cos, x)


def tanh(x: Tensor) -> Tensor:
    """The hyperbolic tangent, elementwise."""
    return _unary(E.tanh, x)


def sigmoid(x: Tensor) -> Tensor:
    """The logistic function ``1 / (1 + exp(-x))``, elementwise."""
    return _unary(E.sigmoid, x)


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)``, elementwise."""
    return _unary(E.relu, x)


def erf(x: Tensor) -> Tensor:
    """The error function, elementwise."""
    return _unary(E.erf, x)


def sgn(x: Tensor) -> Tensor:
    """The sign of ``x`` (-1, 0, 1); its derivative is zero."""
    return _unary(E.sgn, x)


def threshold_backward(g: Tensor, ans: Any) -> Tensor:
    """``g`` where ``ans > 0``, else 0: relu's derivative as a differentiable op."""
    return _binary(E.threshold_backward, g, ans)


def clone(x: Tensor) -> Tensor:
    """A copy with its own memory that stays in the graph (CloneBackward0)."""
    return _unary(E.clone, x)


def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    """Limit ``x`` to ``[min, max]``; the gradient passes where ``min <= x <= max``."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    x = _tensor(x)
    lo = None if min is None else _const(min, x)
    hi = None if max is None else _const(max, x)
    return record(E.clamp, (x,), E.clamp.forward(x.data, lo=lo, hi=hi), params={"lo": lo, "hi": hi})


clip = clamp


def maximum(x: Any, y: Any) -> Tensor:
    """The larger of ``x`` and ``y``, elementwise, broadcasting (the gradient is split evenly on ties)."""
    return _binary(E.maximum, x, y)


def minimum(x: Any, y: Any) -> Tensor:
    """The smaller of ``x`` and ``y``, elementwise, broadcasting (the gradient is split evenly on ties)."""
    return _binary(E.minimum, x, y)


def where(condition: Any, x: Any = None, y: Any = None) -> Any:
    """Elements of ``x`` where ``condition`` holds, else of ``y`` (cond is not differentiated);
    ``where(condition)`` alone is ``nonzero(condition, as_tuple=True)``, as PyTorch."""
    if x is None and y is None:
        cond1 = np.atleast_1d(condition.data if isinstance(condition, Tensor) else np.asarray(condition))
        return tuple(Tensor._wrap(w.astype(np.int64)) for w in np.nonzero(cond1))
    cond = condition.data if isinstance(condition, Tensor) else np.asarray(condition)
    cond = cond.astype(bool, copy=False)
    tx, ty = type(x) is Tensor, type(y) is Tensor
    a = x.data if tx else _const(x, y)
    b = y.data if ty else _const(y, x)
    if a.dtype != b.dtype:
        want = _promote(a, b) or np.result_type(a, b)
        a, b = a.astype(want, copy=False), b.astype(want, copy=False)
    try:
        out = E.where.forward(cond, a, b)
    except ValueError:
        _raise_broadcast_error(np.broadcast_shapes(cond.shape, a.shape) if cond.ndim <= a.ndim else a.shape, b.shape)
    return record(E.where, (cond, x if tx else a, y if ty else b), out)


def compare(op: Callable[..., np.ndarray], x: Any, y: Any) -> Tensor:
    """A comparison: a bool tensor outside the graph."""
    a = x.data if isinstance(x, Tensor) else x
    b = y.data if isinstance(y, Tensor) else y
    return Tensor._wrap(np.asarray(op(a, b)))


def isfinite(x: Any) -> Tensor:
    """A bool tensor, True where ``x`` is neither NaN nor ±inf (integers and bools are
    always finite); outside the graph."""
    return Tensor._wrap(np.asarray(np.isfinite(_tensor(x).data)))


def isinf(x: Any) -> Tensor:
    """A bool tensor, True where ``x`` is +inf or -inf; outside the graph."""
    return Tensor._wrap(np.asarray(np.isinf(_tensor(x).data)))


def to_dtype(x: Tensor, dtype: Any) -> Tensor:
    """Cast; differentiable between floating dtypes (ToCopyBackward0)."""
    d = np.dtype(dtype)
    if x.data.dtype == d:
        return x
    return record(C.to_copy, (x,), x.data.astype(d)) if d.kind == "f" else Tensor._wrap(x.data.astype(d))



def fill(x: Tensor, value: Any) -> Tensor:
    """A tensor like ``x`` filled with ``value`` (used by ``fill_``/``zero_``)."""
    if isinstance(value, Tensor):
        return add(mul(x, 0.0), value) if value._requires_grad else fill(x, value.data)
    return record(C.fill, (x,), np.full_like(x.data, value))



def zero(x: Tensor) -> Tensor:
    """A tensor like ``x`` filled with zeros (used by ``zero_``)."""
    return record(C.zero, (x,), np.zeros_like(x.data))


def copy_from(x: Tensor, src: Any) -> Tensor:
    """``src`` broadcast to ``x``'s shape and dtype (used by ``copy_``)."""
    s = _tensor(src)
    return record(C.copy, (x, s), C.copy.forward(x.data, s.data))



# --- reductions -----------------------------------------------------------------------------
@numpy_aliases
def sum(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Sum over ``dim`` (all dims when None)."""
    x = _tensor(x)
    dims = _reduction_dims(dim, x.ndim)
    spec = R.sum_all if dims is None else R.sum
    out = R._sum(x.data, dim=dims, keepdim=keepdim)
    if x.data.dtype.kind in "bi" and dims is None:
        out = out.astype(np.int64)
    return record(spec, (x,), out, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


@numpy_aliases
def mean(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Mean over ``dim`` (all dims when None)."""
    x = _tensor(x)
    if x.data.dtype.kind not in "fc":
        raise RuntimeError(
            f"mean(): could not infer output dtype. Input dtype must be either a floating "
            f"point or complex dtype. Got: {x.data.dtype}"
        )
    dims = _reduction_dims(dim, x.ndim)
    spec = R.mean_all if dims is None else R.mean
    out = R._mean(x.data, dim=dims, keepdim=keepdim)
    return record(spec, (x,), out, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


@numpy_aliases
def var(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
        unbiased: bool | None = None) -> Tensor:
    """Variance with Bessel's correction by default (``correction=1``)."""
    x = _tensor(x)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dims = _reduction_dims(dim, x.ndim)
    params = {"dim": dims, "keepdim": keepdim, "correction": correction}
    out = R._var(x.data, **params)
    return record(R.var, (x,), out, params={**params, "shape": x.shape})


def _extreme(x: Tensor, dim: Any, keepdim: bool, all_spec: OpSpec, dim_spec: OpSpec) -> Any:
    x = _tensor(x)
    if dim is not None and not isinstance(dim, (int, np.integer)):  # PyTorch's TypeError
        name = "max" if all_spec is R.max_all else "min"
        raise TypeError(f"{name}(): argument 'dim' (position 1) must be int, not {type(dim).__name__}")
    if dim is None:
        if x.data.size == 0:
            raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0.")
        values, weights = all_spec.forward(x.data)
        return record(all_spec, (x,), values, aux=weights)
    d = _dim(int(dim), x.ndim)
    if x.ndim == 0:  # PyTorch: the value itself, index 0
        values, (onehot, idx) = dim_spec.forward(x.data.reshape(1), dim=0, keepdim=False)
        out = record(dim_spec, (x,), values, aux=onehot.reshape(()), params={"dim": 0, "keepdim": True})
        return MinMax(out, Tensor._wrap(np.asarray(idx, dtype=np.int64)))
    values, (onehot, idx) = dim_spec.forward(x.data, dim=d, keepdim=keepdim)
    out = record(dim_spec, (x,), values, aux=onehot, params={"dim": d, "keepdim": keepdim})
    return MinMax(out, Tensor._wrap(np.asarray(idx, dtype=np.int64)))


@numpy_aliases
def max(x: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """The maximum; with ``dim``, a ``(values, indices)`` named tuple."""
    if isinstance(dim, Tensor):  # torch.max(a, b) is maximum
        return maximum(x, dim)
    return _extreme(x, dim, keepdim, R.max_all, R.max_dim)


@numpy_aliases
def min(x: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """The minimum; with ``dim``, a ``(values, indices)`` named tuple."""
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    return _extreme(x, dim, keepdim, R.min_all, R.min_dim)


def sum_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast tensor down to ``shape`` (the engine's shape reduction)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return record(S.sum_to, (x,), S.sum_to.forward(x.data, shape=shape), params={"shape": x.shape})


# --- shapes ----------------------------------------------------------------------------------
def _view(x: Tensor, spec: OpSpec, out: np.ndarray, params: dict[str, Any]) -> Tensor:
    t = record(spec, (x,), out, params=params)
    if out is x._data or (out.base is not None and np.may_share_memory(out, x._data)):
        # a numpy view (not a copy that numpy made): share the version counter
        t._version_counter = x._version_counter
        base = t._base = x if x._base is None else x._base
        meta = view_creation_meta(x, VIEW_DEFAULT if _grad_enabled.get() else VIEW_NO_GRAD, spec.node_name)
        if meta:
            t._creation_meta = meta
        if (t.grad_fn is not None and base.grad_fn is not None) or not base._requires_grad:
            # in-place ops on the base re-point this view's grad_fn (a view of a plain
            # tensor joins the graph when a recorded in-place op changes the tensor);
            # Tensor._register_view, inlined: t is new, so it cannot be registered yet
            views = base._views
            if views is None:
                base._views = [_weakref(t)]
            else:
                _append_view(views, t)
    return t


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """The same data with a new shape (one dim may be -1)."""
    x = _tensor(x)
    shape = tuple(int(s) for s in shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {x.data.size}") from None
    return _view(x, S.view, out, {"shape": x.shape})


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dimensions ``start_dim`` to ``end_dim`` merged into one."""
    x = _tensor(x)
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = _dim(start_dim, x.ndim), _dim(end_dim, x.ndim)
    shape = x.shape[:s] + (-1,) + x.shape[e + 1:]
    return reshape(x, shape)


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    """Dimensions ``dim0`` and ``dim1`` swapped (a view); ``swapaxes`` is the same function."""
    x = _tensor(x)
    d0, d1 = _dim(dim0, x.ndim), _dim(dim1, x.ndim)
    return _view(x, S.transpose, np.swapaxes(x.data, d0, d1), {"d0": d0, "d1": d1})


swapaxes = transpose


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    """The dimensions reordered as ``dims`` (a view)."""
    x = _tensor(x)
    d = _dims(tuple(dims), x.ndim)
    assert d is not None
    if sorted(d) != list(range(x.ndim)):
        raise RuntimeError(f"permute(): dims {list(dims)} is not a permutation of {x.ndim} dims")
    return _view(x, S.permute, np.transpose(x.data, d), {"dims": d})


@numpy_aliases
def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    """Dimensions of size 1 removed (only those in ``dim`` when given)."""
    x = _tensor(x)
    dims = _dims(dim, x.ndim)
    if dims is None:
        out_shape = tuple(n for n in x.shape if n != 1)
    else:
        out_shape = tuple(n for i, n in enumerate(x.shape) if not (i in dims and n == 1))
    spec = S.squeeze if dim is None else S.squeeze_dim if isinstance(dim, (int, np.integer)) else S.squeeze_dims
    return _view(x, spec, x.data.reshape(out_shape), {"shape": x.shape})


@numpy_aliases
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """A dimension of size 1 inserted at ``dim``."""
    x = _tensor(x)
    d = _dim(dim, x.ndim + 1)
    return _view(x, S.unsqueeze, np.expand_dims(x.data, d), {"shape": x.shape})


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Broadcast to ``shape`` (-1 keeps a dim) without copying."""
    x = _tensor(x)
    shape = tuple(int(s) for s in shape)
    lead = len(shape) - x.ndim
    if lead < 0:
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to "
            f"the number of dimensions in the tensor ({x.ndim})"
        )
    full = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    try:
        out = np.broadcast_to(x.data, full)
    except ValueError:
        raise RuntimeError(
            f"The expanded size of the tensor must match the existing size at non-singleton "
            f"dimension: cannot expand {list(x.shape)} to {list(full)}"
        ) from None
    return _view(x, S.expand, out, {})


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """``x`` broadcast to ``shape`` without copying."""
    return expand(x, shape)


def _normalise_index(index: Any) -> tuple[Any, bool]:
    """Tensors in an index become arrays; returns (index, is_basic)."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    basic = True
    for it in items:
        if isinstance(it, Tensor):
            it = it.data
        if isinstance(it, (list, np.ndarray)):
            it = np.asarray(it)
            basic = False
        elif isinstance(it, bool):
            basic = False
        out.append(it)
    return (tuple(out) if isinstance(index, tuple) else out[0]), basic


def _basic_index_spec(idx: Any) -> OpSpec:
    """The node PyTorch would name: that of the last view op it applies for ``idx``."""
    items = idx if isinstance(idx, tuple) else (idx,)
    for it in reversed(items):
        if it is None:
            return S.getitem_unsqueeze
        if isinstance(it, (int, np.integer)):
            return S.getitem_select
        if isinstance(it, slice) and it != slice(None):
            return S.getitem_basic
    if any(isinstance(it, slice) for it in items):
        return S.getitem_basic
    return S.getitem_alias


def getitem(x: Tensor, index: Any) -> Tensor:
    """numpy indexing: basic (views, incl. negative steps) and advanced (copies)."""
    idx, basic = _normalise_index(index)
    try:
        out = x.data[idx]
    except IndexError as e:
        raise IndexError(f"{e} (indexing a tensor of shape {list(x.shape)})") from None
    if basic and not isinstance(out, np.ndarray):  # all ints: a 0-d view, not a numpy scalar
        out = x.data[(*idx, Ellipsis) if isinstance(idx, tuple) else (idx, Ellipsis)]
    out = np.asarray(out) if not isinstance(out, np.ndarray) else out
    if basic:
        return _view(x, _basic_index_spec(idx), out, {"index": idx, "shape": x.shape})
    return record(S.getitem_advanced, (x,), out, params={"index": idx, "shape": x.shape})


def index_add(g: Tensor, index: Any, shape: tuple[int, ...], basic: bool) -> Tensor:
    """Zeros of ``shape`` with ``g`` added at ``index`` (the adjoint of indexing)."""
    out = S.index_add.forward(g.data, index=index, shape=shape, basic=basic)
    return record(S.index_add, (g,), out, params={"index": index})


def index_put(x: Tensor, index: Any, value: Any, *, copy_slices: bool | None = None) -> Tensor:
    """A copy of ``x`` with ``value`` written at ``index`` (used by ``x[index] = value``).

    The node is PyTorch's ``CopySlices`` for basic indices (and, with ``copy_slices=True``,
    for an in-place op through a view), else ``IndexPutBackward0``."""
    idx, basic = _normalise_index(index)
    spec = S.copy_slices if (basic if copy_slices is None else copy_slices) else S.index_put
    v = value if isinstance(value, Tensor) else _const(value, x)
    vd = v.data if isinstance(v, Tensor) else v
    mask = np.zeros(x.shape, dtype=bool)
    mask[idx] = True
    out = S.index_put.forward(x.data, vd.astype(x.data.dtype, copy=False), index=idx)
    return record(spec, (x, v), out, params={"index": idx, "mask": mask})


@numpy_aliases
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along an existing dim."""
    ts = [_tensor(t) for t in tensors]
    if not ts:
        raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
    d = _dim(dim, ts[0].ndim)
    bounds = [0]
    for t in ts:
        bounds.append(bounds[-1] + t.shape[d])
    try:
        out = np.concatenate([t.data for t in ts], axis=d)
    except ValueError as e:
        raise RuntimeError(f"torch.cat(): {e}") from None
    return record(S.cat, tuple(ts), out, params={"dim": d, "bounds": tuple(bounds)})


concat = cat


@numpy_aliases
def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Stack along a new dim."""
    ts = [_tensor(t) for t in tensors]
    if not ts:
        raise RuntimeError("stack expects a non-empty TensorList")
    d = _dim(dim, ts[0].ndim + 1)
    try:
        out = np.stack([t.data for t in ts], axis=d)
    except ValueError:
        raise RuntimeError(
            f"stack expects each tensor to be equal size, but got {[list(t.shape) for t in ts]}"
        ) from None
    return record(S.stack, tuple(ts), out, params={"dim": d})


# --- linear algebra ------------------------------------------------------------------------
def matmul(x: Any, y: Any) -> Tensor:
    """numpy's matmul in all rank cases (node named as PyTorch's mm/dot/mv/bmm)."""
    x, y = _tensor(x), _tensor(y)
    if x.ndim == 0 or y.ndim == 0:
        raise RuntimeError("both arguments to matmul need to be at least 1D")
    try:
        out = L._matmul(x.data, y.data)
    except ValueError:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, x.shape))} and "
            f"{'x'.join(map(str, y.shape))})"
        ) from None
    spec = (L.dot if x.ndim == 1 and y.ndim == 1 else L.mv if y.ndim == 1 and x.ndim == 2
            else L.matmul if x.ndim <= 2 and y.ndim <= 2 else L.bmm)
    return record(spec, (x, y), np.asarray(out))


mm = matmul


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` as one node."""
    if type(x) is not Tensor:
        x = Tensor(x)
    xd, wd = x._data, weight._data
    if bias is None or xd.dtype != wd.dtype or bias._data.dtype != wd.dtype:
        _check_linear_dtypes(x, weight, bias)
    if xd.shape[-1] != wd.shape[-1]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, x.shape))} and "
            f"{'x'.join(map(str, weight.shape[::-1]))})"
        )
    if bias is None:
        return record(L.linear_nobias, (x, weight), L._linear(xd, wd))
    return record(L.linear, (x, weight, bias), L._linear(xd, wd, bias._data))


def _check_linear_dtypes(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """PyTorch raises where numpy would promote (a float32 layer given float64 or int64
    input must not silently compute in float64); its messages differ with and without bias."""
    xd, wd = x.data.dtype, weight.data.dtype
    if bias is None:
        if xd != wd:
            raise RuntimeError(
                "expected m1 and m2 to have the same dtype, but got: "
                f"{_scalar_type_name(xd, c_name=True)} != {_scalar_type_name(wd, c_name=True)}"
            )
        return
    if xd != wd:
        raise RuntimeError(
            f"mat1 and mat2 must have the same dtype, but got {_scalar_type_name(xd)} and {_scalar_type_name(wd)}"
        )
    bd = bias.data.dtype
    if bd != wd:
        raise RuntimeError(
            f"self and mat2 must have the same dtype, but got {_scalar_type_name(bd)} and {_scalar_type_name(wd)}"
        )


# --- nn ------------------------------------------------------------------------------------
@numpy_aliases
def softmax(x: Tensor, dim: int) -> Tensor:
    """``exp(x)`` normalised to sum to 1 along ``dim``."""
    x = _tensor(x)
    d: int | None = _dim(dim, x.ndim)
    if x.ndim == 0:
        d = None  # a 0-d tensor: over its one element
    return record(N.softmax, (x,), N.softmax.forward(x.data, dim=d), params={"dim": d})


@numpy_aliases
def log_softmax(x: Tensor, dim: int) -> Tensor:
    """The logarithm of ``softmax(x, dim)``, computed stably."""
    x = _tensor(x)
    d: int | None = _dim(dim, x.ndim)
    if x.ndim == 0:
        d = None  # a 0-d tensor: over its one element
    return record(N.log_softmax, (x,), N.log_softmax.forward(x.data, dim=d), params={"dim": d})


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU, exact (erf) unless ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate argument must be either none or tanh, got {approximate!r}")
    if approximate == "tanh":
        return _unary_params(N.gelu_tanh, x, approximate=approximate)
    x = _tensor(x)
    out, cdf = N._gelu(x.data, approximate=approximate)  # cdf: kept for the backward
    return record(N.gelu, (x,), out, aux=cdf, params={"approximate": approximate})


def nll_loss(logp: Tensor, target: Any, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """The negative log-likelihood of class indices ``target`` under log-probabilities ``logp`` (N x C)."""
    tgt = np.asarray(target.data if isinstance(target, Tensor) else target)
    if logp.ndim != 2 or tgt.shape != logp.shape[:1]:
        raise ValueError(
            f"Expected input of shape (N, C) and target of shape (N,), got {list(logp.shape)} "
            f"and {list(tgt.shape)}"
        )
    if tgt.dtype.kind not in "iu":
        raise RuntimeError(f"expected scalar type Long but found {tgt.dtype}")
    # (targets out of range raise IndexError in the kernel's pass: Note [NLL in one pass])
    out, weights = N._nll_loss(logp.data, target=tgt, reduction=reduction, ignore_index=ignore_index)
    return record(N.nll_loss, (logp,), out, aux=weights, params={"reduction": reduction})


def cross_entropy(logits: Tensor, targets: Any, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """``nll_loss(log_softmax(logits, 1), targets)`` for class-index targets."""
    return nll_loss(log_softmax(logits, 1), targets, reduction, ignore_index)


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """The squared error between ``input`` and ``target``, averaged (``reduction='mean'``) or summed."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    input = _tensor(input)
    t = target if isinstance(target, Tensor) else _const(target, input)
    td = t.data if isinstance(t, Tensor) else t
    return record(N.mse_loss, (input, t), N._mse(input.data, td, reduction=reduction),
                  params={"reduction": reduction})


# --- more views (PyTorch parity) -------------------------------------------------------------
def _infer_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    """``shape`` with its one ``-1`` resolved, or PyTorch's error when it cannot hold ``size``."""
    if builtins.sum(1 for s in shape if s == -1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
    if -1 in shape:
        if known == 0 or size % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {size}")
        return tuple(size // known if s == -1 else s for s in shape)
    if known != size or any(s < 0 for s in shape):
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {size}")
    return shape


def view(x: Tensor, shape: Sequence[int]) -> Tensor:
    """The same memory with a new shape; raises (as PyTorch) when the layout of ``x``
    makes that impossible without a copy, where ``reshape`` would copy."""
    x = _tensor(x)
    shape = tuple(int(s) for s in shape)
    try:
        out = x.data.reshape(shape)  # numpy copies when it cannot make a view
    except ValueError:
        _infer_shape(shape, x.data.size)  # raises PyTorch's message for a shape that cannot fit
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {x.data.size}") from None
    if out.size and out is not x.data and not np.may_share_memory(out, x.data):
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one dimension "
            "spans across two contiguous subspaces). Use .reshape(...) instead."
        )
    return _view(x, S.view, out, {"shape": x.shape})


def view_as(x: Tensor, other: Tensor) -> Tensor:
    """``x.view(other.shape)``."""
    return view(x, other.shape)


def contiguous(x: Tensor) -> Tensor:
    """``x`` itself when its memory is C-contiguous, else a C-contiguous copy in the graph
    (CloneBackward0), as PyTorch."""
    x = _tensor(x)
    if x.data.flags.c_contiguous:
        return x
    return record(S.contiguous, (x,), S.contiguous.forward(x.data))


def _multi_view(x: Tensor, node_name: str, dim: int, indices: Sequence[Any]) -> tuple[Tensor, ...]:
    """The views ``x[..., i, ...]`` (``i`` at ``dim``) for each of ``indices``, sharing one
    node with a slot per view, as PyTorch's unbind/split; each shares ``x``'s memory and
    version counter like any view."""
    head = (slice(None),) * dim
    outs = [x.data[(*head, i, Ellipsis)] for i in indices]
    params = {"dim": dim, "shapes": tuple(o.shape for o in outs), "dtype": x.data.dtype}
    views = record_views(node_name, S.MULTI_OUTPUT_VIEWS[node_name], x, outs, params)
    base = x if x._base is None else x._base
    meta = view_creation_meta(x, VIEW_MULTI_OUTPUT if _grad_enabled.get() else VIEW_NO_GRAD)
    for t in views:
        t._version_counter = x._version_counter
        t._base = base
        t._creation_meta = meta
        if (t.grad_fn is not None and base.grad_fn is not None) or not base._requires_grad:
            base._register_view(t)  # in-place ops on the base re-point this view's grad_fn (as _view)
    return tuple(views)


def _dim_for(op: str, x: Tensor, dim: int) -> int:
    if x.ndim == 0:
        raise IndexError(f"{op}() cannot be applied to a 0-dim tensor.")
    return _dim(dim, x.ndim)


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """The view of ``length`` elements of ``dim`` from ``start`` (SliceBackward0)."""
    x = _tensor(x)
    d = _dim_for("narrow", x, dim)
    n = x.shape[d]
    start, length = int(start), int(length)
    if not -n <= start <= n:
        raise IndexError(f"start out of range (expected to be in range of [{-n}, {n}], but got {start})")
    if start < 0:
        start += n
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if start + length > n:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({n}).")
    return getitem(x, (slice(None),) * d + (slice(start, start + length),))


def select(x: Tensor, dim: int, index: int) -> Tensor:
    """The view at ``index`` of ``dim``, which is removed (SelectBackward0)."""
    x = _tensor(x)
    d = _dim_for("select", x, dim)
    n = x.shape[d]
    i = int(index)
    if not -n <= i < n:
        raise IndexError(f"select(): index {i} out of range for tensor of size {list(x.shape)} at dimension {dim}")
    return getitem(x, (slice(None),) * d + (i % n,))


def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """Every index of ``dim`` as a view with that dim removed. As in PyTorch, these views
    cannot be modified in place while they require grad."""
    x = _tensor(x)
    d = _dim_for("unbind", x, dim)
    return _multi_view(x, "UnbindBackward0", d, range(x.shape[d]))


def _split_views(x: Tensor, d: int, sizes: Sequence[int], node_name: str) -> tuple[Tensor, ...]:
    bounds = np.cumsum([0, *sizes])
    return _multi_view(x, node_name, d, [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])])


def split(x: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Views of consecutive pieces along ``dim``: of ``split_size`` each (the last may be
    smaller) or of the given sizes, which must add up to the dim's size."""
    x = _tensor(x)
    d = _dim_for("split", x, dim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = int(split_size_or_sections)
        if size < 0:
            raise RuntimeError(f"split expects split_size be non-negative, but got split_size={size}")
        if size == 0:
            if n:
                raise RuntimeError(
                    f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
            return _split_views(x, d, [0], "SplitBackward0")
        sizes = [_py_min(size, n - s) for s in range(0, _py_max(n, 1), size)]
        return _split_views(x, d, sizes, "SplitBackward0")
    sizes = [int(s) for s in split_size_or_sections]
    if builtins.sum(sizes) != n or any(s < 0 for s in sizes):
        raise RuntimeError(
            f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
            f"dimension {dim}), but got split_sizes={sizes}"
        )
    return _split_views(x, d, sizes, "SplitWithSizesBackward0")


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``split`` into ``chunks`` pieces of ``ceil(size / chunks)`` (so possibly fewer pieces)."""
    x = _tensor(x)
    if int(chunks) <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = _dim_for("chunk", x, dim)
    n = x.shape[d]
    if n == 0:  # as PyTorch: ``chunks`` empty pieces
        return _split_views(x, d, [0] * int(chunks), "SplitWithSizesBackward0")
    return split(x, -(-n // int(chunks)), d)


def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The view of the diagonal of the ``(dim1, dim2)`` planes, appended as the last dim."""
    x = _tensor(x)
    if x.ndim < 2:
        raise RuntimeError(f"diagonal(): expected a tensor with at least 2 dimensions, got {x.ndim}")
    d1, d2 = _dim(dim1, x.ndim), _dim(dim2, x.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    params = {"offset": int(offset), "dim1": d1, "dim2": d2}
    out = S.diagonal.forward(x.data, **params)
    return _view(x, S.diagonal, out, {"index": S.diagonal_index(x.shape, **params), "shape": x.shape})



# --- more ops (PyTorch parity) ---------------------------------------------------------------
def repeat(x: Tensor, sizes: Sequence[int]) -> Tensor:
    """Tile ``x`` ``sizes[i]`` times along each dim (``x`` gains leading dims when
    ``sizes`` is longer), as ``Tensor.repeat``."""
    x = _tensor(x)
    reps = tuple(int(s) for s in sizes)
    if len(reps) < x.ndim:
        raise RuntimeError(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    if any(r < 0 for r in reps):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(reps)}")
    return record(S.repeat, (x,), S.repeat.forward(x.data, reps=reps), params={"reps": reps, "shape": x.shape})


@numpy_aliases
def prod(x: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The product over ``dim`` (all elements when None); integer inputs give int64.
    Gradients are exact where the input holds zeros (PyTorch's prod_backward)."""
    x = _tensor(x)
    if dtype is not None:
        x = to_dtype(x, dtype)
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError(f"prod(): argument 'dim' must be int, not {type(dim).__name__}")
    dims = _reduction_dims(dim, x.ndim)
    spec = R.prod_all if dims is None else R.prod
    out = R._prod(x.data, dim=dims, keepdim=keepdim)
    return record(spec, (x,), out, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


def prod_others(x: Tensor, dim: tuple[int, ...] | None) -> Tensor:
    """For each element, the product of the others along ``dim`` (prod's derivative)."""
    return record(R.prod_others, (x,), R._prod_others(x.data, dim=dim), params={"dim": dim})


def masked_fill(x: Tensor, mask: Any, value: Any) -> Tensor:
    """``x`` with ``value`` where the bool ``mask`` (broadcast) is True. ``value`` is a
    number or a 0-d tensor, which gets the gradient of the filled positions."""
    x = _tensor(x)
    m = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if m.dtype != np.bool_:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype {m.dtype}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(
                f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                f"{value.ndim} dimension(s).")
        v: Any = value if value.dtype == x.dtype else to_dtype(value, x.dtype)
        vd = v.data
    else:
        v = vd = np.asarray(value, dtype=x.data.dtype)
    try:
        out = E.masked_fill.forward(x.data, vd, mask=m)
    except ValueError:
        _raise_broadcast_error(x.shape, m.shape)
    return record(E.masked_fill, (x, v), out, params={"mask": m})


def _tri(spec: OpSpec, name: str, x: Tensor, diagonal: int) -> Tensor:
    x = _tensor(x)
    if x.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    return record(spec, (x,), spec.forward(x.data, k=int(diagonal)), params={"k": int(diagonal)})


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (elements above ``diagonal`` zeroed)."""
    return _tri(E.tril, "tril", x, diagonal)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (elements below ``diagonal`` zeroed)."""
    return _tri(E.triu, "triu", x, diagonal)


def _pick(spec: OpSpec, x: Tensor, d: int, idx: np.ndarray, keepdim: bool) -> tuple[Tensor, Tensor]:
    """The values of ``x`` at indices ``idx`` along dim ``d`` (laid out as the output),
    recorded so that the gradient goes to those elements, and the indices as int64."""
    index = R.along_index(x.shape, d, idx, keepdim)
    values = record(spec, (x,), x.data[index], params={"index": index, "shape": x.shape})
    return values, Tensor._wrap(np.asarray(idx, dtype=np.int64))


@numpy_aliases
def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """The ``k`` largest (or smallest) elements along ``dim``: ``(values, indices)``,
    in order (NaN counts as the largest, as in PyTorch)."""
    result = return_types.topk
    x = _tensor(x)
    d = _dim(dim, x.ndim)
    data = x.data if x.ndim else x.data.reshape(1)
    n = data.shape[d]
    if not 0 <= int(k) <= n:
        raise RuntimeError("selected index k out of range")
    order = np.argsort(data, axis=d, kind="stable")  # ascending, NaNs last
    order = np.flip(order, d) if largest else order
    idx = np.take(order, np.arange(int(k)), axis=d)
    if x.ndim == 0:
        values, indices = _pick(R.topk, x.reshape(1), 0, idx, True)
        return result(values.reshape(()), indices.reshape(()))
    return result(*_pick(R.topk, x, d, idx, True))


def _median(x: Tensor, dim: int | None, keepdim: bool, skip_nan: bool) -> Any:
    result, nan_result = return_types.median, return_types.nanmedian
    x = _tensor(x)
    if dim is None:
        spec = R.nanmedian_all if skip_nan else R.median_all
        ans, weights = spec.forward(x.data)
        return record(spec, (x,), ans, aux=weights)
    d = _dim(dim, x.ndim)
    if x.ndim == 0:
        values, indices = _median(x.reshape(1), 0, False, skip_nan)
        return (nan_result if skip_nan else result)(values.reshape(()), indices.reshape(()))
    if x.shape[d] == 0:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    idx = R.median_position(x.data, d, skip_nan)
    if not keepdim:
        idx = np.squeeze(idx, d)
    values, indices = _pick(R.nanmedian_dim if skip_nan else R.median_dim, x, d, idx, keepdim)
    return (nan_result if skip_nan else result)(values, indices)


@numpy_aliases
def median(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """The lower median (NaN if any element is NaN); with ``dim``, ``(values, indices)``."""
    return _median(x, dim, keepdim, skip_nan=False)


@numpy_aliases
def nanmedian(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """``median`` ignoring NaNs (NaN only where every element is)."""
    return _median(x, dim, keepdim, skip_nan=True)


@numpy_aliases
def std(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
        unbiased: bool | None = None) -> Tensor:
    """Standard deviation with Bessel's correction by default; zero gradient where it is 0."""
    return _moment(R.std, x, dim, correction, keepdim, unbiased)


def _moment(spec: OpSpec, x: Tensor, dim: Any, correction: int, keepdim: bool,
            unbiased: bool | None) -> Tensor:
    x = _tensor(x)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dims = _reduction_dims(dim, x.ndim)
    params = {"dim": dims, "keepdim": keepdim, "correction": correction}
    return record(spec, (x,), spec.forward(x.data, **params), params={**params, "shape": x.shape})


def _with_mean(x: Tensor, moment: Tensor, dim: Any, keepdim: bool, spec: OpSpec) -> tuple[Tensor, Tensor]:
    x = _tensor(x)
    dims = _reduction_dims(dim, x.ndim)
    mean_out = R._mean(x.data, dim=dims, keepdim=keepdim)
    return moment, record(spec, (x,), mean_out, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


@numpy_aliases
def var_mean(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
             unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
    """``(var, mean)`` over ``dim`` in one call."""
    v = _moment(R.var_of_var_mean, x, dim, correction, keepdim, unbiased)
    return _with_mean(x, v, dim, keepdim, R.mean_of_var_mean)


@numpy_aliases
def std_mean(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
             unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
    """``(std, mean)`` over ``dim`` in one call."""
    s = _moment(R.std_of_std_mean, x, dim, correction, keepdim, unbiased)
    return _with_mean(x, s, dim, keepdim, R.mean_of_std_mean)


@numpy_aliases
def norm(x: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The vector ``p``-norm over ``dim`` (all elements when None), as ``torch.norm``:
    ``"fro"`` is the 2-norm, ``inf``/``-inf`` the largest/smallest magnitude, 0 counts
    non-zeros. The gradient is zero where the norm is zero."""
    x = _tensor(x)
    if dtype is not None:
        x = to_dtype(x, dtype)
    if isinstance(p, str):
        if p == "nuc":
            raise NotImplementedError("asyncgrad has no nuclear norm (p='nuc'); it needs an SVD")
        if p != "fro":
            raise RuntimeError(f"linalg.matrix_norm: Order {p} not supported.")
        p = 2
    if x.data.dtype.kind not in "fc":
        raise RuntimeError(
            f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {x.data.dtype}")
    p = float(p)
    dims = _reduction_dims(dim, x.ndim)
    params = {"p": p, "dim": dims, "keepdim": keepdim}
    if np.isinf(p):
        ans, weights = R.norm_inf.forward(x.data, **params)
        return record(R.norm_inf, (x,), ans, aux=weights, params={**params, "shape": x.shape})
    return record(R.norm, (x,), R.norm.forward(x.data, **params), params={**params, "shape": x.shape})


def eq(x: Any, y: Any) -> Tensor:
    """``x == y`` elementwise (a bool tensor outside the graph)."""
    return compare(np.equal, x, y)


def ne(x: Any, y: Any) -> Tensor:
    """``x != y`` elementwise."""
    return compare(np.not_equal, x, y)


def lt(x: Any, y: Any) -> Tensor:
    """``x < y`` elementwise."""
    return compare(np.less, x, y)


def le(x: Any, y: Any) -> Tensor:
    """``x <= y`` elementwise."""
    return compare(np.less_equal, x, y)


def gt(x: Any, y: Any) -> Tensor:
    """``x > y`` elementwise."""
    return compare(np.greater, x, y)


def ge(x: Any, y: Any) -> Tensor:
    """``x >= y`` elementwise."""
    return compare(np.greater_equal, x, y)


def relu_(x: Tensor) -> Tensor:
    """``relu`` in place (ReluBackward0 on a non-leaf, as PyTorch)."""
    return x.relu_()


# --- PyTorch's other names (issue 32) ---------------------------------------------------------
def split_with_sizes(x: Tensor, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Views of consecutive pieces of ``split_sizes`` along ``dim`` (they must add up to its size)."""
    if isinstance(split_sizes, (int, np.integer)):
        raise TypeError("split_with_sizes(): argument 'split_size' must be a sequence of ints, not int")
    return split(x, list(split_sizes), dim)


def einsum(equation: str, *operands: Any) -> Tensor:
    """Einstein summation over ``operands`` as ``equation`` says (``"bij,bjk->bik"``, with
    ``...`` and implicit outputs as in PyTorch); the operands may also come as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ts = tuple(_tensor(o) for o in operands)
    subs, out, sizes = K.parse_einsum(equation, [t.shape for t in ts])
    params = {"subs": subs, "out": out, "sizes": sizes}
    spec = K.einsum_spec(len(ts))
    try:
        result = spec.forward(*(t.data for t in ts), **params)
    except ValueError as e:
        raise RuntimeError(f"einsum(): {e}") from None
    return record(spec, ts, result, params=params)


def tensordot(a: Tensor, b: Tensor, dims: Any = 2) -> Tensor:
    """Sum of products over ``dims``: the last ``dims`` dims of ``a`` with the first of
    ``b``, or the listed dims (``([1, 0], [0, 1])``) pairwise."""
    a, b = _tensor(a), _tensor(b)
    if isinstance(dims, (int, np.integer)):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        da, db = list(range(a.ndim - int(dims), a.ndim)), list(range(int(dims)))
    else:
        da, db = ([int(d)] if isinstance(d, (int, np.integer)) else [int(k) for k in d] for d in dims)
    if len(da) != len(db):
        raise RuntimeError(f"both dimension lists should have same length, but got {len(da)} and {len(db)}")
    da = [_dim(d, a.ndim) for d in da]
    db = [_dim(d, b.ndim) for d in db]
    letters = iter(K._LETTERS)
    sa = [next(letters) for _ in range(a.ndim)]
    sb = [next(letters) for _ in range(b.ndim)]
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {a.shape[i]} in dim "
                               f"{i} and second has size {b.shape[j]} in dim {j}")
        sb[j] = sa[i]
    out = [c for k, c in enumerate(sa) if k not in da] + [c for k, c in enumerate(sb) if k not in db]
    return einsum("".join(sa) + "," + "".join(sb) + "->" + "".join(out), a, b)


def _index_array(index: Any, op: str) -> np.ndarray:
    idx = index.data if isinstance(index, Tensor) else np.asarray(index)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"{op}(): Expected dtype int64 for index" if op == "gather"
                           else f"{op}(): Expected dtype int32 or int64 for index")
    return idx


def _check_bounds(idx: np.ndarray, n: int, dim: int) -> None:
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx.max() if idx.max() >= n else idx.min()
        raise RuntimeError(f"index {bad} is out of bounds for dimension {dim} with size {n}")


def _full_index(shape: tuple[int, ...], dim: int, along: np.ndarray) -> tuple[np.ndarray, ...]:
    """Index arrays picking ``x[..., along[...], ...]`` elementwise (``along`` at ``dim``,
    broadcast index ranges elsewhere): the advanced index behind gather and unfold."""
    nd = along.ndim
    out = []
    for k in range(len(shape)):
        if k == dim:
            out.append(along)
        else:
            sh = [1] * nd
            sh[k] = shape[k]
            out.append(np.arange(shape[k]).reshape(sh))
    return tuple(out)


def gather(x: Tensor, dim: int, index: Any, *, sparse_grad: bool = False) -> Tensor:
    """``out[i][j] = x[i][index[i][j]]`` for ``dim=1`` (and likewise for any dim):
    ``index`` has ``x``'s number of dims and is no larger than ``x`` outside ``dim``."""
    x = _tensor(x)
    idx = _index_array(index, "gather")
    d = _dim(dim, _py_max(x.ndim, 1))
    if idx.ndim != x.ndim:
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    for k, (n, m) in enumerate(zip(idx.shape, x.shape)):
        if k != d and n > m:
            raise RuntimeError(f"Size does not match at dimension {k} expected index {list(idx.shape)} to be "
                               f"no larger than self {list(x.shape)} apart from dimension {d}")
    if x.ndim == 0:
        return clone(x)
    _check_bounds(idx, x.shape[d], d)
    full = _full_index(idx.shape, d, idx.astype(np.intp, copy=False))
    return record(S.gather, (x,), x.data[full], params={"index": full, "shape": x.shape})


def index_select(x: Tensor, dim: int, index: Any) -> Tensor:
    """The entries of ``x`` at ``index`` (a vector of ints) along ``dim``."""
    x = _tensor(x)
    idx = _index_array(index, "index_select")
    if idx.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    d = _dim(dim, _py_max(x.ndim, 1))
    n = x.shape[d] if x.ndim else 1
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError("index out of range in self")
    if x.ndim == 0:
        return clone(reshape(x, idx.shape))
    where = (slice(None),) * d + (idx.reshape(-1).astype(np.intp, copy=False),)
    return record(S.index_select, (x,), x.data[where], params={"index": where, "shape": x.shape})


def unfold(x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """Every window of ``size`` elements along ``dimension``, ``step`` apart, as a new
    last dim (PyTorch's ``Tensor.unfold``; a copy here, not a view)."""
    x = _tensor(x)
    d = _dim(dimension, _py_max(x.ndim, 1))
    n = x.shape[d] if x.ndim else 1
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if x.ndim == 0:
        return clone(reshape(x, (1,)))
    windows = (n - size) // step + 1
    # index arrays broadcasting to the result's shape (x's with ``windows`` at d, then
    # ``size``): along d, window w's element e is at w * step + e; elsewhere the position
    full = []
    for k in range(x.ndim):
        sh = [1] * (x.ndim + 1)
        if k == d:
            sh[k] = windows
            full.append((np.arange(windows) * step).reshape(sh) + np.arange(size).reshape([1] * x.ndim + [size]))
        else:
            sh[k] = x.shape[k]
            full.append(np.arange(x.shape[k]).reshape(sh))
    index = tuple(full)
    return record(S.unfold, (x,), x.data[index], params={"index": index, "shape": x.shape})


def scatter_add(x: Tensor, dim: int, index: Any, src: Any) -> Tensor:
    """A copy of ``x`` with ``src[i][j]`` added at ``[i][index[i][j]]`` (``dim=1``)."""
    x = _tensor(x)
    src = _tensor(src)
    full = _scatter_index(x, dim, index, src, "scatter_add")
    return add(x, index_add(_leading_part(src, full), full, x.shape, False))


def scatter(x: Tensor, dim: int, index: Any, src: Any = None, *, value: Any = None, reduce: Any = None) -> Tensor:
    """A copy of ``x`` with ``src[i][j]`` (or ``value``) written at ``[i][index[i][j]]``."""
    if reduce is not None:
        raise NotImplementedError("scatter(reduce=...) is not supported; use scatter_add")
    x = _tensor(x)
    if src is None:
        src = value
    if not isinstance(src, Tensor):
        src = Tensor._wrap(np.full(np.shape(index.data if isinstance(index, Tensor) else index), src,
                                   dtype=x.dtype))
    full = _scatter_index(x, dim, index, src, "scatter")
    return index_put(x, full, _leading_part(src, full))


def _leading_part(src: Tensor, full: tuple[np.ndarray, ...]) -> Tensor:
    """The part of ``src`` that a scatter reads: the leading block of the index's shape."""
    shape = np.broadcast_shapes(*(a.shape for a in full))
    return src if src.shape == shape else getitem(src, tuple(slice(0, n) for n in shape))


def _scatter_index(x: Tensor, dim: int, index: Any, src: Tensor, op: str) -> tuple[np.ndarray, ...]:
    idx = _index_array(index, "gather")
    d = _dim(dim, _py_max(x.ndim, 1))
    if idx.ndim != x.ndim or src.ndim != x.ndim:
        raise RuntimeError("Index tensor must have the same number of dimensions as self tensor")
    for k, n in enumerate(idx.shape):
        if (k != d and n > x.shape[k]) or n > src.shape[k]:
            raise RuntimeError(f"Expected index {list(idx.shape)} to be no larger than self {list(x.shape)} "
                               f"apart from dimension {d} and to be no larger size than src {list(src.shape)}")
    _check_bounds(idx, x.shape[d], d)
    return _full_index(idx.shape, d, idx.astype(np.intp, copy=False))


def _reduced_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return None
    dims = _dims(dim, ndim)
    if dims is not None and len(set(dims)) != len(dims):
        raise RuntimeError(f"dim {dims[0]} appears multiple times in the list of dims")
    return dims


@numpy_aliases
def amax(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """The maximum over ``dim`` (an int or a tuple; all dims when empty); the gradient is
    split evenly among ties."""
    x = _tensor(x)
    dims = _reduced_dims(dim, x.ndim)
    values, weights = R.amax.forward(x.data, dim=dims, keepdim=keepdim)
    return record(R.amax, (x,), values, aux=weights, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


@numpy_aliases
def amin(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """The minimum over ``dim`` (an int or a tuple; all dims when empty); ties share the gradient."""
    x = _tensor(x)
    dims = _reduced_dims(dim, x.ndim)
    values, weights = R.amin.forward(x.data, dim=dims, keepdim=keepdim)
    return record(R.amin, (x,), values, aux=weights, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


# The ops defined here (not the modules and names this file imports).
__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and getattr(v, "__module__", None) == __name__]
