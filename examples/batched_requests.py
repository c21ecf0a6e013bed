"""Many small requests on one model: one backward per request, or the requests in flight
batched into one pass.

    python examples/batched_requests.py --tasks 32 --requests 10

A service that computes gradients per request (a saliency map, an online-learning step)
can ``await ag.backward`` once per request: asyncgrad runs those calls together on the
event loop. For small requests most of each call is Python bookkeeping (recording the
forward, the engine's work per node) that one thread runs, so the calls cannot go faster
than that thread (docs/guides/concurrency.md, "What stands in the way"). Batching the
requests that are in flight at the same moment into one forward and one backward pays
that bookkeeping once per batch instead of once per request.

``MicroBatcher`` below does it: a request waits at most ``max_wait`` seconds (or until
``max_rows`` rows are waiting) for others to join; then one pass computes, for every
request, its mean loss, the gradient of that loss with respect to its own input rows
(the saliency map), and adds the gradient of each request's loss to the shared
parameters' ``.grad``. The batched loss is the *sum of the per-request mean losses*, so
both gradients equal what one backward per request gives (rows of different requests do
not interact in this model: no batch norm). The script times rounds of both ways,
alternating, checks that they give the same gradients, and reports requests per second
and how late a 1 ms ticker woke up. numpy and anyio only.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field

import anyio
import numpy as np

import asyncgrad as ag
from asyncgrad import nn
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


@dataclass
class _Pending:
    x: np.ndarray
    y: np.ndarray
    done: anyio.Event = field(default_factory=anyio.Event)
    answer: Answer | None = None
    error: BaseException | None = None


class MicroBatcher:
    """Batches the requests in flight into one forward and one backward pass.

    Run ``serve()`` in a task group; clients ``await submit(x, y)``. A batch starts when
    ``max_rows`` rows are waiting, or ``max_wait`` seconds after its first request
    arrived; while it runs, the next batch fills. A request is checked before it joins a
    batch (rows of ``features`` numbers, labels in ``range(classes)``), so bad input
    fails alone. An error in a pass is raised in every request of that batch; the pass
    commits nothing then (asyncgrad's commit on success), so no request's gradient is
    half-applied. A request cancelled while it waits for its batch is withdrawn; once
    its batch runs, its gradient is part of the pass, as for a backward call cancelled
    after its commit."""

    def __init__(self, model: nn.Module, *, features: int, classes: int, max_rows: int = 4096,
                 max_wait: float = 0.001) -> None:
        self.model = model
        self.features = features
        self.classes = classes
        self.max_rows = max_rows
        self.max_wait = max_wait
        self.batches = 0
        self._waiting: list[_Pending] = []
        self._rows = 0
        self._arrived = anyio.Event()  # set when the first request of a batch arrives
        self._full = anyio.Event()  # set when max_rows rows are waiting

    def check(self, x: np.ndarray, y: np.ndarray) -> None:
        """Raise ValueError, naming what is wrong, unless ``x`` is (rows, features) finite
        floats and ``y`` one label in ``range(classes)`` per row."""
        if x.ndim != 2 or x.shape[1] != self.features or x.dtype.kind != "f":
            raise ValueError(f"x must be (rows, {self.features}) floats, got {x.dtype} {tuple(x.shape)}")
        if not len(x):
            raise ValueError("x has no rows")
        if not np.isfinite(x).all():
            raise ValueError("x has NaN or infinite values")
        if y.shape != (len(x),) or y.dtype.kind not in "iu":
            raise ValueError(f"y must be {len(x)} integer labels, got {y.dtype} {tuple(y.shape)}")
        if y.min() < 0 or y.max() >= self.classes:
            raise ValueError(f"labels must be in range({self.classes}), got {y.min()}..{y.max()}")

    async def submit(self, x: np.ndarray, y: np.ndarray) -> Answer:
        """Queue one request (``x``: its input rows, ``y``: their class labels) and wait
        for its answer."""
        self.check(x, y)
        request = _Pending(x, y)
        self._waiting.append(request)
        self._rows += len(x)
        self._arrived.set()
        if self._rows >= self.max_rows:
            self._full.set()
        try:
            await request.done.wait()
        except BaseException:
            if request in self._waiting:  # (cancelled before its batch started: withdrawn)
                self._waiting.remove(request)
                self._rows -= len(x)
            raise
        if request.error is not None:
            raise request.error
        assert request.answer is not None
        return request.answer

    async def serve(self) -> None:
        """Run batches for as long as the task group runs."""
        while True:
            await self._arrived.wait()
            with anyio.move_on_after(self.max_wait):
                await self._full.wait()
            batch, self._waiting, self._rows = self._waiting, [], 0
            self._arrived, self._full = anyio.Event(), anyio.Event()
            if not batch:  # (every request of it was withdrawn)
                continue
            try:
                answers = await self._run(batch)
            except Exception as e:  # (cancellation is not caught: it ends serve())
                for request in batch:
                    request.error = e
                    request.done.set()
                continue
            for request, answer in zip(batch, answers):
                request.answer = answer
                request.done.set()

    async def _run(self, batch: list[_Pending]) -> list[Answer]:
        """One pass for the whole batch: the loss is the sum of each request's mean loss."""
        self.batches += 1
        sizes = [len(r.x) for r in batch]
        x = ag.tensor(np.concatenate([r.x for r in batch]), requires_grad=True)
        y = ag.tensor(np.concatenate([r.y for r in batch]))
        row_losses = F.cross_entropy(self.model(x), y, reduction="none")
        row_losses = row_losses * ag.tensor(np.repeat([1.0 / n for n in sizes], sizes).astype(row_losses.dtype))
        await ag.backward(row_losses.sum())  # into the parameters' .grad, and into x.grad
        assert x.grad is not None
        bounds = np.cumsum(sizes)[:-1]  # each request's rows, in the order they were joined
        return [Answer(float(losses.sum()), saliency) for losses, saliency in
                zip(np.split(row_losses.detach().numpy(), bounds), np.split(x.grad.numpy(), bounds))]


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

    async def one_each(answers: dict[tuple[int, int], Answer]) -> None:
        async def client(c: int) -> None:
            for i, (x, y) in enumerate(requests[c]):
                answers[c, i] = await one_request(model, x, y)

        async with anyio.create_task_group() as tg:
            for c in range(args.tasks):
                tg.start_soon(client, c)

    batcher = MicroBatcher(model, features=w, classes=10, max_wait=args.max_wait)

    async def batched(answers: dict[tuple[int, int], Answer]) -> None:
        async def client(c: int) -> None:
            for i, (x, y) in enumerate(requests[c]):
                answers[c, i] = await batcher.submit(x, y)

        async with anyio.create_task_group() as tg:
            for c in range(args.tasks):
                tg.start_soon(client, c)

    async def timed(way: str) -> tuple[float, list[float], dict[tuple[int, int], Answer], list[np.ndarray]]:
        answers: dict[tuple[int, int], Answer] = {}
        lags: list[float] = []
        stop = anyio.Event()
        async with anyio.create_task_group() as outer:
            outer.start_soon(ticker, lags, stop)
            await anyio.sleep(0.005)
            lags.clear()
            t0 = time.perf_counter()
            await (one_each if way == "one backward per request" else batched)(answers)
            seconds = time.perf_counter() - t0
            stop.set()
        grads = [p.grad.numpy().copy() for p in model.parameters()]  # type: ignore[union-attr]
        model.zero_grad()
        return seconds, lags, answers, grads

    ways = ("one backward per request", "batched")
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    lags: dict[str, list[float]] = {way: [] for way in ways}
    batches = []
    equal = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(batcher.serve)
        for way in ways:  # warm-up, untimed
            await timed(way)
        for r in range(args.rounds):
            results = {}
            for way in (ways if r % 2 == 0 else ways[::-1]):
                before = batcher.batches
                s, lag, answers, grads = await timed(way)
                seconds[way].append(s)
                lags[way].extend(lag)
                results[way] = (answers, grads)
                if way == "batched":
                    batches.append(batcher.batches - before)
            (a1, g1), (a2, g2) = results[ways[0]], results[ways[1]]
            equal = equal and all(np.allclose(p, q, rtol=1e-4, atol=1e-6) for p, q in zip(g1, g2)) and all(
                math.isclose(a1[k].loss, a2[k].loss, rel_tol=1e-5, abs_tol=1e-6)
                and np.allclose(a1[k].saliency, a2[k].saliency, rtol=1e-4, atol=1e-6) for k in a1)
        tg.cancel_scope.cancel()

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
