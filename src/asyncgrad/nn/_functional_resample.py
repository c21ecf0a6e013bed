"""``pad`` (constant, reflect, replicate, circular) and ``interpolate`` (nearest,
nearest-exact, linear, bilinear) with PyTorch's arguments and index rules.

Reflect, replicate and circular padding and nearest interpolation are gathers (one index
node per resized dim); linear and bilinear interpolation are products with constant
interpolation matrices (``out = A_h @ x @ A_w^T``), so all are differentiable again.
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence

import numpy as np

from .. import functional as _F
from ..autograd.graph.record import record
from ..ops import padding as _P
from ..tensor import Tensor


def _pad_index(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    i = np.arange(-lo, n + hi)
    if mode == "reflect":
        i = np.abs(i)
        return np.where(i >= n, 2 * (n - 1) - i, i)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    return i % n  # circular


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """Pad the last ``len(pad) // 2`` dims, ``pad`` listing ``(before, after)`` from the last
    dim backwards, as ``torch.nn.functional.pad``; ``mode`` is ``"constant"`` (``value``,
    default 0; negative widths crop), ``"reflect"``, ``"replicate"`` or ``"circular"``."""
    x = input if type(input) is Tensor else Tensor(input)
    widths_list = [int(p) for p in pad]
    if len(widths_list) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(widths_list) // 2 > x.ndim:
        raise RuntimeError("Padding length should be less than or equal to two times the input dimension but got "
                           f"padding length {len(widths_list)} and input of dimension {x.ndim}")
    k = len(widths_list) // 2
    pairs = [(widths_list[2 * i], widths_list[2 * i + 1]) for i in range(k)][::-1]
    widths = tuple([(0, 0)] * (x.ndim - k) + pairs)
    if mode == "constant":
        fill = 0.0 if value is None else value
        for n, (lo, hi) in zip(x.shape, widths):
            if n + lo + hi < 0:
                raise RuntimeError(f"The input size {n}, plus negative padding {lo} and {hi} resulted in a negative "
                                   f"output size, which is invalid. Check dimension of your input.")
        padded = _P._constant_pad(x.data, widths=widths, value=fill)
        return record(_P.constant_pad, (x,), padded, params={"widths": widths, "value": fill, "shape": x.shape})
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if k not in (1, 2, 3) or x.ndim not in (k + 1, k + 2):
        raise NotImplementedError(
            f"Padding size {len(widths_list)} is not supported for {x.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    if value:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    out = x
    for d in range(x.ndim - k, x.ndim):
        lo, hi = widths[d]
        n = x.shape[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise RuntimeError(f"Argument #4: Padding size should be less than the corresponding input dimension, "
                               f"but got: padding ({lo}, {hi}) at dimension {d} of input {list(x.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise RuntimeError("Padding value causes wrapping around more than once.")
        if lo or hi:
            out = _F.getitem(out, (slice(None),) * d + (_pad_index(n, lo, hi, mode),))
    return out


_INTERPOLATING = ("linear", "bilinear", "bicubic", "trilinear")


def _out_sizes(x: Tensor, size: Any, scale_factor: Any, k: int) -> tuple[list[int], list[float | None]]:
    """The output sizes and the scale factors given (None where a size was)."""
    if (size is None) == (scale_factor is None):
        raise ValueError("either size or scale_factor should be defined" if size is None else
                         "only one of size or scale_factor should be defined")
    spatial = x.shape[2:]
    if size is not None:
        sizes = [int(size)] * k if isinstance(size, int) else [int(s) for s in size]
        if len(sizes) != k:
            raise ValueError(f"Input and output must have the same number of spatial dimensions, but got input with "
                             f"spatial dimensions of {list(spatial)} and output size of {sizes}. Please provide "
                             f"input tensor in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) "
                             f"format.")
        return sizes, [None] * k
    scales = [float(scale_factor)] * k if isinstance(scale_factor, (int, float)) else [float(s) for s in scale_factor]
    return [math.floor(n * s) for n, s in zip(spatial, scales)], list(scales)


def _source_scale(n: int, out: int, scale: float | None, align_corners: bool) -> float:
    """PyTorch's ratio from output to input coordinates."""
    if align_corners:
        return (n - 1) / (out - 1) if out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n / out


def _nearest_index(n: int, out: int, scale: float | None, exact: bool) -> np.ndarray:
    s = _source_scale(n, out, scale, False)
    dst = np.arange(out, dtype=np.float64)
    src = np.floor((dst + 0.5) * s) if exact else np.floor(dst * np.float32(s))
    return np.minimum(src.astype(np.intp), n - 1)


def _linear_matrix(n: int, out: int, scale: float | None, align_corners: bool, dtype: np.dtype) -> np.ndarray:
    """The (out, n) matrix of linear interpolation weights along one dim."""
    s = _source_scale(n, out, scale, align_corners)
    dst = np.arange(out, dtype=np.float64)
    src = dst * s if align_corners else np.maximum(s * (dst + 0.5) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.intp), n - 1)
    i1 = np.minimum(i0 + 1, n - 1)
    lam = src - i0
    a = np.zeros((out, n), dtype=np.float64)
    np.add.at(a, (np.arange(out), i0), 1.0 - lam)
    np.add.at(a, (np.arange(out), i1), lam)
    return a.astype(dtype)


def interpolate(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """Resize the spatial dims of ``input`` (N, C, *) to ``size`` or by ``scale_factor``, as
    ``torch.nn.functional.interpolate`` for ``mode`` nearest, nearest-exact, linear (3-D
    input) and bilinear (4-D input), with ``align_corners`` as PyTorch."""
    x = input if type(input) is Tensor else Tensor(input)
    if mode in ("nearest", "nearest-exact", "area") and align_corners is not None:
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if antialias:
        raise NotImplementedError("asyncgrad's interpolate has no antialias")
    k = x.ndim - 2
    sizes, scales = _out_sizes(x, size, scale_factor, k)
    if recompute_scale_factor:
        scales = [None] * k
    if mode in ("nearest", "nearest-exact"):
        if k not in (1, 2):
            raise NotImplementedError(f"asyncgrad's interpolate: mode {mode!r} for {x.ndim}-D input")
        idx = [_nearest_index(n, o, s, mode == "nearest-exact") for n, o, s in zip(x.shape[2:], sizes, scales)]
        index = (slice(None), slice(None), idx[0]) if k == 1 else (slice(None), slice(None), idx[0][:, None], idx[1])
        return _F.getitem(x, index)
    if (mode, k) not in (("linear", 1), ("bilinear", 2)):
        raise NotImplementedError(f"Got {x.ndim}D input, but {mode} mode needs "
                                  f"{ {'linear': 3, 'bilinear': 4}.get(mode, '?') }D input" if mode in _INTERPOLATING
                                  else f"asyncgrad's interpolate has no mode {mode!r}")
    corners = bool(align_corners)
    mats = [_linear_matrix(n, o, s, corners, x.dtype) for n, o, s in zip(x.shape[2:], sizes, scales)]
    out = _F.matmul(x, Tensor(mats[-1].T.copy()))
    if k == 2:
        out = _F.matmul(Tensor(mats[0]), out)
    return out
