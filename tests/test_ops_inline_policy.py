"""Where the default engine runs a node (Note [Inline or offload] in sched/placement.py): the
per-token nodes of a small transformer inline, a matrix product weighed by its
multiply-adds, and a commit into fresh leaves without a worker hop. Observed through
the engine's statistics and which function the engine sends to a worker."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd.task import commit
from asyncgrad.autograd.engine import DEFAULT_INLINE_THRESHOLD, Engine
from asyncgrad.autograd.graph.record import MULTIPLY_ADDS_PER_ELEMENT


def _backward_on(engine: Engine, out: ag.Tensor, grad: ag.Tensor | None = None) -> tuple[int, int]:
    """``await backward`` on ``engine``, on a loop with a timer pending (something else
    wants it: a lone large node on an idle loop runs inline, Note [A lone kernel on an
    idle loop] in sched/placement.py); returns (nodes offloaded, thread hops) it made."""

    async def beside_a_timer() -> None:
        timer = asyncio.get_running_loop().call_later(3600, lambda: None)
        try:
            await ag.backward(out, grad)
        finally:
            timer.cancel()

    before = engine.statistics()
    previous = ag.autograd.get_engine()
    ag.autograd.set_engine(engine)
    try:
        asyncio.run(beside_a_timer())
    finally:
        ag.autograd.set_engine(previous)
    after = engine.statistics()
    return after.nodes_offloaded - before.nodes_offloaded, after.thread_hops - before.thread_hops


@pytest.mark.parametrize("op", ["gelu", "softmax", "layer_norm", "tanh"])
def test_gpt_small_per_token_nodes_run_inline_by_default(op: str) -> None:
    """GPT-small sizes (batch 16, block 64, 128 dims, 4 heads): GELU on 16x64x512,
    softmax on 16x4x64x64, layer norm on 16x64x128; no thread hop for any of them."""
    rng = np.random.default_rng(0)
    shape = {"gelu": (16, 64, 512), "softmax": (16, 4, 64, 64), "layer_norm": (16, 64, 128),
             "tanh": (16, 64, 512)}[op]
    x = ag.from_numpy(rng.standard_normal(shape).astype(np.float32)).requires_grad_()
    fns: dict[str, Any] = {"gelu": AF.gelu, "softmax": lambda t: AF.softmax(t, -1),
                           "layer_norm": lambda t: AF.layer_norm(t, 128), "tanh": ag.tanh}
    y = fns[op](x)
    assert y.grad_fn.work < DEFAULT_INLINE_THRESHOLD
    offloaded, hops = _backward_on(Engine(), y, ag.ones_like(y))
    assert (offloaded, hops) == (0, 0)
    assert x.grad is not None and x.grad.shape == shape


def test_a_matrix_product_is_weighed_by_its_multiply_adds() -> None:
    """A product that reads fewer elements than the threshold but computes many
    multiply-adds goes to a worker; its gradients are still right."""
    rng = np.random.default_rng(1)
    x = ag.from_numpy(rng.standard_normal((64, 2048)).astype(np.float32)).requires_grad_()
    w = ag.from_numpy(rng.standard_normal((512, 2048)).astype(np.float32)).requires_grad_()
    y = AF.linear(x, w)
    reads = y.numel() + x.numel() + w.numel()
    assert reads < DEFAULT_INLINE_THRESHOLD
    assert y.grad_fn.work == reads + y.numel() * 2048 // MULTIPLY_ADDS_PER_ELEMENT
    g = ag.from_numpy(rng.standard_normal((64, 512)).astype(np.float32))
    offloaded, hops = _backward_on(Engine(), y, g)
    assert offloaded >= 1 and hops >= 1
    np.testing.assert_allclose(x.grad.numpy(), g.numpy() @ w.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(w.grad.numpy(), g.numpy().T @ x.numpy(), rtol=1e-4, atol=1e-3)


def test_large_commit_sums_on_a_worker_only_when_there_is_something_to_add(monkeypatch: Any) -> None:
    """A leaf's first ``.grad`` is the staged array itself: no worker hop for it. The same
    backward into an existing ``.grad`` adds on a worker (commit.sum_fresh), and the
    result is the sum."""
    engine = Engine(inline_threshold=1000)
    summed: list[int] = []
    real = commit.sum_fresh

    def counting(task: Any) -> Any:
        summed.append(1)
        return real(task)

    monkeypatch.setattr(commit, "sum_fresh", counting)
    x = ag.from_numpy(np.arange(5000, dtype=np.float64)).requires_grad_()
    _backward_on(engine, (x * 2.0).sum())
    assert summed == []  # fresh leaf: published in place, on the loop
    np.testing.assert_array_equal(x.grad.numpy(), np.full(5000, 2.0))
    _backward_on(engine, (x * 3.0).sum())
    assert summed == [1]  # an existing .grad: the addition went to a worker
    np.testing.assert_array_equal(x.grad.numpy(), np.full(5000, 5.0))


def test_layer_norm_counts_its_reads_at_its_cost_factor() -> None:
    """layer_norm's work is 0.7 of the elements its backward reads (Note [Layer norm's
    cost factor] in ops/nn.py): at the ops table's large size (B32 T128 C256, ~1M
    elements) it runs inline; at twice that it still goes to a worker. Gradients are
    the same either way."""
    from asyncgrad.ops.nn import LAYER_NORM_COST

    rng = np.random.default_rng(2)
    results = []
    for batch, expect_offloaded in ((32, False), (64, True)):
        x = ag.from_numpy(rng.standard_normal((batch, 128, 256)).astype(np.float32)).requires_grad_()
        w = ag.from_numpy(rng.standard_normal(256).astype(np.float32)).requires_grad_()
        b = ag.from_numpy(rng.standard_normal(256).astype(np.float32)).requires_grad_()
        y = AF.layer_norm(x, (256,), w, b)
        reads = y.numel() + x.numel() + w.numel()
        assert y.grad_fn.work == int(reads * LAYER_NORM_COST)
        assert (y.grad_fn.work >= DEFAULT_INLINE_THRESHOLD) == expect_offloaded
        g = ag.from_numpy(rng.standard_normal(y.shape).astype(np.float32))
        offloaded, _ = _backward_on(Engine(), y, g)
        assert (offloaded > 0) == expect_offloaded
        results.append((x, w, b, g))
    x, w, b, g = results[0]
    x2, w2, b2 = (ag.from_numpy(t.detach().numpy().copy()).requires_grad_() for t in (x, w, b))
    _backward_on(Engine(inline_threshold=1), AF.layer_norm(x2, (256,), w2, b2), g)
    for a, c in ((x, x2), (w, w2), (b, b2)):
        np.testing.assert_allclose(a.grad.numpy(), c.grad.numpy(), rtol=1e-5, atol=1e-5)
