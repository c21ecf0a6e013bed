"""Matrix products: ``matmul`` in all of numpy's rank cases, and the fused ``linear``.

The fused linear layer computes ``x @ W.T + b`` as one node (three gradients from one
saved input and weight), which is what keeps an MLP's backward within a few percent of a
hand-written numpy backward.
"""

from __future__ import annotations

import numpy as np

from ._spec import defop


def _matmul_rule_x(m, g, ans, x, y):  # type: ignore[no-untyped-def]
    if len(x.shape) == 1 and len(y.shape) == 1:  # dot: g is a scalar
        return g * y
    if len(x.shape) == 1:  # (k,) @ (..., k, n) -> (..., n)
        return m.sum_to(m.matmul(y, m.unsqueeze(g, -1))[..., 0], x.shape)
    if len(y.shape) == 1:  # (..., n, k) @ (k,) -> (..., n)
        return m.unsqueeze(g, -1) * y
    return m.matmul(g, m.transpose(y, -1, -2))


def _matmul_rule_y(m, g, ans, x, y):  # type: ignore[no-untyped-def]
    if len(x.shape) == 1 and len(y.shape) == 1:
        return g * x
    if len(x.shape) == 1:  # (k,) @ (..., k, n): dY = outer(x, g)
        return m.unsqueeze(x, -1) * m.unsqueeze(g, -2)
    if len(y.shape) == 1:  # (..., n, k) @ (k,): dy = sum over n of g * x
        return m.sum_to(m.matmul(m.unsqueeze(g, -2), x)[..., 0, :], y.shape)
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
    np.matmul(_flat(m, g), w, out=out.reshape(-1, shape[-1]))  # it can become .grad as it is
    return out


def _linear(x, w, b=None):  # type: ignore[no-untyped-def]
    if x.ndim > 2:  # one GEMM over all rows, not numpy's loop of one per leading index
        out = (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])
    else:
        out = x @ w.T
    if b is not None:
        out += b
    return out


# name ------------ node name ------------ forward ------- derivative -------------------
matmul = defop("MmBackward0", np.matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)  # ranks decide
dot = defop("DotBackward0", np.matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)
mv = defop("MvBackward0", np.matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)
bmm = defop("BmmBackward0", np.matmul, _matmul_rule_x, _matmul_rule_y, save="x y", blas=True)
linear = defop("AddmmBackward0", _linear,
               _linear_rule_x,
               lambda m, g, ans, x, w, b: m.matmul(m.transpose(_flat(m, g), 0, 1), _flat(m, x)),
               lambda m, g, ans, x, w, b: g,  # summed over the batch by the engine
               save="x@1 y@0", blas=True)
linear_nobias = defop("MmBackward0", _linear,
                      _linear_rule_x,
                      lambda m, g, ans, x, w: m.matmul(m.transpose(_flat(m, g), 0, 1), _flat(m, x)),
                      save="x@1 y@0", blas=True)
