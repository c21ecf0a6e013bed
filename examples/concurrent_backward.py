"""Many tasks computing gradients of one shared model at once.

    python examples/concurrent_backward.py --tasks 32

Every task has its own batch and loss and runs ``await ag.backward(loss)``; all backward
calls run at the same time on one event loop and accumulate into the shared parameters'
``.grad``. (The forward passes run first: a forward is plain synchronous numpy work on
the loop, while the backward passes are what asyncgrad schedules, inline when small and
on worker threads when large.) The script warms up as a service would (compiled kernels
loaded, a first round untimed), then times rounds of the calls run together and one
after another, alternating, and prints the medians. It checks that both give the same
gradients, measures how responsive the event loop stayed (a 1 ms ticker), says why the
concurrent run was faster or not (how busy the loop's thread was, and how many of the
cores the process kept busy each way), and prints the engine's statistics for one
concurrent round (nodes run inline vs offloaded to worker threads). No extra
dependencies: numpy and anyio only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable

import anyio
import numpy as np

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.nn import functional as F
from asyncgrad.ops import kernels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=16, help="concurrent backward calls")
    p.add_argument("--batch", type=int, default=256, help="examples per task")
    p.add_argument("--hidden", type=int, default=256, help="hidden width (bigger: more work offloaded)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of each way (medians are shown)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio", help="anyio backend to run on")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="fix numpy's BLAS at this many threads per call (default: the engine adapts them)")
    return p.parse_args(argv)


async def ticker(lags: list[float], stop: anyio.Event) -> None:
    """Sleep 1 ms at a time and record how late each wake-up was."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await anyio.sleep(0.001)
        lags.append(time.perf_counter() - t0 - 0.001)


async def run(args: argparse.Namespace) -> bool:
    ag.manual_seed(args.seed)
    if args.blas_threads is not None:
        ag.autograd.set_engine(ag.autograd.Engine(blas_threads=args.blas_threads))
    model = nn.Sequential(
        nn.Linear(64, args.hidden), nn.GELU(approximate="tanh"), nn.LayerNorm(args.hidden),
        nn.Linear(args.hidden, args.hidden), nn.GELU(approximate="tanh"), nn.Linear(args.hidden, 10),
    )
    rng = np.random.default_rng(args.seed)
    data = [(ag.tensor(rng.standard_normal((args.batch, 64)).astype(np.float32)),
             ag.tensor(rng.integers(0, 10, args.batch))) for _ in range(args.tasks)]

    def forward(i: int) -> ag.Tensor:
        x, y = data[i]
        return F.cross_entropy(model(x), y)

    async def one(loss: ag.Tensor) -> None:
        await ag.backward(loss)  # other tasks' backward calls run meanwhile

    async def together(losses: list[ag.Tensor]) -> None:
        async with anyio.create_task_group() as tg:
            for loss in losses:
                tg.start_soon(one, loss)

    async def one_by_one(losses: list[ag.Tensor]) -> None:
        for loss in losses:
            await one(loss)

    def grads() -> list[np.ndarray]:
        out = [p.grad.numpy().copy() for p in model.parameters()]  # type: ignore[union-attr]
        model.zero_grad()
        return out

    def forwards() -> list[ag.Tensor]:
        return [forward(i) for i in range(args.tasks)]  # (never timed)

    async def timed(how: Callable[[list[ag.Tensor]], Awaitable[None]], losses: list[ag.Tensor]
                    ) -> tuple[float, float, list[np.ndarray]]:
        """Seconds, cores kept busy (CPU over wall time, all of the process's threads),
        and the gradients (then zeroed)."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        await how(losses)
        seconds = time.perf_counter() - t0
        return seconds, (time.process_time() - cpu0) / seconds, grads()

    blas = ag.autograd.get_engine().blas_threads  # (the engine's setting: None adapts)
    print(f"[{args.backend}] {args.tasks} tasks x batch {args.batch}, MLP 64-{args.hidden}-{args.hidden}-10 "
          f"({sum(p.numel() for p in model.parameters()):,} parameters); numpy's BLAS: "
          + ("adapted by the engine" if blas is None else f"{blas} thread(s) per call"))
    # A service is warm when requests arrive: it loads the compiled kernels at start-up
    # (docs/guides/kernels.md), and its first backward calls have started the engine's
    # worker threads and inspected BLAS. A cold first round would time that one-time
    # set-up, not concurrency. (``kernels.wait`` blocks; a thread keeps the loop free.)
    await anyio.to_thread.run_sync(kernels.wait)
    for how in (together, one_by_one):
        await timed(how, forwards())

    engine = ag.autograd.get_engine()
    lags: list[float] = []
    times: dict[str, list[float]] = {"together": [], "one_by_one": []}
    cores_used: dict[str, list[float]] = {"together": [], "one_by_one": []}
    equal = True
    before = after = engine.statistics()
    loop_busy = 0.0
    for r in range(args.rounds):
        # alternate which goes first, so that a change in the machine's load meets both alike
        for name in (("together", "one_by_one") if r % 2 == 0 else ("one_by_one", "together")):
            losses = forwards()
            if name == "together":
                stop = anyio.Event()
                async with anyio.create_task_group() as outer:
                    outer.start_soon(ticker, lags, stop)
                    await anyio.sleep(0.01)
                    before, cpu = engine.statistics(), time.thread_time()
                    seconds, cores, summed = await timed(together, losses)
                    after, loop_busy = engine.statistics(), (time.thread_time() - cpu) / seconds
                    stop.set()
                concurrent_grads = summed
            else:
                seconds, cores, sequential_grads = await timed(one_by_one, losses)
            times[name].append(seconds)
            cores_used[name].append(cores)
        equal = equal and all(np.allclose(a, b, rtol=1e-4, atol=1e-6)
                              for a, b in zip(concurrent_grads, sequential_grads))

    concurrent_s = float(np.median(times["together"]))
    sequential_s = float(np.median(times["one_by_one"]))
    speedup = round(sequential_s / concurrent_s, 2)  # (as printed: the verdict below matches it)
    lag_ms = np.array(lags or [0.0]) * 1e3
    stats = counted(before, after)
    print(f"{args.tasks} backward calls: {concurrent_s * 1e3:.0f} ms concurrently, "
          f"{sequential_s * 1e3:.0f} ms one by one ({speedup:.2f}x; "
          f"medians of {args.rounds} rounds, after a warm-up)")
    print(explain(stats, speedup, loop_busy,
                  {name: float(np.median(used)) for name, used in cores_used.items()}))
    print(f"gradients equal to the sequential sum (float32 tolerance): {equal}")
    print(f"event loop lag during the concurrent backward calls: p50 {np.percentile(lag_ms, 50):.2f} ms, "
          f"p99 {np.percentile(lag_ms, 99):.2f} ms, max {lag_ms.max():.2f} ms ({len(lags)} ticks)")
    print("engine statistics (the last concurrent round):")
    for field in dataclasses.fields(stats):
        print(f"  {field.name:<24} {getattr(stats, field.name)}")
    return equal


# a speed-up this close to 1 is within the round-to-round noise of a shared machine: "about as fast"
NOISE = 0.05

# counters that add up over calls; the others are gauges or settings, shown as they are
_COUNTERS = ("graph_tasks_started", "graph_tasks_succeeded", "graph_tasks_failed", "graph_tasks_cancelled",
             "nodes_inline", "nodes_offloaded", "thread_hops")


def counted(before: ag.autograd.EngineStatistics, after: ag.autograd.EngineStatistics
            ) -> ag.autograd.EngineStatistics:
    """The engine's statistics over one round: counters as differences."""
    return dataclasses.replace(after, **{k: getattr(after, k) - getattr(before, k) for k in _COUNTERS})


def explain(stats: ag.autograd.EngineStatistics, speedup: float, loop_busy: float, cores_used: dict[str, float]
            ) -> str:
    """Why running the backward calls together was faster, or why not here. ``speedup``:
    one by one's time over together's; ``loop_busy``: the share of the concurrent run's
    time the event loop's thread spent computing; ``cores_used``: each way's median CPU
    time over wall time (all of the process's threads: the loop, the engine's workers,
    BLAS's own threads)."""
    nodes = stats.nodes_inline + stats.nodes_offloaded
    cores = os.cpu_count() or 1
    together, alone = cores_used["together"], cores_used["one_by_one"]
    why = (f"why: {stats.nodes_offloaded} of {nodes} nodes ran on {stats.max_workers} worker threads "
           f"({stats.thread_hops} hops); the event loop's thread ran the other nodes and the bookkeeping, "
           f"busy {loop_busy:.0%} of the concurrent run. The process kept {together:.1f} of the {cores} cores "
           f"busy together, {alone:.1f} one by one. ")
    if speedup >= 1 + NOISE:
        return why + ("Together, the calls overlap: while some calls' large kernels run on the worker threads "
                      "(numpy releases the GIL), the loop runs other calls' small nodes. One by one, each call "
                      "waits for its own kernels and a core waits with it.")
    verdict = "about as fast" if speedup > 1 - NOISE else "slower"
    if alone >= 0.8 * cores:
        return why + (f"Here it was {verdict}: one call alone already kept the cores busy (BLAS's own threads "
                      "for its large products, counting their spin while they wait for work, and the worker "
                      "threads), so there was little idle time for a second call to fill.")
    if loop_busy >= 0.8:
        return why + (f"Here it was {verdict}: most of each call is the loop's work (small nodes and "
                      "bookkeeping, Python that one thread runs), so the worker threads had little to overlap "
                      "with it. Larger kernels (a wider model, bigger batches) leave more to run in parallel.")
    # the load average counts this process's own threads too (about ``together`` cores
    # while it ran; a one-minute average, so a rough guide only)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load - together >= 0.5:
        return why + (f"Here it was {verdict} though the loop had time to spare: other processes are using the "
                      f"cores (load average {load:.2f} on {cores} cores, about {together:.1f} of it this "
                      "process), and concurrency only pays when there are idle cores to fill.")
    return why + (f"Here it was {verdict}: what running together saves (a core left idle one by one) was no "
                  "more than what it costs (thread hops, the loop's wake-ups, kernels competing for the cores "
                  "and their caches).")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return 0 if anyio.run(run, args, backend=args.backend) else 1


if __name__ == "__main__":
    raise SystemExit(main())
