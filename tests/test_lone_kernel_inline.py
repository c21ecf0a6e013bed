"""Note [A lone kernel on an idle loop] (asyncgrad/autograd/sched/placement.py): a large
built-in node that would run as one kernel, alone in its backward, while nothing else
wants the event loop, runs inline on the default engine; a pending timer, a watched
socket, a second backward in flight, an explicit threshold or a custom Function send it
to a worker as before. Observed through the engine's statistics; gradients are the
reference executor's either way. runtime/loop_idle.py's answers are checked directly."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import Engine
from asyncgrad.autograd.function import Function
from asyncgrad.autograd.runtime.loop_idle import loop_is_idle
from asyncgrad.autograd.tools.reference import ReferenceEngine


def _conv() -> tuple[ag.Tensor, list[ag.Tensor]]:
    """A conv2d layer's output (one ConvolutionBackward0 node above the threshold)."""
    rng = np.random.default_rng(3)
    x = ag.from_numpy(rng.standard_normal((16, 16, 32, 32))).requires_grad_()
    w = ag.from_numpy(rng.standard_normal((16, 16, 3, 3)) * 0.1).requires_grad_()
    y = AF.conv2d(x, w, padding=1)
    assert y.grad_fn.work >= Engine().inline_threshold
    return y.sum(), [x, w]


def _run(engine: Any, beside: str = "", backend: str = "asyncio") -> tuple[list[np.ndarray], int, int]:
    """One backward of ``_conv`` on ``engine``, ``beside`` something on the loop; returns
    the gradients and the nodes offloaded and thread hops it made."""
    loss, leaves = _conv()
    ag.autograd.set_engine(engine)
    before = engine.statistics() if isinstance(engine, Engine) else None

    async def main() -> None:
        if beside == "timer":
            timer = asyncio.get_running_loop().call_later(3600, lambda: None)
            try:
                await ag.backward(loss)
            finally:
                timer.cancel()
        elif beside == "socket":
            a, b = socket.socketpair()
            loop = asyncio.get_running_loop()
            loop.add_reader(a.fileno(), lambda: None)
            try:
                await ag.backward(loss)
            finally:
                loop.remove_reader(a.fileno())
                a.close()
                b.close()
        elif beside == "sleeper":  # trio: a task asleep in the loop, its deadline pending
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.sleep, 3600)
                await anyio.wait_all_tasks_blocked()  # (asleep: its deadline is pending)
                await ag.backward(loss)
                tg.cancel_scope.cancel()
        else:
            await ag.backward(loss)

    anyio.run(main, backend=backend)
    grads = [t.grad.numpy() for t in leaves]
    if before is None:
        return grads, 0, 0
    after = engine.statistics()
    return grads, after.nodes_offloaded - before.nodes_offloaded, after.thread_hops - before.thread_hops


def _reference() -> list[np.ndarray]:
    return _run(ReferenceEngine())[0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_lone_large_node_on_an_idle_loop_runs_inline(backend, restore_engine):
    grads, offloaded, hops = _run(Engine(max_workers=2), backend=backend)
    assert (offloaded, hops) == (0, 0)
    for a, b in zip(grads, _reference()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("beside, backend", [("timer", "asyncio"), ("socket", "asyncio"), ("sleeper", "trio")])
def test_a_loop_that_others_want_still_gets_the_hop(beside, backend, restore_engine):
    grads, offloaded, hops = _run(Engine(max_workers=2), beside, backend)
    assert offloaded == 1 and hops >= 1
    for a, b in zip(grads, _reference()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_an_explicit_threshold_is_a_hard_rule(restore_engine):
    engine = Engine(max_workers=2, inline_threshold=Engine().inline_threshold)
    _, offloaded, hops = _run(engine)
    assert offloaded == 1 and hops >= 1


def test_two_backward_calls_in_flight_hop(restore_engine):
    """A second backward call in flight: each large node goes to a worker."""
    engine = Engine(max_workers=2)
    ag.autograd.set_engine(engine)
    losses = [_conv()[0] for _ in range(2)]
    before = engine.statistics().nodes_offloaded

    async def main() -> None:
        await asyncio.gather(*(ag.backward(loss) for loss in losses))

    asyncio.run(main())
    assert engine.statistics().nodes_offloaded - before == 2


def test_a_custom_functions_backward_still_hops(restore_engine):
    threads: list[int] = []

    class Double(Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            threads.append(threading.get_ident())
            return g * 2

    engine = Engine(max_workers=2)
    ag.autograd.set_engine(engine)
    x = ag.randn(engine.inline_threshold + 10, requires_grad=True)
    asyncio.run(ag.backward(Double.apply(x).sum()))
    assert threads and threads[0] != threading.get_ident()


# --- runtime/loop_idle.py ------------------------------------------------------------------

def test_loop_is_idle_reads_the_loops_state():
    assert not loop_is_idle()  # off any loop

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        seen = [loop_is_idle()]
        timer = loop.call_later(3600, lambda: None)
        seen.append(loop_is_idle())
        timer.cancel()
        seen.append(loop_is_idle())  # (a cancelled timer wants nothing)
        handle = loop.call_soon(lambda: None)
        seen.append(loop_is_idle())
        handle.cancel()
        await asyncio.sleep(0)
        a, b = socket.socketpair()
        loop.add_reader(a.fileno(), lambda: None)
        seen.append(loop_is_idle())
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
        seen.append(loop_is_idle())
        return seen

    assert asyncio.run(main()) == [True, False, True, False, False, True]


def test_loop_is_idle_on_trio():
    trio = pytest.importorskip("trio")
    from trio.testing import wait_all_tasks_blocked

    async def main() -> list[bool]:
        seen = [loop_is_idle()]
        a, b = socket.socketpair()
        for waits in (trio.sleep_forever, lambda: trio.sleep(3600), lambda: trio.lowlevel.wait_readable(a)):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waits)
                await wait_all_tasks_blocked()
                seen.append(loop_is_idle())  # a task asleep with no deadline; until a deadline; on a socket
                nursery.cancel_scope.cancel()
            seen.append(loop_is_idle())
        a.close()
        b.close()
        return seen

    assert trio.run(main) == [True, True, True, False, True, False, True]


def _two_layers(hidden: int) -> tuple[Any, list[ag.Tensor]]:
    """``linear(relu(linear(x, w1)), w2)`` on 512 rows of 512 features, ``hidden`` between;
    the last product is above the threshold."""
    rng = np.random.default_rng(4)
    x = ag.from_numpy(rng.standard_normal((512, 512))).requires_grad_()
    w1 = ag.from_numpy(rng.standard_normal((hidden, 512)) / 20).requires_grad_()
    w2 = ag.from_numpy(rng.standard_normal((512, hidden)) / 20).requires_grad_()

    def loss() -> Any:
        h = AF.linear(x, w1).relu()
        y = AF.linear(h, w2)
        assert y.grad_fn.work >= Engine().inline_threshold
        return y.sum(), h.grad_fn.work

    return loss, [x, w1, w2]


def _two_layer_run(eng: Any, hidden: int) -> tuple[list[np.ndarray], int]:
    loss, leaves = _two_layers(hidden)
    ag.autograd.set_engine(eng)
    out, relu_work = loss()
    asyncio.run(ag.backward(out))
    return [t.grad.numpy() for t in leaves], relu_work


@pytest.mark.parametrize("hidden, hops", [(128, 1), (1024, 0)])
def test_a_chain_with_light_nodes_hops_one_of_heavy_nodes_runs_inline(hidden, hops, blas_threaded, restore_engine):
    """The last layer heads a worker chain through the ReLU and the first layer: one hop
    when the ReLU is a light node (128 hidden features), none when every node of the
    chain is heavy (1024: an MLP's layers)."""
    from asyncgrad.autograd.sched.placement import MID_WORK

    engine = Engine(max_workers=2)
    got, relu_work = _two_layer_run(engine, hidden)
    assert (relu_work < MID_WORK) == (hops == 1)
    stats = engine.statistics()
    assert stats.thread_hops == hops and stats.nodes_offloaded == 3 * hops
    for a, b in zip(got, _two_layer_run(ReferenceEngine(), hidden)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
