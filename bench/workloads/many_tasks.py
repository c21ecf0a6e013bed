"""many_tasks: N = 1, 8, 64, 256 asyncio tasks on one loop, each awaiting the backward of
small-MLP graphs built beforehand (no forward on the loop while timed): total backward
passes per second, and the p99 lag of a 1 ms ticker on the same loop meanwhile.

The same number of passes (``total``) at every N, split evenly over the tasks. Peer:
torch, each task calling ``backward()`` through ``asyncio.to_thread`` on its prebuilt
graphs, in the same run. Targets (issue 11): loop p99 lag <= 2 x yield_interval + 1 ms at
every N, and passes/s not falling from N = 1 to N = 256.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import nets
from ..common import ASYNCGRAD, BLAS, SETTLE, TORCH, About, Column, Result, Target, session_row, ticked

ABOUT = About(
    title="Many backward calls in flight on one loop",
    measures="N = 1, 8, 64 and 256 asyncio tasks on one loop, each awaiting the backward of small-MLP graphs "
             "built beforehand (the same total number of passes at every N): backward passes per second over "
             "all tasks, and how late a 1 ms timer on the same loop fires meanwhile. The peer is PyTorch, each "
             "task calling backward() through asyncio.to_thread.",
    reading="Passes/s should not fall as N grows, and the loop's lag should stay near the engine's "
            "yield_interval (0.5 ms) plus the timer's own 1 ms whatever N is: all backward calls on a loop "
            "share one scheduler, which gives the loop a turn every yield_interval.",
    plots=(("passes_per_s", "passes/s", False), ("p99_lag_ms", "loop p99 lag ms", False)),
)

DEFAULT_ROUNDS = 3
COUNTS = (1, 8, 64, 256)


def _builders(impls: list[str], params: list[Any], batch: int, width: int
              ) -> list[tuple[str, Callable[[int], Any], Callable[[Any], Awaitable[Any]]]]:
    """(name, build graph k, await its backward) per implementation."""
    out: list[tuple[str, Callable[[int], Any], Callable[[Any], Awaitable[Any]]]] = []
    if ASYNCGRAD in impls:
        import asyncgrad as ag

        ps = nets.ag_params(params)
        out.append(("asyncgrad (awaited)", lambda k: nets.ag_graph(ps, nets.make_input(batch, width, seed=k)),
                    ag.backward))
    if TORCH in impls:
        tps = nets.torch_params(params)

        async def torch_backward(loss: Any) -> None:
            await asyncio.to_thread(loss.backward)

        out.append(("torch to_thread", lambda k: nets.torch_graph(tps, nets.make_input(batch, width, seed=k)),
                    torch_backward))
    return out


async def session(build: Callable[[int], Any], backward: Callable[[Any], Awaitable[Any]],
                  tasks: int, total: int) -> dict[str, float]:
    per_task = max(1, total // tasks)
    graphs = [[build(t * per_task + i) for i in range(per_task)] for t in range(tasks)]

    async def worker(mine: list[Any]) -> None:
        for loss in mine:
            await backward(loss)

    async def all_tasks() -> None:
        await asyncio.gather(*(worker(g) for g in graphs))

    out = await ticked(all_tasks)
    out["passes_per_s"] = tasks * per_task / (out["elapsed_ms"] / 1e3)
    return out


def run(impls: list[str], rounds: int | None = None, total: int = 512, layers: int = 4,
        batch: int = 8, width: int = 32) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    params = nets.make_params(layers, width)
    res = Result(
        "many_tasks", f"N tasks each awaiting backward of prebuilt small MLPs ({layers} layers, batch {batch}, "
                      f"width {width}); {total} passes in all at every N",
        {"counts": list(COUNTS), "total": total, "layers": layers, "batch": batch, "width": width,
         "rounds": rounds},
        [Column("tasks", "tasks", "{:.0f}"), Column("passes_per_s", "passes/s", "{:,.0f}"),
         Column("p99_lag_ms", "loop p99 lag ms", "{:.2f}"), Column("max_lag_ms", "loop max lag ms", "{:.2f}")],
    )
    t_start = time.perf_counter()

    async def main() -> None:
        modes = _builders(impls, params, batch, width)
        cells: dict[tuple[str, int], list[dict[str, float]]] = {}
        for name, build, backward in modes:  # warm-up
            BLAS.enter(name)
            await session(build, backward, 4, 16)
            BLAS.leave(name)
        for i in range(rounds):  # interleaved, the order rotating
            k = i % len(modes) if modes else 0
            for n in COUNTS:
                for name, build, backward in modes[k:] + modes[:k]:
                    BLAS.enter(name)
                    await asyncio.sleep(SETTLE)
                    cells.setdefault((name, n), []).append(await session(build, backward, n, total))
                    BLAS.leave(name)
        for (name, n), sessions in cells.items():
            res.rows.append(session_row(f"{name} N={n}", sessions, tasks=n))

    asyncio.run(main())
    res.notes.append(BLAS.describe())
    res.seconds = time.perf_counter() - t_start
    a = "asyncgrad (awaited)"
    if res.row(f"{a} N=1") is not None:
        import asyncgrad as ag

        limit = 2 * ag.autograd.get_engine().yield_interval * 1e3 + 1.0
        for n in COUNTS:
            res.targets.append(Target(f"many_tasks N={n} loop p99 lag <= {limit:.1f} ms",
                                      res.value(f"{a} N={n}", "p99_lag_ms"), limit, "ms"))
        res.add_ratio("asyncgrad N=256/N=1 passes/s", res.value(f"{a} N=256", "passes_per_s"),
                      res.value(f"{a} N=1", "passes_per_s"))
        res.targets.append(Target("many_tasks passes/s N=256 / N=1 >= 1 (does not fall)",
                                  res.ratios.get("asyncgrad N=256/N=1 passes/s", float("nan")), 1.0,
                                  at_least=True))
        for n in COUNTS:
            res.add_ratio(f"asyncgrad/torch to_thread N={n}", res.value(f"{a} N={n}", "passes_per_s"),
                          res.value(f"torch to_thread N={n}", "passes_per_s"))
    return res
