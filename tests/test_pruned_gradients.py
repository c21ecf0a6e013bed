"""A pruned backward (``grad()``, ``inputs=``) computes only the gradients it needs
(``OpNode.apply_needed``, PyTorch's ``task_should_compute_output``): a saliency map's
``grad(loss, x)`` through linear layers computes no weight gradient. Values are those of
a full backward."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.ops import linalg
from asyncgrad.nn.functional import linear


@pytest.fixture
def weight_rule_calls() -> Any:
    """Counts calls of the linear layer's weight-gradient rule."""
    calls: list[int] = []
    spec = linalg.linear
    rule_x, rule_w, *rest = spec.vjps

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return rule_w(*args, **kwargs)

    object.__setattr__(spec, "vjps", (rule_x, counted, *rest))  # (a frozen dataclass)
    yield calls
    object.__setattr__(spec, "vjps", (rule_x, rule_w, *rest))


def _mlp(seed: int) -> tuple[ag.Tensor, ag.Tensor, list[ag.Tensor]]:
    rng = np.random.default_rng(seed)
    x = ag.from_numpy(rng.standard_normal((6, 5))).requires_grad_()
    ws = [ag.from_numpy(rng.standard_normal(s)).requires_grad_() for s in ((7, 5), (7,), (3, 7), (3,))]
    out = linear(linear(x, ws[0], ws[1]).tanh(), ws[2], ws[3])
    return (out * out).sum(), x, ws


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_grad_of_the_input_computes_no_weight_gradient(backend, weight_rule_calls):
    loss, x, ws = _mlp(0)
    (gx,) = anyio.run(lambda: ag.grad(loss, x, retain_graph=True), backend=backend)
    assert weight_rule_calls == []
    assert all(w.grad is None for w in ws)
    anyio.run(ag.backward, loss, backend=backend)  # a full backward computes them all
    assert len(weight_rule_calls) == 2
    np.testing.assert_allclose(gx.numpy(), x.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_backward_with_inputs_computes_only_what_leads_to_them(backend, weight_rule_calls):
    loss, x, ws = _mlp(1)
    anyio.run(lambda: ag.backward(loss, inputs=[ws[2]], retain_graph=True), backend=backend)
    assert len(weight_rule_calls) == 1  # the second layer's weight only
    assert x.grad is None and ws[0].grad is None and ws[1].grad is None and ws[3].grad is None
    want = ws[2].grad.numpy().copy()
    ws[2].grad = None
    anyio.run(ag.backward, loss, backend=backend)
    np.testing.assert_allclose(want, ws[2].grad.numpy(), rtol=1e-12)


def test_a_post_hook_sees_none_for_a_pruned_edge():
    loss, x, ws = _mlp(2)
    seen: list[Any] = []
    node = loss.grad_fn.next_functions[0][0].next_functions[0][0]  # (the second linear layer)
    node.register_hook(lambda grad_inputs, grad_outputs: seen.append([g is None for g in grad_inputs]))
    anyio.run(ag.grad, loss, x)
    assert seen == [[False, True, True]]  # its input's gradient only: weight and bias pruned


def test_a_node_on_a_worker_computes_only_what_is_needed_too(weight_rule_calls, restore_engine):
    ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=0))  # (every node on a worker)
    loss, x, ws = _mlp(3)
    (gx,) = anyio.run(lambda: ag.grad(loss, x, retain_graph=True))
    assert ag.autograd.get_engine().statistics().nodes_offloaded > 0
    assert weight_rule_calls == []
    anyio.run(ag.backward, loss)
    np.testing.assert_allclose(gx.numpy(), x.grad.numpy(), rtol=1e-12)


def test_a_split_node_computes_only_its_needed_parts(weight_rule_calls, blas_single, restore_engine):
    """BLAS at one thread: a product's gradients are split into one kernel each, on
    workers (Policy.splits); the pruned edges get no kernel."""
    ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=0))
    loss, x, ws = _mlp(4)
    (gx,) = anyio.run(lambda: ag.grad(loss, x, retain_graph=True))
    assert weight_rule_calls == []
    anyio.run(ag.backward, loss)
    assert len(weight_rule_calls) == 2
    np.testing.assert_allclose(gx.numpy(), x.grad.numpy(), rtol=1e-12)
