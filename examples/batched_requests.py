"""Many small requests on one model: one backward per request, or the requests in flight
served as one pass by ``asyncgrad.serving.GradientBatcher``.

    python examples/batched_requests.py --tasks 32 --requests 10

A service that computes gradients per request (a saliency map, an online-learning step)
can ``await ag.backward`` once per request. For small requests most of each call is
Python bookkeeping that the loop's one thread runs, so batching the requests that are in
flight at the same moment into one forward and one backward pays it once per batch
(docs/guides/serving.md). The batcher answers each request as if it ran alone: its mean
loss, the gradient of that loss with respect to its own rows (the saliency map), and its
gradient added to the shared parameters' ``.grad``. The script times rounds of both
ways, alternating, checks that they give the same answers, and reports requests per
second and how late a 1 ms ticker woke up. numpy and anyio only.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import anyio
import numpy as np

import asyncgrad as ag
from asyncgrad import nn, serving
from asyncgrad.nn import functional as F
from asyncgrad.ops import kernels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=32, help="clients sending requests at the same time")
    p.add_argument("--requests", type=int, default=10, help="requests per client and round")
    p.add_argument("--rows", type=int, default=32, help="input rows per request")
    p.add_argument("--width", type=int, default=128, help="the MLP's width (4 layers, 10 classes)")
    p.add_argument("--max-wait", type=float, default=0.001, help="seconds a request waits for others to join")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of each way (medians are shown)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio", help="anyio backend to run on")
    return p.parse_args(argv)


@dataclass
class Answer:
    """One request's results: its mean loss and the gradient of that loss with respect to
    its input rows."""

    loss: float
    saliency: np.ndarray


def check(x: np.ndarray, y: np.ndarray, features: int, classes: int) -> None:
    """What only the service knows: ``x`` is (rows, features) finite floats, ``y`` one label
    in ``range(classes)`` per row (the batcher itself checks the row counts and dtypes)."""
    if x.ndim != 2 or x.shape[1] != features or x.dtype.kind != "f":
        raise ValueError(f"x must be (rows, {features}) floats, got {x.dtype} {tuple(x.shape)}")
    if len(x) and not np.isfinite(x).all():
        raise ValueError("x has NaN or infinite values")
    if len(y) and (y.min() < 0 or y.max() >= classes):
        raise ValueError(f"labels must be in range({classes}), got {y.min()}..{y.max()}")


def make_batcher(model: nn.Module, *, max_rows: int = 4096, max_wait: float = 0.001) -> serving.GradientBatcher:
    """Per-row losses of the batch's rows; argument 0 (the inputs) gets its gradient."""
    def loss_fn(x: ag.Tensor, y: ag.Tensor) -> ag.Tensor:
        return F.cross_entropy(model(x), y, reduction="none")

    return serving.GradientBatcher(loss_fn, max_rows=max_rows, max_wait=max_wait, grad_inputs=(0,))


async def batched_request(batcher: serving.GradientBatcher, x: np.ndarray, y: np.ndarray, features: int,
                          classes: int) -> Answer:
    check(x, y, features, classes)
    r = await batcher.submit(x, y)
    return Answer(r.loss, r.input_grads[0])


async def one_request(model: nn.Module, x: np.ndarray, y: np.ndarray) -> Answer:
    """The same answer from one backward call of its own."""
    xt = ag.tensor(x, requires_grad=True)
    loss = F.cross_entropy(model(xt), ag.tensor(y))
    await ag.backward(loss)
    assert xt.grad is not None
    return Answer(float(loss.item()), xt.grad.numpy())


async def ticker(lags: list[float], stop: anyio.Event) -> None:
    """Sleep 1 ms at a time and record how late each wake-up was."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await anyio.sleep(0.001)
        lags.append(time.perf_counter() - t0 - 0.001)


async def run(args: argparse.Namespace) -> bool:
    ag.manual_seed(args.seed)
    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, 10))
    rng = np.random.default_rng(args.seed)
    requests = [[(rng.standard_normal((args.rows, w)).astype(np.float32), rng.integers(0, 10, args.rows))
                 for _ in range(args.requests)] for _ in range(args.tasks)]
    total = args.tasks * args.requests
    print(f"[{args.backend}] {args.tasks} clients x {args.requests} requests of {args.rows} rows, "
          f"MLP {w}-{w}-{w}-{w}-10; batches wait at most {args.max_wait * 1e3:g} ms for more requests")
    await anyio.to_thread.run_sync(kernels.wait)  # (compiled kernels loaded, as a warm service)
    ways = ("one backward per request", "batched")
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    lags: dict[str, list[float]] = {way: [] for way in ways}
    batches = []
    equal = True
    async with make_batcher(model, max_rows=args.tasks * args.rows, max_wait=args.max_wait) as batcher:
        async def timed(way: str) -> tuple[float, list[float], dict[tuple[int, int], Answer], list[np.ndarray]]:
            answers: dict[tuple[int, int], Answer] = {}
            lag: list[float] = []

            async def client(c: int) -> None:
                for i, (x, y) in enumerate(requests[c]):
                    answers[c, i] = await (one_request(model, x, y) if way == ways[0] else
                                           batched_request(batcher, x, y, w, 10))

            stop = anyio.Event()
            async with anyio.create_task_group() as outer:
                outer.start_soon(ticker, lag, stop)
                await anyio.sleep(0.005)
                lag.clear()
                t0 = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for c in range(args.tasks):
                        tg.start_soon(client, c)
                s = time.perf_counter() - t0
                stop.set()
            grads = [p.grad.numpy().copy() for p in model.parameters()]  # type: ignore[union-attr]
            model.zero_grad()
            return s, lag, answers, grads

        for way in ways:  # warm-up, untimed
            await timed(way)
        for r in range(args.rounds):
            results = {}
            for way in (ways if r % 2 == 0 else ways[::-1]):
                before = batcher.statistics().batches
                s, lag, answers, grads = await timed(way)
                seconds[way].append(s)
                lags[way].extend(lag)
                results[way] = (answers, grads)
                if way == "batched":
                    batches.append(batcher.statistics().batches - before)
            (a1, g1), (a2, g2) = results[ways[0]], results[ways[1]]
            equal = equal and all(np.allclose(p, q, rtol=1e-4, atol=1e-6) for p, q in zip(g1, g2)) and all(
                math.isclose(a1[k].loss, a2[k].loss, rel_tol=1e-5, abs_tol=1e-6)
                and np.allclose(a1[k].saliency, a2[k].saliency, rtol=1e-4, atol=1e-6) for k in a1)

    for way in ways:
        s = float(np.median(seconds[way]))
        lag_ms = np.array(lags[way] or [0.0]) * 1e3
        print(f"{way:<25} {s * 1e3:7.1f} ms per round, {total / s:8,.0f} requests/s; loop lag p50 "
              f"{np.percentile(lag_ms, 50):.2f} ms, p99 {np.percentile(lag_ms, 99):.2f} ms")
    speedup = float(np.median(seconds[ways[0]])) / float(np.median(seconds[ways[1]]))
    print(f"batched: {speedup:.1f}x the requests per second, {total / float(np.median(batches)):.1f} requests per "
          f"pass (medians of {args.rounds} rounds, after a warm-up)")
    print(f"same losses, saliency maps and parameter gradients both ways (float32 tolerance): {equal}")
    return equal


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return 0 if anyio.run(run, args, backend=args.backend) else 1


if __name__ == "__main__":
    raise SystemExit(main())
