"""``python -m asyncgrad``: a short self-contained demo.

Trains a small MLP on a synthetic regression task. Each step, several asyncio tasks
compute the gradients of their own mini-batch *concurrently* with ``await ag.backward``
on shared parameters, while a 1 ms ticker measures how responsive the event loop stays.
At the end it checks that the concurrent gradients equal the same calls run one by one.
"""

from __future__ import annotations

import asyncio
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
    lag_ms = np.array(lags) * 1e3
    print(f"loss: {first:.4f} -> {last:.4f}")
    print(f"concurrent gradients equal to sequential: {equal}")
    print(f"event loop lag while training (1 ms ticker): p99 {np.percentile(lag_ms, 99):.2f} ms, "
          f"max {lag_ms.max():.2f} ms over {len(lag_ms)} ticks")
    print(f"engine: {stats.graph_tasks_succeeded} backward calls, {stats.nodes_inline} nodes inline, "
          f"{stats.nodes_offloaded} offloaded")
    return 0 if equal and last < first else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
