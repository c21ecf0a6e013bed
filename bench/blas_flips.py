"""How often numpy's BLAS threads switch while a few tasks alternate backward calls.

    python -m bench.blas_flips 2          # 2 tasks x 480 forward+backward passes
    python -m bench.blas_flips 32 --passes 30

The ``concurrent`` workload's pass (small MLP, 4 layers, width 128, batch 32, float32,
``sleep(0)`` after each pass) on N asyncio tasks. Printed: microseconds per pass, the
``set_num_threads`` calls the engine made (Note [BLAS hysteresis] in
src/asyncgrad/autograd/runtime/blas.py), and how many forward passes ran with single-threaded
BLAS. Use ``PYTHONPATH=<other checkout>/src`` to measure another version of asyncgrad.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np

import asyncgrad as ag
from asyncgrad.autograd.runtime import blas as policy

from . import nets


def _count_switches(counts: dict[str, int]) -> None:
    for lib in policy.BLAS._libs:
        original = lib.set_num_threads

        def counted(n: int, original: Any = original) -> Any:
            counts["set_num_threads"] += 1
            return original(n)

        lib.set_num_threads = counted


async def _main(tasks: int, passes: int) -> None:
    params = [p.astype(np.float32) for p in nets.make_params(4, 128)]
    ps = nets.ag_params(params)
    inputs = [nets.make_input(32, 128, seed=100 + i).astype(np.float32) for i in range(tasks)]
    counts = {"set_num_threads": 0, "single_forwards": 0}

    async def worker(x: np.ndarray, n: int) -> None:
        for _ in range(n):
            if policy.BLAS.per_call == 1:
                counts["single_forwards"] += 1
            await ag.backward(nets.ag_graph(ps, x))
            await asyncio.sleep(0)

    await asyncio.gather(*(worker(x, 3) for x in inputs[:4]))  # warm-up, and the engine's set-up
    await asyncio.to_thread(ag.autograd.get_engine().policy.ready.wait)
    _count_switches(counts)
    counts["single_forwards"] = 0
    start = time.perf_counter()
    await asyncio.gather(*(worker(x, passes) for x in inputs))
    elapsed = time.perf_counter() - start
    total = tasks * passes
    print(f"{tasks} tasks x {passes} passes: {elapsed / total * 1e6:.1f} us/pass, "
          f"set_num_threads calls {counts['set_num_threads']}, "
          f"forward passes with single-threaded BLAS {counts['single_forwards']}/{total}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", type=int, nargs="?", default=2)
    parser.add_argument("--passes", type=int, default=0, help="passes per task (default: 960 in all)")
    args = parser.parse_args()
    asyncio.run(_main(args.tasks, args.passes or max(1, 960 // args.tasks)))


if __name__ == "__main__":
    main()
