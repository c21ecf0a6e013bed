"""Linear resizing of an (N, C, *spatial) array along its spatial axes."""

from __future__ import annotations

import numpy as np


def resize_linear(a: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    """``a`` resized to ``size`` along its spatial axes (2, 3, ...) as PyTorch's
    ``interpolate(mode="linear" | "bilinear" | "trilinear", align_corners=False)`` does:
    output sample ``i`` reads the input at ``(i + 0.5) * in / out - 0.5``, clamped to the
    first and last samples; one axis at a time (the interpolation is separable)."""
    for axis, out_len in zip(range(2, a.ndim), size, strict=True):
        in_len = a.shape[axis]
        if in_len == out_len:
            continue
        src = np.maximum((np.arange(out_len) + 0.5) * (in_len / out_len) - 0.5, 0)
        lo = np.minimum(np.floor(src).astype(np.intp), in_len - 1)
        hi = np.minimum(lo + 1, in_len - 1)
        shape = [1] * a.ndim
        shape[axis] = out_len
        frac = (src - lo).reshape(shape).astype(a.dtype)
        a = np.take(a, lo, axis=axis) * (1 - frac) + np.take(a, hi, axis=axis) * frac
    return a
