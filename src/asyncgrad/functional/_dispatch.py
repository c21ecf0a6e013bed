"""How arguments become arrays and results become recorded tensors: constants in an operand's
dtype, type promotion, the binary and unary dispatch the hottest methods call directly,
and dimension arguments."""

from __future__ import annotations

import builtins
from weakref import ref as _weakref
from typing import Any, NoReturn

import numpy as np

from .. import _context
from .._dtype import as_array
from ..autograd.graph.record import record
from ..ops._spec import OpSpec
from ..tensor import VIEW_DEFAULT, VIEW_NO_GRAD, Tensor, _append_view, view_creation_meta


_py_max = builtins.max


_py_min = builtins.min


_grad_enabled = _context.grad_enabled


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
        # 0-d array faster than by a Python float, and the graph stores no copy.
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
