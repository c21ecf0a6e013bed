"""The recording fast path (Note [The recording fast path] in autograd/graph/record.py): the
inlined constructors build the same objects as the classes' own, and the checks the fast
path must keep (version counters, saved-tensor hooks, anomaly mode, grad mode) still run."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.graph import AccumulateGrad, SavedTensor
from asyncgrad.autograd.graph.record import OpNode
from asyncgrad.tensor import Tensor


def _all_slots(cls: type) -> list[str]:
    return [s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if s != "__weakref__"]


def test_recorded_result_and_node_have_every_slot_set() -> None:
    a = ag.randn(3, requires_grad=True)
    y = (a * 2.0).relu()  # a binary op with a constant, and a unary op saving its output
    for t in (y, a * a):
        for name in _all_slots(Tensor):
            getattr(t, name)  # raises AttributeError when the fast path missed a slot
        assert t._version_counter.value == 0 and t._base is None and t.requires_grad
        node = t.grad_fn
        assert type(node) is OpNode
        for name in _all_slots(OpNode):
            getattr(node, name)
        assert node._hooks is None
    for entry in y.grad_fn.checks:
        assert type(entry) is SavedTensor
        for name in _all_slots(SavedTensor):
            getattr(entry, name)


def test_sequence_numbers_increase_across_fast_path_nodes() -> None:
    a = ag.randn(3, requires_grad=True)
    b = a.exp()
    c = b * a
    assert b.grad_fn.sequence_nr < c.grad_fn.sequence_nr


def test_accumulate_grad_from_for_leaf_matches_constructor() -> None:
    a = ag.randn(2, 3, requires_grad=True)
    acc = (a + 1.0).grad_fn.next_functions[0][0]
    ref = AccumulateGrad(a)
    assert type(acc) is AccumulateGrad and acc.variable is a
    for name in _all_slots(AccumulateGrad):
        if name != "variable":
            assert getattr(acc, name) == getattr(ref, name), name
    assert acc.sequence_nr == ref.sequence_nr and acc._hooks is None
    b = a * 3.0  # while acc is alive, every use of the leaf shares it
    assert b.grad_fn.next_functions[0][0] is acc


def test_inplace_change_of_saved_input_still_raises() -> None:
    w = ag.randn(4, requires_grad=True)
    x = ag.randn(4)
    y = w * x  # saves x (for w's gradient)
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_inplace_change_of_saved_nonleaf_through_cache_still_raises() -> None:
    w = ag.randn(4, requires_grad=True)
    h = w * 2.0
    y1 = h * h  # saves h; its SavedTensor is cached on h
    h.mul_(3.0)  # a new version: the cached entry must not be reused
    y2 = h * h
    y2.sum().backward()  # saved after the change: fine
    np.testing.assert_allclose(w.grad.data, 2 * (6 * w.data) * 6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y1.sum().backward()


def test_inplace_change_of_saved_output_still_raises() -> None:
    a = ag.randn(4, requires_grad=True)
    y = a.exp()  # saves its output
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_cached_plain_entry_not_reused_after_requires_grad_() -> None:
    x = ag.randn(3)
    w = ag.randn(3, requires_grad=True)
    _ = w * x  # caches a plain SavedTensor on x
    x.requires_grad_()
    y = x * x  # x is now a leaf that requires grad: saved as the leaf, not from the cache
    assert all(e.ref is x for e in y.grad_fn.checks)
    (g,) = ag.autograd.grad_sync(y.sum(), x, create_graph=True)
    (gg,) = ag.autograd.grad_sync(g.sum(), x)
    np.testing.assert_allclose(gg.data, np.full(3, 2.0))


def test_saved_tensors_hooks_take_the_full_path() -> None:
    packed: list[object] = []
    unpacked: list[object] = []

    def pack(t: object) -> object:
        packed.append(t)
        return t

    def unpack(t: object) -> object:
        unpacked.append(t)
        return t

    a = ag.randn(4, requires_grad=True)
    with ag.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = (a * a).exp()  # mul saves a twice, exp saves its output
    assert len(packed) == 3
    y.sum().backward()
    assert len(unpacked) == 3
    np.testing.assert_allclose(a.grad.data, np.exp(a.data ** 2) * 2 * a.data, rtol=1e-5)


def test_anomaly_mode_records_a_trace_for_fast_path_nodes() -> None:
    a = ag.randn(3, requires_grad=True)
    with ag.autograd.detect_anomaly():
        y = a + a
        z = y.relu()
    assert y.grad_fn.anomaly_trace is not None and z.grad_fn.anomaly_trace is not None
    assert (a * 1.0).grad_fn.anomaly_trace is None


def test_no_grad_and_constant_inputs_record_nothing() -> None:
    a = ag.randn(3, requires_grad=True)
    with ag.no_grad():
        for t in (a + a, a.relu(), -a):
            assert t.grad_fn is None and not t.requires_grad
            assert t._version_counter.value == 0 and t._version_counter is not a._version_counter
    b = ag.randn(3)
    for t in (b + b, b.exp(), b * 2.0):
        assert t.grad_fn is None and not t.requires_grad
        assert t._version_counter is not b._version_counter


def test_methods_match_functions() -> None:
    a = ag.randn(5, requires_grad=True)
    for m, f in ((a.relu(), ag.relu(a)), (a.exp(), ag.exp(a)), (-a, ag.neg(a)), (a + 2, ag.add(a, 2)),
                 (2 * a, ag.mul(2, a)), (a - 1, ag.sub(a, 1)), (a.tanh(), ag.tanh(a))):
        assert m.grad_fn.name() == f.grad_fn.name()
        np.testing.assert_array_equal(m.data, f.data)


def test_linear_checks_dtypes_and_shapes() -> None:
    x = ag.tensor(np.ones((2, 3), np.float32))
    w = ag.tensor(np.ones((4, 3), np.float32), requires_grad=True)
    b = ag.tensor(np.ones(4, np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):
        ag.functional.linear(x.to(ag.float64), w, b)
    with pytest.raises(RuntimeError, match="self and mat2 must have the same dtype"):
        ag.functional.linear(x, w, b.to(ag.float64))
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
        ag.functional.linear(x.to(ag.float64), w)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        ag.functional.linear(ag.tensor(np.ones((2, 5), np.float32)), w, b)
    out = ag.functional.linear(x, w, b)
    np.testing.assert_array_equal(out.data, np.full((2, 4), 4.0, np.float32))


def test_cached_entry_not_reused_after_inplace_change_of_plain_tensor() -> None:
    w = ag.randn(4, requires_grad=True)
    x = ag.randn(4)
    y1 = w * x  # caches a SavedTensor of x at version 0
    x.add_(1.0)  # same array, same (absent) grad_fn: only the version tells
    y2 = w * x  # must save x anew, at version 1
    y2.sum().backward()
    np.testing.assert_allclose(w.grad.data, x.data)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y1.sum().backward()
