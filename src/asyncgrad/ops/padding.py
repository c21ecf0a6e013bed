"""Constant padding (``F.pad``'s default mode): the input placed inside a block of the
fill value, or cropped where a width is negative; its gradient is the matching slice of
``g`` (put back in zeros of the input's shape for a cropped input)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._spec import defop


Widths = tuple[tuple[int, int], ...]


def crop_and_place(shape: tuple[int, ...], widths: Widths) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """For ``(before, after)`` widths per dim (negative: crop), the slice of the input that
    is kept and the slice of the output it lands in."""
    keep, place = [], []
    for n, (lo, hi) in zip(shape, widths):
        keep.append(slice(max(-lo, 0), n - max(-hi, 0)))
        place.append(slice(max(lo, 0), max(lo, 0) + n - max(-lo, 0) - max(-hi, 0)))
    return tuple(keep), tuple(place)


def _constant_pad(x: np.ndarray, *, widths: tuple[tuple[int, int], ...], value: float) -> np.ndarray:
    out_shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, widths))
    out = np.full(out_shape, value, dtype=x.dtype)
    keep, place = crop_and_place(x.shape, widths)
    out[place] = x[keep]
    return out


def _constant_pad_rule(m: Any, g: Any, ans: Any, x: Any, *, widths: tuple[tuple[int, int], ...], value: float,
                       shape: tuple[int, ...]) -> Any:
    keep, place = crop_and_place(shape, widths)
    inner = m.getitem(g, place)
    if all(k == slice(0, n) for k, n in zip(keep, shape)):
        return inner if m.tensor_mode else np.ascontiguousarray(inner)
    return m.index_add(inner, keep, shape, True)


constant_pad = defop("ConstantPadNdBackward0", _constant_pad, _constant_pad_rule)
