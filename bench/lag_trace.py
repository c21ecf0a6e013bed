"""Where a 1 ms ticker's lateness comes from during loop_lag's MLP backwards.

    python -m bench.lag_trace [--busy] [--sessions 3] [--show 8] [--stacks 2]

Runs loop_lag's asyncgrad session (10 MLP backwards, batch 256, width 1024, under a 1 ms
ticker) with the loop's ``select`` and callbacks instrumented. For each tick, what the
loop's thread did between the tick's due time and its run:

* ``select``: wall time inside the selector, and of it ``runq``, the thread's run-queue
  wait (``/proc/thread-self/schedstat``, prorated): a core it waited for; the rest is the
  sleep itself (epoll's millisecond rounding when the loop went to sleep with a
  fractional timeout, woken between two ticks) and the wait for the GIL after the
  wake-up (``select`` re-takes it before it returns);
* ``callbacks``: the loop's callbacks (wall), engine work or the ticker's own;
* ``other``: neither, the loop's own bookkeeping or a wait outside both.

Also per session, the loop thread's CPU time in callbacks per tick window (p99, max, and
the worst windows): the lag the engine's own work on the loop can cause, which a loaded
machine does not inflate (the wall figures above include every wait for a core).
``--stacks MS`` samples, from a watcher thread, where the loop thread is in a callback
that has run longer than MS ms (the switch interval is lowered to 0.2 ms for it, so
the sample lands within the long callback, not at its end).

Also printed per session: the ticks the loop slept towards with a fractional timeout
(Note [A woken loop's next timer] in asyncgrad/autograd/runtime/timer_wake.py) and their
lag less the run-queue wait. ``--busy`` runs the sessions beside a process spinning on
a core.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import gc
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

import numpy as np

from . import nets
from .workloads.loop_lag import busy_process


def _schedstat() -> float:
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) * 1e-9


class Trace:
    def __init__(self) -> None:
        self.selects: list[tuple[float, float, float, float]] = []  # (called, timeout, returned, runq wait)
        self.calls: list[tuple[float, float, Any, float]] = []  # (start, end, callback, thread CPU seconds)
        self.ticks: list[tuple[float, float]] = []  # (due, ran)
        self.blocked: list[float] = []  # per callback: wall less CPU less run-queue wait (the GIL, a lock)
        self.running = 0.0  # when the loop's current callback started (0: none)
        self.stacks: Counter[str] = Counter()  # --stacks: where long callbacks were seen

    def watch(self, loop_thread: int, after: float, stop: threading.Event) -> None:
        """On a thread of its own: the loop thread's stack whenever one callback has run
        longer than ``after`` seconds (sampled every 0.2 ms; needs the GIL, so it lands
        where the loop thread lets it go: a numpy call or the switch interval)."""
        while not stop.wait(0.0002):
            started = self.running
            if started and time.perf_counter() - started > after:
                frame = sys._current_frames().get(loop_thread)
                if frame is not None:
                    where = traceback.extract_stack(frame)[-8:]
                    self.stacks[" < ".join(f"{f.name}:{f.lineno}" for f in reversed(where))] += 1

    def install(self, loop: asyncio.AbstractEventLoop) -> Any:
        selector = loop._selector  # type: ignore[attr-defined]
        original = selector.select
        trace = self

        def select(timeout: float | None = None) -> Any:
            r0 = _schedstat()
            t0 = time.perf_counter()
            out = original(timeout)
            t1 = time.perf_counter()
            trace.selects.append((t0, -1.0 if timeout is None else timeout, t1, _schedstat() - r0))
            return out

        selector.select = select
        run = asyncio.events.Handle._run

        def timed(handle: asyncio.events.Handle) -> None:
            r0 = _schedstat()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            trace.running = t0
            run(handle)
            trace.running = 0.0
            t1, c1 = time.perf_counter(), time.thread_time()
            trace.calls.append((t0, t1, handle._callback, c1 - c0))
            trace.blocked.append((t1 - t0) - (c1 - c0) - (_schedstat() - r0))

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]

        def undo() -> None:
            selector.select = original
            asyncio.events.Handle._run = run  # type: ignore[method-assign]

        return undo


def _name(callback: Any) -> str:
    owner = getattr(callback, "__self__", None)
    coro = owner.get_coro() if isinstance(owner, asyncio.Task) else None
    return getattr(coro, "__qualname__", getattr(callback, "__qualname__", repr(callback)[:40]))


async def session(ps: list[Any], x: np.ndarray, backwards: int, trace: Trace | None) -> tuple[list[float], float]:
    import asyncgrad as ag

    graphs = [nets.ag_graph(ps, x) for _ in range(backwards)]
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            t1 = time.perf_counter()
            lags.append(t1 - t0 - 0.001)
            if trace is not None:
                trace.ticks.append((t0 + 0.001, t1))

    gc.collect()
    gc.disable()
    task = loop.create_task(ticker())
    await asyncio.sleep(0.01)
    lags.clear()
    undo = trace.install(loop) if trace is not None else None
    watching = threading.Event()
    if trace is not None:
        trace.ticks.clear()
        if STACKS_AFTER:
            threading.Thread(target=trace.watch, args=(threading.get_ident(), STACKS_AFTER, watching),
                             daemon=True).start()
    t0 = time.perf_counter()
    try:
        for g in graphs:
            await ag.backward(g)
            await asyncio.sleep(0)
        elapsed = time.perf_counter() - t0
        await asyncio.sleep(0.002)
    finally:
        watching.set()
        if undo is not None:
            undo()
        stop = True
        await task
        gc.enable()
    return lags, elapsed


STACKS_AFTER = 0.0  # --stacks MS: sample the loop's stack in callbacks longer than this (seconds)


def explain(trace: Trace, show: int) -> dict[str, float]:
    """Per tick, what the loop thread did between the tick's due time and its run:
    callbacks (wall), selects (wall, and run-queue wait inside them), and the rest
    (the loop's own bookkeeping, or the GIL outside a select)."""
    rows = []
    calls, sels = trace.calls, trace.selects
    for due, ran in trace.ticks:
        cb: Counter[str] = Counter()
        n: Counter[str] = Counter()
        in_calls = cpu = 0.0
        for c0, c1, fn, c_cpu in calls:
            a, b = max(c0, due), min(c1, ran)
            if b > a:
                in_calls += b - a
                cpu += c_cpu
                cb[_name(fn)] += b - a
                n[_name(fn)] += 1
        in_sel = runq = 0.0
        timeouts = []
        for s0, timeout, s1, rq in sels:
            a, b = max(s0, due), min(s1, ran)
            if b > a:
                in_sel += b - a
                runq += rq * (b - a) / max(s1 - s0, 1e-9)
                timeouts.append(timeout)
        rows.append((ran - due, in_sel, runq, in_calls, cb, n, timeouts, cpu))
    # ticks the loop slept towards with a fractional timeout (woken between two ticks):
    # epoll rounds it up to a whole millisecond (Note [A woken loop's next timer])
    woken = [lag - runq for lag, _, runq, _, _, _, timeouts, _ in rows
             if any(0.0 < t < 0.0009 for t in timeouts)]
    if woken:
        print(f"  {len(woken)} ticks slept towards with a fractional timeout: lag less run-queue wait "
              f"median {np.median(woken) * 1e3:.2f} ms, p90 {np.percentile(woken, 90) * 1e3:.2f} ms")
    rows.sort(key=lambda r: -r[0])
    lags = np.array([r[0] for r in rows]) * 1e3
    for lag, in_sel, runq, in_calls, cb, n, timeouts, cpu in rows[:show]:
        top = ", ".join(f"{k} x{n[k]} {v * 1e3:.2f}" for k, v in cb.most_common(3))
        rest = lag - in_sel - in_calls
        shown = [round(t * 1e3, 2) for t in timeouts[:3]]
        print(f"  lag {lag * 1e3:.2f}: select {in_sel * 1e3:.2f} (runq {runq * 1e3:.2f}, timeouts {shown}) "
              f"callbacks {in_calls * 1e3:.2f} (CPU {cpu * 1e3:.2f}) other {rest * 1e3:.2f} | {top}")
    # the loop thread's own CPU time in callbacks per tick window: the lag the engine's
    # work on the loop can cause, without the waits for a core (load-independent)
    cpus = np.array([r[7] for r in rows]) * 1e3
    for lag, _, _, _, cb, n, _, cpu in sorted(rows, key=lambda r: -r[7])[:show]:
        top = ", ".join(f"{k} x{n[k]} {v * 1e3:.2f}" for k, v in cb.most_common(3))
        print(f"  CPU {cpu * 1e3:.2f} (lag {lag * 1e3:.2f}) | {top}")
    print(f"  callbacks' CPU per tick window: p99 {np.percentile(cpus, 99):.2f} max {cpus.max():.2f} ms")
    blocked = np.array(trace.blocked or [0.0]) * 1e3
    print(f"  callbacks blocked (wall less CPU less run-queue wait: the GIL, a lock): "
          f"{int((blocked > 0.5).sum())} of {len(blocked)} over 0.5 ms, max {blocked.max():.2f}, "
          f"min {blocked.min():.2f} ms (negative: a wait for a core just before the callback)")
    return {"p99": float(np.percentile(lags, 99)), "max": float(lags.max()),
            "cpu_p99": float(np.percentile(cpus, 99)), "cpu_max": float(cpus.max()),
            "selects_per_tick": len(sels) / max(1, len(rows))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", action="store_true")
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--show", type=int, default=6)
    p.add_argument("--backwards", type=int, default=10)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--stacks", type=float, default=0.0, metavar="MS",
                   help="print where the loop was inside callbacks running longer than MS ms")
    args = p.parse_args(argv)
    global STACKS_AFTER
    STACKS_AFTER = args.stacks * 1e-3
    interval = sys.getswitchinterval()
    if STACKS_AFTER:  # the watcher must get the GIL soon after it asks, not 5 ms later
        sys.setswitchinterval(0.0002)
    try:
        _main(args)
    finally:
        sys.setswitchinterval(interval)
        STACKS_AFTER = 0.0


def _main(args: argparse.Namespace) -> None:
    ps = nets.ag_params(nets.make_params(4, args.width))
    x = nets.make_input(args.batch, args.width)

    async def run() -> None:
        await session(ps, x, 2, None)
        out = []
        for i in range(args.sessions):
            await asyncio.sleep(0.2)
            trace = Trace()
            lags, elapsed = await session(ps, x, args.backwards, trace)
            print(f"session {i}: {elapsed * 1e3:.0f} ms, {len(lags)} ticks")
            r = explain(trace, args.show)
            r["elapsed"] = elapsed * 1e3
            print(f"  p99 {r['p99']:.2f} max {r['max']:.2f} ms, selects per tick {r['selects_per_tick']:.2f}")
            for where, k in trace.stacks.most_common(args.show):
                print(f"  long callback x{k}: {where}")
            out.append(r)
        p99, worst, elapsed, cpu99, cpumax = (float(np.median([r[k] for r in out]))
                                              for k in ("p99", "max", "elapsed", "cpu_p99", "cpu_max"))
        print(f"median: p99 {p99:.2f} max {worst:.2f} ms, {elapsed:.0f} ms; callbacks' CPU per tick window "
              f"p99 {cpu99:.2f} max {cpumax:.2f} ms")

    if args.busy:
        with busy_process():
            time.sleep(0.3)
            asyncio.run(run())
    else:
        asyncio.run(run())


if __name__ == "__main__":
    main()
