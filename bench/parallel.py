"""Speed-up from running independent branches on worker threads (issue 3).

A graph of K independent heavy branches (each ``ops`` elementwise ops — sin, *c, tanh,
+c — on ``size`` values, the branch sums added into one loss) is differentiated by
asyncgrad three ways, interleaved round by round with two numpy references:

* offload   — the default engine: nodes with work >= inline_threshold run on worker
  threads, up to max_workers (= cores) at once, so independent branches overlap; a
  branch's heavy nodes run as one worker chain (Note [Worker chains]);
* inline    — ``Engine(inline_threshold=huge)``: every node on the event loop, one by one;
* 1 worker  — ``Engine(max_workers=1)``: offloaded, but one kernel at a time;
* numpy 1 by 1 / numpy pool — the hand-written branch backwards, one after the other
  and on a pool of ``cores`` threads: what threads can give on this machine at all.

Two presets: ``float64`` (sin/cos/tanh in float64 are compute-bound, the case threads
are for) and ``float32`` (1M float32 values: memory-bound, so two threads share one
memory bus and even plain numpy gains little). Prints each time (median) and the
speed-up of offload over inline next to numpy's own (the ceiling) and the ideal
min(K, cores).

    python bench/parallel.py [--preset float64 --preset float32] [--k 2 --k 4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

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


PRESETS = {"float64": (np.float64, 1_000_000), "float32": (np.float32, 1_000_000)}


def measure_k(k: int, size: int, ops: int, rounds: int, dtype: Any) -> dict[str, float]:
    xs0, c0 = wide._inputs(k, size, dtype)
    offload = Engine()
    engines = {"offload": offload, "inline": Engine(inline_threshold=2**62), "1 worker": Engine(max_workers=1)}
    cases = [Case(name, lambda: wide.ag_graph(xs0, c0, ops), _with_engine(e)) for name, e in engines.items()]
    cores = os.cpu_count() or 1
    pool = ThreadPoolExecutor(cores)

    def np_setup() -> list[list[np.ndarray]]:
        return [wide.numpy_forward_branch(x0, c0, ops) for x0 in xs0]

    def np_pool(ss: list[list[np.ndarray]]) -> None:
        list(pool.map(lambda s: wide.numpy_backward_branch(s, c0, ops), ss))

    cases.append(Case("numpy 1 by 1", np_setup, lambda ss: [wide.numpy_backward_branch(s, c0, ops) for s in ss]))
    cases.append(Case("numpy pool", np_setup, np_pool))
    try:
        times = measure_cases(cases, rounds, settle=0.02)
    finally:
        pool.shutdown()
    out = {name: median(t) for name, t in times.items()}
    out["max_workers"] = offload.max_workers
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="speed-up of K independent branches on worker threads")
    p.add_argument("--preset", action="append", choices=sorted(PRESETS),
                   help="dtype and size (repeatable; default float64 then float32)")
    p.add_argument("--k", type=int, action="append", help="branches (repeatable; default 1 2 4 8)")
    p.add_argument("--size", type=int, help="values per branch (default: the preset's)")
    p.add_argument("--ops", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    cores = os.cpu_count() or 1
    for preset in a.preset or ["float64", "float32"]:
        dtype, size = PRESETS[preset]
        size = a.size or size
        print(f"\n{preset}: cores={cores}; each branch {a.ops} ops on {size:,} {preset}; "
              f"medians of {a.rounds} rounds (ms)")
        print(f"{'K':>3} {'workers':>7} {'inline':>8} {'offload':>8} {'1 worker':>9} {'np 1by1':>8} "
              f"{'np pool':>8} {'speed-up':>9} {'numpy':>6} {'ideal':>6}")
        for k in a.k or [1, 2, 4, 8]:
            r = measure_k(k, size, a.ops, a.rounds, dtype)
            print(f"{k:>3} {int(r['max_workers']):>7} {r['inline'] * 1e3:>8.1f} {r['offload'] * 1e3:>8.1f} "
                  f"{r['1 worker'] * 1e3:>9.1f} {r['numpy 1 by 1'] * 1e3:>8.1f} {r['numpy pool'] * 1e3:>8.1f} "
                  f"{r['inline'] / r['offload']:>8.2f}x {r['numpy 1 by 1'] / r['numpy pool']:>5.2f}x "
                  f"{min(k, cores):>5}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
