"""Pooling over the last two dims: max (with PyTorch's indices), average and adaptive max.

Every kernel walks the window's taps (``kh * kw`` strided slices of the padded input,
vectorised over the batch, the channels and the positions), never the pixels. Max pooling
keeps, per output, the index of the element that won (``aux``); its gradient goes back to
that element alone. Under ``create_graph`` the rules are index adds and gathers of ``m``, differentiable
again (a max pool's double backward picks the gradient's gradient at the same elements).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _windows as W
from ._spec import defop
from .kernels import compiled_path as fast


# --- max pooling ----------------------------------------------------------------------------
def _max_pool(x: np.ndarray, *, win: W.Window) -> tuple[np.ndarray, np.ndarray]:
    """The window maxima (N, C, oh, ow) and, as aux, the flat index into its (H * W) plane
    of the element each came from (PyTorch's ``return_indices``: int64, or int32 from the
    compiled kernel, Note [Max pooling row by row] in ops/kernels/numba_kernels.py), the
    winner as PyTorch's scan picks it: the first tap holding the maximum, or the last NaN.

    The taps are first copied out together, as ``(taps, N * C * oh * ow)``, in one call:
    every later pass then runs over long contiguous rows, where passes over the strided
    taps ran numpy's loop once per short image row."""
    compiled = fast.max_pool(x, win.in_size, win.out_size, W.window_ints(win))
    if compiled is not None:
        return compiled
    taps = W.np_windows(W.np_pad(x, win, -np.inf), win)
    n, c = x.shape[:2]
    cols = np.ascontiguousarray(taps.transpose(2, 3, 0, 1, 4, 5)).reshape(win.taps, -1)
    best = cols.max(axis=0)  # (propagates NaN)
    arg = np.zeros(best.shape, dtype=np.int16)
    for t in range(win.taps - 1, -1, -1):  # the last write is the first tap that holds the maximum
        np.copyto(arg, t, where=cols[t] == best)
    if np.isnan(best).any():  # PyTorch's scan takes every NaN it meets: the last one wins
        for t in range(win.taps):
            np.copyto(arg, t, where=np.isnan(cols[t]))
    shape = (n, c, *win.out_size)
    return best.reshape(shape), max_pool_index(arg.reshape(shape), win).astype(np.int64, copy=False)


def max_pool_index(arg: np.ndarray, win: W.Window) -> np.ndarray:
    """The flat index into each (H * W) plane of the element that tap ``arg`` read (as
    PyTorch's ``return_indices``); a tap in the padding (the first tap of a window of
    -inf) names the window's first tap inside the input, as PyTorch's does."""
    kh, kw = win.kernel
    (sh, sw), (dh, dw), ((pt, _), (pl, _)) = win.stride, win.dilation, win.pad
    (oh, ow), width = win.out_size, win.in_size[1]
    if pt == 0 and pl == 0 and _taps_inside(win):
        # every tap inside the input: a window's origin plus the tap's offset
        origin = (np.arange(oh, dtype=np.intp)[:, None] * sh) * width + np.arange(ow, dtype=np.intp)[None, :] * sw
        offset = ((np.arange(kh, dtype=np.intp) * dh)[:, None] * width + np.arange(kw, dtype=np.intp) * dw).ravel()
        return offset[arg] + origin  # type: ignore[no-any-return]
    a = arg.astype(np.intp)
    rows = np.arange(oh, dtype=np.intp)[:, None] * sh + (a // kw) * dh - pt
    cols = np.arange(ow, dtype=np.intp)[None, :] * sw + (a % kw) * dw - pl
    rows = np.where(rows < 0, rows % dh, rows)
    cols = np.where(cols < 0, cols % dw, cols)
    return rows * width + cols  # type: ignore[no-any-return]


def _taps_inside(win: W.Window) -> bool:
    """Whether every tap of every window reads an input element (no padding reached)."""
    return all((o - 1) * s + d * (k - 1) < n
               for o, s, d, k, n in zip(win.out_size, win.stride, win.dilation, win.kernel, win.in_size))


def _global_index(plane_index: np.ndarray, plane: int) -> np.ndarray:
    """Plane indices (N, C, oh, ow) as indices into the whole flattened input."""
    n, c = plane_index.shape[:2]
    return (plane_index + (np.arange(n * c, dtype=np.intp) * plane).reshape(n, c, 1, 1)).reshape(-1)


def _max_pool_rule(m: Any, g: Any, ans: Any, x: Any, *, win: W.Window, aux: Any) -> Any:
    n, c = g.shape[:2]
    plane = win.in_size[0] * win.in_size[1]
    plane_index = np.asarray(aux.data if hasattr(aux, "data") else aux)
    if not m.tensor_mode:
        compiled = fast.max_pool_backward(g, plane_index, win.in_size)
        if compiled is not None:
            return compiled
    index = _global_index(plane_index, plane)
    if m.tensor_mode:
        flat = m.index_add(m.reshape(g, (-1,)), index, (n * c * plane,), False)
        return m.reshape(flat, (n, c, *win.in_size))
    if not win.overlaps:  # each input element in at most one window: one scatter
        out = np.zeros(n * c * plane, dtype=g.dtype)
        out[index] = np.ravel(g)
    else:  # repeated elements summed (in float64, then rounded once to g's dtype)
        out = np.bincount(index, weights=np.ravel(g), minlength=n * c * plane).astype(g.dtype, copy=False)
    return out.reshape(n, c, *win.in_size)


# --- adaptive max pooling -------------------------------------------------------------------
def adaptive_bounds(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows: output ``i`` covers ``[floor(i*size/out), ceil((i+1)*size/out))``."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _adaptive_max_pool(x: np.ndarray, *, output_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The maxima of PyTorch's adaptive windows and, as aux, each one's flat index into its
    (H * W) plane (the first maximum; NaN wins), one vectorised pass per output cell."""
    n, c, h, w = x.shape
    oh, ow = output_size
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    index = np.empty((n, c, oh, ow), dtype=np.intp)
    for i, (r0, r1) in enumerate(adaptive_bounds(h, oh)):
        for j, (c0, c1) in enumerate(adaptive_bounds(w, ow)):
            cell = x[:, :, r0:r1, c0:c1].reshape(n, c, -1)
            k = np.argmax(cell, axis=2)  # (the first NaN, or the first maximum)
            out[:, :, i, j] = np.take_along_axis(cell, k[..., None], axis=2)[..., 0]
            index[:, :, i, j] = (r0 + k // (c1 - c0)) * w + c0 + k % (c1 - c0)
    return out, index


def _adaptive_max_rule(m: Any, g: Any, ans: Any, x: Any, *, shape: tuple[int, ...], aux: Any) -> Any:
    n, c, h, w = shape
    index = _global_index(np.asarray(aux.data if hasattr(aux, "data") else aux), h * w)
    if m.tensor_mode:
        return m.reshape(m.index_add(m.reshape(g, (-1,)), index, (n * c * h * w,), False), shape)
    return m.reshape(m.index_add(np.ravel(g), index, (n * c * h * w,), False), shape)


# --- average pooling ------------------------------------------------------------------------
def avg_divisor(win: W.Window, count_include_pad: bool,
                divisor_override: int | None, dtype: np.dtype) -> np.ndarray:
    """``1 / divisor`` for each output position (oh, ow), PyTorch's rule: a window counts
    the padded positions it covers (but not those ``ceil_mode`` added) with
    ``count_include_pad``, else only the input elements."""
    if divisor_override is not None:
        return np.full(win.out_size, 1.0 / divisor_override, dtype=dtype)
    sizes = []
    for d in range(2):
        pad = win.pad[d][0]
        start = np.arange(win.out_size[d]) * win.stride[d] - pad
        end = np.minimum(start + win.kernel[d], win.in_size[d] + pad)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, win.in_size[d])
        sizes.append(end - start)
    return (1.0 / (sizes[0][:, None] * sizes[1][None, :])).astype(dtype)


def _avg_pool(x: np.ndarray, *, win: W.Window, scale: np.ndarray) -> np.ndarray:
    xp = W.np_pad(x, win)
    out = None
    for i in range(win.kernel[0]):
        for j in range(win.kernel[1]):
            v = xp[(..., *win.tap_slices(i, j))]
            out = v.copy() if out is None else np.add(out, v, out=out)
    assert out is not None
    out *= scale
    return out


def _avg_pool_rule(m: Any, g: Any, ans: Any, x: Any, *, win: W.Window, scale: np.ndarray) -> Any:
    if m.tensor_mode:
        n, c = g.shape[:2]
        spread = m.reshape(g * m.constant(scale), (n, c, 1, 1, *win.out_size))
        return W.m_fold(m, m.broadcast_to(spread, (n, c, *win.kernel, *win.out_size)), win)
    return W.np_fold_each(g * scale, win)


# name ---------- node name ------------- forward ----------- derivative -----------------------
max_pool2d = defop("MaxPool2DWithIndicesBackward0", _max_pool, _max_pool_rule, has_aux=True)
adaptive_max_pool2d = defop("AdaptiveMaxPool2DBackward0", _adaptive_max_pool, _adaptive_max_rule, has_aux=True)
avg_pool2d = defop("AvgPool2DBackward0", _avg_pool, _avg_pool_rule)
