"""scaled_dot_product_attention as one node (Note [Fused attention] in ops/attention.py):
which calls it serves, values and gradients equal to the attention written out as
separate ops (float64 and float32, numpy and compiled kernels), causal and bool masks,
rows with nothing to attend to, only some inputs requiring grad, gradcheck and
gradgradcheck, and PyTorch's results where it is installed."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as NF
from asyncgrad.autograd import gradgradcheck
from asyncgrad.autograd import gradcheck

FUSED = "ScaledDotProductFlashAttentionForCpuBackward0"


def _qkv(shape_q: tuple[int, ...], source: int, dtype: type = np.float64, seed: int = 0,
         value_dim: int | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    *lead, length, dim = shape_q
    return [rng.standard_normal(shape_q).astype(dtype),
            rng.standard_normal((*lead, source, dim)).astype(dtype),
            rng.standard_normal((*lead, source, value_dim or dim)).astype(dtype)]


def _written_out(q: ag.Tensor, k: ag.Tensor, v: ag.Tensor, allowed: np.ndarray | None,
                 scale: float) -> ag.Tensor:
    """The attention as separate ops, with zeros for rows that may attend to nothing."""
    s = ag.matmul(q, k.transpose(-2, -1)) * scale
    if allowed is not None:
        s = ag.where(allowed, s, -math.inf)
        empty = ~np.broadcast_to(allowed, s.shape).any(axis=-1, keepdims=True)
        if empty.any():
            s = ag.where(empty, 0.0, s)
            return ag.matmul(ag.where(empty, 0.0, NF.softmax(s, -1)), v)
    return ag.matmul(NF.softmax(s, -1), v)


def _run(fn: Callable[..., ag.Tensor], arrays: list[np.ndarray], needs: tuple[bool, ...] = (True, True, True),
         seed: int = 5) -> tuple[np.ndarray, list[np.ndarray | None], str]:
    ts = [ag.from_numpy(a.copy()).requires_grad_(n) for a, n in zip(arrays, needs)]
    y = fn(*ts)
    g = np.random.default_rng(seed).standard_normal(y.shape).astype(y.dtype)
    ag.backward_sync(y, ag.from_numpy(g))
    return y.numpy(), [None if t.grad is None else t.grad.numpy() for t in ts], y.grad_fn.name()


CASES = {  # name: (q shape, source length, is_causal, bool mask or None)
    "plain": ((2, 3, 5, 4), 5, False, None),
    "causal": ((2, 3, 6, 4), 6, True, None),
    "causal_longer_keys": ((2, 2, 4, 3), 7, True, None),
    "causal_fewer_keys": ((2, 2, 7, 3), 4, True, None),
    "three_dims": ((3, 5, 4), 6, False, None),
    "two_dims_causal": ((5, 4), 5, True, None),
    "mask_2d": ((2, 3, 4, 4), 5, False, np.array([[1, 0, 1, 1, 0], [0, 1, 0, 0, 1], [1, 1, 1, 0, 0],
                                                   [0, 0, 0, 0, 1]], dtype=bool)),
    "mask_per_batch": ((2, 3, 4, 4), 5, False, np.random.default_rng(9).random((2, 1, 4, 5)) < 0.6),
    "mask_with_empty_row": ((2, 3, 3, 4), 4, False, np.array([[True, False, True, True], [False] * 4,
                                                              [True, True, False, False]])),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_one_node_equal_to_the_attention_written_out(on_path, name: str, path: str) -> None:
    shape, source, causal, mask = CASES[name]
    arrays = _qkv(shape, source, value_dim=3)
    length = shape[-2]
    allowed = np.tri(length, source, 0, dtype=bool) if causal else mask
    scale = 0.7
    on_path(path)
    out, grads, node = _run(lambda q, k, v: NF.scaled_dot_product_attention(
        q, k, v, attn_mask=None if causal else mask, is_causal=causal, scale=scale), arrays)
    ref, ref_grads, _ = _run(lambda q, k, v: _written_out(q, k, v, allowed, scale), arrays)
    assert node == FUSED
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)
    for gr, rg in zip(grads, ref_grads):
        np.testing.assert_allclose(gr, rg, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_float32_close_to_float64(on_path, path: str) -> None:
    on_path(path)
    arrays = _qkv((4, 2, 16, 8), 16, np.float64, seed=2)
    f = lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    out64, grads64, _ = _run(f, arrays)
    out32, grads32, node = _run(f, [a.astype(np.float32) for a in arrays])
    assert node == FUSED and out32.dtype == np.float32 and all(g.dtype == np.float32 for g in grads32)
    np.testing.assert_allclose(out32, out64, rtol=1e-5, atol=1e-5)
    for g32, g64 in zip(grads32, grads64):
        np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False), (False, False, True),
                                   (False, True, True), (True, True, False)])
def test_only_the_inputs_that_require_grad_get_one(needs: tuple[bool, ...]) -> None:
    arrays = _qkv((2, 2, 5, 3), 5)
    f = lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    _, all_grads, _ = _run(f, arrays)
    _, grads, node = _run(f, arrays, needs)
    assert node == FUSED
    for need, g, full in zip(needs, grads, all_grads):
        if need:
            np.testing.assert_allclose(g, full, rtol=1e-13, atol=1e-14)
        else:
            assert g is None


def test_heads_as_transposed_views_of_one_projection() -> None:
    """As in a GPT: q, k and v are transposed views of one (B, T, 3C) array; the
    gradient reaches that array equal to the written-out attention's."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal((2, 6, 3 * 8))

    def heads(x: ag.Tensor, fused: bool) -> ag.Tensor:
        q, k, v = (t.reshape((2, 6, 2, 4)).transpose(1, 2) for t in x.split(8, dim=2))
        if fused:
            y = NF.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = _written_out(q, k, v, np.tri(6, 6, 0, dtype=bool), 0.5)
        return y.transpose(1, 2).reshape((2, 6, 8))

    got = _run(lambda x: heads(x, True), [base], (True,))
    ref = _run(lambda x: heads(x, False), [base], (True,))
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got[1][0], ref[1][0], rtol=1e-11, atol=1e-12)


def test_a_row_with_nothing_to_attend_to_gives_zeros_and_zero_gradients() -> None:
    q, k, v = _qkv((1, 3, 4), 4)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    out, grads, node = _run(lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, attn_mask=mask), [q, k, v])
    assert node == FUSED
    assert np.all(out[0, 1] == 0) and np.all(grads[0][0, 1] == 0)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(g)) for g in grads)


def test_the_mask_is_read_at_the_forward() -> None:
    """Changing the caller's mask after the forward does not change the backward."""
    arrays = _qkv((2, 4, 3), 4)
    mask = np.tri(4, 4, 0, dtype=bool)
    ts = [ag.from_numpy(a).requires_grad_() for a in arrays]
    y = NF.scaled_dot_product_attention(*ts, attn_mask=mask)
    mask[:] = True
    ag.backward_sync(y.sum())
    ref = [ag.from_numpy(a).requires_grad_() for a in arrays]
    ag.backward_sync(NF.scaled_dot_product_attention(*ref, is_causal=True).sum())
    for t, r in zip(ts, ref):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("kwargs", [{"dropout_p": 0.3}, {"attn_mask": "float"}])
def test_what_the_fused_node_does_not_cover_keeps_the_composite(kwargs: dict) -> None:
    arrays = _qkv((2, 4, 3), 4)
    if kwargs.get("attn_mask") == "float":
        kwargs = {"attn_mask": ag.from_numpy(np.random.default_rng(1).standard_normal((4, 4)))}
    ts = [ag.from_numpy(a).requires_grad_() for a in arrays]
    assert NF.scaled_dot_product_attention(*ts, **kwargs).grad_fn.name() != FUSED


def test_mismatched_batch_shapes_keep_the_composite_and_broadcast() -> None:
    q = ag.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 4, 5))).requires_grad_()
    k = ag.from_numpy(np.random.default_rng(1).standard_normal((1, 3, 6, 5))).requires_grad_()
    v = ag.from_numpy(np.random.default_rng(2).standard_normal((1, 3, 6, 2))).requires_grad_()
    y = NF.scaled_dot_product_attention(q, k, v)
    assert y.shape == (2, 3, 4, 2) and y.grad_fn.name() != FUSED


@pytest.mark.parametrize("path", ["numpy", "compiled"])
@pytest.mark.parametrize("kind", ["causal", "mask", "plain"])
def test_gradcheck_and_gradgradcheck(on_path, path: str, kind: str) -> None:
    on_path(path)
    arrays = _qkv((2, 3, 4), 5, seed=11)
    mask = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=bool)

    def f(q: ag.Tensor, k: ag.Tensor, v: ag.Tensor) -> ag.Tensor:
        if kind == "causal":
            return NF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return NF.scaled_dot_product_attention(q, k, v, attn_mask=mask if kind == "mask" else None, scale=0.8)

    ts = [ag.from_numpy(a).requires_grad_() for a in arrays]
    assert f(*ts).grad_fn.name() == FUSED
    assert gradcheck(f, ts)
    assert gradgradcheck(f, ts)


@pytest.mark.parametrize("name", ["plain", "causal", "causal_longer_keys", "mask_2d", "mask_with_empty_row"])
def test_matches_torch(name: str) -> None:
    torch = pytest.importorskip("torch")
    shape, source, causal, mask = CASES[name]
    arrays = _qkv(shape, source, seed=3)
    kwargs = {"is_causal": causal, "attn_mask": None if mask is None else mask}
    out, grads, node = _run(lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, **kwargs), arrays)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    tkw = {"is_causal": causal, "attn_mask": None if mask is None else torch.tensor(mask)}
    y = torch.nn.functional.scaled_dot_product_attention(*ts, **tkw)
    y.backward(torch.tensor(np.random.default_rng(5).standard_normal(y.shape)))
    assert node == FUSED
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-10, atol=1e-12)
    for g, t in zip(grads, ts):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["causal", "mask", "plain"])
def test_compiled_passes_equal_numpy_on_tricky_values(on_path, dtype: type, kind: str) -> None:
    """The two compiled passes (weights from scores, the scores' gradient) against their
    numpy forms: large scores, -inf, +inf and NaN in the inputs, a masked-out row. (Checked
    at the passes: what a matrix product makes of NaN times 0 varies with BLAS's kernel.)"""
    from asyncgrad.ops import attention as A

    q, k, v = _qkv((2, 2, 6, 4), 6, np.float64, seed=8)
    q[0, 0] *= 1e3  # scores far beyond exp's range: one weight near 1 per row
    k[0, 1, 2, 0] = -math.inf
    q[1, 0, 3, 1] = math.nan
    k[1, 1, 4, 2] = math.inf
    mask = np.random.default_rng(2).random((6, 6)) < 0.7
    mask[2] = False
    causal, allowed = kind == "causal", mask if kind == "mask" else None
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    g = np.random.default_rng(1).standard_normal(v.shape).astype(dtype)

    def passes() -> list[np.ndarray]:
        with np.errstate(invalid="ignore", over="ignore"):
            out, p = A._attention(q, k, v, scale=0.5, causal=causal, allowed=allowed)
            return [p, A._scores_grad(g, v, p, 0.5, causal, allowed)]

    on_path("numpy")
    plain = passes()
    on_path("compiled")
    fast = passes()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.isnan(plain[0]).any() and np.isfinite(plain[0]).any()
    for a, b in zip(fast, plain):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, equal_nan=True)
    if kind != "plain":  # masked keys: weight 0 and gradient 0, even in a row of NaN
        blocked = ~np.tri(6, 6, 0, dtype=bool) if causal else ~mask
        assert np.all(fast[0][..., blocked] == 0) and np.all(fast[1][..., blocked] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["causal", "mask"])
def test_compiled_equals_numpy_path_on_large_scores(on_path, dtype: type, kind: str) -> None:
    q, k, v = _qkv((2, 2, 6, 4), 6, np.float64, seed=8)
    q[0] *= 1e3
    mask = np.random.default_rng(2).random((6, 6)) < 0.7
    arrays = [a.astype(dtype) for a in (q, k, v)]

    def f(q: ag.Tensor, k: ag.Tensor, v: ag.Tensor) -> ag.Tensor:
        if kind == "causal":
            return NF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return NF.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    on_path("numpy")
    plain = _run(f, arrays)
    on_path("compiled")
    fast = _run(f, arrays)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    assert plain[2] == fast[2] == FUSED
    np.testing.assert_allclose(fast[0], plain[0], rtol=tol, atol=tol)
    for a, b in zip(fast[1], plain[1]):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * 10)


# lengths around the compiled kernels' structure: one key, fewer than and not a multiple
# of 8 lanes, S != L either way, and rows beyond the causal kernels' full-width length (128)
SIZES = [(1, 1), (1, 6), (6, 1), (7, 7), (9, 13), (13, 9), (33, 33), (130, 130), (131, 140), (140, 131)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("size", SIZES)
def test_compiled_passes_equal_numpy_at_every_length(on_path, dtype: type, causal: bool,
                                                     size: tuple[int, int]) -> None:
    """The compiled passes (Note [Causal rows at full width]) equal their numpy forms at
    lengths that exercise the lanes, the remainders and the full-width rounding."""
    from asyncgrad.ops import attention as A

    length, source = size
    q, k, v = (a.astype(dtype) for a in _qkv((2, length, 4), source, np.float64, seed=length + source))
    g = np.random.default_rng(1).standard_normal(q.shape[:-1] + (4,)).astype(dtype)

    def passes() -> list[np.ndarray]:
        out, p = A._attention(q, k, v, scale=0.6, causal=causal, allowed=None)
        return [out, p, A._scores_grad(g, v, p, 0.6, causal, None)]

    on_path("numpy")
    plain = passes()
    on_path("compiled")
    fast = passes()
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for a, b in zip(fast, plain):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    if causal:
        blocked = ~np.tri(length, source, 0, dtype=bool)
        assert np.all(fast[1][..., blocked] == 0) and np.all(fast[2][..., blocked] == 0)


@pytest.mark.parametrize("path", ["numpy", "compiled"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1e30])
@pytest.mark.parametrize("length", [5, 40, 135])
def test_causal_scores_of_future_keys_never_reach_the_result(on_path, path: str, bad: float, length: int) -> None:
    """The causal kernels read the scores of masked keys (Note [Causal rows at full
    width]): NaN, inf or huge values there change nothing in the rows that cannot see
    them: the weights on both paths, the compiled scores' gradient too."""
    from asyncgrad.ops import attention as A

    on_path(path)
    q, k, v = (a.astype(np.float32) for a in _qkv((3, length, 8), length, np.float64, seed=length))
    g = np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)
    last = length - 1
    bad_k, bad_v = k.copy(), v.copy()
    bad_k[:, last] = bad
    bad_v[:, last] = bad
    with np.errstate(invalid="ignore", over="ignore"):
        _, p_ref = A._attention(q, k, v, scale=0.4, causal=True, allowed=None)
        ds_ref = A._scores_grad(g, v, p_ref, 0.4, True, None)
        _, p = A._attention(q, bad_k, bad_v, scale=0.4, causal=True, allowed=None)
        ds = A._scores_grad(g, bad_v, p, 0.4, True, None)
    np.testing.assert_array_equal(p[:, :last], p_ref[:, :last])
    assert np.all(p[:, :last, last] == 0)
    if path == "compiled":  # (numpy's pass sums dp * p over every key, as the written-out ops: NaN * 0)
        np.testing.assert_array_equal(ds[:, :last], ds_ref[:, :last])
        assert np.all(ds[:, :last, last] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_compiled_row_maximum_found_in_every_lane(on_path, dtype: type, causal: bool) -> None:
    """The compiled row maximum runs eight lanes and a tail: with one score far above
    the others (exp overflows unless the shift is that score), in every position of
    rows of 1 to 24 keys, the weights equal numpy's."""
    from asyncgrad.ops import attention as A

    on_path("compiled")
    for n in range(1, 25):
        base = np.random.default_rng(n).standard_normal((n, n)).astype(dtype)
        s = np.repeat(base[None], n, axis=0)  # (n heads, n, n): in head h, key h is huge
        for h in range(n):
            s[h, :, h] = 500.0
        on_path("numpy")
        plain = s.copy()
        A._weights_(plain, 0.5, causal, None)
        on_path("compiled")
        fast = s.copy()
        A._weights_(fast, 0.5, causal, None)
        assert np.all(np.isfinite(fast))
        np.testing.assert_allclose(fast, plain, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-30)


@pytest.mark.parametrize("path", ["numpy", "compiled"])
@pytest.mark.parametrize("size", [(2, 2), (3, 5), (9, 4), (16, 16), (17, 30), (130, 130)])
def test_causal_halves_equal_the_whole_products(on_path, monkeypatch, path: str, size: tuple[int, int]) -> None:
    """Note [Causal halves]: the causal forward in two halves of query rows (from any
    length here) gives the weights, output and gradients of the whole products, with
    zeros in the quarter of the weights no product wrote."""
    from asyncgrad.ops import attention as A

    on_path(path)
    length, source = size
    arrays = [a.astype(np.float32) for a in _qkv((2, 3, length, 8), source, seed=length)]
    f = lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    monkeypatch.setattr(A, "CAUSAL_HALVES_MIN", 1 << 30)
    whole = _run(f, arrays)
    _, p_whole = A._attention(*arrays, scale=0.3, causal=True, allowed=None)
    monkeypatch.setattr(A, "CAUSAL_HALVES_MIN", 1)
    halves = _run(f, arrays)
    out, p = A._attention(*arrays, scale=0.3, causal=True, allowed=None)
    assert halves[2] == FUSED
    np.testing.assert_allclose(p, p_whole, rtol=1e-6, atol=1e-7)
    assert np.all(p[..., ~np.tri(length, source, 0, dtype=bool)] == 0)
    np.testing.assert_allclose(halves[0], whole[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(halves[1], whole[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["numpy", "compiled"])
@pytest.mark.parametrize("layout", ["contiguous", "heads_of_a_projection", "keys_transposed"])
@pytest.mark.parametrize("size", [(5, 5), (9, 4), (12, 20), (130, 130)])
def test_joint_backward_in_halves_equals_the_whole(on_path, monkeypatch, path: str, layout: str,
                                                   size: tuple[int, int]) -> None:
    """Note [Causal halves]: the joint backward in halves gives the whole products'
    gradients for every subset of needed inputs, each in its input's layout (row-major,
    heads as transposed views, a column-major key matrix)."""
    from asyncgrad.ops import attention as A

    on_path(path)
    length, source = size
    rng = np.random.default_rng(length * source)
    if layout == "heads_of_a_projection" and length == source:
        base = rng.standard_normal((2, length, 3 * 12)).astype(np.float32)
        q, k, v = (t.reshape(2, length, 3, 4).transpose(0, 2, 1, 3) for t in np.split(base, 3, axis=2))
    else:
        q, k, v = (a.astype(np.float32) for a in _qkv((2, 3, length, 4), source, seed=length))
        if layout == "keys_transposed":
            k = np.ascontiguousarray(np.swapaxes(k, -1, -2)).swapaxes(-1, -2)
    g = rng.standard_normal(q.shape).astype(np.float32)
    _, p = A._attention(q, k, v, scale=0.4, causal=True, allowed=None)
    for mask in [(True, True, True), (True, False, False), (False, True, False), (False, False, True)]:
        monkeypatch.setattr(A, "CAUSAL_HALVES_MIN", 1 << 30)
        whole = A._joint(g, None, q, k, v, mask=mask, scale=0.4, causal=True, allowed=None, aux=p)
        monkeypatch.setattr(A, "CAUSAL_HALVES_MIN", 1)
        halves = A._joint(g, None, q, k, v, mask=mask, scale=0.4, causal=True, allowed=None, aux=p)
        for need, a, b, x in zip(mask, halves, whole, (q, k, v)):
            if not need:
                assert a is None and b is None
                continue
            assert a.shape == x.shape and a.strides == np.empty_like(x).strides
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
