"""Speed-up from running independent branches on worker threads (issue 3).

A graph of K independent heavy branches (each ``ops`` elementwise ops — sin, *c, tanh,
+c — on ``size`` float32 values, the branch sums added into one loss) is differentiated by
asyncgrad three ways, interleaved round by round:

* offload   — the default engine: nodes with work >= inline_threshold run on worker
  threads, up to max_workers (= cores) at once, so independent branches overlap;
* inline    — ``Engine(inline_threshold=huge)``: every node on the event loop, one by one;
* 1 worker  — ``Engine(max_workers=1)``: offloaded, but one kernel at a time.

Prints K, the cores, each time (median), and the speed-up of offload over inline (the
ideal is about min(K, cores) when the kernels are compute-bound and release the GIL).

    python bench/parallel.py [--k 2 --k 4 --k 8] [--size 1000000] [--ops 8] [--rounds 5] [--mallopt]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgrad as ag  # noqa: E402
from asyncgrad.autograd import Engine, get_engine, set_engine  # noqa: E402
from bench.common import Case, measure_cases, median  # noqa: E402
from bench.workloads import wide  # noqa: E402


def _with_engine(engine: Engine) -> Any:
    async def run(loss: Any) -> None:
        prev = get_engine()
        set_engine(engine)
        try:
            await ag.backward(loss)
        finally:
            set_engine(prev)

    return run


def measure_k(k: int, size: int, ops: int, rounds: int) -> dict[str, float]:
    xs0, c0 = wide._inputs(k, size)
    offload = Engine()
    engines = {"offload": offload, "inline": Engine(inline_threshold=2**62), "1 worker": Engine(max_workers=1)}
    cases = [Case(name, lambda: wide.ag_graph(xs0, c0, ops), _with_engine(e)) for name, e in engines.items()]
    times = measure_cases(cases, rounds)
    out = {name: median(t) for name, t in times.items()}
    out["max_workers"] = offload.max_workers
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="speed-up of K independent branches on worker threads")
    p.add_argument("--k", type=int, action="append", help="branches (repeatable; default 1 2 4 8)")
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--ops", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mallopt", action="store_true", help="raise glibc malloc's mmap/trim thresholds first")
    a = p.parse_args(argv)
    if a.mallopt:
        from bench.common import tune_malloc

        tune_malloc()
    cores = os.cpu_count() or 1
    print(f"cores={cores}; each branch {a.ops} ops on {a.size:,} float32; medians of {a.rounds} rounds"
          + ("; glibc malloc thresholds raised" if a.mallopt else ""))
    print(f"{'K':>3} {'cores':>5} {'workers':>7} {'inline ms':>10} {'offload ms':>11} {'1 worker ms':>12} "
          f"{'speed-up':>9} {'ideal':>6}")
    for k in a.k or [1, 2, 4, 8]:
        r = measure_k(k, a.size, a.ops, a.rounds)
        print(f"{k:>3} {cores:>5} {int(r['max_workers']):>7} {r['inline'] * 1e3:>10.1f} {r['offload'] * 1e3:>11.1f} "
              f"{r['1 worker'] * 1e3:>12.1f} {r['inline'] / r['offload']:>8.2f}x {min(k, cores):>5}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
