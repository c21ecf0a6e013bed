"""Linear algebra: matrix products and the linear layer (``ops/linalg.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtype import scalar_type_name as _scalar_type_name
from ..autograd.graph.record import record
from ..ops import contraction as K, linalg as L
from ..tensor import Tensor
from ._dispatch import _dim, _tensor


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
