"""Convolution and transposed convolution over two spatial dims (1-D ones run as 2-D with
a kernel one tap high), with stride, padding, dilation and groups.

Three kernels, each a bilinear map, make all the rules (Note [Convolution's three kernels]):

* ``conv(x, w)``: ``y[n, o] = sum w[o, c, i, j] * x_padded[n, c, s*p + d*i, ...]``, the
  windows of ``x`` copied out (im2col) and multiplied by the weight, one BLAS product per
  part of the batch, on pixel rows (channels last) or channels first (Note [Convolution
  on pixel rows] says which; Note [Convolution by image chunks]), or, on 16 to 31
  channels, one product per tap over shifted views of the input (Note [Convolution by
  shifted taps] in ops/_shifted_taps.py);
* ``conv_input_grad(g, w)``: its adjoint in ``x``; with stride 1 a convolution of ``g``
  with the flipped kernel (Note [A stride-1 adjoint is a convolution]), else the product
  ``w^T @ g`` folded back onto the input positions (col2im, one strided slice addition
  per kernel tap);
* ``conv_weight_grad(x, g)``: its adjoint in ``w``, ``windows(x) @ g^T`` summed over the
  chunks (or over the shifted taps' views).

Note [Convolution's three kernels]: ``conv``'s gradients are ``conv_input_grad(g, w)`` and
``conv_weight_grad(x, g)``; a transposed convolution's forward is ``conv_input_grad`` and its
gradients are ``conv(g, w)`` and ``conv_weight_grad(g, x)``. Under ``create_graph`` each
kernel runs through the math namespace ``m`` (a gather, a matmul, an index add: see
ops/_windows.py), so a gradient of a gradient is exact to any order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from . import _pixel_rows as R
from . import _shifted_taps as S
from . import _windows as W
from ._spec import defop


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution's windows over its input, and its groups. For a transposed
    convolution it is the geometry of the convolution it transposes (whose input is the
    transposed convolution's output)."""

    window: W.Window
    groups: int


# --- which layout ---------------------------------------------------------------------------
# Note [Convolution on pixel rows]: a convolution is one product of its weight with its
# windows, in either of two layouts. Channels first, ``W (O, taps*C) @ windows (taps*C,
# pixels)``, is a product of few rows (O) and long ones, which OpenBLAS runs below its best
# (it packs panels of the long rows); on pixel rows (channels last), ``windows (pixels,
# taps*C) @ W^T (taps*C, O)`` in parts of about a thousand pixels (ops/_pixel_rows.py), it
# runs near its best, no junk columns are computed (Note [Wide rows]), and strided windows
# are copied in runs of ``kw * C`` rather than element by element. Pixel rows cost two
# transposing copies, of the input on the way in and of the output on the way out;
# channels first on wide rows needs neither (the windows are copied in runs of a
# padded row, the output moved in whole planes). So a convolution takes pixel rows when
# its kernel has more than one tap and either its windows are not on wide rows (stride >
# 1, or narrow images) or it has at least ``ROWS_CHANNELS`` input channels; below that
# the transposes cost more than the product gains (a 3-channel stem, 16 channels on 32 x
# 32 images), and a 1 x 1 kernel's channels-first windows are a plain copy. The weight's
# gradient (``g @ windows`` summed over the images, or over parts of small images) and
# the input's (``g @ W`` folded back tap by tap onto a channels-last gradient, or with
# stride 1 a convolution: Note [A stride-1 adjoint is a convolution]) take the same
# layout as the forward, decided on the same geometry and input channels. Grouped
# convolutions keep channels first (their products are per group), as do the kernels
# under ``create_graph`` (through the math namespace). Between ``SHIFT_CHANNELS`` and
# ``ROWS_CHANNELS`` input channels (one group, several taps, little junk) a stride-1
# convolution takes neither: its forward, its input gradient (a convolution of as many
# channels as the output has) and its weight gradient run by shifted taps, with no window
# copy at all (Note [Convolution by shifted taps] in ops/_shifted_taps.py). A strided one
# keeps pixel rows: since the compiled kernels copy the windows straight from the input
# (Note [Pixel rows straight from the input] in ops/kernels/numba_kernels.py), its weight
# gradient there is faster than by phases (Note [Strided taps by phases], which
# ``STRIDED_BY_PHASES`` turns back on). These two functions are the one place that decides.
PIXEL_ROWS = True  # (tests set it False to check the channels-first kernels on every geometry)
ROWS_CHANNELS = 32
STRIDED_BY_PHASES = False  # (tests set it True to check the weight gradient by phases)


def on_pixel_rows(geo: ConvGeometry, channels: int) -> bool:
    """Whether the array kernels of ``geo`` over an input of ``channels`` channels run on
    pixel rows (Note [Convolution on pixel rows])."""
    win = geo.window
    return (PIXEL_ROWS and geo.groups == 1 and win.taps > 1
            and (channels >= ROWS_CHANNELS or not W.wide(win)))


SHIFTED_TAPS = True  # (tests set it False to check the other layouts on these geometries)
SHIFT_CHANNELS = 16


def on_shifted_taps(geo: ConvGeometry, channels: int, *, weight_grad: bool = False) -> bool:
    """Whether ``conv`` (or, ``weight_grad``, ``conv_weight_grad``) of ``geo`` over an
    input of ``channels`` channels runs by shifted taps (Note [Convolution by shifted
    taps] in ops/_shifted_taps.py); this comes before :func:`on_pixel_rows`. A strided
    convolution keeps pixel rows (Note [Convolution on pixel rows]), unless
    ``STRIDED_BY_PHASES`` sends its weight gradient by phases."""
    win = geo.window
    return (SHIFTED_TAPS and geo.groups == 1 and win.taps > 1 and SHIFT_CHANNELS <= channels < ROWS_CHANNELS
            and S.fits(win) and (win.stride == (1, 1) or (weight_grad and STRIDED_BY_PHASES)))


def _rows_weight(w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``w`` (O, C, kh, kw) as the contiguous ``(kh * kw * C, O)`` that pixel rows multiply."""
    o = w.shape[0]
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0), dtype=dtype).reshape(-1, o)


def _rows_conv(x: np.ndarray, w: np.ndarray, win: W.Window) -> np.ndarray:
    """``conv`` on pixel rows."""
    n, o = x.shape[0], w.shape[0]
    dtype = np.result_type(x.dtype, w.dtype)
    wk = _rows_weight(w, dtype)
    windows = R.RowWindows(x, win, dtype)
    y = np.empty((n, o, *win.out_size), dtype=dtype)
    products = np.empty((windows.buf.shape[0] * win.positions, o), dtype=dtype)
    for part in windows.parts:
        ys = products[:(part.stop - part.start) * win.positions]
        np.matmul(windows.cols(part), wk, out=ys)
        R.to_channels_first(ys, y[part])
    return y


# Below this many output pixels an image, the weight's gradient on pixel rows is one
# product per part over its images' pixel rows; from it on, one per image (batched),
# each image's ``g`` plane as it is (Note [Convolution on pixel rows]).
PLANE_PRODUCT_POSITIONS = 256


def _rows_weight_grad(x: np.ndarray, gy: np.ndarray, win: W.Window) -> np.ndarray:
    """``conv_weight_grad`` on pixel rows: ``g @ windows`` summed over the images."""
    n, c = x.shape[:2]
    o = gy.shape[1]
    dtype = np.result_type(x.dtype, gy.dtype)
    windows = R.RowWindows(x, win, dtype)
    dwt = np.zeros((o, win.taps * c), dtype=dtype)
    planes = gy.reshape(n, o, win.positions)
    for part in windows.parts:
        cols = windows.cols(part)
        if win.positions >= PLANE_PRODUCT_POSITIONS or part.stop - part.start == 1:
            dwt += np.matmul(planes[part], cols.reshape(part.stop - part.start, win.positions, -1)).sum(axis=0)
        else:
            dwt += (cols.T @ R.rows_of(gy, part)).T
    return np.ascontiguousarray(dwt.reshape(o, *win.kernel, c).transpose(0, 3, 1, 2))


def _rows_input_grad(gy: np.ndarray, w: np.ndarray, win: W.Window) -> np.ndarray:
    """``conv_input_grad`` on pixel rows: ``g @ W`` per part, folded back tap by tap."""
    n, c = gy.shape[0], w.shape[1]
    dtype = np.result_type(gy.dtype, w.dtype)
    wkt = _rows_weight(w, dtype).T
    dx = np.empty((n, c, *win.in_size), dtype=dtype)
    parts = R.image_parts(n, win.positions)
    most = max((p.stop - p.start for p in parts), default=0)
    products = np.empty((most * win.positions, wkt.shape[1]), dtype=dtype)  # (one buffer for every part)
    for part in parts:
        rows = R.rows_of(gy, part)
        dcols = products[:rows.shape[0]]
        np.matmul(rows, wkt, out=dcols)
        R.fold_channels_first(dcols, dx, part, win)
    return dx


# --- the kernels ----------------------------------------------------------------------------
def _shapes(geo: ConvGeometry, n: int, c_in: int, c_out: int) -> tuple[int, int, int, int]:
    """(groups, input channels per group, output channels per group, taps x channels)."""
    g = geo.groups
    return g, c_in // g, c_out // g, c_in // g * geo.window.taps


def conv(m: Any, x: Any, w: Any, geo: ConvGeometry) -> Any:
    """``x`` (N, C, H, W) convolved with ``w`` (O, C/groups, kh, kw): (N, O, oh, ow)."""
    n, c = x.shape[:2]
    o = w.shape[0]
    g, _, og, k = _shapes(geo, n, c, o)
    win = geo.window
    wg = m.reshape(w, (g, og, k))
    if m.tensor_mode:
        cols = m.reshape(W.m_unfold(m, x, win), (n, g, k, win.positions))
        return m.reshape(m.matmul(wg, cols), (n, o, *win.out_size))
    if on_shifted_taps(geo, c):
        return S.conv(x, w, win)
    if on_pixel_rows(geo, c):
        return _rows_conv(x, w, win)
    y = np.empty((n, o, *win.out_size), dtype=np.result_type(x.dtype, w.dtype))
    parts = _image_chunks(n, c, win, x.dtype.itemsize)  # Note [Convolution by image chunks]
    unfold = W.Unfolder(x, win, parts[0].stop)
    products = np.empty(o * parts[0].stop * unfold.run, dtype=y.dtype)
    for part in parts:
        images = part.stop - part.start
        ys = products[:o * images * unfold.run].reshape(g, og, -1)
        np.matmul(wg, unfold.cols(part).reshape(g, k, -1), out=ys)  # one product per group
        if unfold.is_wide:  # Note [Wide rows] in ops/_windows.py
            y[part] = ys.reshape(o, images, win.out_size[0], win.padded[1])[..., :win.out_size[1]].transpose(1, 0, 2, 3)
        else:
            y[part] = ys.reshape(o, images, *win.out_size).transpose(1, 0, 2, 3)
    return y


# Note [Convolution by image chunks]: im2col makes ``taps`` copies of the input; over a
# whole batch (16 images of 16 x 32 x 32: 9.4 MB) the windows are written to memory and
# read back by the product from memory. Cut into chunks of whole images whose windows
# take at most ``CHUNK_BYTES``, each chunk's windows are still in cache when its product
# reads them. Chunks of half a core's L2 (so that they would stay in its own cache) were
# slower than chunks of twice its L2, whose windows the product reads from the L3, and
# 4 MB chunks slower again (figures: docs/benchmarks.md, "Figures behind the Notes").
# Each chunk is one product and a few numpy calls, and chunks of two images made products
# too short for OpenBLAS and the calls a part of the time. The weight's gradient adds
# up the chunks' products (in chunk order); each element of the forward and of the
# input's gradient comes from one chunk alone, so both are the same sums as over the
# whole batch.
def core_cache_bytes(cpu_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size of one core's L2 cache as Linux reports it (``cpu_dir``), or None where
    it does not."""
    try:
        for entry in sorted(os.listdir(cpu_dir)):
            base = os.path.join(cpu_dir, entry)
            with open(os.path.join(base, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(base, "type")) as f:
                kind = f.read().strip()
            if level == "2" and kind in ("Unified", "Data"):
                with open(os.path.join(base, "size")) as f:
                    size = f.read().strip()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:].upper(), 1)
                return int(size.rstrip("KkMm")) * scale
    except (OSError, ValueError):
        pass
    return None


def chunk_bytes(l2: int | None) -> int:
    """``CHUNK_BYTES`` for a core whose L2 holds ``l2`` bytes: twice that, between 512 kB
    and 4 MB; 1 MB where the size is unknown (Note [Convolution by image chunks])."""
    return 1 << 20 if l2 is None else min(max(2 * l2, 512 << 10), 4 << 20)


CHUNK_BYTES = chunk_bytes(core_cache_bytes())


def _image_chunks(n: int, c: int, win: W.Window, itemsize: int) -> list[slice]:
    """The batch cut into chunks of whole images whose windows fit ``CHUNK_BYTES``."""
    row = win.padded[1] if W.wide(win) else win.out_size[1]
    per_image = c * win.taps * win.out_size[0] * row * itemsize
    step = max(1, CHUNK_BYTES // max(per_image, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)] or [slice(0, 0)]  # (an empty batch: one empty chunk)


def _grouped_rows(gy: np.ndarray, g: int, win: W.Window) -> np.ndarray:
    """``gy`` (N, O, oh, ow) as (groups, O/groups, N * oh * ow), a copy; on wide rows
    (zeros in the junk columns) when the convolution runs on them."""
    n, o = gy.shape[:2]
    if W.wide(win):
        out = np.zeros((o, n, win.out_size[0], win.padded[1]), dtype=gy.dtype)
        out[..., :win.out_size[1]] = gy.transpose(1, 0, 2, 3)
        return out.reshape(g, o // g, -1)
    rows = gy.reshape(n, g, o // g, win.positions)
    return np.ascontiguousarray(rows.transpose(1, 2, 0, 3)).reshape(g, o // g, -1)


def conv_input_grad(m: Any, gy: Any, w: Any, geo: ConvGeometry) -> Any:
    """The adjoint of ``conv`` in ``x``: ``gy`` (N, O, oh, ow) to (N, C, H, W)."""
    n, o = gy.shape[:2]
    c = w.shape[1] * geo.groups
    g, cg, og, k = _shapes(geo, n, c, o)
    win = geo.window
    if m.tensor_mode:
        wt = m.transpose(m.reshape(w, (g, og, k)), 1, 2)
        cols = m.matmul(wt, m.reshape(gy, (n, g, og, win.positions)))
        return W.m_fold(m, m.reshape(cols, (n, c, *win.kernel, *win.out_size)), win)
    flipped = _flipped(geo)
    if flipped is not None:  # Note [A stride-1 adjoint is a convolution]
        return conv(m, gy, _flipped_weight(w, geo.groups), flipped)
    if on_pixel_rows(geo, c):
        return _rows_input_grad(gy, w, win)
    wt = np.swapaxes(w.reshape(g, og, k), 1, 2)
    cols = np.matmul(wt, _grouped_rows(gy, g, win))  # (groups, C/groups * taps, N * positions)
    if W.wide(win):
        return W.np_fold_wide(cols.reshape(c, *win.kernel, n, -1), win)
    return W.np_fold_channels_first(cols.reshape(c, *win.kernel, n, *win.out_size), win)


# Note [A stride-1 adjoint is a convolution]: with stride 1, input element i receives
# ``sum_t g[i + pad_before - d*t] * w[t]``: the correlation of ``g``, padded by
# ``d*(k-1) - pad`` on each side, with the kernel flipped and its in/out channels swapped
# (per group). So the input's gradient runs as a forward convolution: im2col of ``g`` and
# one product with ``O * taps`` terms per output element, where the product ``w^T @ g``
# has only ``O`` and writes ``C * taps`` rows that col2im then adds back tap by tap.
@lru_cache(maxsize=256)
def _flipped(geo: ConvGeometry) -> ConvGeometry | None:
    """The geometry of the convolution that is ``geo``'s adjoint in its input, when
    ``geo`` has stride 1 and pads at most ``d*(k-1)`` on each side; else None."""
    win = geo.window
    if win.stride != (1, 1):
        return None
    # (the far side pads to the input's size: a transposed convolution's output_padding
    # makes it one or more longer than the windows reach)
    pad = tuple((d * (k - 1) - before, size - out + before)
                for d, k, (before, _), size, out in zip(win.dilation, win.kernel, win.pad, win.in_size, win.out_size))
    if any(p < 0 for pair in pad for p in pair):
        return None
    flipped = W.Window(win.kernel, (1, 1), win.dilation, pad, win.out_size, win.in_size)  # type: ignore[arg-type]
    return ConvGeometry(flipped, geo.groups)


def _flipped_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """``w`` (O, C/groups, kh, kw) as (C, O/groups, kh, kw), flipped in both spatial dims."""
    o, cg, kh, kw = w.shape
    per_group = w.reshape(groups, o // groups, cg, kh, kw).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    return np.ascontiguousarray(per_group).reshape(groups * cg, o // groups, kh, kw)


def conv_weight_grad(m: Any, x: Any, gy: Any, geo: ConvGeometry) -> Any:
    """The adjoint of ``conv`` in ``w``: (O, C/groups, kh, kw) from ``x`` and ``gy``."""
    n, c = x.shape[:2]
    o = gy.shape[1]
    g, cg, og, k = _shapes(geo, n, c, o)
    win = geo.window
    shape = (o, cg, *win.kernel)
    if m.tensor_mode:
        gy = m.reshape(gy, (n, g, og, win.positions))
        cols = m.reshape(W.m_unfold(m, x, win), (n, g, k, win.positions))
        return m.reshape(m.sum(m.matmul(gy, m.transpose(cols, 2, 3)), 0), shape)
    if on_shifted_taps(geo, c, weight_grad=True):
        return S.weight_grad(x, gy, win)
    if on_pixel_rows(geo, c):
        return _rows_weight_grad(x, gy, win)
    parts = _image_chunks(n, c, win, x.dtype.itemsize)
    unfold = W.Unfolder(x, win, parts[0].stop)
    dw = None
    for part in parts:
        cols = unfold.cols(part).reshape(g, k, -1)
        # (as ``windows @ g^T``: OpenBLAS runs this product with its few columns ``O``
        # twice as fast as ``g @ windows^T`` with its few rows)
        term = np.matmul(cols, _grouped_rows(gy[part], g, win).transpose(0, 2, 1))
        dw = term if dw is None else np.add(dw, term, out=dw)
    assert dw is not None
    return np.ascontiguousarray(dw.transpose(0, 2, 1)).reshape(shape)


def _conv_joint(g: np.ndarray, ans: Any, x: Any, w: Any, b: Any = None, *, mask: tuple[bool, ...],
                geo: ConvGeometry) -> tuple[np.ndarray | None, ...]:
    """dx, dw and db as ``mask`` asks (Note [Joint rules] in ops/_spec.py)."""
    dx = conv_input_grad(_NP, g, w, geo) if mask[0] else None
    dw = conv_weight_grad(_NP, x, g, geo) if mask[1] else None
    db = g.sum(axis=(0, 2, 3)) if len(mask) > 2 and mask[2] else None
    return (dx, dw, db)[:len(mask)]


def _channel_sum(m: Any, g: Any) -> Any:
    return m.sum(g, (0, 2, 3))


def _with_bias(y: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    if b is not None:
        y += b.reshape(-1, 1, 1)
    return y


# --- forwards -------------------------------------------------------------------------------
def _conv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *, geo: ConvGeometry) -> np.ndarray:
    return _with_bias(conv(_NP, x, w, geo), b)


def _conv_transpose_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *,
                            geo: ConvGeometry) -> np.ndarray:
    return _with_bias(conv_input_grad(_NP, x, w, geo), b)


class _NumpyMath:
    """The few array functions the kernels call outside a backward (the forwards)."""

    tensor_mode = False
    reshape = staticmethod(np.reshape)
    matmul = staticmethod(np.matmul)
    transpose = staticmethod(np.swapaxes)


_NP = _NumpyMath()


# name ---------- node name --------- forward ------- derivative per input ----------------------
conv2d = defop("ConvolutionBackward0", _conv_forward,
               lambda m, g, ans, x, w, b=None, *, geo: conv_input_grad(m, g, w, geo),
               lambda m, g, ans, x, w, b=None, *, geo: conv_weight_grad(m, x, g, geo),
               lambda m, g, ans, x, w, b, *, geo: _channel_sum(m, g),
               save="x@1 y@0", blas=True, joint=_conv_joint)
conv2d_nobias = defop("ConvolutionBackward0", _conv_forward,
                      lambda m, g, ans, x, w, *, geo: conv_input_grad(m, g, w, geo),
                      lambda m, g, ans, x, w, *, geo: conv_weight_grad(m, x, g, geo),
                      save="x@1 y@0", blas=True, joint=_conv_joint)
conv_transpose2d = defop("ConvolutionBackward0", _conv_transpose_forward,
                         lambda m, g, ans, x, w, b=None, *, geo: conv(m, g, w, geo),
                         lambda m, g, ans, x, w, b=None, *, geo: conv_weight_grad(m, g, x, geo),
                         lambda m, g, ans, x, w, b, *, geo: _channel_sum(m, g),
                         save="x@1 y@0", blas=True)
conv_transpose2d_nobias = defop("ConvolutionBackward0", _conv_transpose_forward,
                                lambda m, g, ans, x, w, *, geo: conv(m, g, w, geo),
                                lambda m, g, ans, x, w, *, geo: conv_weight_grad(m, g, x, geo),
                                save="x@1 y@0", blas=True)
