"""Linear algebra: matrix products and the linear layer (``ops/linalg.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtype import scalar_type_name as _scalar_type_name
from ..autograd.recording import record
from ..ops import linalg as L
from ..tensor import Tensor
from ._dispatch import _tensor


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
