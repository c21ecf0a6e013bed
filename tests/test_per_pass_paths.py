"""One small pass (issue 11) through the fused inline step (sched/inline.py), the
inline commit and linear's dtype check: gradients bit for bit the reference executor's in
float32 and float64 (over two backwards, so the second adds into ``.grad`` in place), the
version counts, casts into a ``.grad`` of another dtype, and the same errors. They pin what
any shortcut in those paths must keep (the shortcuts tried this session saved 1.6% of the
instructions of a pass and were not kept)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.tools.reference import ReferenceEngine
from asyncgrad.functional import linear


def _params(dtype: Any, seed: int = 3) -> list[ag.Tensor]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        out.append(ag.tensor((rng.standard_normal((16, 16)) / 4).astype(dtype), requires_grad=True))
        out.append(ag.tensor((rng.standard_normal(16) / 4).astype(dtype), requires_grad=True))
    return out


def _loss(ps: list[ag.Tensor], x: np.ndarray) -> ag.Tensor:
    """The benchmark's small MLP: linear + relu layers, then ``(h * h).mean()``."""
    h = ag.from_numpy(x)
    for i in range(3):
        h = linear(h, ps[2 * i], ps[2 * i + 1])
        if i < 2:
            h = h.relu()
    return (h * h).mean()


async def _grads(engine: Any, dtype: Any) -> list[tuple[np.ndarray, ag.Tensor, int]]:
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(engine)
    try:
        ps = _params(dtype)
        x = np.random.default_rng(5).standard_normal((8, 16)).astype(dtype)
        await ag.backward(_loss(ps, x))
        first = [p.grad for p in ps]
        await ag.backward(_loss(ps, x * 2))  # the second commit adds into .grad
        assert all(p.grad is g for p, g in zip(ps, first))  # the Tensors are kept
        return [(p.grad.numpy().copy(), p.grad, p.grad._version) for p in ps]
    finally:
        ag.autograd.set_engine(prev)


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
async def test_small_mlp_matches_the_reference_bit_for_bit(dtype):
    ref = await _grads(ReferenceEngine(), dtype)
    fast = await _grads(Engine(), dtype)
    for (a, _, va), (b, _, vb) in zip(fast, ref):
        assert a.dtype == b.dtype == np.dtype(dtype)
        assert a.tobytes() == b.tobytes()
        assert va == vb  # one in-place addition each


@pytest.mark.anyio
async def test_commit_adds_in_place_and_bumps_the_version():
    w = ag.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    x = ag.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    await ag.backward(linear(x, w).sum())
    g, arr, version = w.grad, w.grad.numpy(), w.grad._version
    await ag.backward(linear(x, w).sum())
    assert w.grad is g and w.grad.numpy() is arr  # added into the same array
    assert w.grad._version == version + 1
    np.testing.assert_array_equal(arr, 2 * np.tile(x.numpy().sum(0), (2, 1)))


@pytest.mark.anyio
async def test_commit_into_a_grad_of_another_dtype_casts():
    """A ``.grad`` whose array was replaced by one of another dtype is added into with
    numpy's unsafe cast, as before (the fast path takes only equal dtypes)."""
    w = ag.tensor(np.ones(4, np.float32), requires_grad=True)
    await ag.backward((w * 3.0).sum())
    w.grad.data = np.full(4, 0.5, np.float64)
    await ag.backward((w * 3.0).sum())
    assert w.grad.numpy().dtype == np.float64
    np.testing.assert_array_equal(w.grad.numpy(), np.full(4, 3.5))


@pytest.mark.anyio
async def test_the_fused_step_still_raises_on_a_modified_saved_tensor():
    w = ag.tensor(np.ones((4, 4)), requires_grad=True)
    h = linear(ag.tensor(np.ones((2, 4))), w).relu()
    loss = (h * h).mean()
    h.data[0, 0] = 5.0  # (not counted: .data is outside autograd)
    h.add_(1.0)  # counted: mul saved h
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        await ag.backward(loss)
    assert w.grad is None  # nothing committed


@pytest.mark.anyio
async def test_a_leaf_used_twice_gets_the_sum_in_an_array_it_owns():
    """Two gradients for one leaf: the second staging adds (stage_plain's sum), and the
    commit's ``.grad`` is neither gradient's array."""
    w = ag.tensor(np.full((2, 2), 2.0), requires_grad=True)
    x = ag.tensor(np.eye(2))
    loss = (linear(x, w) + linear(x * 2.0, w)).sum()
    await ag.backward(loss)
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 2), 3.0))
    await ag.backward((linear(x, w) + linear(x * 2.0, w)).sum())
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 2), 6.0))


def test_linear_dtype_mismatch_still_raises():
    x = ag.tensor(np.ones((2, 3), np.float64))
    w = ag.tensor(np.ones((4, 3), np.float32), requires_grad=True)
    b = ag.tensor(np.ones(4, np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):
        linear(x, w, b)
    with pytest.raises(RuntimeError, match="self and mat2 must have the same dtype"):
        linear(ag.tensor(np.ones((2, 3), np.float32)), w, ag.tensor(np.ones(4, np.float64)))
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
        linear(x, w)
