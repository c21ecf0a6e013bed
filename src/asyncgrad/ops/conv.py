"""Convolution and transposed convolution over two spatial dims (1-D ones run as 2-D with
a kernel one tap high), with stride, padding, dilation and groups.

Three kernels, each a bilinear map, make all the rules (Note [Convolution's three kernels]):

* ``conv(x, w)``: ``y[n, o] = sum w[o, c, i, j] * x_padded[n, c, s*p + d*i, ...]``, the
  windows of ``x`` copied once (im2col) and multiplied by the weight in one BLAS product;
* ``conv_input_grad(g, w)``: its adjoint in ``x``, the product ``w^T @ g`` folded back onto
  the input positions (col2im, one strided slice addition per kernel tap);
* ``conv_weight_grad(x, g)``: its adjoint in ``w``, ``g @ windows(x)^T``.

Note [Convolution's three kernels]: ``conv``'s gradients are ``conv_input_grad(g, w)`` and
``conv_weight_grad(x, g)``; a transposed convolution's forward is ``conv_input_grad`` and its
gradients are ``conv(g, w)`` and ``conv_weight_grad(g, x)``. Under ``create_graph`` each
kernel runs through the math namespace ``m`` (a gather, a matmul, an index add: see
ops/_windows.py), so a gradient of a gradient is exact to any order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _windows as W
from ._spec import defop


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution's windows over its input, and its groups. For a transposed
    convolution it is the geometry of the convolution it transposes (whose input is the
    transposed convolution's output)."""

    window: W.Window
    groups: int


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
    if W.wide(win):  # Note [Wide rows] in ops/_windows.py
        cols = W.np_unfold_wide(x, win).reshape(g, k, -1)
        y = np.matmul(wg, cols).reshape(o, n, win.out_size[0], win.padded[1])[..., :win.out_size[1]]
    else:
        cols = W.np_unfold_channels_first(x, win).reshape(g, k, n * win.positions)
        y = np.matmul(wg, cols).reshape(o, n, *win.out_size)  # one product per group
    return np.ascontiguousarray(y.transpose(1, 0, 2, 3))


def _grouped_rows(gy: np.ndarray, g: int, win: W.Window) -> np.ndarray:
    """``gy`` (N, O, oh, ow) as (groups, O/groups, N * oh * ow), a copy; on wide rows
    (zeros in the junk columns) when the convolution runs on them."""
    n, o = gy.shape[:2]
    if W.wide(win):
        out = np.zeros((o, n, win.out_size[0], win.padded[1]), dtype=gy.dtype)
        out[..., :win.out_size[1]] = gy.transpose(1, 0, 2, 3)
        return out.reshape(g, o // g, -1)
    return np.ascontiguousarray(gy.reshape(n, g, o // g, -1).transpose(1, 2, 0, 3)).reshape(g, o // g, -1)


def conv_input_grad(m: Any, gy: Any, w: Any, geo: ConvGeometry, rows: np.ndarray | None = None) -> Any:
    """The adjoint of ``conv`` in ``x``: ``gy`` (N, O, oh, ow) to (N, C, H, W); ``rows``
    is ``_grouped_rows(gy)`` when the caller has it already."""
    n, o = gy.shape[:2]
    c = w.shape[1] * geo.groups
    g, cg, og, k = _shapes(geo, n, c, o)
    win = geo.window
    wt = m.transpose(m.reshape(w, (g, og, k)), 1, 2)
    if m.tensor_mode:
        cols = m.matmul(wt, m.reshape(gy, (n, g, og, win.positions)))
        return W.m_fold(m, m.reshape(cols, (n, c, *win.kernel, *win.out_size)), win)
    if rows is None:
        rows = _grouped_rows(gy, g, win)
    cols = np.matmul(wt, rows)  # (groups, C/groups * taps, N * positions)
    if W.wide(win):
        return W.np_fold_wide(cols.reshape(c, *win.kernel, n, -1), win)
    return W.np_fold_channels_first(cols.reshape(c, *win.kernel, n, *win.out_size), win)


def conv_weight_grad(m: Any, x: Any, gy: Any, geo: ConvGeometry, rows: np.ndarray | None = None) -> Any:
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
    unfold = W.np_unfold_wide if W.wide(win) else W.np_unfold_channels_first
    cols = unfold(x, win).reshape(g, k, -1)
    if rows is None:
        rows = _grouped_rows(gy, g, win)
    return np.matmul(rows, cols.transpose(0, 2, 1)).reshape(shape)


def _conv_joint(g: np.ndarray, ans: Any, x: Any, w: Any, b: Any = None, *, mask: tuple[bool, ...],
                geo: ConvGeometry) -> tuple[np.ndarray | None, ...]:
    """dx, dw and db as ``mask`` asks (Note [Joint rules] in ops/_spec.py): the gradient
    laid out as the products want it once, for both."""
    rows = _grouped_rows(g, geo.groups, geo.window)
    dx = conv_input_grad(_NP, g, w, geo, rows) if mask[0] else None
    dw = conv_weight_grad(_NP, x, g, geo, rows) if mask[1] else None
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
