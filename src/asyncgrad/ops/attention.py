"""Scaled dot-product attention as one node: ``softmax(q @ k^T * scale, masked) @ v``.

Note [Fused attention]: written as a composite (matmul, mul, where, softmax, matmul), a
GPT-small's causal attention (16 x 4 heads x 64 x 32, float32) costs five nodes, three
full-size passes over the (L, S) scores beside the two products, and as many again in
the backward: 2.9 ms forward and 2.4 ms backward here, against 0.6 and 1.4 for PyTorch's
fused CPU kernel (``ScaledDotProductFlashAttentionForCpuBackward0``), the node a port of
nanoGPT records. So the node is one, as PyTorch's, and between its products there is one
compiled pass each way:

* forward: ``s = q @ k^T`` (BLAS), then ``attention_softmax`` (``_causal``,
  ``_masked``) in place: scale, mask, max, exp, sum and normalise per row, the scale
  applied within the max and exp passes; causal rows run at full width with a select
  (Note [Causal rows at full width] in ``numba_kernels.py``). ``out = p @ v``. The
  weights ``p`` are kept (aux), as the composite kept its softmax's output;
* backward: ``dv = p^T @ g``, ``dp = g @ v^T``, then ``attention_softmax_backward`` (as
  above) in place (``ds = p * (dp - rowsum(dp * p)) * scale``, 0 where masked),
  ``dq = ds @ k``, ``dk = ds^T @ q``; each gradient laid out as its input (Note
  [Gradients in their input's layout] in linalg.py), so the heads' transposes back are
  views. From 64 query rows a causal attention's products skip the masked quarter
  (Note [Causal halves]).

The per-input rules below are the definition: in a plain backward they compute the
weights' gradient once per rule; under create_graph they recompute the weights from
``q`` and ``k`` with differentiable ops, so grad-of-grad works. The joint rule computes
the needed gradients in one call (Note [Joint rules] in ``_spec.py``). Without the
compiled kernels the two passes are numpy's (same results to rounding).

Only what PyTorch's flash kernel covers is fused: float32/float64 q, k, v of one batch
shape, no dropout, no float (additive) mask; ``nn.functional`` keeps the composite for
the rest.
"""

from __future__ import annotations

import functools

import numpy as np

from .kernels import compiled
from .linalg import _matmul, _product_like, _row_major
from ._spec import defop

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def fusable(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """Whether :data:`attention` applies: float32/float64 arrays of one dtype, at least
    2-D, of one batch shape, with no empty dimension."""
    return (q.dtype in FLOATS and k.dtype == q.dtype and v.dtype == q.dtype and q.ndim >= 2
            and k.ndim == q.ndim and v.ndim == q.ndim and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and q.size > 0 and k.size > 0 and v.size > 0)


def _mask_rows(allowed: np.ndarray, scores_shape: tuple[int, ...]) -> np.ndarray:
    """A bool mask as the kernels read it: ``(L, S)`` when it is the same for every
    leading index, else one row per score row."""
    length, source = scores_shape[-2:]
    if all(d == 1 for d in allowed.shape[:-2]):
        rows = np.broadcast_to(allowed.reshape(allowed.shape[-2:]) if allowed.ndim > 2 else allowed,
                               (length, source))
    else:
        rows = np.broadcast_to(allowed, scores_shape).reshape(-1, source)
    # a copy (writeable, C-contiguous: the type the kernels are compiled for)
    return np.array(rows, dtype=bool, order="C")


@functools.lru_cache(maxsize=16)
def _causal_mask(length: int, source: int) -> np.ndarray:
    """The (L, S) causal mask as the causal kernels read it (True: may attend; shared,
    never written)."""
    return np.tri(length, source, 0, dtype=bool)


def _blocked(length: int, source: int, causal: bool, allowed: np.ndarray | None) -> np.ndarray | None:
    """Where the scores are masked out (broadcastable to the scores), or None."""
    if causal:
        return ~np.tri(length, source, 0, dtype=bool)
    return None if allowed is None else ~allowed


def _weights_(s: np.ndarray, scale: float, causal: bool, allowed: np.ndarray | None) -> None:
    """``s``, the scores ``q @ k^T``, becomes the attention weights, in place."""
    length, source = s.shape[-2:]
    k = compiled()
    if k is not None:
        rows, scale_ = s.reshape(-1, source), s.dtype.type(scale)
        if causal:
            k.attention_softmax_causal(rows, scale_, _causal_mask(length, source))
        elif allowed is None:
            k.attention_softmax(rows, scale_)
        else:
            k.attention_softmax_masked(rows, scale_, _mask_rows(allowed, s.shape))
        return
    s *= s.dtype.type(scale)
    blocked = _blocked(length, source, causal, allowed)
    if blocked is not None:
        np.copyto(s, -np.inf, where=blocked)
    with np.errstate(invalid="ignore"):
        top = np.max(s, axis=-1, keepdims=True)
        top[np.isneginf(top)] = 0  # a row with nothing to attend to: exp(-inf) = 0 below
        np.subtract(s, top, out=s)
        np.exp(s, out=s)
        total = np.sum(s, axis=-1, keepdims=True)
        total[total == 0] = 1
        s /= total
    if blocked is not None:  # 0 at masked keys even in a row of NaN, as the kernel (and PyTorch)
        np.copyto(s, 0, where=blocked)


def _scores_grad(g: np.ndarray, v: np.ndarray, p: np.ndarray, scale: float, causal: bool,
                 allowed: np.ndarray | None) -> np.ndarray:
    """The gradient of the scores ``q @ k^T`` (plain backward): ``dp = g @ v^T`` (a
    fresh array), made the scores' gradient in place."""
    return _scores_grad_(_matmul(g, np.swapaxes(v, -1, -2)), p, scale, causal, allowed)


def _scores_grad_(dp: np.ndarray, p: np.ndarray, scale: float, causal: bool,
                  allowed: np.ndarray | None) -> np.ndarray:
    """``dp``, the weights' gradient (a fresh array), made the scores' gradient in place."""
    length, source = dp.shape[-2:]
    k = compiled()
    if k is not None and p.flags.c_contiguous and p.dtype == dp.dtype:
        rows, weights, scale_ = dp.reshape(-1, source), p.reshape(-1, source), dp.dtype.type(scale)
        if causal:
            k.attention_softmax_backward_causal(rows, weights, scale_, _causal_mask(length, source))
        elif allowed is None:
            k.attention_softmax_backward(rows, weights, scale_)
        else:
            k.attention_softmax_backward_masked(rows, weights, scale_, _mask_rows(allowed, dp.shape))
        return dp
    dot = np.sum(dp * p, axis=-1, keepdims=True)
    np.subtract(dp, dot, out=dp)
    dp *= p
    dp *= dp.dtype.type(scale)
    blocked = _blocked(length, source, causal, allowed)
    if blocked is not None:
        np.copyto(dp, 0, where=blocked)
    return dp


CAUSAL_HALVES_MIN = 64  # query rows from which a causal attention skips its masked quarter


def _causal_halves(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The causal forward with its products in two halves of query rows.

    Note [Causal halves]: query ``i`` attends keys ``j <= i``, so the first half of the
    rows needs only the first half of the keys: ``q[:h] @ k[:h]^T`` and ``p[:h, :h] @
    v[:h]`` skip the (h, S - h) quarter of both products, which is all masked. At the op
    table's large size (32, 8, 128, 32) the forward took 13.3 -> 12.8 and 16.5 -> 15.7
    ms so, the joint backward 21.1 -> 19.1 and 26.1 -> 24.0 (two runs, medians of 30,
    interleaved in one process; the machine's load moves the levels); at GPT-small's
    (16, 4, 64, 32) forward 1.07 -> 1.05, 0.96 -> 0.91, 1.13 -> 1.10 and joint 1.42 ->
    1.38, 1.25 -> 1.21, 1.47 -> 1.45 (three runs, medians of 300): the products' saving
    is still a little more than the extra GEMM calls, so the halves start at
    ``CAUSAL_HALVES_MIN`` = 64 rows (four blocks were no faster at 128). The skipped
    quarter of the scores is never written by a product: the causal kernel reads it only
    under its select (Note [Causal rows at full width] in ``numba_kernels.py``) and
    writes its zeros; numpy's pass gets it zeroed. The joint backward does the same
    (``_joint_halves``): ``dp = g @ v^T``, ``dq = ds @ k``, and the keys' halves of ``dk =
    ds^T @ q`` and ``dv = p^T @ g``, each gradient in its input's layout."""
    length, source = q.shape[-2], k.shape[-2]
    h = length // 2
    kh = min(h, source)
    kt = _row_major(np.swapaxes(k, -1, -2))
    s = np.empty((*q.shape[:-1], source), dtype=q.dtype)
    np.matmul(q[..., :h, :], kt[..., :kh], out=s[..., :h, :kh])
    np.matmul(q[..., h:, :], kt, out=s[..., h:, :])
    s[..., :h, kh:] = 0  # (read by numpy's pass, should the kernels be off by then)
    _weights_(s, scale, True, None)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    np.matmul(s[..., :h, :kh], v[..., :kh, :], out=out[..., :h, :])
    np.matmul(s[..., h:, :], v, out=out[..., h:, :])
    return out, s


def _attention(q, k, v, *, scale, causal, allowed):  # type: ignore[no-untyped-def]
    """The output and, as aux, the attention weights (Note [Fused attention])."""
    if causal and q.shape[-2] >= CAUSAL_HALVES_MIN:
        return _causal_halves(q, k, v, scale)
    s = _matmul(q, np.swapaxes(k, -1, -2))  # a fresh array: the weights are made in it
    _weights_(s, scale, causal, allowed)
    return _matmul(s, v), s


# --- the rules: ``m`` is the math namespace (Note in _spec.py) ---------------------------------
def _weights(m, q, k, scale, causal, allowed, aux):  # type: ignore[no-untyped-def]
    """The attention weights: the forward's in a plain backward; recomputed from ``q`` and
    ``k`` by differentiable ops under create_graph (softmax with a constant shift, which
    changes neither its value nor its derivative)."""
    if not m.tensor_mode:
        return aux
    s = m.matmul(q, m.transpose(k, -2, -1)) * scale
    blocked = _blocked(s.shape[-2], s.shape[-1], causal, allowed)
    if blocked is not None:
        s = m.where(blocked, -np.inf, s)
    top = np.max(s.data, axis=-1, keepdims=True)
    top[np.isneginf(top)] = 0
    e = m.exp(s - m.constant(top))
    total = m.sum(e, -1, True)
    empty = total.data == 0  # no key to attend to: zero weights, as the forward
    return e / (m.where(empty, 1.0, total) if empty.any() else total)


def _ds(m, g, q, k, v, scale, causal, allowed, aux):  # type: ignore[no-untyped-def]
    p = _weights(m, q, k, scale, causal, allowed, aux)
    if not m.tensor_mode:
        return _scores_grad(g, v, p, scale, causal, allowed)
    dp = m.matmul(g, m.transpose(v, -2, -1))
    return p * (dp - m.sum(dp * p, -1, True)) * scale


def _rule_q(m, g, ans, q, k, v, *, scale, causal, allowed, aux):  # type: ignore[no-untyped-def]
    ds = _ds(m, g, q, k, v, scale, causal, allowed, aux)
    return m.matmul(ds, k) if m.tensor_mode else _product_like(ds, k, q)


def _rule_k(m, g, ans, q, k, v, *, scale, causal, allowed, aux):  # type: ignore[no-untyped-def]
    ds = _ds(m, g, q, k, v, scale, causal, allowed, aux)
    if m.tensor_mode:
        return m.matmul(m.transpose(ds, -2, -1), q)
    return _product_like(np.swapaxes(ds, -1, -2), q, k)


def _rule_v(m, g, ans, q, k, v, *, scale, causal, allowed, aux):  # type: ignore[no-untyped-def]
    p = _weights(m, q, k, scale, causal, allowed, aux)
    if m.tensor_mode:
        return m.matmul(m.transpose(p, -2, -1), g)
    return _product_like(np.swapaxes(p, -1, -2), g, v)


def _into(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``out[...] = a @ b`` for ``out`` a block of an array made by ``np.empty_like`` of an
    input (``_product_like``'s layouts): GEMM writes it row-major, or its transpose."""
    if out.strides[-1] == out.itemsize:
        np.matmul(a, _row_major(b), out=out)
    elif out.strides[-2] == out.itemsize:
        np.matmul(b.swapaxes(-1, -2), _row_major(a.swapaxes(-1, -2)), out=out.swapaxes(-1, -2))
    else:
        out[...] = np.matmul(a, b)


def _joint_halves(g, q, k, v, p, scale, mask):  # type: ignore[no-untyped-def]
    """``_joint`` of a causal forward made in halves (Note [Causal halves]): each product
    skips the masked quarter, ``dp``'s and the gradients' blocks as the forward's."""
    length, source = q.shape[-2], k.shape[-2]
    h = length // 2
    kh = min(h, source)
    dq = dk = dv = None
    if mask[0] or mask[1]:
        vt = _row_major(np.swapaxes(v, -1, -2))
        dp = np.empty(p.shape, dtype=p.dtype)
        np.matmul(g[..., :h, :], vt[..., :kh], out=dp[..., :h, :kh])
        np.matmul(g[..., h:, :], vt, out=dp[..., h:, :])
        dp[..., :h, kh:] = 0  # (numpy's pass, should it run, sums dp * p over every key)
        ds = _scores_grad_(dp, p, scale, True, None)
        if mask[0]:
            dq = np.empty_like(q)
            _into(dq[..., :h, :], ds[..., :h, :kh], k[..., :kh, :])
            _into(dq[..., h:, :], ds[..., h:, :], k)
        if mask[1]:
            dk = np.empty_like(k)
            dst = np.swapaxes(ds, -1, -2)
            _into(dk[..., :kh, :], dst[..., :kh, :], q)
            _into(dk[..., kh:, :], dst[..., kh:, h:], q[..., h:, :])
    if mask[2]:
        dv = np.empty_like(v)
        pt = np.swapaxes(p, -1, -2)
        _into(dv[..., :kh, :], pt[..., :kh, :], g)
        _into(dv[..., kh:, :], pt[..., kh:, h:], g[..., h:, :])
    return dq, dk, dv


def _joint(g, ans, q, k, v, *, mask, scale, causal, allowed, aux):  # type: ignore[no-untyped-def]
    """The needed gradients of q, k and v, the scores' gradient computed once (a plain
    backward; ``mask`` says which are needed)."""
    if causal and q.shape[-2] >= CAUSAL_HALVES_MIN:
        return _joint_halves(g, q, k, v, aux, scale, mask)
    dq = dk = dv = None
    if mask[0] or mask[1]:
        ds = _scores_grad(g, v, aux, scale, causal, allowed)
        dq = _product_like(ds, k, q) if mask[0] else None
        dk = _product_like(np.swapaxes(ds, -1, -2), q, k) if mask[1] else None
    if mask[2]:
        dv = _product_like(np.swapaxes(aux, -1, -2), g, v)
    return dq, dk, dv


# name -------------- node name (PyTorch's CPU kernel) --------- forward --- derivative ------
attention = defop("ScaledDotProductFlashAttentionForCpuBackward0", _attention, _rule_q, _rule_k, _rule_v,
                  save="x y z", has_aux=True, joint=_joint, blas=True)
