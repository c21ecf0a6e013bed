"""Convolution layouts before and after, inside the ops benchmark's harness (issue 32).

    python -m bench.conv_layouts [--size small] [--reps 6] [--rounds 5] [ROW ...]

For each ``ROW`` of the ops table (default: the two convolution rows), runs
``bench.workloads.ops._measure_op`` (asyncgrad and PyTorch interleaved, one thread
each) ``--reps`` times with ``ops.conv.SHIFTED_TAPS`` off ("im2col": the layouts
without shifted taps) and on ("shifted"), alternating within the process, and prints
the medians of all rounds: forward, backward and backward inline, each over PyTorch's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics

from .common import ASYNCGRAD, BLAS, TORCH
from .workloads import ops

ROWS = ("conv2d 3x3 pad 1", "conv2d 3x3 stride 2")


async def _measure(row: str, size: str, reps: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    from asyncgrad.ops import conv

    op = next(o for o in ops._cases() if o.name == row)
    times: dict[str, dict[str, list[float]]] = {"im2col": {}, "shifted": {}}
    for _ in range(reps):
        for name, on in (("im2col", False), ("shifted", True)):
            conv.SHIFTED_TAPS = on
            for kind, ts in (await ops._measure_op(op, ops.SIZES[size], [ASYNCGRAD, TORCH], rounds)).items():
                times[name].setdefault(kind, []).extend(ts)
    conv.SHIFTED_TAPS = True
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rows", nargs="*", default=list(ROWS), metavar="ROW")
    p.add_argument("--size", default="small", choices=sorted(ops.SIZES))
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per repetition")
    args = p.parse_args()
    import torch

    from asyncgrad.ops import kernels

    kernels.wait()
    torch.set_num_threads(1)
    with BLAS.limited(1):
        for row in args.rows:
            times = asyncio.run(_measure(row, args.size, args.reps, args.rounds))
            for name, t in times.items():
                m = {k: statistics.median(v) * 1e3 for k, v in t.items()}
                fwd, bwd = m[f"{TORCH} forward"], m[f"{TORCH} backward"]
                a_fwd, a_bwd, a_inl = (m[f"{ASYNCGRAD} {k}"] for k in ("forward", "backward", "backward inline"))
                print(f"{row} ({args.size}) {name:8s} fwd {a_fwd:.3f}/{fwd:.3f} = {a_fwd / fwd:.2f}  "
                      f"bwd {a_bwd:.3f}/{bwd:.3f} = {a_bwd / bwd:.2f}  bwd inline {a_inl:.3f} = {a_inl / bwd:.2f}")
            print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
