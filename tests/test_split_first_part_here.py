"""A small split node's first gradient computed on the loop (Note [The loop takes a
small split's first part] in autograd/task/split_node.py): its other gradients go to a
worker meanwhile, one thread hop instead of one per gradient; gradients as finite
differences. Observed through the engine's thread hops."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

import asyncgrad as ag
from asyncgrad.autograd import Engine, set_engine
from asyncgrad.autograd import gradcheck
from asyncgrad.autograd.task import split_node




def _hops(engine: Engine, loss: ag.Tensor) -> int:
    before = engine.statistics().thread_hops
    set_engine(engine)
    asyncio.run(ag.backward(loss, retain_graph=True))
    return engine.statistics().thread_hops - before


def _leaves(seed: int, *shapes: tuple[int, ...]) -> list[ag.Tensor]:
    rng = np.random.default_rng(seed)
    return [ag.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]


def test_a_small_split_product_computes_its_first_gradient_on_the_loop(blas_single, restore_engine,
                                                                       monkeypatch: Any) -> None:
    """att @ v, float64: each half of the node is below the threshold, the whole above
    it. The first gradient runs on the loop's thread, the second on a worker: one hop
    (two without the rule); the gradients match finite differences."""
    a, v = _leaves(0, (4, 6, 6), (4, 6, 3))
    loss = (a @ v).sum()
    work = loss.grad_fn.next_functions[0][0].work
    engine = Engine(inline_threshold=work // 2 + 1, max_workers=2)
    threads: list[bool] = []
    apply_edges = split_node.apply_edges

    def spy(node: Any, group: list[int], *args: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return apply_edges(node, group, *args)

    monkeypatch.setattr("asyncgrad.autograd.sched.offload.apply_edges", spy)
    assert _hops(engine, loss) == 1
    assert sorted(threads) == [False, True]  # one part on the loop, one on a worker
    ga, gv = a.grad.numpy().copy(), v.grad.numpy().copy()
    np.testing.assert_allclose(ga, np.ones((4, 6, 3)) @ v.detach().numpy().transpose(0, 2, 1))
    np.testing.assert_allclose(gv, a.detach().numpy().transpose(0, 2, 1) @ np.ones((4, 6, 3)))
    set_engine(engine)
    assert gradcheck(lambda x, y: x @ y, (a, v))


def test_a_split_product_goes_wholly_to_workers_when_its_halves_are_large(blas_single,
                                                                          restore_engine) -> None:
    """Each half at or above the threshold: both gradients on workers, two hops."""
    a, v = _leaves(1, (4, 6, 6), (4, 6, 3))
    loss = (a @ v).sum()
    work = loss.grad_fn.next_functions[0][0].work
    assert _hops(Engine(inline_threshold=work // 2, max_workers=2), loss) == 2


def test_the_loop_keeps_out_of_a_split_while_other_nodes_are_ready_or_in_flight(blas_single,
                                                                                restore_engine) -> None:
    """Two products ready at once: the first starts while the second is ready, the second
    while the first is in flight; neither takes a part on the loop (four hops), and the
    gradients are those of the inline engine."""
    a, v, b, w = _leaves(2, (4, 6, 6), (4, 6, 3), (4, 6, 6), (4, 6, 3))
    loss = (a @ v).sum() + (b @ w).sum()
    work = (a @ v).grad_fn.work
    assert _hops(Engine(inline_threshold=work // 2 + 1, max_workers=2), loss) == 4
    got = [t.grad.numpy().copy() for t in (a, v, b, w)]
    for t in (a, v, b, w):
        t.grad = None
    set_engine(Engine(inline_threshold=2**62))
    asyncio.run(ag.backward(loss))
    for g, t in zip(got, (a, v, b, w)):
        np.testing.assert_allclose(g, t.grad.numpy())
