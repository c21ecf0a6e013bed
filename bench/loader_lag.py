"""Event-loop lag while the compiled kernels load (issue 11, item 5: no one-time stall).

Each round starts fresh processes, one per variant, in turn (interleaved, so a busy
spell of the shared machine hits every variant alike). A process builds a small MLP
(Linear 64-256, tanh GELU, LayerNorm, Linear 256-10; batch 256 float32), starts a 1 ms
asyncio ticker, then runs a forward and ``await ag.backward`` every 5 ms; its first op
starts the kernels' loader (Note [Compiled kernels load off the loop] in
``ops/kernels/loader.py``). It reports the ticker's lateness from that first op on: p99, max,
how many ticks were more than 10 ms late, and when the compiled kernels came into use.
The model's construction before the first op is not measured (user code).

    python -m bench.loader_lag [--procs 5] [--steps 200]
    python -m bench.loader_lag --variant "auto, 1 BLAS thread:OPENBLAS_NUM_THREADS=1"

Variants are ``label:VAR=value,VAR=value`` (environment of the child); the defaults are
``auto`` (the loader) and ``numpy`` (``ASYNCGRAD_KERNELS=numpy``: no loader, the floor).
Figures are medians over the processes (worst max: the largest over them). Run it after
one process has loaded the kernels (numba's cache is warm): a first load compiles them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VARIANTS = ("auto:ASYNCGRAD_KERNELS=auto", "numpy:ASYNCGRAD_KERNELS=numpy")
LATE = 0.010  # seconds: a tick this late counts as a stall


def _child(steps: int) -> None:
    """One fresh process: the ticker, the model's steps; prints one JSON line."""
    import numpy as np

    import asyncgrad as ag
    from asyncgrad import nn
    from asyncgrad.nn import functional as F
    from asyncgrad.ops import kernels

    async def run() -> dict[str, object]:
        lags: list[float] = []
        ready_at: list[float] = []
        stop = False
        start = 0.0

        async def ticker() -> None:
            while not stop:
                t0 = time.perf_counter()
                await asyncio.sleep(0.001)
                t1 = time.perf_counter()
                if start and t0 >= start:
                    lags.append(t1 - t0 - 0.001)
                    if not ready_at and kernels.ready():
                        ready_at.append(t1 - start)

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.05)
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(approximate="tanh"), nn.LayerNorm(256),
                              nn.Linear(256, 10))
        x = ag.tensor(np.random.rand(256, 64).astype(np.float32))
        y = ag.tensor(np.random.randint(0, 10, 256))
        start = time.perf_counter()
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            await ag.backward(loss)
            await asyncio.sleep(0.005)
        stop = True
        await tick
        ms = np.array(lags) * 1e3
        return {"p99": float(np.percentile(ms, 99)), "max": float(ms.max()), "ticks": len(ms),
                "late": int((ms > LATE * 1e3).sum()), "ready": ready_at[0] * 1e3 if ready_at else None,
                "status": kernels.status()}

    print(json.dumps(asyncio.run(run())))


def _parse_variant(text: str) -> tuple[str, dict[str, str]]:
    label, _, assigns = text.partition(":")
    env = {}
    for item in filter(None, (a.strip() for a in assigns.split(","))):
        name, _, value = item.partition("=")
        env[name.strip()] = value.strip()
    return label.strip(), env


def _run_child(env: dict[str, str], steps: int) -> dict[str, object]:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), full.get("PYTHONPATH", "")])
    full.update(env)
    r = subprocess.run([sys.executable, "-m", "bench.loader_lag", "--child", "--steps", str(steps)],
                       cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"child failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=5, help="fresh processes per variant")
    p.add_argument("--steps", type=int, default=200, help="forward+backward steps per process")
    p.add_argument("--variant", action="append", default=[],
                   help='"label:VAR=value,..." (repeatable; default: auto and numpy)')
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.steps)
        return
    variants = [_parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    print(f"# load {os.getloadavg()[0]:.2f}; python -m bench.loader_lag --procs {args.procs} --steps {args.steps}"
          + "".join(f' --variant "{v}"' for v in args.variant))
    results: dict[str, list[dict[str, object]]] = {label: [] for label, _ in variants}
    for _ in range(args.procs):
        for label, env in variants:
            results[label].append(_run_child(env, args.steps))
    print(f"{'variant':<28} {'p99 ms':>7} {'max ms':>7} {'worst':>7} {'>10ms':>6} {'ready ms':>9}  "
          "per process: p99 / max")
    for label, rows in results.items():
        ready = [float(r["ready"]) for r in rows if r["ready"] is not None]  # type: ignore[arg-type]
        per = "  ".join(f"{r['p99']:.1f}/{r['max']:.0f}" for r in rows)
        print(f"{label:<28} {statistics.median(float(r['p99']) for r in rows):>7.2f} "  # type: ignore[arg-type]
              f"{statistics.median(float(r['max']) for r in rows):>7.1f} "  # type: ignore[arg-type]
              f"{max(float(r['max']) for r in rows):>7.1f} "  # type: ignore[arg-type]
              f"{statistics.median(int(r['late']) for r in rows):>6} "  # type: ignore[call-overload]
              f"{statistics.median(ready) if ready else float('nan'):>9.0f}  {per}")


if __name__ == "__main__":
    main()
