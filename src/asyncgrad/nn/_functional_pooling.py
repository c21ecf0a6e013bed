"""``max_pool2d``, ``avg_pool2d``, ``adaptive_avg_pool2d`` and ``adaptive_max_pool2d``
with PyTorch's arguments, defaults and messages (kernels in ops/pooling.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import functional as _F
from .._dtype import scalar_type_name
from ..autograd.graph.record import record
from ..ops import _windows as W
from ..ops import pooling as _P
from ..tensor import Tensor


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    out = tuple(int(v) for v in value)
    return (out[0], out[0]) if len(out) == 1 else (out[0], out[1])


def _batched(x: Any, op: str) -> tuple[Tensor, bool]:
    x = x if type(x) is Tensor else Tensor(x)
    if x.ndim == 3:
        return _F.unsqueeze(x, 0), True
    if x.ndim != 4:
        raise RuntimeError(f"{op}: Expected 3D or 4D tensor, but got {list(x.shape)}")
    return x, False


def _pool_window(x: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                 ceil_mode: bool) -> W.Window:
    k = _pair(kernel_size)
    s = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _pair(stride)
    p, d = _pair(padding), _pair(dilation)
    if any(v <= 0 for v in k):
        raise RuntimeError("kernel size should be greater than zero, but got kH: {} kW: {}".format(*k))
    if any(v <= 0 for v in s):
        raise RuntimeError("stride should be greater than zero, but got dH: {} dW: {}".format(*s))
    if any(v <= 0 for v in d):
        raise RuntimeError("dilation should be greater than zero, but got dilationH: {} dilationW: {}".format(*d))
    for pi, ki, di in zip(p, k, d):
        if pi < 0 or pi > ((ki - 1) * di + 1) // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={pi}, "
                               f"kernel_size={ki} and dilation={di}")
    size = (x.shape[2], x.shape[3])
    out = tuple(W.out_length(n, ki, si, di, pi, pi, ceil_mode) for n, ki, si, di, pi in zip(size, k, s, d, p))
    if any(o <= 0 for o in out):
        raise RuntimeError(f"Given input size: ({x.shape[1]}x{size[0]}x{size[1]}). Calculated output size: "
                           f"({x.shape[1]}x{out[0]}x{out[1]}). Output size is too small")
    # ceil_mode: the last window may reach past the right padding; pad that far too
    after = tuple(max(pi, (o - 1) * si + di * (ki - 1) + 1 - n - pi)
                  for n, ki, si, di, pi, o in zip(size, k, s, d, p, out))
    return W.Window(k, s, d, ((p[0], after[0]), (p[1], after[1])), size, out)  # type: ignore[arg-type]


def max_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """The maximum over each window (padding counts as -inf), as
    ``torch.nn.functional.max_pool2d``; ``stride`` defaults to ``kernel_size``. With
    ``return_indices``, also each maximum's flat index into its input plane (int64)."""
    x, unbatched = _batched(input, "max_pool2d")
    if x.dtype.kind != "f":
        raise RuntimeError(f'"max_pool2d" not implemented for \'{scalar_type_name(x.dtype)}\'')
    win = _pool_window(x, kernel_size, stride, padding, dilation, ceil_mode)
    out, arg = _P._max_pool(x.data, win=win)
    y = record(_P.max_pool2d, (x,), out, aux=arg, params={"win": win})
    if unbatched:
        y = _F.squeeze(y, 0)
    if not return_indices:
        return y
    index = Tensor(arg.astype(np.int64))  # (a copy: the node keeps its own)
    return y, (index[0] if unbatched else index)


def avg_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """The mean over each window, as ``torch.nn.functional.avg_pool2d``: the divisor counts
    the zero padding with ``count_include_pad`` (the default), or is ``divisor_override``."""
    x, unbatched = _batched(input, "avg_pool2d")
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("divisor must be not zero")
    win = _pool_window(x, kernel_size, stride, padding, 1, ceil_mode)
    scale = _P.avg_divisor(win, count_include_pad, divisor_override, x.dtype)
    y = record(_P.avg_pool2d, (x,), _P._avg_pool(x.data, win=win, scale=scale), params={"win": win, "scale": scale})
    return _F.squeeze(y, 0) if unbatched else y


def _adaptive_size(x: Tensor, output_size: Any) -> tuple[int, int]:
    if isinstance(output_size, int):
        return (output_size, output_size)
    sizes = tuple(output_size)
    if len(sizes) != 2:
        raise ValueError(f"adaptive pooling: output_size must be 2, got {len(sizes)}")
    return (x.shape[-2] if sizes[0] is None else int(sizes[0]), x.shape[-1] if sizes[1] is None else int(sizes[1]))


def _averaging(size: int, out: int, dtype: np.dtype) -> np.ndarray:
    """The (out, size) matrix whose rows average PyTorch's adaptive windows."""
    a = np.zeros((out, size), dtype=dtype)
    for i, (lo, hi) in enumerate(_P.adaptive_bounds(size, out)):
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """The mean over PyTorch's adaptive windows, to ``output_size`` (an int, a pair, None
    keeping that dim), as ``torch.nn.functional.adaptive_avg_pool2d``: a mean over the
    plane for 1 x 1, else two products with averaging matrices (differentiable again)."""
    x = input if type(input) is Tensor else Tensor(input)
    if x.ndim not in (3, 4) or any(s == 0 for s in x.shape[-2:]):
        raise RuntimeError(f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got {list(x.shape)}")
    oh, ow = _adaptive_size(x, output_size)
    if (oh, ow) == (1, 1):
        return _F.mean(x, (-2, -1), keepdim=True)
    rows = Tensor(_averaging(x.shape[-2], oh, x.dtype))
    cols = Tensor(_averaging(x.shape[-1], ow, x.dtype).T.copy())
    return _F.matmul(_F.matmul(rows, x), cols)


def adaptive_max_pool2d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """The maximum over PyTorch's adaptive windows, as ``torch.nn.functional.adaptive_max_pool2d``."""
    x, unbatched = _batched(input, "adaptive_max_pool2d")
    size = _adaptive_size(x, output_size)
    out, index = _P._adaptive_max_pool(x.data, output_size=size)
    y = record(_P.adaptive_max_pool2d, (x,), out, aux=index, params={"shape": x.shape})
    if unbatched:
        y = _F.squeeze(y, 0)
    if not return_indices:
        return y
    idx = Tensor(index.astype(np.int64))
    return y, (idx[0] if unbatched else idx)
