"""Where the GPT training step's backward runs: every derivative rule timed, on the loop
or on a worker, and each thread hop (submit, arrival on the loop), with chains and split
nodes as the engine runs them (the profiler, ``asyncgrad.autograd.profiler``, turns both
off, so it cannot show them).

    python -m bench.step_trace            # BLAS with the engine's own threads
    python -m bench.step_trace --one      # numpy's BLAS at one thread (splits on)
    python -m bench.step_trace --one --timeline   # and one backward's events in order

Printed: the forward, backward and optimizer step (median of 10 steps after 2 warm-ups),
then per rule (node name, input index, J for a joint rule) the time per step on the loop
and on workers, then the hops of the median step. It wraps every OpSpec's rules for the
process, so its times include a few microseconds per rule of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np

from . import gpt
from .common import BLAS

Event = tuple[str, str, Any, float, float]


def _instrument(events: list[Event], hops: list[tuple[str, str, float]]) -> None:
    from asyncgrad.autograd.sched import offload
    from asyncgrad.ops._spec import OpSpec

    clock = time.perf_counter

    def wrap(name: str, i: Any, f: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = clock()
            r = f(*a, **k)
            events.append((threading.current_thread().name, name, i, t0, clock()))
            return r
        return timed

    for s in [o for o in gc.get_objects() if isinstance(o, OpSpec)]:
        object.__setattr__(s, "vjps", tuple(None if f is None else wrap(s.node_name, i, f)
                                            for i, f in enumerate(s.vjps)))
        if s.joint is not None:
            object.__setattr__(s, "joint", wrap(s.node_name, "J", s.joint))
    from asyncgrad.ops import shape

    for name, rule in list(shape.MULTI_OUTPUT_VIEWS.items()):  # split / unbind: one node, all pieces
        shape.MULTI_OUTPUT_VIEWS[name] = wrap(name, "J", rule)
    submit = offload.WorkerKernels.submit

    def counted(self: Any, run: Any, fn: Any, args: Any, arrive: Any) -> None:
        name = run.node.name()
        hops.append(("submit", name, clock()))

        def arrived(*a: Any) -> Any:
            hops.append(("arrive", name, clock()))
            return arrive(*a)
        submit(self, run, fn, args, arrived)

    offload.WorkerKernels.submit = counted  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--one", action="store_true", help="numpy's BLAS at one thread")
    p.add_argument("--timeline", action="store_true", help="print the median step's events")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--attention", choices=("manual", "sdpa"), default="sdpa",
                   help="the model's attention (bench/gpt.py)")
    a = p.parse_args(argv)
    import asyncgrad as ag
    from asyncgrad.ops import kernels

    events: list[Event] = []
    hops: list[tuple[str, str, float]] = []
    _instrument(events, hops)
    cfg = gpt.GPTConfig()
    idx, targets = gpt.make_batch(cfg)
    ag.manual_seed(0)
    model = gpt.ag_model(cfg, a.attention)
    opt = ag.optim.AdamW(model.parameters(), lr=1e-3)
    clock = time.perf_counter

    async def steps() -> list[tuple[Any, ...]]:
        kernels.wait()
        out = []
        for _ in range(a.steps + 2):
            opt.zero_grad()
            gc.disable()
            t0 = clock()
            loss = model(idx, targets)
            t1 = clock()
            events.clear()
            hops.clear()
            await ag.backward(loss)
            t2 = clock()
            opt.step()
            t3 = clock()
            gc.enable()
            out.append((t1 - t0, t2 - t1, t3 - t2, list(events), list(hops), t1))
        return out[2:]

    if a.one:
        with BLAS.limited(1):
            res = asyncio.run(steps())
    else:
        res = asyncio.run(steps())

    def med(xs: list[float]) -> float:
        return float(np.median(xs)) * 1e3

    print(f"forward {med([r[0] for r in res]):.1f} ms, backward {med([r[1] for r in res]):.1f} ms, "
          f"optimizer {med([r[2] for r in res]):.1f} ms (median of {len(res)}); load {os.getloadavg()[0]:.2f}; "
          f"{BLAS.describe()}")
    per: dict[tuple[str, Any, str], float] = defaultdict(float)
    calls: dict[tuple[str, Any, str], int] = defaultdict(int)
    for r in res:
        for th, name, i, t0, t1 in r[3]:
            key = (name, i, "loop" if th == "MainThread" else "worker")
            per[key] += (t1 - t0) / len(res)
            calls[key] += 1
    print(f"  {'rule':<28}{'input':>6}  {'where':<7}{'ms/step':>8}{'calls':>6}")
    for key, s in sorted(per.items(), key=lambda kv: -kv[1]):
        name, i, where = key
        print(f"  {name:<28}{i!s:>6}  {where:<7}{s * 1e3:>8.2f}{calls[key] // len(res):>6}")
    order = sorted(range(len(res)), key=lambda k: res[k][1])
    r = res[order[len(order) // 2]]
    loop = sum(t1 - t0 for th, *_, t0, t1 in r[3] if th == "MainThread")
    work = sum(t1 - t0 for th, *_, t0, t1 in r[3] if th != "MainThread")
    print(f"  median step: {sum(1 for k, *_ in r[4] if k == 'submit')} hops; rules {loop * 1e3:.1f} ms on the "
          f"loop, {work * 1e3:.1f} ms on workers; backward {r[1] * 1e3:.1f} ms")
    if a.timeline:
        t1 = r[5]
        items = [(s - t1, e - t1, th, name, i) for th, name, i, s, e in r[3]]
        items += [(t - t1, t - t1, kind, name, "") for kind, name, t in r[4]]
        for s, e, th, name, i in sorted(items, key=lambda x: x[0]):
            print(f"  {s * 1e3:8.2f} {(e - s) * 1e3:6.2f}  {th[-10:]:<10} {name} {i}")


if __name__ == "__main__":
    main()
