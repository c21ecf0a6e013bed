"""Property tests: for broadcastable shapes, binary ops give numpy's forward values and
gradients reduced back to each input's shape, equal to a numpy reference VJP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import asyncgrad as ag


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Reference: sum ``g`` down to ``shape`` (written independently of the library's helper)."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(axis=i, keepdims=True)
    return g


# op name -> (asyncgrad op, forward reference, d/da reference, d/db reference)
BINARY: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {
    "add": (lambda a, b: a + b, np.add, lambda a, b: np.ones_like(a + b), lambda a, b: np.ones_like(a + b)),
    "sub": (lambda a, b: a - b, np.subtract, lambda a, b: np.ones_like(a - b), lambda a, b: -np.ones_like(a - b)),
    "mul": (lambda a, b: a * b, np.multiply, lambda a, b: b + 0 * a, lambda a, b: a + 0 * b),
    "div": (lambda a, b: a / b, np.divide, lambda a, b: 1 / b + 0 * a, lambda a, b: -a / (b * b)),
    "maximum": (ag.maximum, np.maximum,
                lambda a, b: np.where(a > b, 1.0, np.where(a == b, 0.5, 0.0)),
                lambda a, b: np.where(b > a, 1.0, np.where(a == b, 0.5, 0.0))),
    "minimum": (ag.minimum, np.minimum,
                lambda a, b: np.where(a < b, 1.0, np.where(a == b, 0.5, 0.0)),
                lambda a, b: np.where(b < a, 1.0, np.where(a == b, 0.5, 0.0))),
}

shapes = hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=1, max_side=4)
# small integers (then halved) so that maximum/minimum see real ties
values = st.integers(-3, 3).map(lambda v: v / 2.0)


def _array(data: st.DataObject, shape: tuple[int, ...], nonzero: bool = False) -> np.ndarray:
    elements = values.filter(lambda v: v != 0) if nonzero else values
    return data.draw(hnp.arrays(np.float64, shape, elements=elements))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(BINARY)), bshapes=shapes, data=st.data())
def test_binary_op_gradients_reduce_to_input_shapes(name: str, bshapes: Any, data: st.DataObject) -> None:
    op, ref, da, db = BINARY[name]
    sa, sb, _ = bshapes.input_shapes
    a_np = _array(data, sa)
    b_np = _array(data, sb, nonzero=(name == "div"))
    out_shape = np.broadcast_shapes(sa, sb)
    w = data.draw(hnp.arrays(np.float64, out_shape, elements=values))
    a, b = ag.tensor(a_np, requires_grad=True), ag.tensor(b_np, requires_grad=True)
    out = op(a, b)
    assert out.shape == out_shape
    np.testing.assert_allclose(out.numpy(), ref(a_np, b_np))
    ga, gb = ag.grad_sync(out, [a, b], ag.tensor(w))
    assert ga.shape == sa and gb.shape == sb
    np.testing.assert_allclose(ga.numpy(), _unbroadcast(w * da(a_np, b_np), sa), atol=1e-12)
    np.testing.assert_allclose(gb.numpy(), _unbroadcast(w * db(a_np, b_np), sb), atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(bshapes=shapes, data=st.data())
def test_where_gradients_reduce_to_input_shapes(bshapes: Any, data: st.DataObject) -> None:
    sc, sa, sb = bshapes.input_shapes
    cond = data.draw(hnp.arrays(np.bool_, sc))
    a_np, b_np = _array(data, sa), _array(data, sb)
    out_shape = np.broadcast_shapes(sc, sa, sb)
    w = data.draw(hnp.arrays(np.float64, out_shape, elements=values))
    a, b = ag.tensor(a_np, requires_grad=True), ag.tensor(b_np, requires_grad=True)
    out = ag.where(ag.tensor(cond), a, b)
    assert out.shape == out_shape
    np.testing.assert_array_equal(out.numpy(), np.where(cond, a_np, b_np))
    ga, gb = ag.grad_sync(out, [a, b], ag.tensor(w))
    assert ga.shape == sa and gb.shape == sb
    full_cond = np.broadcast_to(cond, out_shape)
    np.testing.assert_allclose(ga.numpy(), _unbroadcast(np.where(full_cond, w, 0.0), sa))
    np.testing.assert_allclose(gb.numpy(), _unbroadcast(np.where(full_cond, 0.0, w), sb))


@settings(max_examples=30, deadline=None)
@given(bshapes=shapes, data=st.data())
def test_scalar_and_chained_broadcasts(bshapes: Any, data: st.DataObject) -> None:
    """``(a * b + c) * 2 - a`` through three broadcast inputs, one of them reused."""
    sa, sb, sc = bshapes.input_shapes
    a_np, b_np, c_np = _array(data, sa), _array(data, sb), _array(data, sc)
    a, b, c = (ag.tensor(v, requires_grad=True) for v in (a_np, b_np, c_np))
    out = (a * b + c) * 2 - a
    shape = np.broadcast_shapes(sa, sb, sc)
    ga, gb, gc = ag.grad_sync(out.sum(), [a, b, c])
    ones = np.ones(shape)
    np.testing.assert_allclose(ga.numpy(), _unbroadcast(ones * (2 * b_np - 1), sa))
    np.testing.assert_allclose(gb.numpy(), _unbroadcast(ones * 2 * a_np, sb))
    np.testing.assert_allclose(gc.numpy(), _unbroadcast(ones * 2.0, sc))
