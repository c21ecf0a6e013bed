"""``python -m asyncgrad``: a short self-contained demo.

Trains a small MLP on a synthetic regression task (a few seconds). Each step, several
asyncio tasks compute the gradients of their own mini-batch *concurrently* with
``await ag.backward`` on shared parameters, while a 1 ms ticker measures how late the
event loop answers. At the end it checks that the concurrent gradients equal the same
calls run one by one, and measures the ticker again during the same training steps run
*blocking* (every backward to completion without giving the loop a turn, as a
synchronous ``loss.backward()`` would), so the two lag figures can be compared.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time

import numpy as np

import asyncgrad as ag


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {done}/{total}"


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t0 - 0.001)


async def main(steps: int = 300, workers: int = 8, batch: int = 32) -> int:
    ag.manual_seed(0)
    ag.set_default_dtype(np.float64)
    rng = np.random.default_rng(1)
    true_w = rng.standard_normal((16, 1))
    xs = rng.standard_normal((steps * workers * batch, 16))
    ys = np.sin(xs @ true_w) + 0.05 * rng.standard_normal((len(xs), 1))
    model = ag.nn.Sequential(ag.nn.Linear(16, 64), ag.nn.Tanh(), ag.nn.Linear(64, 64), ag.nn.Tanh(),
                             ag.nn.Linear(64, 1))
    lr = 0.2
    # the workers' gradients add up in .grad: lr / workers makes the step use their mean
    opt = ag.optim.SGD(model.parameters(), lr=lr / workers)
    # one untimed backward first: it pays for lazy imports and the engine's BLAS probe
    await ag.backward(model(ag.tensor(xs[:batch])).sum())
    model.zero_grad()
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lags, stop))

    async def worker_grad(k: int, step: int) -> float:
        i = (step * workers + k) * batch
        x, y = ag.tensor(xs[i:i + batch]), ag.tensor(ys[i:i + batch])
        loss = ((model(x) - y) ** 2).mean()
        await ag.backward(loss)
        return loss.item()

    async def blocking_steps(n: int) -> list[float]:
        """The same training steps, every backward blocking the loop (the baseline): an
        engine that runs every node inline and never yields, the calls one after another."""
        engine = ag.autograd.get_engine()
        ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=1 << 62, yield_interval=math.inf))
        blocked: list[float] = []
        done = asyncio.Event()
        probe = asyncio.create_task(_ticker(blocked, done))
        try:
            await asyncio.sleep(0.01)  # let the probe start ticking
            for step in range(n):
                for k in range(workers):
                    await worker_grad(k, step)
                opt.step()
                opt.zero_grad()
                await asyncio.sleep(0)  # the loop's turn between steps, as in the run above
        finally:
            done.set()
            await probe
            ag.autograd.set_engine(engine)
        return blocked

    print(f"asyncgrad {ag.__version__}: {workers} concurrent backward calls per step, "
          f"{steps} steps, MLP 16-64-64-1")
    first = last = 0.0
    for step in range(steps):
        losses = await asyncio.gather(*(worker_grad(k, step) for k in range(workers)))
        opt.step()
        opt.zero_grad()
        last = float(np.mean(losses))
        first = first or last
        if step % 25 == 0 or step == steps - 1:
            sys.stdout.write(f"\r{_bar(step + 1, steps)}  loss {last:.4f}")
            sys.stdout.flush()
    print()

    # concurrent gradients == the same backward calls one by one (float64, exact sums
    # up to the order of addition)
    async def grads(concurrent: bool) -> list[np.ndarray]:
        calls = [worker_grad(k, 0) for k in range(workers)]
        if concurrent:
            await asyncio.gather(*calls)
        else:
            for c in calls:
                await c
        out = [p.grad.numpy().copy() for p in model.parameters()]  # type: ignore[union-attr]
        model.zero_grad()
        return out

    together, one_by_one = await grads(True), await grads(False)
    equal = all(np.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(together, one_by_one))
    stop.set()
    await ticker
    stats = ag.autograd.get_engine().statistics()
    blocked = await blocking_steps(max(1, steps // 4))
    print(f"loss: {first:.4f} -> {last:.4f}")
    print(f"concurrent gradients equal to sequential: {equal}")
    print("event loop lag (how late a 1 ms timer on the same loop fires; lower is better):")
    print(f"  awaited backward (asyncgrad): {_lag(lags)}")
    print(f"  blocking backward (baseline): {_lag(blocked)}")
    print(f"engine: {stats.graph_tasks_succeeded} backward calls; {stats.nodes_inline} nodes ran inline on the "
          f"event loop, {stats.nodes_offloaded} were offloaded to worker threads (only nodes with at least "
          f"{ag.autograd.get_engine().inline_threshold:,} elements are; this demo's are all smaller)")
    return 0 if equal and last < first else 1


def _lag(lags: list[float]) -> str:
    if not lags:
        return "no ticks"
    ms = np.array(lags) * 1e3
    return f"p99 {np.percentile(ms, 99):.2f} ms, max {ms.max():.2f} ms over {len(ms)} ticks"


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
