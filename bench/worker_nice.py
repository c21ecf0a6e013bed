"""The worker threads' niceness (Note [Niced kernels on the cores others leave] in
sched/placement.py): 10 MLP backwards (4 layers, batch 256, width 1024) under a 1 ms ticker on
the loop, with ``Engine(worker_nice=n)`` for each n (``auto``: the default, None; ``n/t``:
niceness n on ``max_workers=t`` threads), and the idle loop (the ticker alone) in the
same rounds; interleaved rounds, medians, and the
time the loop's thread waited, runnable, for a CPU during the backwards (the part of its
lag the OS scheduler caused; Linux). With
``--busy``, next to one other process that spins on a core the whole time. The header
gives the cores' worth of CPU that other processes (the spinner included) kept busy.

With ``--graph wide``, 8 independent branches of three elementwise ops on 1 M floats
each (sin and tanh above the inline threshold: two kernels at once) instead of the MLP.

    python -m bench.worker_nice [--rounds 5] [--busy] [--nice auto 10 0 10/1] [--graph wide]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgrad as ag  # noqa: E402
from asyncgrad.autograd.engine import Engine, set_engine  # noqa: E402
from asyncgrad.autograd.runtime.cpu_load import read_busy_seconds  # noqa: E402
from bench import nets  # noqa: E402
from bench.workloads.loop_lag import idle_session, lag_session  # noqa: E402

IDLE = "idle loop"


def _engine(setting: str) -> Engine:
    """``auto``, ``n`` or ``n/t`` (niceness n on t threads)."""
    if setting == "auto":
        return Engine()
    nice, _, threads = setting.partition("/")
    return Engine(worker_nice=int(nice), max_workers=int(threads) if threads else None)


def _builder(graph: str) -> Any:
    if graph == "mlp":
        params = nets.ag_params(nets.make_params(4, 1024))
        x = nets.make_input(256, 1024)
        return lambda: nets.ag_graph(params, x)
    rng = np.random.default_rng(0)
    xs = [ag.from_numpy(rng.standard_normal(1_000_000).astype(np.float32)).requires_grad_() for _ in range(8)]
    return lambda: sum(((x.sin() * 1.5).tanh().sum() for x in xs), ag.tensor(0.0))


async def _run(nices: list[str], rounds: int, graph: str) -> dict[str, list[dict[str, float]]]:
    build = _builder(graph)
    engines = {n: _engine(n) for n in nices}
    results: dict[str, list[dict[str, float]]] = {n: [] for n in [*nices, IDLE]}
    for r in range(rounds + 1):  # round 0 warms up; the order rotates
        if r:
            results[IDLE].append(await idle_session())
        k = r % len(nices)
        for n in nices[k:] + nices[:k]:
            set_engine(engines[n])
            await asyncio.sleep(0.2)  # BLAS's helper threads stop spinning
            session = await lag_session(build, ag.backward, 10)
            if r:
                results[n].append(session)
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--busy", action="store_true", help="next to one process spinning on a core")
    p.add_argument("--nice", nargs="+", default=["auto", "10", "0"],
                   help="settings: auto, a niceness n, or n/t (niceness n on t threads)")
    p.add_argument("--graph", choices=["mlp", "wide"], default="mlp")
    args = p.parse_args(argv)
    for n in args.nice:
        nice, _, threads = n.partition("/")
        if n != "auto" and not (nice.isdigit() and (not threads or threads.isdigit())):
            p.error(f"--nice takes auto, a niceness or niceness/threads, got {n!r}")
    cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    busy0, own0, t0 = read_busy_seconds(cpus), time.process_time(), time.monotonic()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        results = asyncio.run(_run(args.nice, args.rounds, args.graph))
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    busy1, own1, t1 = read_busy_seconds(cpus), time.process_time(), time.monotonic()
    others = "?" if busy0 is None or busy1 is None else f"{((busy1 - busy0) - (own1 - own0)) / (t1 - t0):.2f}"
    print(f"# {time.strftime('%H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}, others kept {others} "
          f"cores busy{' (one busy process added)' if args.busy else ''}; "
          f"python -m bench.worker_nice --rounds {args.rounds}{' --busy' if args.busy else ''} "
          f"--nice {' '.join(args.nice)} --graph {args.graph}")
    print("| worker_nice | 10 backwards ms | p99 lag ms | max lag ms | loop waited for a CPU ms |")
    print("|---|---:|---:|---:|---:|")
    for n, sessions in results.items():
        def med(key: str, sessions: list[dict[str, float]] = sessions) -> float:
            return statistics.median(s[key] for s in sessions)
        name = n if n == IDLE else ("None (auto)" if n == "auto" else n.replace("/", ", max_workers="))
        waited = "" if n == IDLE else f"{med('runqueue_ms'):.1f}"
        print(f"| {name} | {med('elapsed_ms'):.1f} | {med('p99_lag_ms'):.2f} | {med('max_lag_ms'):.2f} | {waited} |")


if __name__ == "__main__":
    main()
