"""The fixed cost of one backward call, cold and warm: what the small-op rows of the ``ops``
workload pay besides their kernels.

The ``ops`` workload times each backward right after a ``gc.collect()`` (``no_gc`` in
bench/common.py), with the other cases of the round (torch's, the forward) in between, so
its backward calls are more than ``cpu_load.INTERVAL`` apart. "cold" mimics that: for each
call, a graph is built untimed, then ``gc.collect()``, a pause of ``--gap`` seconds (past
the interval by default), and the timed ``await ag.backward``. "warm" times backward calls
back to back, without collecting. Both run with numpy's BLAS pinned at one thread, as the
``ops`` rows do, and (when installed) with torch imported, whose objects make the collector's
pass as long as in the benchmark. Reports the median of ``--calls`` calls per case, in us.

    PYTHONPATH=$PWD/src env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.cold_backward
    ... python -m bench.cold_backward --cases tiny max_pool2d --calls 200 --profile

Alternate two trees (PYTHONPATH) in the same minutes and compare medians; check ``uptime``.
``--cpu`` times the calling thread's CPU time instead of the wall clock.
With ``--profile`` it prints cProfile's top functions of the cold calls instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib.util
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _cases() -> dict[str, Callable[[], tuple[list[Any], Callable[[], Any], Any]]]:
    import asyncgrad as ag
    import asyncgrad.nn.functional as AF

    rng = np.random.default_rng(0)
    image = (16, 16, 32, 32)  # the ops workload's small images (bench/workloads/ops.py IMAGES)

    def leaf(*shape: int) -> Any:
        return ag.from_numpy(rng.standard_normal(shape).astype(np.float32)).requires_grad_()

    def tiny() -> tuple[list[Any], Callable[[], Any], Any]:
        x = leaf(4)
        return [x], lambda: (x * 2.0).sum(), None

    def max_pool2d() -> tuple[list[Any], Callable[[], Any], Any]:
        x = leaf(*image)
        g = ag.from_numpy(rng.standard_normal((16, 16, 16, 16)).astype(np.float32))
        return [x], lambda: AF.max_pool2d(x, 2), g

    def batch_norm() -> tuple[list[Any], Callable[[], Any], Any]:
        x, w, b = leaf(*image), leaf(image[1]), leaf(image[1])
        g = ag.from_numpy(rng.standard_normal(image).astype(np.float32))
        return [x, w, b], lambda: AF.batch_norm(x, None, None, w, b, training=True), g

    return {"tiny": tiny, "max_pool2d": max_pool2d, "batch_norm": batch_norm}


async def _measure(make: Callable[[], tuple[list[Any], Callable[[], Any], Any]], calls: int, cold: bool,
                   gap: float, prof: cProfile.Profile | None,
                   clock: Callable[[], float] = time.perf_counter) -> list[float]:
    import asyncgrad as ag

    leaves, forward, g = make()
    times = []
    for i in range(calls + 2):  # two warm-ups
        for t in leaves:
            t.grad = None
        out = forward()
        if cold:
            gc.collect()
            time.sleep(gap)
        was = gc.isenabled()
        gc.disable()
        try:
            if prof is not None and i >= 2:
                prof.enable()
            t0 = clock()
            await ag.backward(out, g)
            dt = clock() - t0
            if prof is not None:
                prof.disable()
        finally:
            if was:
                gc.enable()
        del out
        if i >= 2:
            times.append(dt)
    return times


def _top(prof: cProfile.Profile, calls: int, n: int = 30) -> str:
    """cProfile's top functions by their own time, in us per backward call."""
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:n]
    out = []
    for (path, line, fn), (_cc, nc, tt, ct, _callers) in rows:
        where = f"{'/'.join(path.split('/')[-2:])}:{line}({fn})"
        out.append(f"{tt / calls * 1e6:8.1f} {ct / calls * 1e6:8.1f}  x{nc / calls:<4.1f} {where}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=["tiny", "max_pool2d", "batch_norm"])
    parser.add_argument("--calls", type=int, default=60, help="timed calls per case and mode")
    parser.add_argument("--gap", type=float, default=0.12, help="seconds between a cold call and the last")
    parser.add_argument("--profile", action="store_true", help="cProfile the cold calls instead")
    parser.add_argument("--no-torch", action="store_true", help="do not import torch")
    parser.add_argument("--cpu", action="store_true",
                        help="time the calling thread's CPU time (time.thread_time), not the wall clock: "
                             "less disturbed by other processes, and blind to other threads' work")
    args = parser.parse_args()
    if not args.no_torch and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401  (its objects lengthen the collector's pass, as in the ops workload)
    from asyncgrad.autograd.runtime.blas import BLAS
    from asyncgrad.ops import kernels

    kernels.wait()
    cases = _cases()
    BLAS.configure()
    with BLAS.pinned(1):
        for name in args.cases:
            if args.profile:
                prof = cProfile.Profile()
                asyncio.run(_measure(cases[name], args.calls, True, args.gap, prof))
                print(f"== {name}: cold, {args.calls} calls; us per backward call: own, cumulative")
                print(_top(prof, args.calls))
                continue
            row = []
            for mode in ("cold", "warm"):
                clock = time.thread_time if args.cpu else time.perf_counter
                times = asyncio.run(_measure(cases[name], args.calls, mode == "cold", args.gap, None, clock))
                row.append(f"{mode} {statistics.median(times) * 1e6:8.1f} us")
            print(f"{name:12s} " + "   ".join(row), flush=True)


if __name__ == "__main__":
    main()
