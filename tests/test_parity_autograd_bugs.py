"""PyTorch parity: the autograd semantics issue 32 found differing from PyTorch 2.13, one
section per bug. Each test states what PyTorch does (checked against torch 2.13)."""

import gc
import weakref

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.threads import running_graph_task
from asyncgrad.utils.checkpoint import checkpoint


# --- 1. a checkpoint's graph is freed by reference counting -------------------------------

def _checkpointed_backward(use_reentrant):
    """Backward through a checkpoint whose function saves its own output (exp); weak
    references to what the recomputation made: exp's output, and (reentrant) the nested
    backward's GraphTask."""
    refs = []
    calls = []

    def fn(a):
        b = a.exp()  # ExpBackward0 saves its output
        calls.append(1)
        if len(calls) == 2:  # the recomputation in backward
            refs.append(weakref.ref(b))
            if use_reentrant:
                b.register_hook(lambda g: refs.append(weakref.ref(running_graph_task())))
        return b.sin()

    x = ag.ones(3, requires_grad=True)
    y = checkpoint(fn, x * 2, use_reentrant=use_reentrant)
    refs.append(weakref.ref(y.grad_fn))
    y.sum().backward()
    del y
    return x, refs, len(calls)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_checkpoint_and_its_recomputation_are_freed_without_the_garbage_collector(use_reentrant):
    gc.collect()
    gc.disable()
    try:
        x, refs, calls = _checkpointed_backward(use_reentrant)
        assert calls == 2
        assert len(refs) == (3 if use_reentrant else 2)
        assert [r() is not None for r in refs] == [False] * len(refs)
        assert np.allclose(x.grad.numpy(), 2 * np.exp(2) * np.cos(np.exp(2)))
    finally:
        gc.enable()


# --- 3. ctx.saved_tensors returns the saved object inside a non-reentrant checkpoint ------

def test_saved_tensors_is_the_saved_object_inside_a_non_reentrant_checkpoint():
    """PyTorch: a saved tensor outside the graph comes back as the same object, with or
    without checkpoint (its recomputation keeps such tensors as they are)."""
    unpacked = []

    class SaveSecond(ag.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x * 1

        @staticmethod
        def backward(ctx, g):
            unpacked.append(ctx.saved_tensors[0])
            return g, None

    a = ag.tensor(2.0, requires_grad=True)
    b = ag.tensor(1.0)
    SaveSecond.apply(a, b).backward()
    checkpoint(SaveSecond.apply, a, b, use_reentrant=False).backward()
    assert [t is b for t in unpacked] == [True, True]
    assert a.grad.item() == 2.0
