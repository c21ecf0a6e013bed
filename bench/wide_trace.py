"""Where one backward of the wide workload (bench/workloads/wide.py) spends its time:
every derivative rule timed on the thread that ran it, each worker hop (submit, arrival
on the loop), each worker chain's span, and the loop's callbacks; beside it the schedule
of the "numpy 2 threads" floor (which thread ran which branch when).

    python -m bench.wide_trace                 # summary of the median of 7 backwards
    python -m bench.wide_trace --timeline      # and the median backward's events in order

Printed per thread: busy time (rules, chains), idle gaps, and the loop's time in
callbacks; then the hops. It wraps every OpSpec's rules for the process, so its times
include a few microseconds per rule of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import gc
import os
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .workloads import wide

Event = tuple[str, str, float, float]  # (thread, what, start, end)


def _instrument(events: list[Event]) -> None:
    from asyncgrad.autograd.sched import offload
    from asyncgrad.ops._spec import OpSpec

    clock = time.perf_counter

    def wrap(name: str, f: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = clock()
            r = f(*a, **k)
            events.append((threading.current_thread().name, name, t0, clock()))
            return r
        return timed

    for s in [o for o in gc.get_objects() if isinstance(o, OpSpec)]:
        object.__setattr__(s, "vjps", tuple(None if f is None else wrap(s.node_name, f) for f in s.vjps))
    submit = offload.WorkerKernels.submit

    def counted(self: Any, run: Any, fn: Any, args: Any, arrive: Any) -> None:
        name = run.node.name()
        t = clock()
        events.append(("hop", "submit " + name, t, t))

        def arrived(*a: Any) -> Any:
            t = clock()
            events.append(("hop", "arrive " + name, t, t))
            return arrive(*a)
        submit(self, run, fn, args, arrived)

    offload.WorkerKernels.submit = counted  # type: ignore[method-assign]
    chain = offload._run_chain

    def timed_chain(task: Any, plan: Any, inputs: Any) -> Any:
        t0 = clock()
        r = chain(task, plan, inputs)
        events.append((threading.current_thread().name, f"chain of {len(plan.nodes)}", t0, clock()))
        return r

    offload._run_chain = timed_chain  # type: ignore[assignment]
    original = asyncio.events.Handle._run

    def run(handle: asyncio.events.Handle) -> None:
        t0 = clock()
        original(handle)
        events.append(("loop", "callback", t0, clock()))

    asyncio.events.Handle._run = run  # type: ignore[method-assign]


def _summary(label: str, events: list[Event], t0: float, t1: float) -> None:
    total = t1 - t0
    print(f"{label}: {total * 1e3:.2f} ms")
    by: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for th, what, s, e in events:
        by[th].append((s, e, what))
    for th in sorted(by):
        if th == "hop":
            continue
        spans = sorted(by[th])
        rules = [x for x in spans if not x[2].startswith("chain") and x[2] != "callback"]
        outer = [x for x in spans if x[2].startswith("chain") or x[2] == "callback"] or rules
        busy = sum(e - s for s, e, _ in outer)
        rule = sum(e - s for s, e, _ in rules)
        first = min(s for s, _, _ in spans) - t0
        last = t1 - max(e for _, e, _ in spans)
        print(f"  {th[-20:]:<20} busy {busy * 1e3:6.2f} ms (rules {rule * 1e3:6.2f} ms in {len(rules)}), "
              f"first at {first * 1e3:5.2f}, idle after last {last * 1e3:5.2f} ms")
    hops = [x for x in events if x[0] == "hop"]
    print(f"  hops: {sum(1 for h in hops if h[1].startswith('submit'))}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeline", action="store_true", help="print the median backward's events")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--size", type=int, default=500_000)
    a = p.parse_args(argv)
    import asyncgrad as ag

    xs0, c0 = wide._inputs(16, a.size)
    events: list[Event] = []
    _instrument(events)
    clock = time.perf_counter

    async def rounds() -> list[tuple[float, float, list[Event]]]:
        out = []
        for _ in range(a.rounds + 2):
            loss = wide.ag_graph(xs0, c0, 8)
            await asyncio.sleep(0.05)
            gc.disable()
            events.clear()
            t0 = clock()
            await ag.backward(loss)
            t1 = clock()
            gc.enable()
            out.append((t0, t1, [e for e in events if e[3] <= t1]))
            del loss
        return out[2:]

    res = asyncio.run(rounds())
    res.sort(key=lambda r: r[1] - r[0])
    t0, t1, ev = res[len(res) // 2]
    print(f"asyncgrad backward: median {np.median([r[1] - r[0] for r in res]) * 1e3:.2f} ms of {len(res)}; "
          f"load {os.getloadavg()[0]:.2f}")
    _summary("asyncgrad, the median backward", ev, t0, t1)
    if a.timeline:
        for th, what, s, e in sorted(ev, key=lambda x: x[2]):
            if what == "callback" and e - s < 20e-6:
                continue
            print(f"  {(s - t0) * 1e3:8.3f} {(e - s) * 1e3:6.3f}  {th[-10:]:<10} {what}")
    # the numpy floor on 2 threads: which thread ran which branch when
    pool = ThreadPoolExecutor(2)
    floor: list[tuple[float, float, list[Event]]] = []
    for _ in range(a.rounds + 2):
        saved = [wide.numpy_forward_branch(x0, c0, 8) for x0 in xs0]
        marks: list[Event] = []

        def branch(s: list[np.ndarray], marks: list[Event] = marks) -> np.ndarray:
            b0 = clock()
            g = wide.numpy_backward_branch(s, c0, 8)
            marks.append((threading.current_thread().name, "branch", b0, clock()))
            return g

        gc.disable()
        f0 = clock()
        list(pool.map(branch, saved))
        floor.append((f0, clock(), marks))
        gc.enable()
    pool.shutdown()
    floor = floor[2:]
    floor.sort(key=lambda r: r[1] - r[0])
    f0, f1, marks = floor[len(floor) // 2]
    print(f"numpy 2 threads: median {np.median([r[1] - r[0] for r in floor]) * 1e3:.2f} ms")
    _summary("numpy 2 threads, the median backward", marks, f0, f1)
    if a.timeline:
        for th, what, s, e in sorted(marks, key=lambda x: x[2]):
            print(f"  {(s - f0) * 1e3:8.3f} {(e - s) * 1e3:6.3f}  {th[-10:]:<10} {what}")


if __name__ == "__main__":
    main()
