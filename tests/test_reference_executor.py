"""Every fast path of the engine against the reference executor (autograd/tools/reference.py):
the fused inline step, the loop's shared scheduler, offloaded kernels, worker chains,
per-input splits, deferred sums and the synchronous driver must give the gradients, and
(when every node runs inline) the hook order, that running each node through the plain
prepare -> kernel -> finish sequence gives. Data are integer-valued so sums are exact in
any order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.tools.reference import ReferenceEngine
from asyncgrad.nn.functional import linear
from asyncgrad.utils.checkpoint import checkpoint


def _ints(rng: np.random.Generator, *shape: int) -> ag.Tensor:
    return ag.tensor(rng.integers(-3, 4, shape).astype(np.float64), requires_grad=True)


class Exp2(ag.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    @staticmethod
    async def backward(ctx, g):
        await anyio.sleep(0)
        return g * 2.0


def _backward_of(loss: ag.Tensor) -> Callable[[], Any]:
    def run() -> Any:
        return ag.backward(loss)

    run.loss = loss  # type: ignore[attr-defined]  (for the sync driver's test)
    return run


# Each builder returns (run, leaves, log): ``await run()`` does one backward or grad call
# and returns what it computed; hooks append to ``log``.
def mlp(rng, log):
    w1, w2, x = _ints(rng, 16, 8), _ints(rng, 1, 16), _ints(rng, 4, 8)
    h = linear(x, w1).relu()
    h.register_hook(lambda g: log.append(("h", g.sum().item())))
    return _backward_of((linear(h, w2) ** 2).sum()), [w1, w2, x], log


def branches(rng, log):
    x = _ints(rng, 5)
    a, b = x * 2, x * 3
    c, d = a.exp(), b.sin()
    for name, t in (("a", a), ("b", b), ("c", c), ("d", d)):
        t.grad_fn.register_prehook(lambda g, name=name: log.append(name))
    x.register_post_accumulate_grad_hook(lambda t: log.append("acc"))
    return _backward_of((c + d).sum()), [x], log


def shared_large(rng, log):
    w = _ints(rng, 300, 300)  # large: deferred sums, offloaded kernels at threshold 0
    y = sum(((w * float(k)).relu() for k in range(1, 5)), ag.zeros(300, 300))
    y.retain_grad()
    return _backward_of((y * y).sum()), [w], log


def pruned(rng, log):
    x, y, z = _ints(rng, 3), _ints(rng, 3), _ints(rng, 3)
    u = x * y
    u.register_hook(lambda g: log.append(("u", g.tolist())))
    out = (u * z).sum() + (z * z).sum()

    async def run():
        (gx, gu) = await ag.grad(out, [x, u], retain_graph=True)
        await ag.backward(out, inputs=[y])
        return gx, gu

    return run, [x, y, z], log


def double(rng, log):
    x = _ints(rng, 4)

    async def run():
        (g,) = await ag.grad((x ** 3).sum(), x, create_graph=True)
        await ag.backward((g * g).sum())
        return g

    return run, [x], log


def custom_and_checkpoint(rng, log):
    x, w = _ints(rng, 6), _ints(rng, 6)
    y = checkpoint(lambda t: (t * w).sin(), Exp2.apply(x), use_reentrant=True)
    return lambda: ag.backward(y.sum()), [x, w], log


def input_buffers(rng, log):
    """InputBuffers with a None slot (chunk's node: its third output gets no gradient),
    sums of small and large gradients, and gradients shared by leaves (``add`` hands
    one array to both): two backward calls, so a commit that wrote into a shared array
    shows."""
    x, v, w = _ints(rng, 6), _ints(rng, 300, 300), _ints(rng, 300, 300)
    y1, y2, _y3 = x.chunk(3)
    y1.register_hook(lambda g: log.append(("y1", g.tolist())))
    small = (y1 * 2.0).sum() + (y1 * 5.0).sum() + (y1 * y2).sum()
    s = v + w
    large = (s * 2.0).sum() + (s.relu() * 3.0).sum() + (v * w).sum()
    loss = small + large

    async def run():
        await ag.backward(loss, retain_graph=True)
        await ag.backward(loss)

    return run, [x, v, w], log


BUILDERS = [mlp, branches, shared_large, pruned, double, custom_and_checkpoint, input_buffers]


async def _outcome(engine: Engine, build: Callable[..., Any]) -> tuple[Any, list[Any], list[Any]]:
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(engine)
    try:
        log: list[Any] = []
        run, leaves, log = build(np.random.default_rng(7), log)
        result = await run()
        grads = [None if t.grad is None else t.grad.numpy().copy() for t in leaves]
        values = [r.numpy().copy() for r in result] if isinstance(result, tuple) else (
            None if result is None else [result.numpy().copy()])
        return grads, values, log
    finally:
        ag.autograd.set_engine(prev)


def _same(a: Any, b: Any) -> None:
    assert (a is None) == (b is None)
    if a is not None:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert (x is None) == (y is None)
            if x is not None:
                np.testing.assert_array_equal(x, y)


FAST_ENGINES = {
    "inline": lambda: Engine(),
    "offload_all": lambda: Engine(inline_threshold=0, max_workers=2),
    "one_worker": lambda: Engine(inline_threshold=0, max_workers=1),
}


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("fast", list(FAST_ENGINES))
async def test_fast_paths_match_the_reference(build, fast):
    ref_grads, ref_values, ref_log = await _outcome(ReferenceEngine(), build)
    grads, values, log = await _outcome(FAST_ENGINES[fast](), build)
    _same(grads, ref_grads)
    _same(values, ref_values)
    if fast == "inline":
        assert log == ref_log  # every node inline: the same order of hooks
    else:
        assert sorted(map(repr, log)) == sorted(map(repr, ref_log))


@pytest.mark.parametrize("build", [mlp, branches, shared_large], ids=lambda b: b.__name__)
@pytest.mark.parametrize("engine", [ReferenceEngine, Engine])
def test_sync_driver_matches_the_reference(build, engine):
    """``backward_sync`` (the synchronous driver, every node inline) against the
    reference executor's asynchronous driver."""
    ref_grads, _, ref_log = anyio.run(_outcome, ReferenceEngine(), build)
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(engine())
    try:
        log: list[Any] = []
        run, leaves, log = build(np.random.default_rng(7), log)
        run().close()  # (the awaitable form is not used here)
        ag.backward_sync(run.loss)
    finally:
        ag.autograd.set_engine(prev)
    _same([t.grad.numpy() for t in leaves], ref_grads)
    assert log == ref_log


async def test_many_backwards_on_one_loop_match_the_reference():
    """The loop's shared scheduler interleaves GraphTasks; each one's gradients are the
    reference's, and the shared leaf gets their exact sum."""
    rng = np.random.default_rng(3)
    w = _ints(rng, 8, 8)
    xs = [ag.tensor(rng.integers(-2, 3, (4, 8)).astype(np.float64)) for _ in range(64)]
    losses = [(linear(x, w).tanh() * 2).sum() for x in xs]
    expected = np.zeros((8, 8))
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(ReferenceEngine())
    try:
        for x in xs:
            (g,) = await ag.grad((linear(x, w).tanh() * 2).sum(), w)
            expected += g.numpy()
    finally:
        ag.autograd.set_engine(prev)
    async with anyio.create_task_group() as tg:
        for loss in losses:
            tg.start_soon(ag.backward, loss)
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)
