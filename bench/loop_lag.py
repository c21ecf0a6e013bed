"""Event-loop lag during a large backward (issue 3): a 1 ms ticker runs on the loop while
asyncgrad's backward is awaited on the same loop; prints the p50 / p99 / max lateness of
the ticker and the backward's time, for three graphs:

* mlp  — 10 backwards of a 4-layer MLP, batch 256, width 1024 (big matmul nodes: offloaded);
* deep — one backward of a 100,000-node chain of tiny ops (all inline: the engine must
  yield to the loop every ``yield_interval``);
* wide — one backward of 16 branches x 8 elementwise ops on 1M floats (offloaded ufuncs).

    python bench/loop_lag.py [--only mlp] [--rounds 3]

The forward graphs are built before the ticker starts and dropped after it stopped:
"drop graph" is the time CPython takes to free them (the caller's cost, on whichever
thread drops the last reference; a 100,000-node graph takes tens of ms). Figures are
medians over rounds (and the worst max over rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgrad as ag  # noqa: E402
from bench import nets  # noqa: E402
from bench.workloads import chain, wide  # noqa: E402
from bench.workloads.loop_lag import idle_session, lag_session  # noqa: E402

SCENARIOS = ("mlp", "deep", "wide")


def _builder(name: str) -> tuple[Any, int, str]:
    if name == "mlp":
        params = nets.ag_params(nets.make_params(4, 1024))
        x = nets.make_input(256, 1024)
        return (lambda: nets.ag_graph(params, x)), 10, "10 backwards, 4-layer MLP batch 256 width 1024"
    if name == "deep":
        x0, c0 = chain._inputs(1, 1e-4)
        return (lambda: chain.ag_forward(x0, c0, 100_000)), 1, "1 backward, 100,000-node chain of tiny ops"
    if name == "wide":
        xs0, c0 = wide._inputs(16, 1_000_000)
        return (lambda: wide.ag_graph(xs0, c0, 8)), 1, "1 backward, 16 branches x 8 ops on 1M floats"
    raise ValueError(name)


async def _main(only: list[str], rounds: int) -> None:
    eng = ag.autograd.get_engine()
    print(f"engine: max_workers={eng.max_workers} inline_threshold={eng.inline_threshold} "
          f"yield_interval={eng.yield_interval * 1e3:.1f} ms; ticker interval 1 ms; {rounds} rounds")
    print(f"{'scenario':<8} {'backward':>12} {'p50 lag':>9} {'p99 lag':>9} {'max lag':>9} {'worst max':>10} "
          f"{'ticks':>6} {'drop graph':>10}  graph")
    idle = [await idle_session() for _ in range(rounds)]
    _print("idle", idle, "ticker alone (the loop's own jitter)")
    for name in only:
        build, backwards, what = _builder(name)
        await lag_session(build, ag.backward, 1)  # warm-up
        sessions = [await lag_session(build, ag.backward, backwards) for _ in range(rounds)]
        _print(name, sessions, what)


def _print(name: str, sessions: list[dict[str, float]], what: str) -> None:
    def med(k: str) -> float:
        return statistics.median(s.get(k, 0.0) for s in sessions)

    worst = max(s["max_lag_ms"] for s in sessions)
    print(f"{name:<8} {med('elapsed_ms'):>9.1f} ms {med('p50_lag_ms'):>6.2f} ms {med('p99_lag_ms'):>6.2f} ms "
          f"{med('max_lag_ms'):>6.2f} ms {worst:>7.2f} ms {med('ticks'):>6.0f} {med('drop_ms'):>7.1f} ms  {what}",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="ticker lag during asyncgrad backwards")
    p.add_argument("--only", action="append", choices=SCENARIOS)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    asyncio.run(_main(a.only or list(SCENARIOS), a.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
