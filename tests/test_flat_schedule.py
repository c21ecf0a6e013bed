"""Note [The flat schedule] (asyncgrad/autograd/task/schedule.py): a plain backward of small
built-in nodes runs from its nodes in descending sequence order, each gradient added into
its consumer's slot. It must give the dynamic engine's results bit for bit (the same sums
in the same order, the same ownership of ``.grad`` arrays, the same errors), hand over to
the dynamic engine at the first node it cannot run, yield the loop, and leave nothing
behind when cancelled. Values are real floats (not integers), so a sum in another order
would show in the last bits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.task import graph_task as graph_task_module
from asyncgrad.autograd.sched import inline as inline_module
from asyncgrad.autograd.task.schedule import CLOCK_AFTER_WORK
from asyncgrad.autograd.tools.reference import ReferenceEngine
from conftest import DynamicEngine

BACKENDS = ["asyncio", "trio"]
ENGINES = {"flat": Engine, "dynamic": DynamicEngine, "reference": ReferenceEngine}


@pytest.fixture
def schedules(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each backward's set-up made a flat schedule (True) or counted
    dependencies (False), in call order."""
    made: list[bool] = []
    real = graph_task_module.GraphTask.setup_steps

    def recorded(self: Any) -> Any:
        yield from real(self)
        made.append(self.schedule is not None)

    monkeypatch.setattr(graph_task_module.GraphTask, "setup_steps", recorded)
    return made


# --- graphs: each builder returns (loss, leaves) from a seeded generator -----------------
def _leaf(rng: np.random.Generator, *shape: int, dtype: Any = np.float64) -> ag.Tensor:
    return ag.from_numpy(rng.standard_normal(shape).astype(dtype)).requires_grad_()


def chain(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    x = _leaf(rng, 16, dtype=dtype)
    c = ag.from_numpy((1 + 0.01 * rng.standard_normal(16)).astype(dtype))
    y = x
    for i in range(60):
        y = [y.sin(), y * c, y.tanh(), y + c][i & 3]
    return y.sum(), [x]


def shared_uses(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    """One tensor used by five consumers (a sum of five in the slot, in arrival order), a
    leaf used three times, ``x * x`` on a leaf and on a non-leaf, broadcasting."""
    w, b = _leaf(rng, 4, 6, dtype=dtype), _leaf(rng, 6, dtype=dtype)
    h = (w * 1.5 + b).tanh()
    parts = [h.exp(), h * h, h.sin() * w, (h + b).relu(), h.mean() * w]
    y = parts[0]
    for p in parts[1:]:
        y = y + p
    return (y * y).sum() + (w * w).mean() + (b * b).sum(), [w, b]


def wide_mid(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    """Mid-size arrays (deferred sums of a shared gradient: Note [Deferred sums]) that
    still run inline: 67,600 floats, below the mid-size nodes' work, Note [Mid-size nodes
    hop beside another])."""
    x = _leaf(rng, 260, 260, dtype=dtype)
    y = sum(((x * float(k)).sin() for k in range(1, 4)), ag.zeros(260, 260, dtype=dtype))
    return (y * x).mean(), [x]


def mlp(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    x = _leaf(rng, 8, 5, dtype=dtype)
    w1, w2 = _leaf(rng, 7, 5, dtype=dtype), _leaf(rng, 3, 7, dtype=dtype)
    h = ag.nn.functional.linear(x, w1).relu()
    out = ag.nn.functional.linear(h, w2)
    return ag.nn.functional.cross_entropy(out, ag.tensor([0, 1, 2, 0, 1, 2, 0, 1])), [x, w1, w2]


def views_and_indexing(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    x = _leaf(rng, 6, 4, dtype=dtype)
    y = x.t().reshape(4, 6)[1:, ::2] * 2.0
    z = x[[0, 2, 2]].sum(0) + y.max()
    return (z * z).sum() + y.pow(3).mean(), [x]


GRAPHS = [chain, shared_uses, wide_mid, mlp, views_and_indexing]


def _run(engine_type: type[Engine], build: Callable[..., Any], dtype: Any, backend: str = "asyncio",
         seed: int = 0) -> list[np.ndarray]:
    ag.autograd.set_engine(engine_type())
    loss, leaves = build(np.random.default_rng(seed), dtype)
    anyio.run(ag.backward, loss, backend=backend)
    return [leaf.grad.numpy().copy() for leaf in leaves]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("build", GRAPHS, ids=lambda f: f.__name__)
def test_the_flat_schedule_gives_the_dynamic_engines_bits(build, dtype, backend, schedules, restore_engine):
    got = {name: _run(engine, build, dtype, backend) for name, engine in ENGINES.items()}
    assert schedules == [True, False, False]  # (the flat engine's call made one; the others did not)
    for a, b, ref in zip(got["flat"], got["dynamic"], got["reference"]):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
        # (the fused step adds ``t + t`` for ``x * x`` where the reference adds in arrival
        # order: Note [A tensor times itself]; the last bits may differ)
        np.testing.assert_allclose(a, ref, rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("build", GRAPHS, ids=lambda f: f.__name__)
def test_the_blocking_driver_runs_flat_too(build, schedules, restore_engine):
    ag.autograd.set_engine(Engine())
    loss, leaves = build(np.random.default_rng(1), np.float64)
    ag.backward_sync(loss)
    flat = [leaf.grad.numpy().copy() for leaf in leaves]
    want = _run(DynamicEngine, build, np.float64, "asyncio", seed=1)
    assert schedules[0] is True
    for a, b in zip(flat, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("build", GRAPHS, ids=lambda f: f.__name__)
def test_leaves_are_staged_in_the_dynamic_engines_order_and_ownership(build, backend, monkeypatch,
                                                                        restore_engine):
    """What the commit sees: the leaves in the order they were staged (the order the
    commit writes ``.grad`` and runs post-accumulate hooks), and which staged arrays
    the engine owns and may adopt without a copy (Note [Owned gradients])."""
    from asyncgrad.autograd.task import commit

    seen: list[list[tuple[int, bool]]] = []
    real = commit.commit_inline

    def recording(task: Any) -> None:
        order = {id(leaf): i for i, leaf in enumerate(current)}
        seen.append([(order[id(var)], var in task.owned) for var in task.staged])
        real(task)

    monkeypatch.setattr(commit, "commit_inline", recording)
    for engine_type in (Engine, DynamicEngine):
        ag.autograd.set_engine(engine_type())
        loss, current = build(np.random.default_rng(2), np.float64)
        anyio.run(ag.backward, loss, backend=backend)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert sorted(i for i, _ in seen[0]) == list(range(len(current)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_several_roots_run_flat(backend, schedules, restore_engine):
    def grads(engine_type: type[Engine]) -> list[np.ndarray]:
        ag.autograd.set_engine(engine_type())
        rng = np.random.default_rng(4)
        x = _leaf(rng, 5)
        a, b = x.sin() * 2.0, (x * x).exp()
        anyio.run(lambda: ag.backward([a, b], [ag.ones(5), ag.full((5,), 0.5)]), backend=backend)
        return [x.grad.numpy().copy()]

    np.testing.assert_array_equal(grads(Engine)[0], grads(DynamicEngine)[0])
    assert schedules[0] is True


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_backward_and_an_in_place_change_raise_as_in_the_dynamic_engine(backend, restore_engine):
    def errors(engine_type: type[Engine]) -> list[str]:
        ag.autograd.set_engine(engine_type())
        x = _leaf(np.random.default_rng(5), 4)
        loss = (x.sin() * 3.0).sum()
        anyio.run(ag.backward, loss, backend=backend)
        out = []
        with pytest.raises(RuntimeError) as second:
            anyio.run(ag.backward, loss, backend=backend)
        out.append(str(second.value))
        y = x * 2.0
        w = y.sin()
        with ag.no_grad():
            y.add_(1.0)  # y was saved by sin
        with pytest.raises(RuntimeError) as modified:
            anyio.run(ag.backward, (w * 3.0).sum(), backend=backend)
        out.append(str(modified.value))
        return out

    flat, dynamic = errors(Engine), errors(DynamicEngine)
    assert flat == dynamic
    assert "second time" in flat[0] and "modified by an inplace operation" in flat[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_graph_keeps_the_saved_values_and_release_frees_them(backend, restore_engine):
    ag.autograd.set_engine(Engine())
    x = _leaf(np.random.default_rng(6), 4)
    loss = (x.sin() * x.exp()).sum()
    anyio.run(lambda: ag.backward(loss, retain_graph=True), backend=backend)
    once = x.grad.numpy().copy()
    anyio.run(ag.backward, loss, backend=backend)  # the saved values were kept
    np.testing.assert_array_equal(x.grad.numpy(), 2 * once)
    assert loss.grad_fn.next_functions[0][0].saved is None  # released by the second


@pytest.mark.parametrize("where", ["near the root", "near the leaves"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hook_hands_the_walk_to_the_dynamic_engine(where, backend, schedules, restore_engine):
    """The walk stops at the first node it cannot run and the dynamic engine goes on from
    there, with what was counted: gradients and the hook's call are the reference's."""
    def run(engine_type: type[Engine]) -> tuple[list[Any], np.ndarray]:
        ag.autograd.set_engine(engine_type())
        log: list[Any] = []
        x = _leaf(np.random.default_rng(7), 6)
        y = x
        hooked = None
        for i in range(40):
            y = (y * 1.1).sin() if i % 2 else y + x
            if (i == 35 and where == "near the root") or (i == 2 and where == "near the leaves"):
                hooked = y
        assert hooked is not None
        hooked.register_hook(lambda g: log.append(float(g.sum())))
        anyio.run(ag.backward, (y * y).sum(), backend=backend)
        return log, x.grad.numpy().copy()

    (log, g), (ref_log, ref) = run(Engine), run(ReferenceEngine)
    assert schedules[0] is False
    assert log == ref_log and len(log) == 1
    np.testing.assert_allclose(g, ref, rtol=1e-12)


def _sin_product(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    x = _leaf(rng, 40, 40, dtype=dtype)
    return ((x * 2.0).sin() * x).sum(), [x]


def test_a_node_to_offload_hands_the_walk_to_the_dynamic_engine(schedules, restore_engine):
    class Offloading(Engine):
        def __init__(self) -> None:
            super().__init__(inline_threshold=1000)  # (40 x 40 nodes go to workers)

    got = _run(Offloading, _sin_product, np.float64, "asyncio")
    assert schedules == [False]
    np.testing.assert_array_equal(got[0], _run(ReferenceEngine, _sin_product, np.float64, "asyncio")[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_long_flat_backward_gives_the_loop_turns(backend, schedules, restore_engine):
    """yield_interval=0: every clock check ends the slice, so another task runs while a
    long flat backward is in progress, and the statistics show its progress. (2,000
    products: fused runs of RUN_MAX_NODES, the clock read after each: Note [Fused runs].)"""
    ag.autograd.set_engine(Engine(yield_interval=0.0))
    x = _leaf(np.random.default_rng(9), 8)
    y = x
    for _ in range(2000):
        y = y * 1.0001
    loss = y.sum()
    seen: list[Any] = []

    async def main() -> None:
        done = anyio.Event()

        async def other() -> None:
            while not done.is_set():
                seen.append(ag.autograd.get_engine().statistics().nodes_inline)
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            await anyio.sleep(0)
            await ag.backward(loss)
            done.set()

    anyio.run(main, backend=backend)
    assert schedules == [True]
    assert len(seen) > 5  # the loop ran the other task between slices
    np.testing.assert_allclose(x.grad.numpy(), np.full(8, 1.0001 ** 2000), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size, expected", [(2048, [8, 8, 8, 8, 8, 1]), (CLOCK_AFTER_WORK, [2] + [1] * 39),
                                            (8, [41])])
def test_the_clock_is_read_every_8_nodes_and_after_each_heavy_one(backend, size, expected, schedules,
                                                                  monkeypatch, restore_engine):
    """yield_interval=0: a slice of the core loop ends at its first clock check. It is
    read every 8 nodes, and in a schedule with a node of CLOCK_AFTER_WORK elements or
    more after each such node as well, and after each fused run (Note [Fused runs]: 8
    floats, the sum then one run of 40 products; 2,048 floats are too many for a run)."""
    ag.autograd.set_engine(Engine(yield_interval=0.0))
    slices: list[int] = []
    real = inline_module.run_flat

    def counted(task: Any, deadline: float) -> bool:
        pos = task.schedule.pos
        try:
            return real(task, deadline)
        finally:
            slices.append(task.schedule.pos - pos)

    monkeypatch.setattr(inline_module, "run_flat", counted)
    x = _leaf(np.random.default_rng(11), size)
    y = x
    for _ in range(40):
        y = y * 1.001
    anyio.run(ag.backward, y.sum(), backend=backend)
    assert schedules == [True]
    # 41 nodes, the sum (light) then 40 products: heavy ones end a slice each, a run too
    assert slices == expected
    np.testing.assert_allclose(x.grad.numpy(), np.full(size, 1.001 ** 40), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_flat_backward_cancelled_between_slices_changes_nothing(backend, restore_engine):
    ag.autograd.set_engine(Engine(yield_interval=0.0))
    x = _leaf(np.random.default_rng(10), 8)

    def loss() -> ag.Tensor:
        y = x
        for _ in range(2000):  # (4,000 nodes: fused runs of RUN_MAX_NODES, many slices)
            y = (y * 1.001).sin()
        return y.sum()

    async def main() -> None:
        turns = 0
        with anyio.CancelScope() as scope:
            async def canceller() -> None:
                nonlocal turns
                while True:
                    await anyio.sleep(0)
                    turns += 1
                    if turns == 3:
                        scope.cancel()
                        return

            async with anyio.create_task_group() as tg:
                tg.start_soon(canceller)
                await ag.backward(loss())
        assert scope.cancelled_caught and turns == 3
        assert x.grad is None
        await ag.backward(loss())  # the engine runs the next call as usual

    anyio.run(main, backend=backend)
    after = x.grad.numpy().copy()  # one backward's gradient
    x.grad = None
    ag.autograd.set_engine(ReferenceEngine())
    anyio.run(ag.backward, loss(), backend=backend)
    np.testing.assert_array_equal(after, x.grad.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
def test_start_hooks_are_found_by_the_flat_walk(backend, schedules, restore_engine):
    """Note [Backward start hooks]: the flat walk finds the nodes with start hooks as the
    dynamic walk does; they run before any node, and the backward still runs flat."""
    ag.autograd.set_engine(Engine())
    calls: list[str] = []
    x = _leaf(np.random.default_rng(11), 4)
    a = x.sin()
    b = (a * 2.0).exp()
    handles = [ag.autograd.register_backward_start_hook(a.grad_fn, lambda: calls.append("a")),
               ag.autograd.register_backward_start_hook(b.grad_fn, lambda: calls.append("b"))]
    try:
        anyio.run(ag.backward, b.sum(), backend=backend)
    finally:
        for h in handles:
            h.remove()
    assert schedules == [True]
    assert calls == ["b", "a"]  # (highest sequence_nr first)
    np.testing.assert_allclose(x.grad.numpy(), np.cos(x.numpy()) * 2 * np.exp(2 * np.sin(x.numpy())),
                               rtol=1e-12)


@pytest.mark.parametrize("shape", ["chain", "found out of order"])
def test_the_flat_order_is_descending_sequence_nr(shape, monkeypatch, restore_engine):
    """Note [The flat schedule]: the order runs the highest ``sequence_nr`` first, whether
    the walk found the nodes in that order (a chain: no sort) or not (two branches, the
    older one found first: sorted)."""
    orders: list[list[int]] = []
    real = graph_task_module.GraphTask.setup_steps

    def recorded(self: Any) -> Any:
        yield from real(self)
        orders.append([n.sequence_nr for n in self.schedule.order])

    monkeypatch.setattr(graph_task_module.GraphTask, "setup_steps", recorded)
    ag.autograd.set_engine(Engine())
    x = _leaf(np.random.default_rng(12), 4)
    if shape == "chain":
        loss = x.sin().exp().tanh().sum()
        expected = [loss.grad_fn.sequence_nr - i for i in range(4)]
    else:
        a = x * 2.0  # older: the walk reaches it first (the add's first edge)
        b = x.exp()
        s = a + b
        loss = s.sum()
        expected = [loss.grad_fn.sequence_nr, s.grad_fn.sequence_nr, b.grad_fn.sequence_nr, a.grad_fn.sequence_nr]
    anyio.run(ag.backward, loss)
    assert orders == [expected]
    assert sorted(expected, reverse=True) == expected
