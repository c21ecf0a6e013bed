"""concurrent: 32 asyncio tasks on one loop, each running forward + backward passes of a
small MLP (4 layers, batch 32, width 128, float32) with shared parameters; passes per
second over all tasks, and the p99 lag of a 1 ms ticker on the same loop meanwhile.

Every task awaits ``asyncio.sleep(0)`` after each pass (a handler yielding between
requests), in every mode. Modes: asyncgrad awaited; torch, HIPS autograd and the numpy
floor called inline on the loop (fast, but blocking it) and via ``asyncio.to_thread``.
Two more rows show the design change that the guide's "Many small requests: batch them"
recommends, for asyncgrad and for torch alike: the passes submitted in one turn of the
loop joined into one pass over all their rows (``TurnBatcher``), whose loss is the sum of
the passes' losses, so the parameters' gradients are the same sum.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from .. import nets
from ..common import (ASYNCGRAD, AUTOGRAD, BLAS, NUMPY, SETTLE, TORCH, About, Column, Result, Target, session_row,
                      ticked)

DEFAULT_ROUNDS = 3

ABOUT = About(
    title="Many concurrent requests on shared parameters",
    measures="32 asyncio tasks on one loop, each running 10 forward+backward passes of a small MLP (4 layers, "
             "batch 32, width 128) on shared parameters and yielding to the loop after each pass: passes per "
             "second over all tasks, and how late a 1 ms timer on the same loop fires meanwhile. The peers run "
             "on the loop (\"inline\") or through asyncio.to_thread.",
    reading="Higher passes/s and lower lag are better. With graphs this small the cost per call dominates; "
            "\"numpy inline\" (no autograd at all, blocking the loop) bounds the throughput. The lag shows "
            "how long the loop is unavailable: with 32 tasks each running a whole pass between two awaits, "
            "the timer gets the loop about once per 32 passes, whatever the library, so compare the lag "
            "between rows rather than with the 1 ms timer. The \"requests batched\" rows are a different "
            "way to serve: the passes submitted in one turn of the loop run as one pass over all their rows "
            "(the same gradients), which pays the per-call cost once per turn instead of once per pass.",
    plots=(("passes_per_s", "passes/s", False), ("p99_lag_ms", "p99 lag ms (log scale)", True)),
)

Pass = Callable[[np.ndarray], Awaitable[Any]]


class TurnBatcher:
    """The passes submitted in one turn of the loop, run as one pass over all their rows
    by ``run_batch`` (docs/guides/concurrency.md, "Many small requests: batch them";
    ``examples/batched_requests.py`` is the full service pattern, with validation and
    cancellation). ``submit`` returns when that pass has ended, or raises its error."""

    def __init__(self, run_batch: Callable[[list[np.ndarray]], Awaitable[None]]) -> None:
        self._run_batch = run_batch
        self._waiting: list[tuple[np.ndarray, asyncio.Future[None]]] = []
        self._flushes: set[asyncio.Task[None]] = set()  # (the loop keeps only weak references)

    async def submit(self, x: np.ndarray) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiting.append((x, done))
        if len(self._waiting) == 1:  # the first of this turn: the pass starts on the next turn
            flush = loop.create_task(self._flush())
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        await done

    async def _flush(self) -> None:
        batch, self._waiting = self._waiting, []
        try:
            await self._run_batch([x for x, _ in batch])
        except BaseException as e:
            for _, done in batch:
                if not done.done():
                    done.set_exception(e)
            if not isinstance(e, Exception):
                raise
        else:
            for _, done in batch:
                if not done.done():
                    done.set_result(None)


def _modes(impls: list[str], params: list[np.ndarray], batched: bool) -> list[tuple[str, Pass]]:
    modes: list[tuple[str, Pass]] = []
    for impl in impls:
        if impl == ASYNCGRAD:
            import asyncgrad as ag

            ps = nets.ag_params(params)

            async def ag_pass(x: np.ndarray, ps: list[Any] = ps) -> None:
                await ag.backward(nets.ag_graph(ps, x))

            async def ag_batch(xs: list[np.ndarray], ps: list[Any] = ps) -> None:
                # each pass's loss is the mean over its rows: the sum of those means
                await ag.backward(nets.ag_graph(ps, np.concatenate(xs)) * len(xs))

            modes.append(("asyncgrad (awaited)", ag_pass))
            if batched:
                modes.append(("asyncgrad (requests batched)", TurnBatcher(ag_batch).submit))
        elif impl == TORCH:
            tps = nets.torch_params(params)

            def torch_sync(x: np.ndarray, tps: list[Any] = tps) -> None:
                nets.torch_graph(tps, x).backward()

            async def torch_inline(x: np.ndarray) -> None:
                torch_sync(x)

            async def torch_thread(x: np.ndarray) -> None:
                await asyncio.to_thread(torch_sync, x)

            def torch_batch_sync(xs: list[np.ndarray], tps: list[Any] = tps) -> None:
                (nets.torch_graph(tps, np.concatenate(xs)) * len(xs)).backward()

            async def torch_batch(xs: list[np.ndarray]) -> None:
                await asyncio.to_thread(torch_batch_sync, xs)

            modes.append(("torch inline", torch_inline))
            modes.append(("torch to_thread", torch_thread))
            if batched:
                modes.append(("torch (requests batched, to_thread)", TurnBatcher(torch_batch).submit))
        elif impl == AUTOGRAD:
            def hips_sync(x: np.ndarray) -> None:
                nets.autograd_backward(nets.autograd_graph(params, x))

            async def hips_inline(x: np.ndarray) -> None:
                hips_sync(x)

            async def hips_thread(x: np.ndarray) -> None:
                await asyncio.to_thread(hips_sync, x)

            modes.append(("autograd inline", hips_inline))
            modes.append(("autograd to_thread", hips_thread))
        elif impl == NUMPY:
            def np_sync(x: np.ndarray) -> None:
                nets.numpy_backward(params, nets.numpy_graph(params, x))

            async def np_inline(x: np.ndarray) -> None:
                np_sync(x)

            async def np_thread(x: np.ndarray) -> None:
                await asyncio.to_thread(np_sync, x)

            modes.append(("numpy inline", np_inline))
            modes.append(("numpy to_thread", np_thread))
    return modes


async def session(one_pass: Pass, inputs: list[np.ndarray], passes: int) -> dict[str, float]:
    """All tasks' passes under a ticker: passes/s and lag."""
    async def worker(x: np.ndarray) -> None:
        for _ in range(passes):
            await one_pass(x)
            await asyncio.sleep(0)

    async def all_tasks() -> None:
        await asyncio.gather(*(worker(x) for x in inputs))

    out = await ticked(all_tasks)
    out["passes_per_s"] = len(inputs) * passes / (out["elapsed_ms"] / 1e3)
    return out


def run(impls: list[str], rounds: int | None = None, tasks: int = 32, passes: int = 10,
        layers: int = 4, batch: int = 32, width: int = 128, batched: bool = True) -> Result:
    """``batched``: also the "requests batched" rows (the contended workload leaves them out)."""
    rounds = rounds or DEFAULT_ROUNDS
    params = nets.make_params(layers, width)
    inputs = [nets.make_input(batch, width, seed=100 + i) for i in range(tasks)]
    res = Result(
        "concurrent", f"{tasks} concurrent asyncio tasks x small MLP ({layers} layers, batch {batch}, "
                      f"width {width}) forward+backward, {passes} passes each",
        {"tasks": tasks, "passes_per_task": passes, "layers": layers, "batch": batch, "width": width,
         "rounds": rounds},
        [Column("passes_per_s", "passes/s", "{:,.0f}"),
         Column("p99_lag_ms", "loop p99 lag ms", "{:.2f}"),
         Column("max_lag_ms", "loop max lag ms", "{:.2f}")],
    )
    t_start = time.perf_counter()

    async def main() -> None:
        modes = _modes(impls, params, batched)
        by_mode: dict[str, list[dict[str, float]]] = {}
        for name, one_pass in modes:
            BLAS.enter(name)
            await session(one_pass, inputs[:4], 2)  # warm-up
            BLAS.leave(name)
            by_mode[name] = []
        for i in range(rounds):  # interleaved, the order rotating: load changes hit all alike
            k = i % len(modes) if modes else 0
            for name, one_pass in modes[k:] + modes[:k]:
                BLAS.enter(name)
                await asyncio.sleep(SETTLE)  # let the previous library's spinning BLAS/OpenMP threads sleep
                by_mode[name].append(await session(one_pass, inputs, passes))
                BLAS.leave(name)
        for name, sessions in by_mode.items():
            res.rows.append(session_row(name, sessions))

    asyncio.run(main())
    res.notes.append(BLAS.describe())
    res.seconds = time.perf_counter() - t_start
    a = res.value("asyncgrad (awaited)", "passes_per_s")
    res.add_ratio("asyncgrad/numpy inline", a, res.value("numpy inline", "passes_per_s"))
    res.add_ratio("asyncgrad/torch to_thread", a, res.value("torch to_thread", "passes_per_s"))
    res.add_ratio("asyncgrad/torch inline", a, res.value("torch inline", "passes_per_s"))
    batched_rate = res.value("asyncgrad (requests batched)", "passes_per_s")
    res.add_ratio("asyncgrad requests batched/torch to_thread", batched_rate,
                  res.value("torch to_thread", "passes_per_s"))
    res.add_ratio("asyncgrad requests batched/torch requests batched", batched_rate,
                  res.value("torch (requests batched, to_thread)", "passes_per_s"))
    row = res.row("asyncgrad (awaited)")
    if row is not None:
        res.targets.append(Target("concurrent >= 3,000 passes/s", a, 3000.0, "passes/s", at_least=True))
        res.targets.append(Target("concurrent loop p99 lag <= 5 ms", row["p99_lag_ms"], 5.0, "ms"))
        for peer, limit in (("numpy inline", 0.6), ("torch inline", 1.0)):
            rate = res.value(peer, "passes_per_s")
            if not math.isnan(rate):
                res.targets.append(Target(f"issue 33: concurrent >= {limit}x {peer}", a / rate, limit, "x",
                                          at_least=True))
    return res
