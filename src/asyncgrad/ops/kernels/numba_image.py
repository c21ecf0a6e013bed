"""Compiled kernels of the image layers (numba): max pooling and batch normalisation, each
way in one kernel, and convolution's col2im. Imported by ``numba_kernels.py`` (so only on
the loader thread, Note [Compiled kernels load off the loop] in ``loader.py``), whose
``_jit`` and ``_c`` they use; ``compiled_path.py`` is how the ops call them.

Note [Max pooling per output]: the numpy kernel copies the ``kh * kw`` taps of every
window out (a tap matrix as large as the input times the taps), takes the maximum, then
finds the winning tap in one more pass per tap. Here each output walks its window's taps
that lie inside the input once, keeping the best value and where it was by selects, not
branches (which random data mispredicts half the time); a tap in the padding never wins,
as the -inf it would read never beats the -inf each best starts from. The winner is
PyTorch's: the first tap holding the maximum, or the last NaN (a NaN always takes the
place; nothing beats a NaN). The backward adds each output's gradient at that element,
in output order, in the gradient's type (PyTorch's order).

Note [Batch norm per channel]: batch norm's channels are independent, and one channel's
elements (N rows of H * W) fit in L2 for the image sizes it sees; so each kernel finishes
a channel before the next, its passes over the channel reading from L2. The forward makes
three (the sum; x - mean, written once, and its squares; the output), the backward two
(``sum g`` and ``sum g * (x - mean)``; dx as ``a g - b (x - mean) - c`` with the three
coefficients per channel). Sums are accumulated in float64 and rounded once.
"""

from __future__ import annotations

import math

import numpy as np
from numba import types

from .numba_kernels import _c, _jit

_I = types.int64
P32, P64 = types.float32[:, :, ::1], types.float64[:, :, ::1]  # (planes, H, W) or (N, C, R)
A32, A64 = types.float32[::1], types.float64[::1]
_INDEX = types.int64[::1]
_SIZES = (_I,) * 5  # planes, H, W, oh, ow
_WIN = (_I,) * 8  # kh, kw, sh, sw, dh, dw, pad top, pad left


# --- max pooling (Note [Max pooling per output]) -----------------------------------------------
_U = np.uint64  # (an unsigned index: numba checks a signed one for wrapping at every access)


@_jit((A32, A32, _INDEX, *_SIZES, *_WIN), (A64, A64, _INDEX, *_SIZES, *_WIN))
def max_pool(x, out, index, planes, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (planes, oh, ow), flat: each window's maximum of ``x`` (planes, H, W) read
    with the given kernel, stride, dilation and leading padding; ``index``: the flat
    index into its plane of the element that won."""
    for p in range(planes):
        base = p * h * w
        for i in range(oh):
            o = (p * oh + i) * ow
            r0 = i * sh - pt
            for j in range(ow):
                c0 = j * sw - pl
                best = _c(x[0], -np.inf)
                won = (r0 if r0 >= 0 else r0 % dh) * w + (c0 if c0 >= 0 else c0 % dw)  # its first tap inside
                for a in range(kh):
                    r = r0 + a * dh
                    if r < 0 or r >= h:
                        continue
                    for b in range(kw):
                        c = c0 + b * dw
                        if c < 0 or c >= w:
                            continue
                        e = r * w + c
                        v = x[_U(base + e)]
                        take = (v > best) | (v != v)
                        best = v if take else best
                        won = e if take else won
                out[_U(o + j)] = best
                index[_U(o + j)] = won


@_jit((A32, _INDEX, A32, _I, _I), (A64, _INDEX, A64, _I, _I))
def max_pool_backward(g, index, out, positions, plane):  # type: ignore[no-untyped-def]
    """``out`` (planes, H * W, zeros on entry), flat, += each output's gradient ``g``
    (planes, positions) at the element ``index`` names in its plane."""
    for p in range(g.size // positions):
        for k in range(p * positions, (p + 1) * positions):
            out[_U(p * plane + index[k])] += g[k]


# --- batch norm (Note [Batch norm per channel]) -------------------------------------------------
@_jit((P32, A32, A32, types.float64, P32, P32, A32, A32, A32),
      (P64, A64, A64, types.float64, P64, P64, A64, A64, A64))
def batch_norm(x, w, b, eps, out, xc, mean, var, rstd):  # type: ignore[no-untyped-def]
    """Training batch norm of ``x`` (N, C, R) per channel: ``mean``, biased ``var``,
    ``rstd = 1 / sqrt(var + eps)``, the centred input ``xc`` and ``out = xc * rstd * w + b``
    (``w``, ``b`` empty: no affine part)."""
    n, c, r = x.shape
    count = n * r
    for ch in range(c):
        total = 0.0
        for i in range(n):
            row = x[i, ch]
            for k in range(r):
                total += row[k]
        mean[ch] = total / count
        m = mean[ch]  # (in x's type, as the numpy kernel centres by it)
        sq = 0.0
        for i in range(n):
            row, d = x[i, ch], xc[i, ch]
            for k in range(r):
                v = row[k] - m
                d[k] = v
                sq += v * v
        v64 = sq / count
        var[ch] = v64
        rstd[ch] = 1.0 / math.sqrt(v64 + eps)
        scale = rstd[ch] * w[ch] if w.size else rstd[ch]
        shift = b[ch] if b.size else _c(scale, 0.0)
        for i in range(n):
            d, o = xc[i, ch], out[i, ch]
            for k in range(r):
                o[k] = d[k] * scale + shift


@_jit((P32, P32, A32, A32, types.boolean, P32, A32, A32),
      (P64, P64, A64, A64, types.boolean, P64, A64, A64))
def batch_norm_backward(g, xc, rstd, w, need_dx, dx, gx, gsum):  # type: ignore[no-untyped-def]
    """Batch norm's backward per channel from ``g`` and the centred input ``xc`` (N, C, R):
    ``gsum = sum g`` (db), ``gx = sum g * xhat`` (dw) and, when ``need_dx``,
    ``dx = w * rstd * (g - gsum / count - xhat * gx / count)`` (``w`` empty: 1)."""
    n, c, r = g.shape
    count = n * r
    for ch in range(c):
        s1 = 0.0
        s2 = 0.0
        for i in range(n):
            gi, d = g[i, ch], xc[i, ch]
            for k in range(r):
                s1 += gi[k]
                s2 += gi[k] * d[k]
        rs = np.float64(rstd[ch])
        gsum[ch] = s1
        gx[ch] = s2 * rs
        if not need_dx:
            continue
        scale = rs * (np.float64(w[ch]) if w.size else 1.0)
        a = _c(rstd[ch], scale)
        bb = _c(rstd[ch], scale * s2 * rs * rs / count)
        cc = _c(rstd[ch], scale * s1 / count)
        for i in range(n):
            gi, d, o = g[i, ch], xc[i, ch], dx[i, ch]
            for k in range(r):
                o[k] = a * gi[k] - bb * d[k] - cc


# --- convolution's im2col and col2im (Note [Windows row by row]) ---------------------------------
# Note [Windows row by row]: numpy copies the windows of a strided view one innermost row
# at a time, through its iterator: on small images (a 4 x 4 plane: rows of 4) or strided
# windows that is a call per few elements, and the copy took twice the product's time.
# These kernels walk the same rows in compiled loops, reading the unpadded input (the
# padding is the zeros they write, or the elements they skip), in the order of the
# channels-first windows (C, kh, kw, N, oh, ow). col2im adds each window element back in
# tap order, as the numpy kernel's one slice addition per tap, so the sums are the same.
@_jit((A32, A32, *_SIZES, _I, *_WIN), (A64, A64, *_SIZES, _I, *_WIN))
def unfold(x, out, n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (C, kh, kw, N, oh, ow), flat: the windows of ``x`` (N, C, H, W), flat."""
    o = 0
    for ch in range(c):
        for a in range(kh):
            for b in range(kw):
                off = b * dw - pl
                lo = min(ow, 0 if off >= 0 else (sw - 1 - off) // sw)  # the first j with j * sw + off >= 0
                hi = max(lo, min(ow, (w - 1 - off) // sw + 1) if w - 1 - off >= 0 else 0)
                for img in range(n):
                    for i in range(oh):
                        r = i * sh + a * dh - pt
                        if r < 0 or r >= h:
                            for j in range(ow):
                                out[_U(o + j)] = 0
                        else:
                            src = ((img * c + ch) * h + r) * w + off
                            for j in range(lo):
                                out[_U(o + j)] = 0
                            for j in range(lo, hi):
                                out[_U(o + j)] = x[_U(src + j * sw)]
                            for j in range(hi, ow):
                                out[_U(o + j)] = 0
                        o += ow


@_jit((A32, A32, *_SIZES, _I, *_WIN), (A64, A64, *_SIZES, _I, *_WIN))
def fold(cols, out, n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (N, C, H, W), flat, zeros on entry, += the windows ``cols`` (C, kh, kw, N,
    oh, ow), flat: the adjoint of ``unfold``."""
    o = 0
    for ch in range(c):
        for a in range(kh):
            for b in range(kw):
                off = b * dw - pl
                lo = min(ow, 0 if off >= 0 else (sw - 1 - off) // sw)
                hi = max(lo, min(ow, (w - 1 - off) // sw + 1) if w - 1 - off >= 0 else 0)
                for img in range(n):
                    for i in range(oh):
                        r = i * sh + a * dh - pt
                        if 0 <= r < h:
                            dst = ((img * c + ch) * h + r) * w + off
                            for j in range(lo, hi):
                                out[_U(dst + j * sw)] += cols[_U(o + j)]
                        o += ow
