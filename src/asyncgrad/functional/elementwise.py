"""Elementwise operations: arithmetic, functions of one tensor, selections (clamp, where,
masked_fill, tril/triu), comparisons, casts and fills (``ops/elementwise.py``,
``ops/copies.py``)."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import numpy as np

from .._dtype import get_default_dtype
from ..autograd.graph.record import record
from ..ops import copies as C, elementwise as E
from ..ops._spec import OpSpec
from ..tensor import Tensor
from ._dispatch import _binary, _const, _promote, _raise_broadcast_error, _tensor, _unary


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
