"""The compiled path of each op (``ops/kernels/numba_kernels.py``): every function returns the
op's result, or None when the compiled kernels are not in use (not loaded yet, mode
``numpy``, see ``ops/kernels/loader.py``) or do not apply, and the caller then runs its numpy
kernel. They apply to float32 and float64 arrays of at least one dimension whose dtypes
all agree (mixed dtypes keep numpy's promotion); inputs that are not C-contiguous are
copied first, as are read-only ones (the kernels are compiled for writeable arrays).
Row ops (softmax, log_softmax, layer_norm) apply along the last axis only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .loader import compiled

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _fits(first: np.ndarray, *others: np.ndarray) -> bool:
    """Whether the kernels apply: one float dtype and shape for all, at least one
    dimension and one element. (A plain loop: a generator in ``all()`` was a
    measurable part of a small node's kernel call.)"""
    dt = first.dtype
    if dt not in _FLOATS or not first.ndim or not first.size:
        return False
    for a in others:
        if a.dtype != dt or a.shape != first.shape:
            return False
    return True


def _c(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous, writeable-typed array. numba compiles a kernel per array
    type, and a read-only array (a broadcast gradient, a frozen user array) is a type the
    kernels were not compiled for, so such an input is copied: one pass, rather than a
    second set of kernels to compile and load."""
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


def writeable_c(a: np.ndarray) -> np.ndarray:
    """``a`` as the kernels take it: C-contiguous and writeable-typed (a copy if not)."""
    return _c(a)


def _flat(a: np.ndarray) -> np.ndarray:
    return _c(a).reshape(-1)


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    return _c(a).reshape(-1, n)


def _last(x: np.ndarray, dim: Any) -> bool:
    return dim is not None and dim in (-1, x.ndim - 1)


# --- elementwise ---------------------------------------------------------------------------
# Below this many elements an elementwise op keeps its numpy kernel: a call into a compiled
# kernel costs about 2 us more than a ufunc (dispatch on the argument types, the output and
# its flat views), more than the whole op on a few thousand floats, and graphs of many tiny
# nodes (the chain and deep workloads) pay it on every node. Row ops (softmax, layer_norm)
# replace several numpy passes and win at every size.
ELEMENTWISE_MIN = 4096


def _unary(name: str, x: np.ndarray) -> np.ndarray | None:
    """``name``'s kernel on ``x``; a C-contiguous, writeable ``x`` (the usual case) is
    passed as a flat view directly (as in ``_binary``)."""
    if x.size < ELEMENTWISE_MIN:
        return None
    k = compiled()
    if k is None or not _fits(x):
        return None
    out = np.empty(x.shape, dtype=x.dtype)
    xf = x.flags
    getattr(k, name)(x.reshape(-1) if xf.c_contiguous and xf.writeable else _flat(x), out.reshape(-1))
    return out


def _binary(name: str, g: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """``name``'s kernel on a gradient ``g`` and a saved array ``x``; a ``g`` that is one
    value broadcast (all strides 0, as a sum's gradient) goes to the kernel's ``_scalar``
    variant, where there is one, rather than being copied out in full.

    Arguments that are both C-contiguous and writeable (the usual case) are passed as
    flat views directly: ``_flat``'s copies-if-needed were part of the ~2.5 us this adds
    to the kernel on a small array (a ReLU of 32 x 128, on every pass of the concurrent
    benchmark)."""
    if x.size < ELEMENTWISE_MIN:
        return None
    k = compiled()
    if k is None or not _fits(x, g):
        return None
    out = np.empty(x.shape, dtype=x.dtype)
    gf = g.flags
    xf = x.flags
    if gf.c_contiguous and gf.writeable and xf.c_contiguous and xf.writeable:
        getattr(k, name)(g.reshape(-1), x.reshape(-1), out.reshape(-1))
        return out
    if not any(g.strides):
        scalar = getattr(k, name + "_scalar", None)
        if scalar is not None:
            scalar(g.reshape(-1)[0], _flat(x), out.reshape(-1))
            return out
    getattr(k, name)(_flat(g), _flat(x), out.reshape(-1))
    return out


def gelu(x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(x * Phi(x), Phi(x))``."""
    k = compiled()
    if k is None or not _fits(x):
        return None
    out = np.empty(x.shape, dtype=x.dtype)
    cdf = np.empty(x.shape, dtype=x.dtype)
    k.gelu(_flat(x), out.reshape(-1), cdf.reshape(-1))
    return out, cdf


def gelu_backward(g: np.ndarray, x: np.ndarray, cdf: np.ndarray) -> np.ndarray | None:
    k = compiled()
    if k is None or not _fits(x, g, cdf):
        return None
    out = np.empty(x.shape, dtype=x.dtype)
    k.gelu_backward(_flat(g), _flat(x), _flat(cdf), out.reshape(-1))
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray | None:
    return _unary("gelu_tanh", x)


def gelu_tanh_backward(g: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    return _binary("gelu_tanh_backward", g, x)


def sigmoid(x: np.ndarray) -> np.ndarray | None:
    return _unary("sigmoid", x)


def sigmoid_backward(g: np.ndarray, ans: np.ndarray) -> np.ndarray | None:
    return _binary("sigmoid_backward", g, ans)


def tanh_backward(g: np.ndarray, ans: np.ndarray) -> np.ndarray | None:
    return _binary("tanh_backward", g, ans)


def relu(x: np.ndarray) -> np.ndarray | None:
    """``np.maximum(x, 0)``, bit for bit (NaN passes, -0 gives +0)."""
    return _unary("relu", x)


def threshold_backward(g: np.ndarray, ans: np.ndarray) -> np.ndarray | None:
    """``g`` where ``ans > 0``, else +0 (relu's derivative), bit for bit the numpy rule."""
    return _binary("threshold_backward", g, ans)


# --- masks (Note [Masks broadcast over rows] in numba_kernels.py) ----------------------------
def select(mask: np.ndarray, x: np.ndarray, fill: Any, keep: bool = True) -> np.ndarray | None:
    """``np.where(mask, x, fill)`` (``keep``) or ``np.where(mask, fill, x)`` (not ``keep``)
    for a bool ``mask`` that broadcasts over ``x``'s leading dims only (its shape, less
    leading 1s, is ``x``'s trailing shape), a float32/float64 ``x`` of the result's shape
    and a scalar ``fill`` (a Python number or 0-d array) that does not change the dtype;
    else None."""
    if x.size < ELEMENTWISE_MIN or mask.dtype != np.bool_ or mask.ndim > x.ndim:
        return None
    if isinstance(fill, np.ndarray):
        if fill.ndim or fill.dtype != x.dtype:
            return None
        fill = fill.item()
    elif type(fill) not in (float, int):
        return None
    k = compiled()
    if k is None or not _fits(x):
        return None
    shape = mask.shape
    while shape and shape[0] == 1:
        shape = shape[1:]
    if shape != x.shape[x.ndim - len(shape):] or not mask.size:
        return None
    n = mask.size
    out = np.empty(x.shape, dtype=x.dtype)
    k.select_rows(_rows(x, n), _flat(mask), keep, x.dtype.type(fill), out.reshape(-1, n))
    return out


# --- rows ------------------------------------------------------------------------------------
def _row_op(name: str, x: np.ndarray, dim: Any) -> np.ndarray | None:
    k = compiled()
    if k is None or not _fits(x) or not _last(x, dim):
        return None
    out = np.empty(x.shape, dtype=x.dtype)
    n = x.shape[-1]
    getattr(k, name)(_rows(x, n), out.reshape(-1, n))
    return out


def _row_backward(name: str, g: np.ndarray, ans: np.ndarray, dim: Any) -> np.ndarray | None:
    k = compiled()
    if k is None or not _fits(ans, g) or not _last(ans, dim):
        return None
    out = np.empty(ans.shape, dtype=ans.dtype)
    n = ans.shape[-1]
    getattr(k, name)(_rows(g, n), _rows(ans, n), out.reshape(-1, n))
    return out


def softmax(x: np.ndarray, dim: Any) -> np.ndarray | None:
    return _row_op("softmax", x, dim)


def softmax_backward(g: np.ndarray, ans: np.ndarray, dim: Any) -> np.ndarray | None:
    return _row_backward("softmax_backward", g, ans, dim)


def log_softmax(x: np.ndarray, dim: Any) -> np.ndarray | None:
    return _row_op("log_softmax", x, dim)


def log_softmax_backward(g: np.ndarray, ans: np.ndarray, dim: Any) -> np.ndarray | None:
    return _row_backward("log_softmax_backward", g, ans, dim)


def layer_norm(x: np.ndarray, affine: tuple[np.ndarray, ...], n: int,
               eps: float) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]] | None:
    """``(out, (xhat, rstd))`` as ``nn._layer_norm`` returns them, over the last ``n``
    elements of each row."""
    k = compiled()
    if k is None or not _fits(x) or n == 0 or any(a.dtype != x.dtype or a.size != n for a in affine):
        return None
    rows = _rows(x, n)
    none = np.empty(0, dtype=x.dtype)
    w = _flat(affine[0]) if affine else none
    b = _flat(affine[1]) if len(affine) > 1 else none
    out = np.empty(rows.shape, dtype=x.dtype)
    xhat = np.empty(rows.shape, dtype=x.dtype)
    rstd = np.empty((rows.shape[0], 1), dtype=x.dtype)
    k.layer_norm(rows, w, b, float(eps), out, xhat, rstd)
    return out.reshape(x.shape), (xhat, rstd)


def layer_norm_backward(g: np.ndarray, xhat: np.ndarray, rstd: np.ndarray,
                        w: np.ndarray | None) -> np.ndarray | None:
    """dx of layer_norm, in ``g``'s shape, or None. (A fresh array, not a view: the engine
    can make it ``.grad`` without a copy.)"""
    k = compiled()
    if k is None or not _fits(xhat) or g.dtype != xhat.dtype or rstd.dtype != xhat.dtype:
        return None
    weight = np.empty(0, dtype=xhat.dtype) if w is None else w
    if weight.dtype != xhat.dtype:
        return None
    out = np.empty(g.shape, dtype=xhat.dtype)
    n = xhat.shape[1]
    k.layer_norm_backward(_rows(g, n), _c(xhat), _c(rstd),
                          _flat(weight), out.reshape(-1, n))
    return out


def layer_norm_backward_joint(g: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, w: np.ndarray | None,
                              mask: tuple[bool, bool, bool], shape: tuple[int, ...]
                              ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] | None:
    """``(dx, dw, db)`` of layer_norm in one pass, each None where ``mask`` says it is
    not needed; dx in ``g``'s shape, dw and db in ``shape`` (fresh arrays). None: the
    compiled kernels do not apply."""
    k = compiled()
    if k is None or not _fits(xhat) or g.dtype != xhat.dtype or rstd.dtype != xhat.dtype:
        return None
    n = xhat.shape[1]
    weight = np.ones(n, dtype=xhat.dtype) if w is None else w
    if weight.dtype != xhat.dtype:
        return None
    none = np.empty(0, dtype=xhat.dtype)
    dx = np.empty(g.shape, dtype=xhat.dtype) if mask[0] else none
    dw = np.empty(shape, dtype=xhat.dtype) if mask[1] else none
    db = np.empty(shape, dtype=xhat.dtype) if mask[2] else none
    k.layer_norm_backward_joint(_rows(g, n), _c(xhat), _c(rstd),
                                _flat(weight), mask[0], dx.reshape(-1, n) if mask[0] else none.reshape(0, n),
                                dw.reshape(-1), db.reshape(-1))
    return dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None


def nll_loss(logp: np.ndarray, target: np.ndarray, ignore_index: int,
             mean: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """``(picked, safe targets, coefficients, count)`` of nll_loss's forward in one pass
    (Note [NLL in one pass] in ``numba_kernels.py``), or None: ``logp`` a non-empty 2-D
    float32/64 array, ``target`` int64. Raises PyTorch's IndexError for a target out of
    range that is not ``ignore_index``."""
    k = compiled()
    if (k is None or logp.ndim != 2 or logp.dtype not in _FLOATS or not logp.size
            or target.dtype != np.int64 or not -2**63 <= ignore_index < 2**63):
        return None
    n = logp.shape[0]
    picked = np.empty(n, dtype=logp.dtype)
    safe = np.empty(n, dtype=np.int64)
    coef = np.empty(n, dtype=logp.dtype)
    target = _c(target)
    count, bad = k.nll_pick(_c(logp), target, ignore_index, mean, picked, safe, coef)
    if bad >= 0:
        raise IndexError(f"Target {int(target[bad])} is out of bounds.")
    return picked, safe, coef, count


def column_dots(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``(a * b).sum(axis=0)`` of two 2-D arrays of one shape, as a fresh array of
    ``shape`` (``a.shape[1]`` elements), or None."""
    k = compiled()
    if k is None or not _fits(a, b) or a.ndim != 2:
        return None
    out = np.empty(shape, dtype=a.dtype)
    k.column_dots(_c(a), _c(b), out.reshape(-1))
    return out


# --- embedding backward ----------------------------------------------------------------------
def add_rows(out: np.ndarray, rows: np.ndarray, g: np.ndarray) -> bool:
    """``out[rows[i]] += g[i]`` in order of i on the 2-D C-contiguous ``out``; False (and
    nothing done) when the compiled kernels are not in use or do not apply. ``rows``
    must lie in ``[-len(out), len(out))``: checked here, as compiled code has no bounds
    checks."""
    k = compiled()
    if (k is None or out.dtype not in _FLOATS or g.dtype != out.dtype or not out.flags.c_contiguous
            or rows.ndim != 1 or g.ndim != 2 or g.shape[0] != rows.size or g.shape[1] != out.shape[1]):
        return False
    r = rows.astype(np.int64, copy=False)
    n = out.shape[0]
    if r.size and (int(r.min()) < -n or int(r.max()) >= n):
        return False  # numpy's indexing raises its IndexError
    if r.size and r.min() < 0:
        r = np.where(r < 0, r + n, r)
    k.add_rows(out, _c(r), _c(g))
    return True


# --- optimizers (Note [Adam in one pass] in numba_kernels.py) ---------------------------------
def adam_step(x: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, *, decoupled: bool, lr: float,
              weight_decay: float, maximize: bool, beta1: float, beta2: float, step_size: float,
              bc2_sqrt: float, eps: float) -> bool:
    """One Adam (AdamW when ``decoupled``) step in place, as ``optim/adam.py``'s numpy
    rule without amsgrad; False (nothing done) when the compiled kernels are not in use or
    the arrays are not all C-contiguous, writeable and of one float dtype."""
    k = compiled()
    if k is None or x.dtype not in _FLOATS or x.size < 1:
        return False
    for a in (x, g, m, v):
        if a.dtype != x.dtype or a.shape != x.shape or not a.flags.c_contiguous or not a.flags.writeable:
            return False
    f = x.dtype.type
    w1 = f(1 - beta1)
    decay = f(1 - lr * weight_decay) if decoupled and weight_decay != 0 else f(1)
    k.adam_step(x.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1),
                bool(decoupled and weight_decay != 0), decay, bool(maximize),
                bool(not decoupled and weight_decay != 0), f(weight_decay),
                bool(abs(w1) < 0.5), w1, f(1) - w1, f(beta2), f(1 - beta2),
                f(-step_size), f(bc2_sqrt), f(eps))
    return True


# --- image layers --------------------------------------------------------------------------
def max_pool(x: np.ndarray, in_size: tuple[int, int], out_size: tuple[int, int],
             window: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """Max pooling of ``x`` (N, C, H, W) to ``out_size``: the maxima and the flat index
    into its plane of each one's element (int32: Note [Max pooling row by row] in
    numba_kernels.py), or None (also for planes of 2**31 elements or more).
    ``window`` is ``(kh, kw, sh, sw, dh, dw, pad top, pad left)``."""
    k = compiled()
    if k is None or x.ndim != 4 or not _fits(x) or in_size[0] * in_size[1] >= 2**31:
        return None
    shape = (*x.shape[:2], *out_size)
    out = np.empty(shape, dtype=x.dtype)
    index = np.empty(shape, dtype=np.int32)
    k.max_pool(_flat(x), out.reshape(-1), index.reshape(-1), x.shape[0] * x.shape[1], *in_size, *out_size,
               *window)
    return out, index


def max_pool_backward(g: np.ndarray, index: np.ndarray, in_size: tuple[int, int]) -> np.ndarray | None:
    """The input's gradient (N, C, H, W) of max pooling: each output's gradient ``g``
    added at the element of its plane that ``index`` (int32 or int64) names, or None."""
    k = compiled()
    if (k is None or g.ndim != 4 or not _fits(g) or index.dtype not in (np.int32, np.int64)
            or index.shape != g.shape):
        return None
    out = np.empty((*g.shape[:2], *in_size), dtype=g.dtype)  # (the kernel zeroes it, plane by plane)
    k.max_pool_backward(_flat(g), _flat(index), out.reshape(-1), g.shape[2] * g.shape[3], in_size[0] * in_size[1])
    return out


def batch_norm(x: np.ndarray, affine: tuple[np.ndarray, ...],
               eps: float) -> tuple[np.ndarray, tuple[np.ndarray, ...]] | None:
    """Training batch norm of ``x`` (N, C, ...): ``(out, (xc, rstd, mean, var))`` as
    ``normalization._batch_norm`` returns them, or None."""
    k = compiled()
    if k is None or x.ndim < 2 or not _fits(x) or any(a.dtype != x.dtype for a in affine):
        return None
    c = x.shape[1]
    x3 = _c(x).reshape(x.shape[0], c, -1)
    none = np.empty(0, dtype=x.dtype)
    w, b = (_flat(affine[0]), _flat(affine[1])) if affine else (none, none)
    out = np.empty(x.shape, dtype=x.dtype)
    xc = np.empty(x3.shape, dtype=x.dtype)
    mean, var, rstd = (np.empty(c, dtype=x.dtype) for _ in range(3))
    k.batch_norm(x3, w, b, float(eps), out.reshape(x3.shape), xc, mean, var, rstd)
    return out, (xc, rstd, mean, var)


def batch_norm_backward(g: np.ndarray, xc: np.ndarray, rstd: np.ndarray, w: np.ndarray | None,
                        need_dx: bool) -> tuple[np.ndarray | None, np.ndarray, np.ndarray] | None:
    """``(dx or None, sum g * xhat, sum g)`` of training batch norm from the gradient ``g``
    (N, C, ...) and the forward's centred input ``xc`` (N, C, R), or None."""
    k = compiled()
    if (k is None or g.ndim < 2 or not _fits(xc) or g.dtype != xc.dtype or rstd.dtype != xc.dtype
            or (w is not None and w.dtype != xc.dtype) or g.size != xc.size):
        return None
    c = xc.shape[1]
    dx = np.empty(g.shape, dtype=g.dtype) if need_dx else np.empty((0, c, 0), dtype=g.dtype)
    gx, gsum = np.empty(c, dtype=g.dtype), np.empty(c, dtype=g.dtype)
    weight = np.empty(0, dtype=g.dtype) if w is None else _flat(w)
    k.batch_norm_backward(_c(g).reshape(xc.shape), _c(xc), _c(rstd), weight, need_dx,
                          dx.reshape(xc.shape) if need_dx else dx, gx, gsum)
    return (dx if need_dx else None), gx, gsum


def unfold(x: np.ndarray, out: np.ndarray, out_size: tuple[int, int], window: tuple[int, ...]) -> bool:
    """The channels-first windows (C, kh, kw, N, oh, ow) of ``x`` (N, C, H, W) written into
    the C-contiguous ``out`` of x's dtype; False (nothing written) when the compiled
    kernels are not in use or do not apply."""
    k = compiled()
    if k is None or x.ndim != 4 or not _fits(x) or out.dtype != x.dtype or not out.flags.c_contiguous:
        return False
    k.unfold(_flat(x), out.reshape(-1), *x.shape, *out_size, *window)
    return True


def fold(cols: np.ndarray, shape: tuple[int, ...], out_size: tuple[int, int],
         window: tuple[int, ...]) -> np.ndarray | None:
    """The adjoint of :func:`unfold`: the windows ``cols`` (C, kh, kw, N, oh, ow) added back
    into a fresh (N, C, H, W) of ``shape``, or None."""
    k = compiled()
    if k is None or not _fits(cols) or len(shape) != 4:
        return None
    out = np.zeros(shape, dtype=cols.dtype)
    k.fold(_flat(cols), out.reshape(-1), *shape, *out_size, *window)
    return out


# --- convolution on pixel rows (ops/_pixel_rows.py) ----------------------------------------------
def rows_fold(cols: np.ndarray, xp: np.ndarray, out_size: tuple[int, int], window: tuple[int, ...]) -> bool:
    """The window gradients ``cols`` (N * oh * ow, kh * kw * C) added onto the
    C-contiguous padded channels-last ``xp`` (N, Hp, Wp, C) in place, tap by tap (the
    adjoint of the windows' copy in ops/_pixel_rows.py); False (nothing added) when the
    compiled kernels are not in use or do not apply."""
    k = compiled()
    if k is None or xp.ndim != 4 or not _fits(xp) or not xp.flags.c_contiguous or cols.dtype != xp.dtype:
        return False
    n, hp, wp, c = xp.shape
    k.rows_fold(_flat(cols), xp.reshape(-1), n, c, hp, wp, *out_size, *window)
    return True


def channels_last(x: np.ndarray, padded: tuple[int, int], pad: tuple[int, int]) -> np.ndarray | None:
    """``x`` (N, C, H, W) as a fresh (N, Hp, Wp, C) of ``padded`` rows and columns, ``x``
    at rows ``pad[0]`` and columns ``pad[1]`` on and zeros around it (Note [Channels last
    by a compiled copy] in numba_kernels.py); None when the compiled kernels are not in use
    or do not apply."""
    k = compiled()
    if k is None or x.ndim != 4 or not _fits(x):
        return None
    n, c, h, w = x.shape
    hp, wp = padded
    full = (hp, wp) == (h, w)
    out = np.empty((n, hp, wp, c), dtype=x.dtype) if full else np.zeros((n, hp, wp, c), dtype=x.dtype)
    k.channels_last(_flat(x), out.reshape(-1), n, c, h, w, hp, wp, *pad)
    return out


def channels_first(xp: np.ndarray, size: tuple[int, int], pad: tuple[int, int]) -> np.ndarray | None:
    """The inverse of :func:`channels_last`: the ``size`` rows and columns of ``xp`` (N, Hp,
    Wp, C) from ``pad`` on, as a fresh (N, C, H, W); or None."""
    k = compiled()
    if k is None or xp.ndim != 4 or not _fits(xp):
        return None
    n, hp, wp, c = xp.shape
    h, w = size
    out = np.empty((n, c, h, w), dtype=xp.dtype)
    k.channels_first(_flat(xp), out.reshape(-1), n, c, h, w, hp, wp, *pad)
    return out


def rows_unfold(x: np.ndarray, out: np.ndarray, tmp: np.ndarray, part: slice, padded: tuple[int, int],
                out_size: tuple[int, int], window: tuple[int, ...]) -> bool:
    """The windows on pixel rows (images, oh, ow, kh, kw, C) of images ``part`` of ``x``
    (N, C, H, W), C-contiguous and writeable, into the C-contiguous ``out``, through the
    padded channels-last image ``tmp`` (Hp, Wp, C), zeros on the first call (Note [Pixel
    rows straight from the input] in numba_kernels.py); False (nothing written) when the
    compiled kernels are not in use or do not apply."""
    k = compiled()
    if (k is None or x.ndim != 4 or not _fits(x) or not x.flags.c_contiguous or not x.flags.writeable
            or out.dtype != x.dtype or tmp.dtype != x.dtype or not out.flags.c_contiguous):
        return False
    k.rows_unfold(x.reshape(-1), out.reshape(-1), tmp.reshape(-1), part.start, part.stop - part.start,
                  *x.shape[1:], *padded, *out_size, *window)
    return True


def rows_fold_first(cols: np.ndarray, out: np.ndarray, part: slice, padded: tuple[int, int],
                    out_size: tuple[int, int], window: tuple[int, ...]) -> bool:
    """The adjoint of :func:`rows_unfold`: the window gradients ``cols`` (images * oh * ow,
    kh * kw * C) of images ``part`` folded back onto those images of the C-contiguous
    ``out`` (N, C, H, W), which they overwrite; False (nothing written) when the compiled
    kernels are not in use or do not apply."""
    k = compiled()
    if (k is None or out.ndim != 4 or not _fits(out) or not out.flags.c_contiguous or cols.dtype != out.dtype):
        return False
    tmp = np.empty(padded[0] * padded[1] * out.shape[1], dtype=out.dtype)
    k.rows_fold_first(_flat(cols), out.reshape(-1), tmp, part.start, part.stop - part.start,
                      *out.shape[1:], *padded, *out_size, *window)
    return True
