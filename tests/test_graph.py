"""The backward graph as users see it: ``grad_fn``, ``next_functions``, AccumulateGrad,
``sequence_nr``, and graphs deep enough to break anything recursive.

Ports the intent of the graph-structure cases (1-3) of
/work/shared/reference/pytorch_engine_semantics.md; API.md §4.
"""

import gc
import sys
import weakref

import numpy as np

import asyncgrad as ag
from asyncgrad.autograd.graph import AccumulateGrad, Node

UINT64_MAX = 2**64 - 1


def test_next_functions_of_binary_op_on_two_leaves():
    # case 1 (test_next_functions)
    x = ag.randn(5, 5, requires_grad=True)
    y = ag.randn(5, 5, requires_grad=True)
    a = x + y
    nf = a.grad_fn.next_functions
    assert isinstance(nf, tuple) and len(nf) == 2
    for (node, nr), leaf in zip(nf, (x, y)):
        assert isinstance(node, AccumulateGrad)
        assert node.name() == "AccumulateGrad"
        assert node.variable is leaf
        assert nr == 0
    assert nf[0][0] is not nf[1][0]


def test_next_functions_constant_operand_gives_invalid_edge():
    # case 1, second half: `a + 5` -> ((a.grad_fn, 0), (None, 0)); `x * w` with w constant (1.2)
    x = ag.randn(3, requires_grad=True)
    y = ag.randn(3, requires_grad=True)
    a = x + y
    b = a + 5
    nf = b.grad_fn.next_functions
    assert nf[0][0] is a.grad_fn and nf[0][1] == 0
    assert nf[1] == (None, 0)

    w = ag.randn(3)  # does not require grad
    nf = (x * w).grad_fn.next_functions
    assert isinstance(nf[0][0], AccumulateGrad) and nf[0][1] == 0
    assert nf[1] == (None, 0)


def test_grad_fn_is_a_stable_node_with_metadata():
    x = ag.randn(3, requires_grad=True)
    y = x.exp()
    assert isinstance(y.grad_fn, Node)
    assert y.grad_fn is y.grad_fn
    assert y.grad_fn.name() == "ExpBackward0"
    y.grad_fn.metadata["tag"] = 1
    assert y.grad_fn.metadata == {"tag": 1}


def test_leaves_and_untracked_results_have_no_grad_fn():
    # 1.4: leaves have no grad_fn; ops on non-requiring inputs or under no_grad make leaves
    x = ag.randn(3, requires_grad=True)
    c = ag.randn(3)
    assert x.grad_fn is None and x.is_leaf
    z = c * 2
    assert z.grad_fn is None and not z.requires_grad and z.is_leaf
    with ag.no_grad():
        w = x * 2
    assert w.grad_fn is None and not w.requires_grad and w.is_leaf


def test_accumulate_grad_is_shared_while_a_graph_holds_it():
    # case 2: (x*2) and (x*3) alive together share one AccumulateGrad
    x = ag.randn(3, requires_grad=True)
    a = x * 2
    b = x * 3
    acc = a.grad_fn.next_functions[0][0]
    assert acc is b.grad_fn.next_functions[0][0]
    assert acc.sequence_nr == UINT64_MAX
    assert acc.next_functions == ()
    assert acc.variable is x


def test_accumulate_grad_is_weakly_held_by_the_leaf():
    # 1.5: once every graph is gone, the node is gone too (the leaf keeps a weak ref)
    x = ag.randn(3, requires_grad=True)
    a = x * 2
    ref = weakref.ref(a.grad_fn.next_functions[0][0])
    del a
    gc.collect()
    assert ref() is None
    b = x * 2
    assert isinstance(b.grad_fn.next_functions[0][0], AccumulateGrad)


def test_sequence_nr_follows_creation_order():
    # case 3: y=x*2, z=y*w, y2=x*3 -> increasing sequence numbers
    x = ag.randn(3, requires_grad=True)
    w = ag.randn(3, requires_grad=True)
    y = x * 2
    z = y * w
    y2 = x * 3
    s = [t.grad_fn.sequence_nr for t in (y, z, y2)]
    assert s[0] < s[1] < s[2]
    assert all(isinstance(v, int) for v in s)
    assert all(v < UINT64_MAX for v in s)


def test_multi_output_edges_use_output_nr():
    # 1.3: each output of a forward op is a slot of its producer's input buffer; a
    # tensor's gradient edge is (grad_fn, output_nr)
    x = ag.randn(4, requires_grad=True)
    y = x * 2
    z = y * y
    nf = z.grad_fn.next_functions
    assert nf[0] == (y.grad_fn, y.output_nr) == nf[1]


async def test_deep_chain_builds_runs_and_frees_without_recursion():
    """A 100,000-node chain: building, backward (no recursion in the engine) and freeing
    (no recursive dealloc crash), with a small recursion limit to catch any recursion."""
    n = 100_000
    x = ag.tensor([0.5], requires_grad=True)
    w = ag.tensor([2.0], requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.00001
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        out = (y * w).sum()
        (gx,) = await ag.grad(out, x, retain_graph=True)  # the pruning walk
        await ag.backward(out)
        ref = weakref.ref(y.grad_fn)
        del y, out
        gc.collect()
    finally:
        sys.setrecursionlimit(old)
    assert ref() is None
    np.testing.assert_allclose(gx.numpy(), [2 * 1.00001**n], rtol=1e-9)
    np.testing.assert_allclose(x.grad.numpy(), [2 * 1.00001**n], rtol=1e-9)


def test_deep_chain_freed_without_running_backward():
    n = 100_000
    x = ag.tensor([0.5], requires_grad=True)
    y = x
    for _ in range(n):
        y = y.sin()
    ref = weakref.ref(y.grad_fn)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        del y
        gc.collect()
    finally:
        sys.setrecursionlimit(old)
    assert ref() is None

