"""The cheaper paths of small nodes (issue 11: the engine's cost per small node): each
gives bit for bit what the code it replaced gave, in float32 and float64.

* ``reductions._mean``: numpy's ``np.mean`` written out (sum, then divide by the count
  as an ``intp``) for float32/float64;
* ``reductions._mean_rule``: ``g / n`` copied into a fresh C-ordered array (was: a copy
  of ``np.broadcast_to``'s view);
* linear's weight rule: ``g.T @ x`` for 2-D arrays (was: ``np.matmul(np.swapaxes(g, 0,
  1), x)`` through ``_flat``);
* ``_fast._binary``: contiguous writeable arguments go to the kernel as flat views
  without ``_fits``/``_flat`` (other layouts still are copied as before).
"""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck
from asyncgrad.ops import linalg, reductions
from asyncgrad.ops.kernels import compiled_path as _fast
from asyncgrad.ops._array_math import ARRAY_MATH

DTYPES = [np.float32, np.float64]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)))


@pytest.mark.parametrize("dtype", DTYPES + [np.float16])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (None, True), ((0,), False), ((1,), True),
                                          ((0, 2), False), ((), False), ((2,), False)])
def test_mean_forward_is_np_mean_bit_for_bit(dtype, dim, keepdim) -> None:
    x = (np.random.default_rng(0).standard_normal((7, 33, 5)) * 1e3).astype(dtype)
    ours = reductions._mean(x, dim=dim, keepdim=keepdim)
    theirs = np.asarray(np.mean(x, axis=dim, keepdims=keepdim))
    assert type(ours) is np.ndarray
    assert _same_bits(ours, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_forward_of_a_count_beyond_float32_integers_and_odd_inputs(dtype) -> None:
    # a count above 2**24 is not a float32 integer: numpy divides by it in float64
    x = np.broadcast_to(dtype(1.7), (2**24 + 3,))  # (a view: nothing allocated)
    assert _same_bits(reductions._mean(x, dim=None, keepdim=False), np.asarray(np.mean(x)))
    for odd in (np.asarray(dtype(2.5)), np.arange(12, dtype=dtype).reshape(3, 4).T):  # 0-d, a transposed view
        for dim in (None, (0,)) if odd.ndim else (None,):
            assert _same_bits(reductions._mean(odd, dim=dim, keepdim=False),
                              np.asarray(np.mean(odd, axis=dim)))
    with pytest.warns(RuntimeWarning):  # empty: numpy's own path, with its warning
        assert np.isnan(reductions._mean(np.zeros(0, dtype=dtype), dim=None, keepdim=False))


def _old_mean_rule(g: np.ndarray, dim, keepdim: bool, shape: tuple[int, ...]) -> np.ndarray:
    """The array path of ``_mean_rule`` before issue 11's change."""
    n = int(np.prod(shape if dim is None else [shape[d] for d in dim], dtype=np.int64))
    q = np.true_divide(g, n)
    if dim is not None and not keepdim:
        for d in sorted(dim):
            q = np.expand_dims(q, d)
    return np.array(np.broadcast_to(q, shape), order="C")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim, keepdim", [(None, False), ((0,), False), ((1,), True), ((0, 2), False),
                                          ((2,), False), ((), False)])
@pytest.mark.parametrize("shape", [(4, 6, 3), (64, 32, 33)])  # a small gradient, and one past SMALL_EXPANDED_GRAD
def test_mean_backward_rule_equals_the_old_rule_and_is_a_fresh_array(dtype, dim, keepdim, shape) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    out_shape = np.mean(x, axis=dim, keepdims=keepdim).shape
    g = np.asarray(np.random.default_rng(2).standard_normal(out_shape) * 7).astype(dtype)
    ours = reductions._mean_rule(ARRAY_MATH, g, None, x, dim=dim, keepdim=keepdim, shape=shape)
    assert _same_bits(ours, _old_mean_rule(g, dim, keepdim, shape))
    assert ours.flags.c_contiguous and ours.flags.writeable and ours.base is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (16,), (4, 6, 3), (64, 32, 33)])  # small ones, and one past SMALL_EXPANDED_GRAD
def test_sum_backward_rule_is_the_expanded_gradient_copied_out_when_small(dtype, shape) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    g = np.asarray(np.random.default_rng(2).standard_normal() * 7).astype(dtype)
    ours = reductions.sum_all.vjps[0](ARRAY_MATH, g, None, x, dim=None, keepdim=False, shape=shape)
    assert ours.shape == shape and ours.dtype == dtype
    assert _same_bits(np.array(ours), np.full(shape, g))
    if x.size < reductions.SMALL_EXPANDED_GRAD:  # a new array: the engine may make it .grad as it is
        assert ours.flags.c_contiguous and ours.flags.writeable and ours.base is None
    else:  # PyTorch's expand: a view, no write pass over the input's shape
        assert not ours.flags.writeable and ours.strides == (0,) * len(shape)
    t = ag.from_numpy(x).requires_grad_()
    ag.backward_sync(t.sum() * ag.from_numpy(g))
    assert _same_bits(t.grad.numpy(), np.full(shape, g))


@pytest.mark.parametrize("dim", [None, 1, (0, 2)])
def test_mean_gradcheck_in_float64(dim) -> None:
    x = ag.from_numpy(np.random.default_rng(3).standard_normal((3, 4, 2))).requires_grad_()
    assert gradcheck(lambda t: (t * t).mean(dim), (x,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_gradient_through_the_engine_equals_the_old_rule(dtype) -> None:
    x = ag.from_numpy(np.random.default_rng(4).standard_normal((32, 128)).astype(dtype)).requires_grad_()
    ag.backward_sync(x.mean())
    assert _same_bits(x.grad.numpy(), _old_mean_rule(np.ones((), dtype), None, False, (32, 128)))
    x.grad = None
    ag.backward_sync(x.mean(1).sum())
    assert _same_bits(x.grad.numpy(), _old_mean_rule(np.ones(32, dtype), (1,), False, (32, 128)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 7), (2, 5, 7)])
def test_linear_weight_gradient_equals_the_old_rule(dtype, shape) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((3, 7)).astype(dtype)
    g = rng.standard_normal((*shape[:-1], 3)).astype(dtype)
    old = np.matmul(np.swapaxes(g.reshape(-1, 3), 0, 1), x.reshape(-1, 7))
    assert _same_bits(linalg.linear.vjps[1](ARRAY_MATH, g, None, x, w, None), old)
    assert _same_bits(linalg.linear_nobias.vjps[1](ARRAY_MATH, g, None, x, w), old)
    # and through the engine, with the bias's gradient summed over the batch
    tx = ag.from_numpy(x)
    tw = ag.from_numpy(w).requires_grad_()
    tb = ag.from_numpy(np.zeros(3, dtype)).requires_grad_()
    ag.backward_sync(ag.functional.linear(tx, tw, tb), ag.from_numpy(g))
    assert _same_bits(tw.grad.numpy(), old)
    assert _same_bits(tb.grad.numpy(), np.add.reduce(g.reshape(-1, 3), axis=0))


def test_linear_gradcheck_in_float64() -> None:
    rng = np.random.default_rng(6)
    x = ag.from_numpy(rng.standard_normal((4, 5))).requires_grad_()
    w = ag.from_numpy(rng.standard_normal((3, 5))).requires_grad_()
    b = ag.from_numpy(rng.standard_normal(3)).requires_grad_()
    assert gradcheck(lambda x, w, b: ag.functional.linear(x, w, b), (x, w, b))
    assert gradcheck(lambda x, w: ag.functional.linear(x, w), (x, w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_binary_on_every_layout_equals_the_numpy_rule(on_path, dtype) -> None:
    on_path("compiled")
    rng = np.random.default_rng(8)
    ans = np.maximum(rng.standard_normal((64, 80)), 0).astype(dtype)
    g = rng.standard_normal((64, 80)).astype(dtype)
    frozen = g.copy()
    frozen.flags.writeable = False
    layouts = {
        "contiguous": g,
        "transposed": np.ascontiguousarray(g.T).T,
        "read-only": frozen,
        "broadcast": np.broadcast_to(dtype(3.0), g.shape),
        "strided": np.repeat(g, 2, axis=1)[:, ::2],
    }
    for name, grad in layouts.items():
        ours = _fast.threshold_backward(grad, ans)
        assert ours is not None, name
        assert _same_bits(ours, np.where(ans > 0, grad, dtype(0))), name
        assert ours.flags.c_contiguous and ours.flags.writeable, name
    # not for mixed dtypes or shapes: None, the caller's numpy rule runs
    assert _fast.threshold_backward(g.astype(np.float16), ans) is None
    assert _fast.threshold_backward(g[:1], ans) is None
    # nor for 0-d or empty arrays (as before: ``_fits`` refused them)
    zero_d = np.asarray(dtype(2.0))
    assert _fast.threshold_backward(zero_d, zero_d) is None
    assert _fast.threshold_backward(g[:0], ans[:0]) is None


# Note [A tensor times itself]: the fused step settles both edges of ``x * x`` at once
# (no InputBuffer for the second, None, gradient); the child still waits for its other
# consumers, and a child with several outputs gets the sum in the right slot.
def _reference_grads(build, leaves):
    """The same gradients by the reference executor (every node through prepare/run/finish)."""
    from asyncgrad.autograd.tools.reference import ReferenceEngine

    from asyncgrad.autograd import get_engine, set_engine

    old = get_engine()
    set_engine(ReferenceEngine())
    try:
        for t in leaves:
            t.grad = None
        ag.backward_sync(build())
        return [t.grad.numpy().copy() for t in leaves]
    finally:
        set_engine(old)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["other consumer first", "other consumer after", "unbind 0", "unbind 1",
                                  "square twice"])
def test_a_square_settles_both_edges_and_the_child_still_waits_for_the_rest(dtype, case) -> None:
    rng = np.random.default_rng(9)
    w = ag.from_numpy(rng.standard_normal((3, 4)).astype(dtype)).requires_grad_()
    v = ag.from_numpy(rng.standard_normal((3, 4)).astype(dtype)).requires_grad_()

    def build():
        return build_from(w, v)

    def build_from(w, v):
        h = (w * v).exp()  # a non-leaf: its node waits for every consumer
        if case == "other consumer first":
            return (h.sin().sum() + (h * h).sum())
        if case == "other consumer after":
            return ((h * h).sum() + h.sin().sum())
        if case == "square twice":
            return ((h * h).sum() + (h * h).mean())
        a, b, _ = h.unbind(0)  # a node with several outputs: the square of output 0 or 1
        sq = a * a if case == "unbind 0" else b * b
        return sq.sum() + a.sum() * 0.5
    want = _reference_grads(build, [w, v])
    for t in (w, v):
        t.grad = None
    ag.backward_sync(build())
    for t, ref in zip((w, v), want):
        # (the fused step adds ``t + t`` first, the reference in arrival order: the last
        # bits may differ where another consumer's gradient is added too)
        np.testing.assert_allclose(t.grad.numpy(), ref, rtol=1e-5 if dtype == np.float32 else 1e-12)
    if dtype == np.float64:
        assert gradcheck(lambda w, v: build_from(w, v), (w.detach().requires_grad_(), v.detach().requires_grad_()))


def test_a_square_makes_no_input_buffer_for_its_one_gradient(monkeypatch, restore_engine) -> None:
    from asyncgrad.autograd.task import graph_task

    from conftest import DynamicEngine  # (the ready queue's input buffers: a flat schedule has none)

    ag.autograd.set_engine(DynamicEngine())  # (the Engine's fused step: not the reference executor's)

    made = []

    class Counting(graph_task.InputBuffer):
        __slots__ = ()

        def __init__(self, *args) -> None:
            made.append(args)
            super().__init__(*args)

    monkeypatch.setattr(graph_task, "InputBuffer", Counting)
    w = ag.from_numpy(np.linspace(-1, 1, 12).reshape(3, 4)).requires_grad_()
    h = (w * 2.0).exp()
    ag.backward_sync((h * h).sum())
    assert made == []
    np.testing.assert_allclose(w.grad.numpy(), 4 * np.exp(4 * w.numpy()), rtol=1e-12)
    # a product of two different tensors still buffers its first gradient
    w.grad = None
    h = (w * 2.0).exp()
    ag.backward_sync((h * h.sin()).sum())
    assert len(made) == 1


# Note [The recording fast path]: record builds a saved input's SavedTensor itself on a
# cache miss; it must equal save_for_backward's (SavedTensor(v)), cached the same way.
def test_a_saved_input_missing_the_cache_is_save_for_backwards_entry() -> None:
    from asyncgrad.autograd.graph import SavedTensor, save_for_backward
    from asyncgrad.autograd.graph.saved import _LEAF, _NONLEAF, _PLAIN

    slots = [s for c in SavedTensor.__mro__ for s in getattr(c, "__slots__", ())]
    rng = np.random.default_rng(10)
    w = ag.from_numpy(rng.standard_normal((4, 4))).requires_grad_()  # a leaf that requires grad
    x = ag.from_numpy(rng.standard_normal((2, 4)))  # plain
    h = ag.functional.linear(x, w)  # a non-leaf
    w._version_counter.value = 3  # (saved_version follows the counter)
    out = ag.functional.linear(h, w)  # saves h (for w's rule) and w (for h's rule)
    entries = {e.kind: e for e in out.grad_fn.checks}
    assert set(entries) == {_LEAF, _NONLEAF}
    first = ag.functional.linear(x, w).grad_fn.checks  # x plain, w a leaf
    entries[_PLAIN] = next(e for e in first if e.kind == _PLAIN)
    for kind, value in ((_LEAF, w), (_NONLEAF, h), (_PLAIN, x)):
        ours = entries[kind]
        value._saved = None  # (save_for_backward's own miss: no cache to hit)
        theirs = SavedTensor(value)
        for name in slots:
            assert getattr(ours, name) is getattr(theirs, name) or getattr(ours, name) == getattr(theirs, name), name
        assert ours.saved_version == value._version_counter.value
    # cached as save_for_backward caches: a plain or non-leaf tensor keeps its entry (the
    # next save reuses it), a leaf that requires grad does not (a reference cycle)
    again = ag.functional.linear(h, w)
    assert h._saved is not None
    kept = h._saved
    assert kept in again.grad_fn.checks
    assert kept in ag.functional.linear(h, w).grad_fn.checks  # a hit: the same entry
    assert w._saved is None
    assert save_for_backward(h) is h._saved
    # and the entries still catch an in-place change
    with ag.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ag.backward_sync(again.sum())
