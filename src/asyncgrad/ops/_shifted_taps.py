"""A convolution as one product per kernel tap over shifted views of its padded input,
without copying the windows out (Note [Convolution by shifted taps]; Note [Convolution on
pixel rows] in ops/conv.py says when a convolution runs this way).

Note [Convolution by shifted taps]: with stride 1, on wide rows (Note [Wide rows] in
ops/_windows.py), the elements that tap ``(a, b)`` reads for one image are, in every
channel, ONE contiguous run of ``oh * Wp`` elements of the padded plane, starting
``a*dh*Wp + b*dw`` into it; over the channels these runs are a matrix whose rows are one
plane apart, which BLAS reads in place. So ``y = sum_t W_t @ shifted_t`` (``W_t`` the
``(O, C)`` weights of tap ``t``): a product of ``C`` terms per tap, added up tap by tap,
where im2col first copies ``taps`` shifted copies of the input into a ``(taps * C,
pixels)`` matrix (which BLAS then packs again) and multiplies once. With 16 channels or
more a product of ``C`` terms runs OpenBLAS's kernel about as fast as one of ``taps * C``,
and the window copy, a large part of a 16-channel layer's forward, is gone; with
fewer channels the products are too thin and im2col stays, and from 32 channels pixel
rows are faster still. The weight's gradient reads the same views the other way round,
one product per tap and image, ``dW_t = sum_n g_n @ shifted_{n,t}^T``, with ``g`` laid out
on wide rows (zeros in the junk columns, so the junk reads add nothing: a non-finite
input value read only by junk outputs would make it NaN, as on wide rows). Each kernel
runs over a chunk of images at a time (``CHUNK_BYTES``), so that one call of numpy's
batched ``matmul`` makes a tap's products for the whole chunk. The sums are in another
order than im2col's (tap by tap), equal to rounding.

Note [Strided taps by phases]: with stride ``(sh, sw)`` a tap's elements are every
``sw``-th of a row, which is no BLAS matrix. Split the padded plane into its ``sh * sw``
phases, ``phase[p, q] = padded[p::sh, q::sw]`` (each ``hq x wq``, zeros where the plane
ends); output ``(i, j)`` reads at tap ``(a, b)`` the element ``(i + a*dh // sh, j + b*dw //
sw)`` of phase ``(a*dh % sh, b*dw % sw)``, so each tap is a stride-1 tap of one phase
plane, with runs of ``oh * wq`` (``wq - ow`` junk columns a row). The phases are one copy
of the input, the size of the padded one; stride 1 is one phase. (A strided weight
gradient runs by phases only under ``ops.conv.STRIDED_BY_PHASES``: Note [Convolution on
pixel rows] in ops/conv.py.)
"""

from __future__ import annotations

import numpy as np

from . import _windows as W

# The working set of one chunk of images (its phase planes and the two partial outputs):
# whole batches of small layers, so numpy's calls are made per tap and chunk, not per image.
CHUNK_BYTES = 4 << 20


def _chunks(n: int, per_image: int) -> list[slice]:
    step = max(1, CHUNK_BYTES // max(per_image, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def phase_plane(win: W.Window) -> tuple[int, int]:
    """The rows and columns of one phase plane (Note [Strided taps by phases])."""
    (hp, wp), (sh, sw) = win.padded, win.stride
    return -(-hp // sh), -(-wp // sw)


def fits(win: W.Window) -> bool:
    """Whether a convolution over ``win`` may run by shifted taps: at most a quarter of
    the outputs it computes are junk (with stride 1, :func:`ops._windows.wide`)."""
    wq = phase_plane(win)[1]
    return 4 * (wq - win.out_size[1]) <= win.out_size[1]


class ShiftedTaps:
    """The phase planes of the padded input ``x`` (N, C, H, W), flattened with a tail of
    zeros for the last plane's junk reads, and ``tap(t, part)``: the elements tap ``t``
    reads for images ``part``, a read-only ``(images, C, oh * wq)`` view."""

    def __init__(self, x: np.ndarray, win: W.Window, dtype: np.dtype) -> None:
        n, c = x.shape[:2]
        (sh, sw), (dh, dw), (kh, kw) = win.stride, win.dilation, win.kernel
        self.win, self.c = win, c
        self.hq, self.wq = phase_plane(win)
        self.channel = sh * sw * self.hq * self.wq  # (the elements of one channel's planes)
        self.run = win.out_size[0] * self.wq
        self.src = np.zeros(n * c * self.channel + (kw - 1) * dw // sw, dtype=dtype)
        planes = self.src[:n * c * self.channel].reshape(n, c, sh, sw, self.hq, self.wq)
        (pt, _), (pl, _) = win.pad
        for p in range(sh):
            h0 = (p - pt) % sh  # the first input row in phase p, at row (h0 + pt) // sh
            for q in range(sw):
                w0 = (q - pl) % sw
                part = x[:, :, h0::sh, w0::sw]
                r0, c0 = (h0 + pt) // sh, (w0 + pl) // sw
                planes[:, :, p, q, r0:r0 + part.shape[2], c0:c0 + part.shape[3]] = part
        self.offsets = [((a * dh % sh) * sw + b * dw % sw) * self.hq * self.wq + a * dh // sh * self.wq + b * dw // sw
                        for a in range(kh) for b in range(kw)]

    def tap(self, t: int, part: slice) -> np.ndarray:
        c, e = self.c, self.src.itemsize
        start = part.start * c * self.channel + self.offsets[t]
        return np.lib.stride_tricks.as_strided(
            self.src[start:], (part.stop - part.start, c, self.run), (c * self.channel * e, self.channel * e, e),
            writeable=False)


def _tap_weights(w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``w`` (O, C, kh, kw) as the contiguous ``(taps, O, C)``."""
    o, c = w.shape[:2]
    return np.ascontiguousarray(w.reshape(o, c, -1).transpose(2, 0, 1), dtype=dtype)


def conv(x: np.ndarray, w: np.ndarray, win: W.Window) -> np.ndarray:
    """``x`` (N, C, H, W) convolved with ``w`` (O, C, kh, kw), stride 1, on wide rows."""
    n, o = x.shape[0], w.shape[0]
    dtype = np.result_type(x.dtype, w.dtype)
    taps = ShiftedTaps(x, win, dtype)
    weights = _tap_weights(w, dtype)
    oh, ow = win.out_size
    y = np.empty((n, o, oh, ow), dtype=dtype)
    parts = _chunks(n, (taps.c * taps.channel + 2 * o * taps.run) * dtype.itemsize)
    most = max((p.stop - p.start for p in parts), default=0)
    acc, term = (np.empty((most, o, taps.run), dtype=dtype) for _ in range(2))
    for part in parts:
        images = part.stop - part.start
        total, product = acc[:images], term[:images]
        np.matmul(weights[0], taps.tap(0, part), out=total)
        for t in range(1, win.taps):
            np.matmul(weights[t], taps.tap(t, part), out=product)
            total += product
        y[part] = total.reshape(images, o, oh, taps.wq)[..., :ow]
    return y


def weight_grad(x: np.ndarray, gy: np.ndarray, win: W.Window) -> np.ndarray:
    """The adjoint of :func:`conv` in ``w``: (O, C, kh, kw) from ``x`` and ``gy`` (N, O, oh, ow)."""
    n, c = x.shape[:2]
    o = gy.shape[1]
    dtype = np.result_type(x.dtype, gy.dtype)
    taps = ShiftedTaps(x, win, dtype)
    oh, ow = win.out_size
    g = np.zeros((n, o, oh, taps.wq), dtype=dtype)  # on wide rows, zeros in the junk columns
    g[..., :ow] = gy
    g = g.reshape(n, o, taps.run)
    dw = np.zeros((win.taps, o, c), dtype=dtype)
    for part in _chunks(n, (c * taps.channel + o * taps.run) * dtype.itemsize):
        for t in range(win.taps):
            dw[t] += np.matmul(g[part], taps.tap(t, part).transpose(0, 2, 1)).sum(axis=0)
    return np.ascontiguousarray(dw.transpose(1, 2, 0)).reshape(o, c, *win.kernel)
