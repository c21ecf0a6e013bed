"""Grad mode (API §2): context managers, decorators (sync, generator, async), the bare
``set_grad_enabled`` call, and context-locality across asyncio tasks and threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag

MODES: list[tuple[str, Callable[[], Any], bool]] = [
    ("no_grad", ag.no_grad, False),
    ("enable_grad", ag.enable_grad, True),
    ("set_grad_enabled_false", lambda: ag.set_grad_enabled(False), False),
    ("set_grad_enabled_true", lambda: ag.set_grad_enabled(True), True),
    ("inference_mode", ag.inference_mode, False),
    ("inference_mode_false", lambda: ag.inference_mode(False), True),
]
IDS = [m[0] for m in MODES]


@pytest.fixture(autouse=True)
def _restore_grad_mode() -> Iterator[None]:
    yield
    ag.set_grad_enabled(True)


def _records() -> bool:
    x = ag.tensor([1.0], requires_grad=True)
    return (x * 2).requires_grad


@pytest.mark.parametrize("name,make,mode", MODES, ids=IDS)
@pytest.mark.parametrize("outer", [True, False])
def test_context_manager(name: str, make: Callable[[], Any], mode: bool, outer: bool) -> None:
    ag.set_grad_enabled(outer)
    with make():
        assert ag.is_grad_enabled() is mode
        assert _records() is mode
    assert ag.is_grad_enabled() is outer
    assert _records() is outer


@pytest.mark.parametrize("name,make,mode", MODES, ids=IDS)
def test_context_manager_restores_on_exception(name: str, make: Callable[[], Any], mode: bool) -> None:
    with pytest.raises(ValueError):
        with make():
            raise ValueError
    assert ag.is_grad_enabled()


@pytest.mark.parametrize("name,make,mode", MODES, ids=IDS)
def test_decorator_on_function(name: str, make: Callable[[], Any], mode: bool) -> None:
    @make()
    def f(a: int, *, b: int) -> tuple[bool, int]:
        return ag.is_grad_enabled(), a + b

    for outer in (True, False):
        ag.set_grad_enabled(outer)
        assert f(1, b=2) == (mode, 3)
        assert ag.is_grad_enabled() is outer
        assert f.__name__ == "f"


@pytest.mark.parametrize("name,make,mode", MODES, ids=IDS)
def test_decorator_on_generator(name: str, make: Callable[[], Any], mode: bool) -> None:
    @make()
    def gen(n: int) -> Iterator[bool]:
        for _ in range(n):
            got = yield ag.is_grad_enabled()
            assert got is None or got == "ping"
        return "done"

    ag.set_grad_enabled(not mode)
    g = gen(3)
    seen = []
    for v in g:
        seen.append(v)
        # between items the caller's mode is in effect again
        assert ag.is_grad_enabled() is (not mode)
    assert seen == [mode] * 3
    g2 = gen(2)
    assert next(g2) is mode
    assert g2.send("ping") is mode
    with pytest.raises(StopIteration) as stop:
        g2.send("ping")
    assert stop.value.value == "done"


@pytest.mark.parametrize("name,make,mode", MODES, ids=IDS)
async def test_decorator_on_async_function(name: str, make: Callable[[], Any], mode: bool) -> None:
    @make()
    async def f(x: ag.Tensor) -> tuple[bool, bool]:
        before = ag.is_grad_enabled()
        await asyncio.sleep(0)
        y = x * 2
        return before and ag.is_grad_enabled(), y.requires_grad

    ag.set_grad_enabled(not mode)
    x = ag.tensor([1.0], requires_grad=True)
    enabled, recorded = await f(x)
    assert enabled is mode and recorded is mode
    assert ag.is_grad_enabled() is (not mode)


async def test_async_context_manager_use_inside_coroutine() -> None:
    x = ag.tensor([1.0], requires_grad=True)
    with ag.no_grad():
        await asyncio.sleep(0)
        y = x * 2
    assert not y.requires_grad
    z = x * 2
    assert z.requires_grad


def test_bare_set_grad_enabled_call_switches_mode() -> None:
    assert ag.is_grad_enabled()
    ag.set_grad_enabled(False)
    assert not ag.is_grad_enabled() and not _records()
    ag.set_grad_enabled(True)
    assert ag.is_grad_enabled() and _records()


def test_set_grad_enabled_as_decorator_does_not_change_mode_now() -> None:
    @ag.set_grad_enabled(False)
    def f() -> bool:
        return ag.is_grad_enabled()

    assert ag.is_grad_enabled()
    assert f() is False
    assert ag.is_grad_enabled()


def test_nesting() -> None:
    with ag.no_grad():
        with ag.enable_grad():
            assert _records()
            with ag.set_grad_enabled(False):
                assert not _records()
                with ag.inference_mode():
                    assert not ag.is_grad_enabled()
                    assert ag.is_inference_mode_enabled()
                assert not ag.is_inference_mode_enabled()
            assert ag.is_grad_enabled()
        assert not ag.is_grad_enabled()
    assert ag.is_grad_enabled()


def test_reused_context_manager_instance() -> None:
    ng = ag.no_grad()
    with ng:
        with ng:
            assert not ag.is_grad_enabled()
        assert not ag.is_grad_enabled()
    assert ag.is_grad_enabled()


def test_no_grad_outputs_are_leaves() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    with ag.no_grad():
        y = (x * 2).exp().sum()
        v = x[0]
    assert y.is_leaf and not y.requires_grad and y.grad_fn is None
    assert not v.requires_grad
    # a graph recorded before no_grad can still be backpropagated inside it
    z = (x * x).sum()
    with ag.no_grad():
        z.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


async def test_tasks_do_not_see_each_others_mode() -> None:
    seen: dict[str, list[bool]] = {"off": [], "on": []}
    step = asyncio.Event()

    async def off() -> None:
        with ag.no_grad():
            for _ in range(5):
                seen["off"].append(ag.is_grad_enabled() or _records())
                await asyncio.sleep(0)
            step.set()

    async def on() -> None:
        for _ in range(5):
            seen["on"].append(ag.is_grad_enabled() and _records())
            await asyncio.sleep(0)
        await step.wait()
        seen["on"].append(ag.is_grad_enabled())

    async def bare_switch() -> None:
        ag.set_grad_enabled(False)  # only this task's context
        await asyncio.sleep(0)
        assert not ag.is_grad_enabled()

    await asyncio.gather(off(), on(), bare_switch())
    assert seen["off"] == [False] * 5
    assert seen["on"] == [True] * 6
    assert ag.is_grad_enabled()


async def test_anyio_task_group_modes_are_independent() -> None:
    results: dict[int, list[bool]] = {}

    @ag.no_grad()
    async def worker_off(i: int) -> None:
        results[i] = []
        for _ in range(3):
            results[i].append(ag.is_grad_enabled())
            await anyio.sleep(0)

    async def worker_on(i: int) -> None:
        results[i] = []
        for _ in range(3):
            results[i].append(ag.is_grad_enabled())
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(worker_off if i % 2 else worker_on, i)
    assert results == {0: [True] * 3, 1: [False] * 3, 2: [True] * 3, 3: [False] * 3}


async def test_thread_offload_sees_offloading_task_mode() -> None:
    with ag.no_grad():
        inner = await anyio.to_thread.run_sync(ag.is_grad_enabled)
    assert inner is False
    assert await anyio.to_thread.run_sync(ag.is_grad_enabled) is True


def test_threads_start_with_default_mode() -> None:
    out: list[bool] = []
    with ag.no_grad():
        t = threading.Thread(target=lambda: out.append(ag.is_grad_enabled()))
        t.start()
        t.join()
    assert out == [True]


def test_backward_under_no_grad_and_create_graph() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = (x ** 3).sum()
    with ag.no_grad():
        (g,) = ag.grad_sync(y, [x], create_graph=True)  # create_graph records even under no_grad
    assert g.requires_grad
    (h,) = ag.grad_sync(g.sum(), [x])
    np.testing.assert_array_equal(h.numpy(), [6.0, 12.0])


async def test_bare_decorators_without_parentheses() -> None:
    @ag.no_grad
    def f() -> bool:
        return ag.is_grad_enabled()

    @ag.inference_mode
    async def g() -> bool:
        return ag.is_grad_enabled()

    with ag.no_grad():
        @ag.enable_grad
        def h() -> bool:
            return ag.is_grad_enabled()

        assert h() is True
    assert f() is False and await g() is False and f.__name__ == "f"
    assert ag.is_grad_enabled()
