"""What a recorded graph shares between nodes, or leaves out, to hold fewer bytes per
node, and that the semantics hold through it: Note [One slot for a saved tensor's place]
and Note [Shared one-entry checks] (autograd/graph/saved.py), Note [An OpNode's one edge
in its slot] (autograd/graph/op_node.py)."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck
from asyncgrad.autograd.graph import FREED_MESSAGE, HookedSavedTensor, Node, SavedTensor, save_for_backward
from asyncgrad.autograd.graph.saved import _LEAF, _NONLEAF, _OUTPUT, _PLAIN

MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace operation"


def _leaf(*shape: int, seed: int = 0) -> ag.Tensor:
    return ag.from_numpy(np.random.default_rng(seed).standard_normal(shape)).requires_grad_()


# --- one slot for the place ---------------------------------------------------------------
def test_a_saved_tensor_has_four_slots_and_reads_its_place() -> None:
    assert SavedTensor.__slots__ == ("data", "version", "saved_version", "place")
    w = _leaf(3)
    c = ag.from_numpy(np.full(3, 2.0))  # plain
    h = w.exp()  # a non-leaf, output 0 of ExpBackward0
    plain = SavedTensor(c)
    assert (plain.kind, plain.ref, plain.output_nr, plain.place) == (_PLAIN, None, 0, None)
    leaf = SavedTensor(w)
    assert leaf.kind == _LEAF and leaf.ref is w and leaf.place is w and leaf.output_nr == 0
    nonleaf = SavedTensor(h)
    assert nonleaf.kind == _NONLEAF and nonleaf.ref is h.grad_fn and nonleaf.place is h.grad_fn
    out = SavedTensor(h, is_output=True)
    assert (out.kind, out.ref, out.output_nr, out.place) == (_OUTPUT, None, 0, 0)
    # output 1 of a multi-output node: the place is (grad_fn, 1)
    m = _leaf(2, 3)
    _, second = m.unbind(0)
    e = SavedTensor(second)
    assert e.kind == _NONLEAF and e.ref is second.grad_fn and e.output_nr == 1
    assert e.place == (second.grad_fn, 1)
    # unpacked under create_graph, each keeps its place in the graph
    assert leaf.unpack_tensor() is w
    t = nonleaf.unpack_tensor()
    assert t.grad_fn is h.grad_fn and t.output_nr == 0
    t = e.unpack_tensor()
    assert t.grad_fn is second.grad_fn and t.output_nr == 1


def test_a_modified_view_output_names_its_output_number() -> None:
    m = _leaf(2, 3)
    _, second = m.unbind(0)
    y = second.sin()
    with ag.no_grad():
        second.add_(1.0)
    with pytest.raises(RuntimeError, match=MODIFIED + r".*which is output 1 of UnbindBackward0, is at version 1"):
        ag.backward_sync(y.sum())


def test_a_view_output_saved_twice_shares_one_entry() -> None:
    """A tensor that is not output 0 takes save_for_backward, which still shares."""
    m = _leaf(2, 3)
    _, second = m.unbind(0)
    a, b = second.sin(), second.cos()
    (ea,), (eb,) = a.grad_fn.checks, b.grad_fn.checks
    assert ea is eb and ea.output_nr == 1
    assert save_for_backward(second) is ea
    ag.backward_sync((a + b).sum())
    row = m.detach().numpy()[1]
    np.testing.assert_allclose(m.grad.numpy(), np.stack([np.zeros(3), np.cos(row) - np.sin(row)]), rtol=1e-12)


# --- shared one-entry checks and rule arguments ----------------------------------------------
def test_nodes_saving_one_constant_alone_share_checks_and_arguments() -> None:
    x = _leaf(4)
    c = ag.from_numpy(np.linspace(0.5, 1.5, 4))
    y1 = x * c
    y2 = y1.sin() * c  # another mul node saving c alone, at the same position
    n1, n2 = y1.grad_fn, y2.grad_fn
    assert n1 is not n2
    # one check, held bare (no 1-tuple per node): c's cached entry
    assert type(n1._checks) is SavedTensor and n1._checks is n2._checks and n1.saved is n2.saved
    assert n1.checks == (n1._checks,)
    assert n1.saved[:2] == (None, None) and n1.saved[2] is c.data
    assert n1._checks is c._saved and n1.saved is c._saved_args
    ag.backward_sync(y2.sum())
    xv, cv = x.detach().numpy(), c.numpy()
    np.testing.assert_allclose(x.grad.numpy(), cv * np.cos(xv * cv) * cv, rtol=1e-12)
    assert gradcheck(lambda t: (t * c).sin() * c, (x.detach().requires_grad_(),))


def test_a_nonleaf_saved_alone_by_two_nodes_shares_and_double_backward_works() -> None:
    x = _leaf(5, seed=1)
    h = x.exp()
    a, b = h.sin(), h.cos()  # both save h alone at position 1 of (ans, x)
    assert a.grad_fn._checks is b.grad_fn._checks is h._saved
    assert a.grad_fn.saved is b.grad_fn.saved
    (g,) = ag.autograd.grad_sync((a + b).sum(), (x,), create_graph=True)
    xv = x.detach().numpy()
    e = np.exp(xv)
    np.testing.assert_allclose(g.detach().numpy(), (np.cos(e) - np.sin(e)) * e, rtol=1e-12)
    (gg,) = ag.autograd.grad_sync(g.sum(), (x,))
    np.testing.assert_allclose(gg.numpy(), (-np.sin(e) - np.cos(e)) * e * e + (np.cos(e) - np.sin(e)) * e,
                               rtol=1e-10)
    assert gradcheck(lambda t: t.exp().sin() + t.exp().cos(), (x.detach().requires_grad_(),))


def test_different_layouts_do_not_share_arguments() -> None:
    x = _leaf(3, seed=2)
    c = ag.from_numpy(np.array([2.0, 3.0, 4.0]))
    right, left = x * c, c * x  # c saved at position 2, then at position 1
    assert right.grad_fn._checks is left.grad_fn._checks  # (the one entry of c)
    assert right.grad_fn.saved is not left.grad_fn.saved
    assert right.grad_fn.saved[1] is None and right.grad_fn.saved[2] is c.data
    assert left.grad_fn.saved[1] is c.data and left.grad_fn.saved[2] is None
    sq = x * x  # one entry, two positions: its own arguments
    assert sq.grad_fn.saved[1] is x.data and sq.grad_fn.saved[2] is x.data
    ag.backward_sync((right + left + sq).sum())
    np.testing.assert_allclose(x.grad.numpy(), 2 * c.numpy() + 2 * x.detach().numpy(), rtol=1e-12)


def test_a_shared_entry_still_catches_an_inplace_change_for_every_node() -> None:
    x = _leaf(4, seed=3)
    c = ag.from_numpy(np.linspace(1.0, 2.0, 4))
    y1, y2 = x * c, x.exp() * c
    assert y1.grad_fn._checks is y2.grad_fn._checks
    with ag.no_grad():
        c.mul_(2.0)
    for y in (y1, y2):
        with pytest.raises(RuntimeError, match=MODIFIED + r": \[float64 tensor \[4\]\] is at version 1; "
                                                          r"expected version 0 instead"):
            ag.backward_sync(y.sum(), retain_graph=True)
    # after the change, new nodes get a new entry (and new arguments), not the stale ones
    y3 = x * c
    assert y3.grad_fn._checks is not y1.grad_fn._checks and y3.grad_fn._checks.saved_version == 1
    ag.backward_sync(y3.sum())
    np.testing.assert_allclose(x.grad.numpy(), c.numpy(), rtol=1e-12)


def test_release_of_sharing_nodes_leaves_the_tensors_cache_intact() -> None:
    x = _leaf(3, seed=4)
    c = ag.from_numpy(np.array([1.0, -1.0, 0.5]))
    y1 = x * c
    y2 = (x + 1.0) * c
    shared_checks, shared_args = c._saved, c._saved_args
    ag.backward_sync(y1.sum(), retain_graph=True)
    ag.backward_sync(y1.sum())  # retain_graph: a second time works
    np.testing.assert_allclose(x.grad.numpy(), 2 * c.numpy(), rtol=1e-12)
    assert y1.grad_fn.saved is None  # released
    with pytest.raises(RuntimeError) as info:
        ag.backward_sync(y1.sum())
    assert str(info.value) == FREED_MESSAGE
    # the other node, and the tensor's cache, are untouched by that release
    assert c._saved is shared_checks and c._saved_args is shared_args
    assert y2.grad_fn._checks is shared_checks and y2.grad_fn.saved is shared_args
    x.grad = None
    ag.backward_sync(y2.sum())
    np.testing.assert_allclose(x.grad.numpy(), c.numpy(), rtol=1e-12)


def test_saved_tensors_hooks_share_nothing() -> None:
    x = _leaf(3, seed=5)
    c = ag.from_numpy(np.array([1.0, 2.0, 3.0]))
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with ag.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y1, y2 = x * c, x * c
    assert len(packed) == 2
    (e1,), (e2,) = y1.grad_fn.checks, y2.grad_fn.checks
    assert type(e1) is HookedSavedTensor and e1 is not e2
    assert y1.grad_fn._checks is e1 and y2.grad_fn._checks is e2  # (one each, bare)
    ag.backward_sync((y1 + y2).sum())
    np.testing.assert_allclose(x.grad.numpy(), 2 * c.numpy(), rtol=1e-12)


def test_new_data_drops_the_caches() -> None:
    x = _leaf(3, seed=6)
    c = ag.from_numpy(np.ones(3))
    y = x * c
    assert c._saved is not None and c._saved_args is not None
    c.data = ag.from_numpy(np.full(3, 3.0))
    assert c._saved is None and c._saved_args is None
    z = x * c
    assert z.grad_fn.saved[2] is c.data and z.grad_fn.saved is not y.grad_fn.saved
    ag.backward_sync((y + z).sum())
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 4.0), rtol=1e-12)


def test_a_leaf_that_requires_grad_is_not_cached() -> None:
    w = _leaf(3, seed=7)
    x = ag.from_numpy(np.array([1.0, 2.0, 3.0]))
    y1, y2 = x * w, (x + 1.0) * w  # w saved alone (for x's rule, were x to require grad: not here)
    z1, z2 = w.sin(), w.cos()  # w saved alone by each: no cache on a leaf (a reference cycle)
    assert w._saved is None and w._saved_args is None
    assert z1.grad_fn._checks is not z2.grad_fn._checks
    assert z1.grad_fn._checks.kind == _LEAF
    ag.backward_sync((y1 + y2 + z1 + z2).sum())
    wv = w.detach().numpy()
    np.testing.assert_allclose(w.grad.numpy(), 2 * x.numpy() + 1 + np.cos(wv) - np.sin(wv), rtol=1e-12)


# --- an OpNode's one edge in its slot -------------------------------------------------------
def test_a_node_whose_one_edge_is_input_0s_output_0_holds_its_producer_alone() -> None:
    """Note [An OpNode's one edge in its slot] (autograd/graph/op_node.py): the slot holds
    the producer, ``next_edges``/``next_functions`` give the tuple of edges as before."""
    w = _leaf(3, seed=11)
    c = ag.from_numpy(np.array([1.0, 2.0, 3.0]))
    h = w.exp()
    acc = h.grad_fn.next_functions[0][0]
    assert h.grad_fn._edges is acc and h.grad_fn.next_edges == ((acc, 0),)  # from a leaf
    s = h.sin()
    assert s.grad_fn._edges is h.grad_fn and s.grad_fn.next_functions == ((h.grad_fn, 0),)
    right = h * c  # input 1 a constant: one edge that needs a gradient, input 0's
    assert right.grad_fn._edges is h.grad_fn and right.grad_fn.next_edges == ((h.grad_fn, 0), (None, 0))
    assert (h + 1.0).grad_fn.next_edges == ((h.grad_fn, 0), (None, 0))
    # every other node keeps its tuple of edges
    left = c * h  # input 1's edge
    assert left.grad_fn._edges == ((None, 0), (h.grad_fn, 0)) == left.grad_fn.next_edges
    both = h * w
    assert both.grad_fn._edges == ((h.grad_fn, 0), (acc, 0))
    _, second = _leaf(2, 3, seed=12).unbind(0)  # output 1 of its producer
    t = second.sin()
    assert t.grad_fn._edges == ((second.grad_fn, 1),)
    cat = ag.functional.cat([h, c, c])  # variadic, only input 0 needs a gradient
    assert cat.grad_fn._edges is h.grad_fn
    assert cat.grad_fn.next_edges == ((h.grad_fn, 0), (None, 0), (None, 0))
    loss = (s + right + left + both).sum() + t.sum() + cat.sum()
    ag.backward_sync(loss)
    wv, cv, e = w.detach().numpy(), c.numpy(), np.exp(w.detach().numpy())
    np.testing.assert_allclose(w.grad.numpy(), e * (np.cos(e) + 2 * cv + wv + 1) + e, rtol=1e-12)


def _one_edge_graph(x: ag.Tensor, c: ag.Tensor) -> ag.Tensor:
    """Nodes of both forms: one edge in the slot (unary, with a constant, variadic, a
    product with one input that needs a gradient) and tuples."""
    h = x.sin() * c
    m = ag.functional.matmul(h.reshape(2, 2), c.reshape(2, 2))  # (a BLAS node, one edge)
    k = ag.functional.cat([m.reshape(4), c])
    return (k.tanh().sum() + (c * h).exp().sum() + (h * h).sum())


@pytest.mark.parametrize("engine", ["flat", "dynamic"])
def test_one_edge_nodes_give_the_same_gradients_on_every_path(engine: str, restore_engine) -> None:
    from conftest import DynamicEngine

    if engine == "dynamic":
        ag.autograd.set_engine(DynamicEngine())
    c = ag.from_numpy(np.linspace(0.5, 1.5, 4))
    x = _leaf(4, seed=13)
    assert gradcheck(lambda t: _one_edge_graph(t, c), (x,))
    ref = ag.autograd.grad_sync(_one_edge_graph(x, c), (x,))[0].numpy()  # pruned (apply_needed)
    ag.backward_sync(_one_edge_graph(x, c))
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-12)
    # hooks (the dynamic engine's router), retain_graph, create_graph (tensor mode)
    y = _one_edge_graph(x, c)
    seen = []
    y.grad_fn.next_functions[0][0].register_hook(lambda gi, go: seen.append(len(gi)))
    x.grad = None
    ag.backward_sync(y, retain_graph=True)
    ag.backward_sync(y)
    np.testing.assert_allclose(x.grad.numpy(), 2 * ref, rtol=1e-12)
    assert seen == [2, 2]
    (g,) = ag.autograd.grad_sync(_one_edge_graph(x, c), (x,), create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), ref, rtol=1e-12)
    assert gradcheck(lambda t: ag.autograd.grad_sync(_one_edge_graph(t, c), (t,), create_graph=True)[0], (x,))
    # called directly, a node with one edge gives a gradient per input
    node = (x * c).grad_fn
    out = node(ag.from_numpy(np.ones(4)))
    assert len(out) == 2 and out[1] is None
    np.testing.assert_allclose(out[0].numpy(), c.numpy())


# --- what a recorded chain holds per node ---------------------------------------------------
def _chain(n: int) -> ag.Tensor:
    """The deep workload's op cycle (sin, * c, tanh, + d) on one float, ``n`` ops."""
    x = ag.from_numpy(np.array([0.3], dtype=np.float32)).requires_grad_()
    c = ag.from_numpy(np.array([0.9999], dtype=np.float32))
    d = ag.from_numpy(np.array([-0.0001], dtype=np.float32))
    y = x
    for i in range(n):
        k = i & 3
        y = y.sin() if k == 0 else y * c if k == 1 else y.tanh() if k == 2 else y + d
    return y


def _held_per_node(n: int) -> float:
    """The bytes a recorded ``_chain(n)`` holds per node, by tracemalloc."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        y = _chain(n)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    ag.backward_sync(y.sum())  # (and the graph still runs)
    return held / n


def test_a_recorded_chain_of_tiny_ops_holds_few_bytes_per_node() -> None:
    """Per node of the cycle: the node and its sequence number, and for half of them a
    SavedTensor, its rule arguments, the tensor's version counter and its array (what
    bench/workloads/deep.py measures); no tuple of edges (Note [An OpNode's one edge in its
    slot]) nor of checks (Note [Shared one-entry checks]). A slot or an object per node
    more shows here."""
    from asyncgrad.ops import kernels

    n = 20_000  # (enough that numpy's cache of small blocks cannot hide the arrays)
    ag.backward_sync(_chain(4000).sum())  # warm-up: caches, interned metadata
    # tracemalloc counts every thread's allocations: the compiled kernels' loader (started
    # by the first op) must be done, and the least of two counts leaves out whatever another
    # thread allocated during one of them
    kernels.wait(120)
    per_node = min(_held_per_node(n), _held_per_node(n))
    assert per_node < 320, f"{per_node:.0f} bytes per node"


# --- rare per-node data, interned constants ---------------------------------------------------
def test_a_nodes_metadata_lives_with_its_hooks_and_changes_no_gradient() -> None:
    """Note [Rare per-node data]: no slot of its own; a node with metadata runs as before."""
    assert "_extra" not in Node.__slots__
    x = _leaf(4, seed=8)
    y = x.sin() * 2.0
    node = y.grad_fn.next_functions[0][0]
    assert node._hooks is None and node.anomaly_trace is None  # reading makes nothing
    node.metadata["tag"] = "sin"
    assert node.metadata == {"tag": "sin"} and node._hooks is not None
    assert not node._hooks.pre and not node._hooks.post
    ag.backward_sync(y.sum())
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.cos(x.detach().numpy()), rtol=1e-12)
    assert gradcheck(lambda t: t.sin() * 2.0, (x.detach().requires_grad_(),))


def test_nodes_of_one_op_and_signature_share_params_and_work() -> None:
    """Note [Interned node constants]."""
    from asyncgrad.autograd.graph.record import _interned_params

    x = _leaf(30, 40, seed=9)
    a, b = x.sum(dim=1), (x * 2.0).sum(dim=1)
    assert a.grad_fn.params == {"dim": (1,), "keepdim": False, "shape": (30, 40)}
    assert a.grad_fn.params is b.grad_fn.params
    p, q = x.exp(), x.exp()  # work: the gradient's and the saved output's elements
    assert p.grad_fn.work == q.grad_fn.work == 2400 and p.grad_fn.work is q.grad_fn.work
    # values compared exactly: a bool is not an int, a float or an array is never interned
    one, true = _interned_params({"k": 1}), _interned_params({"k": True})
    assert one is not true and type(true["k"]) is bool and _interned_params({"k": 1}) is one
    f = {"lo": 1.0}
    assert _interned_params(f) is f and _interned_params({"lo": 1.0}) is not f
    arr = {"index": np.arange(3)}
    assert _interned_params(arr) is arr
    mixed = {"dims": (1, True)}
    assert _interned_params(mixed) is mixed and _interned_params({"dims": (1, True)}) is not mixed
    ag.backward_sync((a + b).sum() + (p + q).sum())
    np.testing.assert_allclose(x.grad.numpy(), 3.0 + 2 * np.exp(x.detach().numpy()), rtol=1e-12)
    assert gradcheck(lambda t: t.sum(dim=1) + (t * 2.0).sum(dim=1), (_leaf(3, 4, seed=10),))
