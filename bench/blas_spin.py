"""What BLAS's helper threads cost when backward calls come one by one, then together.

    python -m bench.blas_spin                  # the example's sizes: 32 calls, MLP 64-256-256-10, batch 256
    python -m bench.blas_spin --hidden 512 --batch 64
    python -m bench.blas_spin --checkpoint     # a checkpointed training step alone

Rounds of 32 backward calls of a small MLP, one by one or together (``asyncio.gather``),
each way with the engine's adaptive BLAS threads and with BLAS pinned at one thread
(``BLAS.pinned(1)``), all four interleaved in one process, the order rotating. Printed
per combination, medians over the rounds: wall time, and CPU time per thread group from
each thread's CPU clock (the loop's thread, the engine's worker threads, and the rest:
BLAS's own helper threads). After a product that used them, OpenBLAS's helpers
spin for work for ~0.1 s, so the helper's CPU in a round where BLAS is single-threaded is
spin (Note [BLAS hysteresis] in src/asyncgrad/autograd/runtime/blas.py).

``--checkpoint``: a training step alone (4 linear layers of 1,024 with GELU, batch 256,
one reentrant checkpoint per layer): its time and the BLAS threads per call the engine
chose. A nested backward used to count as a second backward call and keep BLAS at one
thread. Use ``PYTHONPATH=<other checkout>/src`` to measure another version of asyncgrad.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Awaitable, Callable

import numpy as np

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.autograd.runtime.blas import BLAS
from asyncgrad.nn import functional as F
from asyncgrad.ops import kernels

GROUPS = ("loop", "workers", "blas")


def thread_cpu_ns() -> dict[str, tuple[str, int]]:
    """Each thread of this process: its group and the CPU time it has run (ns), read
    from the thread's own CPU clock (Linux's clock id for a thread: ``~tid << 3 | 6``,
    as glibc's ``pthread_getcpuclockid`` makes it; ``/proc``'s schedstat lags by up to
    a scheduler tick)."""
    loop = threading.get_native_id()
    workers = {t.native_id for t in threading.enumerate() if t.name.startswith("asyncgrad")}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            ns = time.clock_gettime_ns((~int(tid) << 3) | 6)
        except OSError:  # (the thread ended)
            continue
        group = "loop" if int(tid) == loop else "workers" if int(tid) in workers else "blas"
        out[tid] = (group, ns)
    return out


def cpu_ms(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> dict[str, float]:
    used = dict.fromkeys(GROUPS, 0.0)
    for tid, (group, ns) in after.items():
        used[group] += (ns - before.get(tid, (group, 0))[1]) / 1e6
    return used


async def rounds(tasks: int, hidden: int, batch: int, repeats: int) -> None:
    ag.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, hidden), nn.GELU(approximate="tanh"), nn.LayerNorm(hidden),
                          nn.Linear(hidden, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, 10))
    rng = np.random.default_rng(0)
    dtype = model[0].weight.dtype  # (float32 unless a program changed the default)
    data = [(ag.tensor(rng.standard_normal((batch, 64)), dtype=dtype), ag.tensor(rng.integers(0, 10, batch)))
            for _ in range(tasks)]

    async def together(losses: list[ag.Tensor]) -> None:
        await asyncio.gather(*(ag.backward(loss) for loss in losses))

    async def one_by_one(losses: list[ag.Tensor]) -> None:
        for loss in losses:
            await ag.backward(loss)

    async def timed(how: Callable[[list[ag.Tensor]], Awaitable[None]]) -> tuple[float, dict[str, float]]:
        losses = [F.cross_entropy(model(x), y) for x, y in data]  # (not timed)
        before, t0 = thread_cpu_ns(), time.perf_counter()
        await how(losses)
        wall, after = time.perf_counter() - t0, thread_cpu_ns()
        model.zero_grad()
        return wall * 1e3, cpu_ms(before, after)

    await asyncio.to_thread(kernels.wait)
    for _ in range(3):  # warm-up, and the engine's set-up
        await timed(one_by_one)
        await timed(together)
    seen: dict[tuple[str, str], list[tuple[float, dict[str, float]]]] = {}
    for r in range(repeats):
        for blas in (("adaptive", "pinned") if r % 2 == 0 else ("pinned", "adaptive")):
            with BLAS.pinned(1) if blas == "pinned" else contextlib.nullcontext():
                for how in ((one_by_one, together) if r % 4 < 2 else (together, one_by_one)):
                    seen.setdefault((blas, how.__name__), []).append(await timed(how))
    print(f"{tasks} calls per round, MLP 64-{hidden}-{hidden}-10, batch {batch}; medians of {repeats} rounds")
    print("| BLAS | way | wall ms | loop's thread ms | workers ms | BLAS helpers ms |")
    print("|---|---|---|---|---|---|")
    for (blas, way), runs in seen.items():
        cpu = {g: statistics.median(used[g] for _, used in runs) for g in GROUPS}
        print(f"| {blas} | {way.replace('_', ' ')} | {statistics.median(w for w, _ in runs):.1f} "
              f"| {cpu['loop']:.1f} | {cpu['workers']:.1f} | {cpu['blas']:.1f} |")


async def checkpointed(steps: int, width: int = 1024, batch: int = 256) -> None:
    from asyncgrad.utils.checkpoint import checkpoint

    ag.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(4)]
    x = ag.tensor(np.random.default_rng(0).standard_normal((batch, width)), dtype=layers[0][0].weight.dtype)
    per_call: list[int] = []

    async def step() -> float:
        t0 = time.perf_counter()
        h = x
        for layer in layers:
            h = checkpoint(layer, h, use_reentrant=True)
        h.register_hook(lambda g: per_call.append(BLAS.per_call))
        await ag.backward(h.pow(2).mean())
        return (time.perf_counter() - t0) * 1e3

    await asyncio.to_thread(kernels.wait)
    for _ in range(5):
        await step()
    times = [await step() for _ in range(steps)]
    print(f"checkpointed step alone: {statistics.median(times):.1f} ms (median of {steps}); "
          f"BLAS threads per call during backward: {sorted(set(per_call[-steps:]))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=12, help="rounds of each combination")
    parser.add_argument("--checkpoint", action="store_true", help="time a checkpointed training step instead")
    args = parser.parse_args()
    if args.checkpoint:
        asyncio.run(checkpointed(15))
    else:
        asyncio.run(rounds(args.tasks, args.hidden, args.batch, args.rounds))


if __name__ == "__main__":
    main()
