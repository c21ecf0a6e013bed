"""A convolution's windows on pixel rows (channels last): the layout in which a convolution
over ``(N, C, H, W)`` images is a product of a ``(pixels, kh * kw * C)`` matrix of windows,
one row per output pixel, with the ``(kh * kw * C, O)`` weight (Note [Convolution on pixel
rows] in ops/conv.py says when a convolution runs this way).

In a padded channels-last ``(N, Hp, Wp, C)`` copy of the input the window of output pixel
``(n, i, j)`` at kernel row ``a`` is ``kw`` runs of ``C`` consecutive elements (one run of
``kw * C`` without dilation), so each part's windows are one strided view copied into a
contiguous matrix. :func:`fold_rows` is the adjoint, adding a matrix of window gradients
back onto the padded buffer one strided slice per tap. The compiled kernels make both
image by image through one padded channels-last image, never the batch's copy (Note
[Pixel rows straight from the input] in ops/kernels/numba_kernels.py), with the same
bits: the same copies, the same additions in the same order.
"""

from __future__ import annotations

import numpy as np

from . import _windows as W
from .kernels import compiled_path as fast

# Output pixels per product: the windows of a part are about ROWS_PER_PART x taps x C
# elements, which stay in cache between the copy that writes them and the product that
# reads them; and a product of a few hundred to a few thousand rows runs OpenBLAS's kernel
# at its best (longer ones pack more of the windows than the cache holds).
ROWS_PER_PART = 1024


def image_parts(n: int, positions: int) -> list[slice]:
    """The batch cut into parts of whole images of about ``ROWS_PER_PART`` output pixels
    (at least one image each)."""
    step = max(1, ROWS_PER_PART // max(positions, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def padded_channels_last(x: np.ndarray, win: W.Window, dtype: np.dtype) -> np.ndarray:
    """``x`` (N, C, H, W) as a fresh ``(N, Hp, Wp, C)`` of ``dtype``, zeros around it."""
    if x.dtype == dtype:  # (compiled: Note [Channels last by a compiled copy] in ops/kernels/numba_kernels.py)
        compiled = fast.channels_last(x, win.padded, (win.pad[0][0], win.pad[1][0]))
        if compiled is not None:
            return compiled
    n, c = x.shape[:2]
    hp, wp = win.padded
    out = np.empty((n, hp, wp, c), dtype=dtype) if win.padded == win.in_size else np.zeros((n, hp, wp, c), dtype)
    out[:, win.crop[0], win.crop[1]] = x.transpose(0, 2, 3, 1)
    return out


def rows_of(g: np.ndarray, part: slice) -> np.ndarray:
    """The images ``part`` of ``g`` (N, O, oh, ow) as a contiguous ``(images * oh * ow, O)``."""
    o = g.shape[1]
    return np.ascontiguousarray(g[part].reshape(-1, o, g.shape[2] * g.shape[3]).transpose(0, 2, 1)).reshape(-1, o)


def to_channels_first(rows: np.ndarray, out: np.ndarray) -> None:
    """Write the products ``rows`` (images * oh * ow, O) into ``out`` (images, O, oh, ow)."""
    m, o, oh, ow = out.shape
    out[...] = rows.reshape(m, oh, ow, o).transpose(0, 3, 1, 2)


class RowWindows:
    """The windows of ``x`` (N, C, H, W), part by part of images (:func:`image_parts`):
    ``cols(part)`` is a contiguous ``(images * oh * ow, kh * kw * C)``, columns in
    ``(tap row, tap column, channel)`` order, copied into one buffer that the next call
    overwrites: straight from ``x`` by the compiled kernel (Note [Pixel rows straight from
    the input] in ops/kernels/numba_kernels.py), else out of a padded channels-last copy
    of the batch."""

    def __init__(self, x: np.ndarray, win: W.Window, dtype: np.dtype) -> None:
        n, c = x.shape[:2]
        self.x, self.win, self.dtype, self.parts = x, win, dtype, image_parts(n, win.positions)
        most = max((p.stop - p.start for p in self.parts), default=0)
        self.buf = np.empty((most, *win.out_size, *win.kernel, c), dtype=dtype)
        self.width = win.taps * c
        self.view: np.ndarray | None = None
        self.tmp: np.ndarray | None = None
        if x.dtype == dtype and fast.compiled() is not None:
            self.x = fast.writeable_c(x)
            self.tmp = np.zeros((*win.padded, c), dtype=dtype)

    def _view(self) -> np.ndarray:
        """The windows of the whole batch, a strided view of its padded channels-last copy."""
        if self.view is None:
            win, c = self.win, self.x.shape[1]
            xp = padded_channels_last(self.x, win, self.dtype)
            hp, wp = win.padded
            e = xp.itemsize
            (sh, sw), (dh, dw) = win.stride, win.dilation
            self.view = np.lib.stride_tricks.as_strided(
                xp, (self.x.shape[0], *win.out_size, *win.kernel, c),
                (hp * wp * c * e, sh * wp * c * e, sw * c * e, dh * wp * c * e, dw * c * e, e), writeable=False)
        return self.view

    def cols(self, part: slice) -> np.ndarray:
        out = self.buf[:part.stop - part.start]
        win = self.win
        if self.tmp is None or not fast.rows_unfold(self.x, out, self.tmp, part, win.padded, win.out_size,
                                                    W.window_ints(win)):
            np.copyto(out, self._view()[part])
        return out.reshape(-1, self.width)


def fold_rows(dcols: np.ndarray, dxp: np.ndarray, win: W.Window) -> None:
    """Add the window gradients ``dcols`` (images * oh * ow, kh * kw * C) of some images
    onto their padded channels-last gradient ``dxp`` (images, Hp, Wp, C), tap by tap (the
    adjoint of :class:`RowWindows`' copy)."""
    if fast.rows_fold(dcols, dxp, win.out_size, W.window_ints(win)):
        return
    m, c = dxp.shape[0], dxp.shape[3]
    taps = dcols.reshape(m, *win.out_size, *win.kernel, c)
    for a in range(win.kernel[0]):
        for b in range(win.kernel[1]):
            rows, cols = win.tap_slices(a, b)
            dxp[:, rows, cols] += taps[:, :, :, a, b]


def cropped_channels_first(dxp: np.ndarray, win: W.Window) -> np.ndarray:
    """The inverse of :func:`padded_channels_last`'s layout: ``dxp`` (N, Hp, Wp, C)
    cropped to the input and as a fresh ``(N, C, H, W)`` (or by the compiled copy)."""
    compiled = fast.channels_first(dxp, win.in_size, (win.pad[0][0], win.pad[1][0]))
    if compiled is not None:
        return compiled
    return np.ascontiguousarray(dxp[:, win.crop[0], win.crop[1]].transpose(0, 3, 1, 2))


def fold_channels_first(dcols: np.ndarray, dx: np.ndarray, part: slice, win: W.Window) -> None:
    """Write onto images ``part`` of ``dx`` (N, C, H, W), C-contiguous, the window
    gradients ``dcols`` (images * oh * ow, kh * kw * C) of those images folded back (the
    adjoint of :class:`RowWindows`' copy): by the compiled kernel, else onto a padded
    channels-last gradient of the part, tap by tap, then cropped to channels first (the
    same additions in the same order)."""
    if fast.rows_fold_first(dcols, dx, part, win.padded, win.out_size, W.window_ints(win)):
        return
    dxp = np.zeros((part.stop - part.start, *win.padded, dx.shape[1]), dtype=dx.dtype)
    fold_rows(dcols, dxp, win)
    dx[part] = cropped_channels_first(dxp, win)
