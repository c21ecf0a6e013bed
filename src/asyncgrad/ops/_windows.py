"""Sliding windows over the last two dims: the geometry that convolution and pooling share,
and the two data movements built on it, ``unfold`` (im2col) and ``fold`` (col2im).

A :class:`Window` describes a kernel of ``kernel`` taps spaced ``dilation`` apart, moved by
``stride`` over an input of ``in_size`` padded by ``pad`` (``(before, after)`` per dim) to
``out_size`` positions. ``unfold`` turns ``(N, C, H, W)`` into the windows
``(N, C, kh, kw, oh, ow)``; ``fold`` is its adjoint, adding each window entry back to the
input position it came from.

Each comes twice: on arrays (``np_*``: a strided view copied once, and ``kh * kw`` strided
slice additions, never a Python loop over pixels) for the kernels and plain backward
rules, and through a math namespace ``m`` (``m_*``: an index gather and its adjoint, an
index add) for rules under ``create_graph``, where they are differentiable again and again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .kernels import compiled_path as fast


@dataclass(frozen=True)
class Window:
    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad: tuple[tuple[int, int], tuple[int, int]]
    in_size: tuple[int, int]
    out_size: tuple[int, int]

    @property
    def padded(self) -> tuple[int, int]:
        return (self.in_size[0] + sum(self.pad[0]), self.in_size[1] + sum(self.pad[1]))

    @property
    def taps(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def positions(self) -> int:
        return self.out_size[0] * self.out_size[1]

    def tap_slices(self, i: int, j: int) -> tuple[slice, slice]:
        """The padded input positions that tap ``(i, j)`` reads, as strided slices."""
        (sh, sw), (dh, dw), (oh, ow) = self.stride, self.dilation, self.out_size
        return (slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
                slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))

    @property
    def crop(self) -> tuple[slice, slice]:
        (pt, _), (pl, _) = self.pad
        return slice(pt, pt + self.in_size[0]), slice(pl, pl + self.in_size[1])

    @cached_property
    def flat_index(self) -> np.ndarray:
        """For each tap and output position ``(kh, kw, oh, ow)``, the flat index of the
        padded input element it reads."""
        (kh, kw), (sh, sw), (dh, dw), (oh, ow) = self.kernel, self.stride, self.dilation, self.out_size
        rows = (np.arange(kh) * dh)[:, None, None, None] + (np.arange(oh) * sh)[None, None, :, None]
        cols = (np.arange(kw) * dw)[None, :, None, None] + (np.arange(ow) * sw)[None, None, None, :]
        return (rows * self.padded[1] + cols).astype(np.intp)

    @property
    def overlaps(self) -> bool:
        """Whether an input position can be read by more than one window."""
        return any(d * (k - 1) + 1 > s for k, s, d in zip(self.kernel, self.stride, self.dilation))


def window_ints(win: Window) -> tuple[int, ...]:
    """The window as the compiled kernels take it: kernel, stride, dilation, leading pads."""
    return (*win.kernel, *win.stride, *win.dilation, win.pad[0][0], win.pad[1][0])


def out_length(size: int, kernel: int, stride: int, dilation: int, before: int, after: int,
               ceil_mode: bool = False) -> int:
    """Output positions along one dim (PyTorch's formula; ``ceil_mode`` as its pooling:
    the last window must start inside the input or its left padding)."""
    span = size + before + after - dilation * (kernel - 1) - 1
    if not ceil_mode:
        return span // stride + 1
    n = -(-span // stride) + 1
    if (n - 1) * stride >= size + before:
        n -= 1
    return n


# --- on arrays ------------------------------------------------------------------------------
def np_pad(x: np.ndarray, win: Window, value: float = 0.0) -> np.ndarray:
    """``x`` (..., H, W) padded to ``win.padded`` with ``value`` (itself when no padding)."""
    if win.padded == win.in_size:
        return x
    out = np.full((*x.shape[:-2], *win.padded), value, dtype=x.dtype)
    out[(..., *win.crop)] = x
    return out


def np_windows(xp: np.ndarray, win: Window) -> np.ndarray:
    """The read-only strided view ``(N, C, kh, kw, oh, ow)`` of the padded ``xp``."""
    n, c = xp.shape[:2]
    s0, s1, s2, s3 = xp.strides
    (sh, sw), (dh, dw) = win.stride, win.dilation
    return np.lib.stride_tricks.as_strided(
        xp, (n, c, *win.kernel, *win.out_size), (s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw), writeable=False)


def np_unfold(x: np.ndarray, win: Window) -> np.ndarray:
    """The windows of ``x`` (N, C, H, W) as a fresh contiguous ``(N, C, kh, kw, oh, ow)``."""
    return np.ascontiguousarray(np_windows(np.ascontiguousarray(np_pad(x, win)), win))


def np_fold_channels_first(cols: np.ndarray, win: Window) -> np.ndarray:
    """The adjoint of :class:`Unfolder`'s windows: ``cols`` (C, kh, kw, N, oh, ow) added
    back to a fresh ``(N, C, H, W)``, one strided slice addition per tap (over rows that
    are contiguous on both sides), then one transposing copy (or the compiled kernel:
    Note [Windows row by row] in ops/kernels/numba_kernels.py)."""
    c, n = cols.shape[0], cols.shape[3]
    compiled = fast.fold(cols, (n, c, *win.in_size), win.out_size, window_ints(win))
    if compiled is not None:
        return compiled
    out = np.zeros((c, n, *win.padded), dtype=cols.dtype)
    for i in range(win.kernel[0]):
        for j in range(win.kernel[1]):
            out[(..., *win.tap_slices(i, j))] += cols[:, i, j]
    return np.ascontiguousarray(out[(..., *win.crop)].transpose(1, 0, 2, 3))


def np_fold_each(g: np.ndarray, win: Window) -> np.ndarray:
    """``np_fold`` of ``g`` (N, C, oh, ow) repeated at every tap (average pooling's adjoint)."""
    out = np.zeros((*g.shape[:2], *win.padded), dtype=g.dtype)
    for i in range(win.kernel[0]):
        for j in range(win.kernel[1]):
            out[(..., *win.tap_slices(i, j))] += g
    if win.padded == win.in_size:
        return out
    return np.ascontiguousarray(out[(..., *win.crop)])


# Note [Wide rows]: a stride-1 window reads, for each output row, ``ow`` consecutive input
# elements; over the padded plane flattened, output row i of tap (a, b) starts at
# ``(i + a*dh) * Wp + b*dw``, so if every output row is ``Wp`` long (the ``ow`` true outputs
# and ``Wp - ow`` junk ones), the positions a tap reads for a whole plane are ONE contiguous
# run of ``oh * Wp`` elements. Copying windows out (im2col) and adding them back (col2im)
# then move long runs, where the ``(oh, ow)`` layout made numpy loop once per short image
# row (a 32-wide image: 32 floats per inner loop). The junk outputs read past their row's
# end (the next row's start, or ``tail`` zeros after the last plane): a forward drops
# them, a backward gives them zero gradient, so they add exact zeros to the input's
# gradient; the weight's gradient multiplies them by those zeros (a non-finite input value
# at such a position would make it NaN).
def wide(win: Window) -> bool:
    """Whether a convolution runs on wide rows: stride 1 and at most a quarter of junk."""
    return win.stride == (1, 1) and 4 * win.dilation[1] * (win.kernel[1] - 1) <= win.out_size[1]


class Unfolder:
    """The windows of ``x`` (N, C, H, W) for a convolution's products, chunk by chunk of
    images: ``cols(part)`` is the windows of images ``part`` as a contiguous
    ``(C * kh * kw, images * run)``, channels first (the layout in which a convolution is
    one matrix product over the images), on wide rows when :func:`wide` (``run`` is
    ``oh * Wp``; Note [Wide rows]), else ``oh * ow``. ``x`` is padded once, and every chunk
    is copied into the same buffer (Note [Convolution by image chunks] in ops/conv.py), so
    it is overwritten by the next call."""

    def __init__(self, x: np.ndarray, win: Window, most_images: int) -> None:
        n, c = x.shape[:2]
        self.win, self.c, self.is_wide = win, c, wide(win)
        hp, wp = win.padded
        self.run = win.out_size[0] * (wp if self.is_wide else win.out_size[1])
        self.x: np.ndarray | None = None  # (the compiled kernel's input: not padded)
        if self.is_wide:  # flat, with a tail of zeros for the last plane's junk reads
            tail = win.dilation[1] * (win.kernel[1] - 1)
            self.src = np.zeros(n * c * hp * wp + tail, dtype=x.dtype)
            self.src[:n * c * hp * wp].reshape(n, c, hp, wp)[(..., *win.crop)] = x
        elif fast.compiled() is not None and x.dtype in (np.float32, np.float64):
            self.x = np.ascontiguousarray(x)
        else:
            self.src = np.ascontiguousarray(np_pad(x, win))
        self.buf = np.empty(c * win.taps * most_images * self.run, dtype=x.dtype)

    def cols(self, part: slice) -> np.ndarray:
        win, c = self.win, self.c
        images = part.stop - part.start
        out = self.buf[:c * win.taps * images * self.run].reshape(c, *win.kernel, images, self.run)
        if self.is_wide:
            hp, wp = win.padded
            e = self.src.itemsize
            (dh, dw), (kh, kw) = win.dilation, win.kernel
            view = np.lib.stride_tricks.as_strided(
                self.src[part.start * c * hp * wp:], (c, kh, kw, images, self.run),
                (hp * wp * e, dh * wp * e, dw * e, c * hp * wp * e, e), writeable=False)
        else:
            out = out.reshape(c, *win.kernel, images, *win.out_size)
            # (compiled: Note [Windows row by row] in ops/kernels/numba_kernels.py)
            if self.x is not None and fast.unfold(self.x[part], out, win.out_size, window_ints(win)):
                return out.reshape(c * win.taps, images * self.run)
            if self.x is not None:  # (the kernels went away meanwhile: set_mode)
                self.src, self.x = np.ascontiguousarray(np_pad(self.x, win)), None
            view = np_windows(self.src[part], win).transpose(1, 2, 3, 0, 4, 5)
        np.copyto(out, view)
        return out.reshape(c * win.taps, images * self.run)


def np_fold_wide(cols: np.ndarray, win: Window) -> np.ndarray:
    """The adjoint of :class:`Unfolder`'s wide windows: ``cols`` (C, kh, kw, N, oh * Wp) added back to a
    fresh ``(N, C, H, W)``, one addition of long runs per tap."""
    c, kh, kw, n, run = cols.shape
    hp, wp = win.padded
    plane = hp * wp
    buf = np.zeros(c * n * plane + win.dilation[1] * (kw - 1), dtype=cols.dtype)
    e = buf.itemsize
    (dh, dw) = win.dilation
    for a in range(kh):
        for b in range(kw):
            start = a * dh * wp + b * dw
            target = np.lib.stride_tricks.as_strided(buf[start:], (c, n, run), (n * plane * e, plane * e, e))
            target += cols[:, a, b]
    out = buf[:c * n * plane].reshape(c, n, hp, wp)[(..., *win.crop)]
    return np.ascontiguousarray(out.transpose(1, 0, 2, 3))


# --- through a math namespace (differentiable under create_graph) ----------------------------
def m_pad(m: Any, x: Any, win: Window) -> Any:
    if win.padded == win.in_size:
        return x
    return m.index_add(x, (slice(None), slice(None), *win.crop), (*x.shape[:2], *win.padded), True)


def m_unfold(m: Any, x: Any, win: Window) -> Any:
    """``np_unfold`` as a gather of ``m``: ``(N, C, kh, kw, oh, ow)``."""
    xp = m_pad(m, x, win)
    n, c = x.shape[:2]
    flat = m.reshape(xp, (n, c, win.padded[0] * win.padded[1]))
    return m.getitem(flat, (slice(None), slice(None), win.flat_index))


def m_fold(m: Any, cols: Any, win: Window) -> Any:
    """``np_fold`` as an index add of ``m`` (repeated positions summed)."""
    n, c = cols.shape[:2]
    flat = m.index_add(cols, (slice(None), slice(None), win.flat_index), (n, c, win.padded[0] * win.padded[1]),
                       False)
    out = m.reshape(flat, (n, c, *win.padded))
    if win.padded == win.in_size:
        return out
    return m.getitem(out, (slice(None), slice(None), *win.crop))
