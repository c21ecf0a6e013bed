"""The worker threads' niceness (Note [Worker threads yield the CPU to the loop] in
runtime/workers.py): 10 MLP backwards (4 layers, batch 256, width 1024) under a 1 ms ticker on
the loop, with ``Engine(worker_nice=n)`` for each n, interleaved rounds, medians; with
``--busy``, next to one other process that spins on a core the whole time.

    python -m bench.worker_nice [--rounds 4] [--busy] [--nice 10 5 2 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgrad as ag  # noqa: E402
from asyncgrad.autograd.engine import Engine, set_engine  # noqa: E402
from bench import nets  # noqa: E402
from bench.workloads.loop_lag import lag_session  # noqa: E402


async def _run(nices: list[int], rounds: int) -> dict[int, list[dict[str, float]]]:
    params = nets.ag_params(nets.make_params(4, 1024))
    x = nets.make_input(256, 1024)

    def build() -> Any:
        return nets.ag_graph(params, x)

    engines = {n: Engine(worker_nice=n) for n in nices}
    results: dict[int, list[dict[str, float]]] = {n: [] for n in nices}
    for r in range(rounds + 1):  # round 0 warms up; the order alternates
        for n in (nices if r % 2 else nices[::-1]):
            set_engine(engines[n])
            session = await lag_session(build, ag.backward, 10)
            if r:
                results[n].append(session)
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--busy", action="store_true", help="next to one process spinning on a core")
    p.add_argument("--nice", type=int, nargs="+", default=[10, 5, 2, 0])
    args = p.parse_args(argv)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        results = asyncio.run(_run(args.nice, args.rounds))
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print(f"# load {os.getloadavg()[0]:.2f}{', one busy process' if args.busy else ''}; "
          f"python -m bench.worker_nice --rounds {args.rounds}{' --busy' if args.busy else ''}")
    print("| worker_nice | 10 backwards ms | p99 lag ms | max lag ms |")
    print("|---:|---:|---:|---:|")
    for n, sessions in results.items():
        def med(key: str, sessions: list[dict[str, float]] = sessions) -> float:
            return statistics.median(s[key] for s in sessions)
        print(f"| {n} | {med('elapsed_ms'):.1f} | {med('p99_lag_ms'):.2f} | {med('max_lag_ms'):.2f} |")


if __name__ == "__main__":
    main()
