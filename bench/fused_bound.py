"""What a captured step could give the ``concurrent`` workload: the bound of graph capture.

    python -m bench.fused_bound              # 5 interleaved rounds
    python -m bench.fused_bound --rounds 9

The concurrent workload's pass (32 tasks x small MLP forward+backward, shared
parameters) run four ways in one process, rounds interleaved with the order rotating:

* ``asyncgrad (awaited)``: as the workload runs it, every op recorded;
* ``asyncgrad, pass as one node``: the whole pass as ONE custom Function whose forward
  and backward are the numpy floor's code. This is what a traced step that fused the
  pass into one node would run at best: the real ``Function.apply``, engine, scheduler
  and commit into the shared ``.grad``, and no per-op bookkeeping at all;
* ``torch to_thread`` and ``numpy inline`` (no autograd, blocking the loop), as in the
  workload.

If the one-node row stays far below the 3,000 passes/s target, capture alone would not
meet it: what is left is the cost of one ``Function.apply`` and one ``await backward``
with its leaves' commits, per pass.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

import numpy as np

from . import nets
from .common import BLAS, SETTLE
from .workloads.concurrent import _modes, session


def _whole_pass_function() -> Any:
    import asyncgrad as ag

    class WholePass(ag.autograd.Function):
        """The small MLP's forward and backward as one node (the numpy floor's code)."""

        @staticmethod
        def forward(ctx: Any, x: Any, *params: Any) -> Any:
            arrays = [p.numpy() for p in params]
            acts, out = nets.numpy_graph(arrays, x.numpy())
            ctx.state = (arrays, acts, out)
            return ag.from_numpy(np.asarray(np.mean(out * out), dtype=np.float32))

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            arrays, acts, out = ctx.state
            scale = np.float32(g.numpy())
            grads = nets.numpy_backward(arrays, (acts, out))
            return (None, *[ag.from_numpy(gr * scale) for gr in grads])

    return WholePass


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fused_bound", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()

    import asyncgrad as ag

    params = nets.make_params(4, 128)
    inputs = [nets.make_input(32, 128, seed=100 + i) for i in range(args.tasks)]
    whole_pass = _whole_pass_function()
    fused_params = nets.ag_params(params)

    async def fused(x: np.ndarray) -> None:
        await ag.backward(whole_pass.apply(ag.from_numpy(x), *fused_params))

    keep = ("asyncgrad (awaited)", "torch to_thread", "numpy inline")
    modes = [m for m in _modes(["asyncgrad", "torch", "numpy"], params) if m[0] in keep]
    modes.insert(1, ("asyncgrad, pass as one node", fused))

    async def run() -> dict[str, list[dict[str, float]]]:
        out: dict[str, list[dict[str, float]]] = {name: [] for name, _ in modes}
        for name, one_pass in modes:  # warm-up
            BLAS.enter(name)
            await session(one_pass, inputs[:4], 2)
            BLAS.leave(name)
        for i in range(args.rounds):
            k = i % len(modes)
            for name, one_pass in modes[k:] + modes[:k]:
                BLAS.enter(name)
                await asyncio.sleep(SETTLE)
                out[name].append(await session(one_pass, inputs, args.passes))
                BLAS.leave(name)
        return out

    results = asyncio.run(run())
    print(f"{args.tasks} tasks x {args.passes} passes, {args.rounds} interleaved rounds (medians)")
    print("| mode | passes/s | loop p99 lag ms | rounds' passes/s |")
    print("|---|---|---|---|")
    for name, rows in results.items():
        rates = [r["passes_per_s"] for r in rows]
        lag = statistics.median(r["p99_lag_ms"] for r in rows)
        print(f"| {name} | {statistics.median(rates):,.0f} | {lag:.2f} | "
              f"{', '.join(f'{r:,.0f}' for r in rates)} |")


if __name__ == "__main__":
    main()
