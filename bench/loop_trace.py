"""How long asyncgrad's own work keeps the event loop from a timer, on a busy machine too.

    python -m bench.loop_trace many_tasks 256        # N tasks awaiting prebuilt small graphs
    python -m bench.loop_trace concurrent 32         # N tasks each running forward + backward
    python -m bench.loop_trace many_tasks 256 --show 3   # also what ran in the 3 worst windows

Every callback the asyncio loop runs is timed in *thread CPU time* (``time.thread_time``),
and for each tick of a 1 ms timer the CPU time of the callbacks that ended between the
tick's due time and its run is summed (the one running when the tick fell due counts
whole): the loop's lag that the engine and the tasks caused,
without the time the kernel gave the thread to other processes (which dominates the
wall-clock lag on a shared machine). Printed: passes/s, passes per CPU-second, the wall
p99 lag, and the p99 / max of that CPU time, median of ``--sessions`` sessions, GC off.
Use ``PYTHONPATH=<other checkout>/src`` to trace another version of asyncgrad.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import gc
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from . import nets

_records: list[tuple[float, float, Any]] = []  # (wall end, CPU seconds, callback)
_original_run = asyncio.events.Handle._run


def _timed_run(self: asyncio.events.Handle) -> None:
    cpu = time.thread_time()
    _original_run(self)
    _records.append((time.perf_counter(), time.thread_time() - cpu, self._callback))


def _name(callback: Any) -> str:
    owner = getattr(callback, "__self__", None)
    coro = owner.get_coro() if isinstance(owner, asyncio.Task) else None
    return getattr(coro, "__qualname__", getattr(callback, "__qualname__", repr(callback)[:40]))


def _session(workload: str, n: int, passes: int, params: list[Any]) -> Callable[[], Awaitable[Any]]:
    """The workload's tasks, ready to run (many_tasks' graphs are built here, untimed)."""
    import asyncgrad as ag

    if workload == "many_tasks":
        per = max(1, passes // n)
        graphs = [[nets.ag_graph(params, nets.make_input(8, 32, seed=t * per + i)) for i in range(per)]
                  for t in range(n)]

        async def awaiting(mine: list[Any]) -> None:
            for loss in mine:
                await ag.backward(loss)

        return lambda: asyncio.gather(*(awaiting(g) for g in graphs))
    xs = [nets.make_input(32, 128, seed=100 + i) for i in range(n)]

    async def forward_backward(x: Any) -> None:
        for _ in range(max(1, passes // n)):
            await ag.backward(nets.ag_graph(params, x))
            await asyncio.sleep(0)

    return lambda: asyncio.gather(*(forward_backward(x) for x in xs))


async def _traced(workload: str, n: int, passes: int, params: list[Any], show: int) -> tuple[float, ...]:
    loop = asyncio.get_running_loop()
    ticks: list[tuple[float, float]] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            due = loop.time() + 0.001
            await asyncio.sleep(0.001)
            ticks.append((due, loop.time()))

    session = _session(workload, n, passes, params)
    tick_task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.005)
    ticks.clear()
    _records.clear()
    gc.collect()
    gc.disable()
    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        await session()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        asyncio.events.Handle._run = _original_run  # type: ignore[method-assign]
        gc.enable()
    stop = True
    await tick_task
    offset = time.perf_counter() - loop.time()
    ends = np.array([r[0] for r in _records])
    cpus = np.array([r[1] for r in _records])
    # the callbacks that ended after the tick fell due and before it ran (the one running
    # when it fell due counts whole: an upper bound)
    windows = [(int(np.searchsorted(ends, due + offset)), int(np.searchsorted(ends, ran + offset)))
               for due, ran in ticks]
    busy = np.array([cpus[a:b].sum() for a, b in windows]) * 1e3
    lags = np.array([ran - due for due, ran in ticks]) * 1e3
    for k in np.argsort(busy)[::-1][:show]:
        a, b = windows[k]
        names: Counter[str] = Counter()
        for j in range(a, b):
            names[_name(_records[j][2])] += 1
        print(f"  window {k}: {busy[k]:.2f} ms CPU in {b - a} callbacks: {dict(names.most_common(4))}")
    return (passes / wall, passes / cpu, float(np.percentile(lags, 99)), float(np.percentile(busy, 99)),
            float(busy.max()))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=["many_tasks", "concurrent"])
    p.add_argument("tasks", type=int)
    p.add_argument("--passes", type=int, default=1024)
    p.add_argument("--sessions", type=int, default=5)
    p.add_argument("--show", type=int, default=0, help="print what ran in the N worst windows of the last session")
    args = p.parse_args(argv)
    width = 32 if args.workload == "many_tasks" else 128
    params = nets.ag_params(nets.make_params(4, width))

    async def run() -> None:
        await _session(args.workload, 4, 16, params)()  # warm-up
        results = [await _traced(args.workload, args.tasks, args.passes, params,
                                 args.show if i == args.sessions - 1 else 0) for i in range(args.sessions)]
        passes_s, per_cpu, wall_p99, busy_p99, busy_max = np.median(np.array(results), axis=0)
        print(f"{args.workload} N={args.tasks}: {passes_s:,.0f} passes/s, {per_cpu:,.0f} per CPU-second; "
              f"wall lag p99 {wall_p99:.2f} ms; loop CPU between ticks p99 {busy_p99:.2f} ms, "
              f"max {busy_max:.2f} ms (median of {args.sessions} sessions)")

    asyncio.run(run())


if __name__ == "__main__":
    main()
