"""The loop's stall during the first backward of a process (issue 33: "First backward").

Each run is a fresh process: it imports asyncgrad, builds ``tanh(x @ w).sum()`` on 512x512
float32 (untimed: user code), starts a 1 ms asyncio ticker, and after 20 ticks awaits the
first ``ag.backward``, then a second one for comparison. It reports the ticker's worst
lateness during each backward, and with ``--profile`` what the loop's thread ran during
the first one (cProfile on that thread, top functions by their own time and by cumulative
time), the modules imported while it ran and the threads it started.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.first_backward [--runs 3] [--profile]
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.first_backward --env ASYNCGRAD_KERNELS=numpy

Check ``uptime`` first: on a loaded machine every tick is late by the scheduler's slices.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, cProfile, io, json, pstats, sys, threading, time
import numpy as np
import asyncgrad as ag

PROFILE = {profile}
rng = np.random.default_rng(0)
x = ag.from_numpy(rng.standard_normal((512, 512)).astype(np.float32)).requires_grad_()
w = ag.from_numpy(rng.standard_normal((512, 512)).astype(np.float32) / 20).requires_grad_()


def loss():
    return (x @ w).tanh().sum()


async def main():
    lags, marks = [], []
    stop = False

    async def ticker():
        while not stop:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((t0, time.perf_counter() - t0 - 0.001))

    task = asyncio.ensure_future(ticker())
    while len(lags) < 20:
        await asyncio.sleep(0.001)
    out = {{}}
    for name in ("first", "second"):
        l = loss()
        modules, threads = set(sys.modules), {{t.name for t in threading.enumerate()}}
        prof = cProfile.Profile() if PROFILE and name == "first" else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        await ag.backward(l)
        if prof:
            prof.disable()
        t1 = time.perf_counter()
        await asyncio.sleep(0.005)  # the tick that was due during the backward's last step
        during = [lag for t, lag in lags if t0 - 0.001 <= t <= t1]
        out[name] = {{"backward_ms": (t1 - t0) * 1e3, "worst_lag_ms": max(during, default=0.0) * 1e3,
                     "ticks": len(during)}}
        if prof:
            out[name]["imported"] = sorted(m for m in set(sys.modules) - modules if "." not in m or m.count(".") < 2)
            out[name]["new_threads"] = sorted({{t.name for t in threading.enumerate()}} - threads)
            for key in ("tottime", "cumulative"):
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats(key).print_stats(14)
                out[name][key] = s.getvalue()
            s = io.StringIO()
            starts = r"threading.py:\d+\(start\)|start_new_thread"
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_callers(starts)
            out[name]["thread_starts"] = s.getvalue()
        x.grad = w.grad = None
    task.cancel()
    return out


print(json.dumps(asyncio.run(main())))
"""


def run_once(profile: bool, env: dict[str, str]) -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", CHILD.format(profile=profile)], capture_output=True, text=True,
                         env={**os.environ, **env}, cwd=ROOT, timeout=300)
    if res.returncode:
        raise SystemExit(res.stderr)
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.first_backward", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="fresh processes (default 3)")
    p.add_argument("--profile", action="store_true", help="profile the loop's thread in the first backward")
    p.add_argument("--env", action="append", default=[], metavar="VAR=VALUE", help="the children's environment")
    args = p.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in args.env)
    print(f"# load average {os.getloadavg()[0]:.2f}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}; children's env {env or '{}'}")
    print("| run | first: worst lag ms | first: backward ms | second: worst lag ms | second: backward ms |")
    print("|---|---|---|---|---|")
    last: dict[str, object] = {}
    for i in range(args.runs):
        last = run_once(args.profile, env)
        f, s = last["first"], last["second"]
        print(f"| {i + 1} | {f['worst_lag_ms']:.1f} | {f['backward_ms']:.1f} | "  # type: ignore[index]
              f"{s['worst_lag_ms']:.1f} | {s['backward_ms']:.1f} |")  # type: ignore[index]
    if args.profile:
        first = last["first"]
        print("\nimported during the first backward:", ", ".join(first["imported"]) or "nothing")  # type: ignore[index]
        print("threads started:", ", ".join(first["new_threads"]) or "none")  # type: ignore[index]
        print("\nthe loop's thread, by own time:\n" + first["tottime"])  # type: ignore[index,operator]
        print("the loop's thread, cumulative:\n" + first["cumulative"])  # type: ignore[index,operator]
        print("who started threads on the loop's thread:\n" + first["thread_starts"])  # type: ignore[index,operator]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
