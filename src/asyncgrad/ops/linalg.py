"""Matrix products: ``matmul`` in all of numpy's rank cases, and the fused ``linear``.

The fused linear layer computes ``x @ W.T + b`` as one node (three gradients from one
saved input and weight), which is what keeps an MLP's backward within a few percent of a
hand-written numpy backward.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .kernels import intra_op
from ._spec import defop


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
SMALL_STACK_OPERAND = 1 << 20  # elements: a column-major right operand up to this size is copied first


def _row_major(b: np.ndarray) -> np.ndarray:
    """``b`` as a right operand of a stacked product: each matrix row-major.

    Note [Stacked products]: numpy's ``matmul`` of stacks calls one GEMM per matrix, and
    OpenBLAS's GEMM with a transposed right operand (``g @ v^T``, ``q @ k^T``: each
    matrix column-major) and a short inner dimension (a head's 32 features) is slow at a
    transformer's sizes: q @ k^T for a GPT-small's (16, 4, 64, 32) heads took 0.44 ms, 0.32
    with the operand copied row-major first (torch 0.29); the attention's ``g @ v^T``
    0.41 -> 0.31 (one thread, 40 calls each). A transposed left operand (``a^T @ g``) runs
    at torch's speed and is left alone; so are 2-D products (one GEMM, no gain measured
    for a linear layer's ``x @ W^T``)."""
    if b.strides[-2] == b.itemsize and b.strides[-1] != b.itemsize and b.size <= SMALL_STACK_OPERAND:
        return np.ascontiguousarray(b)
    return b


def _mm_pool(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``_mm`` while one pool is on: a 2-D float product split over TBB's pool when Note
    [One pool] in ``intra_op.py`` allows it (``intra_op.product``), else numpy's ``matmul``."""
    product = intra_op.product
    if product is not None:
        res = product(a, b, out)
        if res is not None:
            return res  # type: ignore[no-any-return]
    return np.matmul(a, b, out=out)  # type: ignore[no-any-return]


# the linear layers' and flat products (``_mm(a, b[, out])``): numpy's ``matmul``, or
# ``_mm_pool`` while one pool is on (``intra_op.set_one_pool`` swaps it through
# ``_use_pool``), so the default path costs what it did before
_mm: Callable[..., np.ndarray] = _mm_pool if intra_op.one_pool else np.matmul


def _use_pool(on: bool) -> None:
    global _mm
    _mm = _mm_pool if on else np.matmul


intra_op.on_one_pool = _use_pool


def _stacked(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a @ b`` is a product of stacks of one shape and float type, no broadcasting."""
    return (a.ndim >= 3 and a.ndim == b.ndim and a.shape[:-2] == b.shape[:-2] and a.dtype in _FLOATS
            and b.dtype == a.dtype)


def _flat_product(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``a @ b`` for a C-contiguous stack ``a`` (..., n, k) and a matrix ``b`` (k, m) of
    one float type, as one GEMM over all of ``a``'s rows; else None.

    Note [A stack times a matrix]: numpy's ``matmul`` of a (B, T, k) stack by a (k, m)
    matrix calls one GEMM per leading index. A GPT's logits (``ln_f(x) @ wte.T``, 16 x 64
    rows by 128 x 65) took 0.43 ms so, 0.17 as one GEMM over the 1024 rows (2 BLAS
    threads); their backward, ``g @ W`` 0.20 -> 0.11 ms and the weight's ``x^T g``, a
    stack of products summed afterwards, 0.23 -> 0.15 as one GEMM. (As ``_linear``.)"""
    if (a.ndim >= 3 and b.ndim == 2 and a.dtype in _FLOATS and b.dtype == a.dtype and a.flags.c_contiguous
            and a.shape[-1] == b.shape[0] and a.size and b.size):  # (reshape(-1, 0) cannot infer -1)
        return _mm(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
    return None


def _matmul(a, b):  # type: ignore[no-untyped-def]
    """``np.matmul``, stacks with their right operand row-major (Note [Stacked products]),
    a stack times a matrix as one GEMM (Note [A stack times a matrix])."""
    if type(a) is np.ndarray and type(b) is np.ndarray:
        if _stacked(a, b):
            return np.matmul(a, _row_major(b))
        out = _flat_product(a, b)
        if out is not None:
            return out
    return np.matmul(a, b)


def _product_like(a: np.ndarray, b: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``a @ b`` (stacks, ``_stacked``) into a fresh array laid out in memory as ``like``,
    the input it is the gradient of.

    Note [Gradients in their input's layout]: attention's q, k and v are transposed views
    of one (B, T, 3C) array; a gradient made C-contiguous in (B, H, T, hs) order is
    copied back by the reshape's backward (``transpose(1, 2).reshape(B, T, C)``), three
    copies per layer. Written in the input's own memory order (``np.empty_like`` keeps
    it), those backward reshapes are views. numpy's GEMM writes only row-major matrices
    (else it falls back to a loop without BLAS), so a column-major target gets the
    transposed product, ``b^T @ a^T``, into its transpose: the same arithmetic."""
    if like.flags.c_contiguous or 0 in like.strides:
        return np.matmul(a, _row_major(b))
    out = np.empty_like(like, dtype=a.dtype)
    if out.strides[-1] == out.itemsize:
        np.matmul(a, _row_major(b), out=out)
    elif out.strides[-2] == out.itemsize:
        np.matmul(b.swapaxes(-1, -2), _row_major(a.swapaxes(-1, -2)), out=out.swapaxes(-1, -2))
    else:  # (no BLAS layout: a plain product)
        return np.matmul(a, _row_major(b))
    return out


def _matmul_rule_x(m, g, ans, x, y):  # type: ignore[no-untyped-def]
    if len(x.shape) == 1 and len(y.shape) == 1:  # dot: g is a scalar
        return g * y
    if len(x.shape) == 1:  # (k,) @ (..., k, n) -> (..., n)
        return m.sum_to(m.matmul(y, m.unsqueeze(g, -1))[..., 0], x.shape)
    if len(y.shape) == 1:  # (..., n, k) @ (k,) -> (..., n)
        return m.unsqueeze(g, -1) * y
    if not m.tensor_mode and _stacked(g, y) and g.shape[:-1] == x.shape[:-1]:
        return _product_like(g, y.swapaxes(-1, -2), x)
    if not m.tensor_mode and len(y.shape) == 2 and len(x.shape) >= 3 and g.shape[:-1] == x.shape[:-1]:
        d = _flat_product(g, y.T)  # Note [A stack times a matrix]
        if d is not None:
            return d
    return m.matmul(g, m.transpose(y, -1, -2))


def _matmul_rule_y(m, g, ans, x, y):  # type: ignore[no-untyped-def]
    if len(x.shape) == 1 and len(y.shape) == 1:
        return g * x
    if len(x.shape) == 1:  # (k,) @ (..., k, n): dY = outer(x, g)
        return m.unsqueeze(x, -1) * m.unsqueeze(g, -2)
    if len(y.shape) == 1:  # (..., n, k) @ (k,): dy = sum over n of g * x
        return m.sum_to(m.matmul(m.unsqueeze(g, -2), x)[..., 0, :], y.shape)
    if not m.tensor_mode and _stacked(x, g) and g.shape[:-2] + g.shape[-1:] == y.shape[:-2] + y.shape[-1:]:
        return _product_like(x.swapaxes(-1, -2), g, y)
    if (not m.tensor_mode and len(y.shape) == 2 and len(x.shape) >= 3 and x.shape[:-1] == g.shape[:-1]
            and x.dtype in _FLOATS and g.dtype == x.dtype and x.flags.c_contiguous and g.flags.c_contiguous
            and x.size and g.size):
        # the stack of products x^T g summed over the leading dims, as one GEMM over all
        # rows (Note [A stack times a matrix])
        return _mm(x.reshape(-1, x.shape[-1]).T, g.reshape(-1, g.shape[-1]))
    return m.matmul(m.transpose(x, -1, -2), g)


def _flat(m, t):  # type: ignore[no-untyped-def]
    """View a (..., n) array as (-1, n)."""
    return t if len(t.shape) == 2 else m.reshape(t, (-1, t.shape[-1]))


def _linear_rule_x(m, g, ans, x, w, b=None):  # type: ignore[no-untyped-def]
    """``g @ w`` as one GEMM over all rows, as the forward: numpy's ``matmul`` of a
    (B, T, n) gradient by a 2-D weight loops over B GEMMs of T rows, 10-15% slower at a
    small GPT's sizes (B16 T64, 128-512 features, one thread)."""
    if len(g.shape) <= 2:
        return m.matmul(g, w)
    shape = (*g.shape[:-1], w.shape[-1])
    if m.tensor_mode:
        return m.reshape(m.matmul(_flat(m, g), w), shape)
    out = np.empty(shape, dtype=np.result_type(g.dtype, w.dtype))  # a base array, not a view:
    _mm(_flat(m, g), w, out.reshape(-1, shape[-1]))  # it can become .grad as it is
    return out


def _linear(x, w, b=None):  # type: ignore[no-untyped-def]
    if x.ndim > 2:  # one GEMM over all rows, not numpy's loop of one per leading index
        out = _mm(x.reshape(-1, x.shape[-1]), w.T).reshape(*x.shape[:-1], w.shape[0])
    elif x.ndim == 2 and w.ndim == 2:
        out = _mm(x, w.T)
    else:
        out = x @ w.T
    if b is not None:
        out += b
    return out


def _linear_rule_w(m, g, ans, x, w, b=None):  # type: ignore[no-untyped-def]
    """``g^T @ x`` over all rows. For 2-D arrays written with ``.T`` (the same view
    and GEMM as ``m.transpose``): ``np.swapaxes`` and ``_flat`` are Python-level calls,
    a third of this rule's ~16 us on a small layer (batch 32, width 128)."""
    if not m.tensor_mode and len(g.shape) == 2 and len(x.shape) == 2:
        return _mm(g.T, x)
    if not m.tensor_mode:
        return _mm(_flat(m, g).T, _flat(m, x))
    return m.matmul(m.transpose(_flat(m, g), 0, 1), _flat(m, x))


def _linear_rule_b(m, g, ans, x, w, b):  # type: ignore[no-untyped-def]
    """The bias's gradient: ``g`` summed over its rows (Note [A bias sums its own rows])."""
    if type(g) is np.ndarray and len(g.shape) == 2:
        return np.add.reduce(g, axis=0)
    return g


# Note [A bias sums its own rows]: a linear layer's bias gradient is ``g`` summed over
# every axis but the last. The rule used to return ``g`` whole and leave the sum to the
# engine's check of each gradient against its input's shape (``fix_gradient`` in
# graph/validate.py: its one-leading-axis case, ``np.add.reduce(g, axis=0)``), a
# Python-level call per layer of every backward whose only work is that sum. So a 2-D
# numpy ``g`` (one batch axis) is summed here, by that same reduction (the same bits),
# and the check finds the shape right; any other ``g`` (a stack of rows, another
# backend's array, a create_graph Tensor, whose sum must be differentiable) is returned
# whole as before, for the engine to sum down.
# name ------------ node name ------------ forward ------- derivative -------------------
matmul = defop("MmBackward0", _matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)  # ranks decide
dot = defop("DotBackward0", np.matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)
mv = defop("MvBackward0", np.matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)
bmm = defop("BmmBackward0", _matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)
linear = defop("AddmmBackward0", _linear, _linear_rule_x, _linear_rule_w, _linear_rule_b,
               save="x@1 y@0", blas=True)
linear_nobias = defop("MmBackward0", _linear, _linear_rule_x, _linear_rule_w,
                      save="x@1 y@0", blas=True)
