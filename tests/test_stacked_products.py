"""Stacked matrix products (ops/linalg.py): the right operand copied row-major first
(Note [Stacked products]), gradients written in their input's memory layout (Note
[Gradients in their input's layout]), and a product's leaf gradients in one kernel
(Note [One kernel for a product's leaves] in autograd/task/split_node.py). Values against
the plain numpy products, against torch where installed, and finite differences."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, set_engine
from asyncgrad.autograd import gradcheck
from asyncgrad.ops import linalg
from asyncgrad.ops._array_math import ARRAY_MATH

DTYPES = [np.float32, np.float64]
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def _heads(dtype: Any, B: int = 3, T: int = 5, C: int = 8, H: int = 2, seed: int = 0) -> tuple[Any, ...]:
    """q, k, v as attention makes them: transposed views of slices of one (B, T, 3C) array."""
    qkv = np.random.default_rng(seed).standard_normal((B, T, 3 * C)).astype(dtype)
    return tuple(qkv[:, :, i * C:(i + 1) * C].reshape(B, T, H, C // H).transpose(0, 2, 1, 3) for i in range(3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_stacked_product_with_a_transposed_right_operand_equals_numpys(dtype) -> None:
    q, k, _ = _heads(dtype)
    kt = k.swapaxes(-1, -2)
    assert kt.strides[-2] == kt.itemsize  # column-major matrices: copied first
    got = linalg._matmul(q, kt)
    np.testing.assert_allclose(got, np.matmul(q, kt), rtol=TOL[dtype], atol=TOL[dtype])
    assert got.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_of_attention_products_keep_their_inputs_layout(dtype) -> None:
    """dq of q @ k^T and dv of att @ v come back in the memory order of q and v (views of
    one (B, T, 3C) array): the backward's transpose + reshape of them are views. The
    values are the plain numpy rule's."""
    q, k, v = _heads(dtype)
    kt = k.swapaxes(-1, -2)
    rng = np.random.default_rng(1)
    g = rng.standard_normal((3, 2, 5, 5)).astype(dtype)
    m = ARRAY_MATH
    dq = linalg._matmul_rule_x(m, g, None, q, kt)
    dkt = linalg._matmul_rule_y(m, g, None, q, kt)
    np.testing.assert_allclose(dq, g @ k, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(dkt, q.swapaxes(-1, -2) @ g, rtol=TOL[dtype], atol=TOL[dtype])
    assert dq.base is None and dkt.base is None  # fresh arrays (they may become .grad without a copy)
    for grad in (dq, dkt.swapaxes(-1, -2)):  # (B, H, T, hs), as q and k
        assert grad.transpose(0, 2, 1, 3).flags.c_contiguous  # (B, T, H, hs) in memory
    att = rng.standard_normal((3, 2, 5, 5)).astype(dtype)
    gy = rng.standard_normal((3, 2, 5, 4)).astype(dtype)
    dv = linalg._matmul_rule_y(m, gy, None, att, v)
    np.testing.assert_allclose(dv, att.swapaxes(-1, -2) @ gy, rtol=TOL[dtype], atol=TOL[dtype])
    assert dv.transpose(0, 2, 1, 3).flags.c_contiguous
    da = linalg._matmul_rule_x(m, gy, None, att, v)
    np.testing.assert_allclose(da, gy @ v.swapaxes(-1, -2), rtol=TOL[dtype], atol=TOL[dtype])
    assert da.flags.c_contiguous  # att is contiguous: so is its gradient


def test_broadcast_stacks_keep_the_plain_rule() -> None:
    """A batch dimension broadcast in the forward: the engine sums the gradient down."""
    rng = np.random.default_rng(2)
    a = ag.tensor(rng.standard_normal((1, 4, 3)), requires_grad=True)
    b = ag.tensor(rng.standard_normal((5, 3, 2)), requires_grad=True)
    assert gradcheck(lambda x, y: x @ y, (a, b))


def _attention(qkv: Any, B: int, T: int, C: int, H: int) -> Any:
    q, k, v = (qkv[:, :, i * C:(i + 1) * C].reshape((B, T, H, C // H)).transpose(1, 2) for i in range(3))
    att = (q @ k.transpose(-2, -1)).softmax(-1)
    return (att @ v).transpose(1, 2).reshape((B, T, C))


def test_attention_gradients_match_finite_differences() -> None:
    qkv = ag.tensor(np.random.default_rng(3).standard_normal((2, 4, 12)), requires_grad=True)
    assert gradcheck(lambda x: _attention(x, 2, 4, 4, 2), (qkv,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_gradients_match_torch(dtype) -> None:
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(4).standard_normal((2, 6, 24)).astype(dtype)
    g = np.random.default_rng(5).standard_normal((2, 6, 8)).astype(dtype)
    x = ag.tensor(data, requires_grad=True)
    asyncio.run(ag.backward(_attention(x, 2, 6, 8, 2), ag.tensor(g)))
    tx = torch.from_numpy(data.copy()).requires_grad_()
    B, T, C, H = 2, 6, 8, 2
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in tx.split(C, dim=2))
    y = ((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    y.backward(torch.from_numpy(g))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)




def test_a_linear_layers_weight_and_bias_gradients_share_one_kernel(blas_single, restore_engine) -> None:
    """A linear layer between two nodes, split: dx on one worker kernel, dW and db on
    another (two hops, not three); the gradients equal the inline engine's."""
    rng = np.random.default_rng(6)
    x = ag.tensor(rng.standard_normal((16, 8)), requires_grad=True)
    w = ag.tensor(rng.standard_normal((4, 8)), requires_grad=True)
    b = ag.tensor(rng.standard_normal(4), requires_grad=True)
    loss = ag.nn.functional.linear(x.tanh(), w, b).tanh().sum()
    engine = Engine(inline_threshold=1, max_workers=2)
    set_engine(engine)
    before = engine.statistics().thread_hops
    asyncio.run(ag.backward(loss, retain_graph=True))
    hops = engine.statistics().thread_hops - before
    got = [t.grad.numpy().copy() for t in (x, w, b)]
    # the two tanh nodes hop once each, the layer twice
    assert hops == 4
    for t in (x, w, b):
        t.grad = None
    set_engine(Engine(inline_threshold=2**62))
    asyncio.run(ag.backward(loss))
    for g, t in zip(got, (x, w, b)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12)
