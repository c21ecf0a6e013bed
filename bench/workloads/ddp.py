"""ddp: data-parallel backward over MPI ranks on this machine (asyncgrad.distributed).

An MLP of ``layers`` fused linear layers of ``width`` (10 x 1000 = about 10 M float32
parameters, 40 MB of gradients), batch ``batch`` per rank, loss ``mean(out * out)``. The
workload launches ``mpiexec -n N python -m mpi4py -m bench.workloads.ddp`` for each N in
``ranks`` (2, and 4 oversubscribed on 2 cores); on every rank and in every round, in a
rotating order, with a barrier before each timed step, it times:

* ddp: ``await ag.backward(loss)`` through ``DistributedDataParallel`` (buckets
  all-reduced while the backward runs, then the vote);
* backward then all-reduce: a plain ``await ag.backward(loss)``, then one
  ``await dist.all_reduce`` of all gradients as one flat buffer (no overlap);
* local backward, all ranks: every rank runs the plain backward at once, with no
  communication: the compute baseline (ranks compete for the cores), and the loop lag
  a backward has here without DDP;
* alone, half data: rank 0 alone runs the plain backward on its share (the other ranks
  wait): the step with no communication at all;
* all-reduce only: that flat all-reduce by itself, all ranks starting together.

The forward is built untimed. Rank 0's medians are reported; "comm hidden" is
``(sequential - ddp) / comm``, with ``comm`` the "all-reduce only" time (copy,
all-reduce, copy back): the share of the communication time the overlap removed
(negative when DDP costs more than it hides). "alone" differs from "sequential" by more
than the communication on a loaded machine: the ranks also compete for the cores.
A 1 ms ticker on rank 0's loop measures its lag during each timed step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..common import ASYNCGRAD, About, Column, Result, Target, median

ABOUT = About(
    title="Data-parallel training over MPI ranks",
    measures="A 10 M-parameter MLP (40 MB of float32 gradients), batch 64 per rank, on 2 ranks and on 4 ranks "
             "sharing the 2 cores: the step time of a DDP backward (buckets all-reduced while the backward runs), "
             "of a plain backward followed by one all-reduce of every gradient, of the backward with no "
             "communication, and of the all-reduce alone; and how late a 1 ms timer on rank 0's loop fires.",
    reading="\"comm hidden\" is the share of the all-reduce time that overlapping it with the backward removed. "
            "Overlap pays when the backward leaves CPU free while gradients travel, as on separate machines; on "
            "2 busy cores the all-reduce competes with the backward for the same cores, so little can be hidden "
            "here. Lower step ms and lag are better.",
    plots=(("step_ms", "step ms", False), ("p99_lag_ms", "loop p99 lag ms", False)),
)

DEFAULT_ROUNDS = 7
MODES = ("ddp", "backward then all-reduce", "local backward, all ranks", "alone, half data", "all-reduce only")
REPO = Path(__file__).resolve().parents[2]


def run(impls: list[str], rounds: int | None = None, ranks: tuple[int, ...] = (2, 4), layers: int = 10,
        width: int = 1000, batch: int = 64, bucket_mb: float = 8.0, timeout: float = 600.0) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    res = Result(
        "ddp", f"data-parallel MLP backward over MPI ({layers} layers of {width}, "
               f"{layers * (width * width + width) / 1e6:.1f} M float32 parameters, batch {batch} per rank)",
        {"layers": layers, "width": width, "batch": batch, "rounds": rounds, "ranks": list(ranks),
         "bucket_cap_mb": bucket_mb},
        [Column("step_ms", "step ms", "{:.1f}"),
         Column("x_alone", "x alone", "{:.2f}"),
         Column("p99_lag_ms", "loop p99 lag ms", "{:.2f}"),
         Column("max_lag_ms", "loop max lag ms", "{:.2f}")],
    )
    t_start = time.perf_counter()
    if ASYNCGRAD not in impls:
        return res
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        res.notes.append('skipped: needs the "mpi" extra (pip install "asyncgrad[mpi]")')
        return res
    mpiexec = Path(sys.executable).with_name("mpiexec")
    for n in ranks:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "rank0.json"
            cmd = [str(mpiexec), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "bench.workloads.ddp",
                   "--out", str(out), "--rounds", str(rounds), "--layers", str(layers), "--width", str(width),
                   "--batch", str(batch), "--bucket-mb", str(bucket_mb)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and every rank
                proc.communicate()
                raise RuntimeError(f"ddp workload with {n} ranks did not finish in {timeout:g} s") from None
            if proc.returncode != 0:
                raise RuntimeError(f"ddp workload with {n} ranks failed:\n{stdout}\n{stderr}")
            data = json.loads(out.read_text())
        alone = data["alone, half data"]["step_ms"]
        for mode in MODES:
            row = {"impl": f"{mode} ({n} ranks)", **data[mode]}
            row["x_alone"] = row["step_ms"] / alone
            res.rows.append(row)
        seq, ddp = data["backward then all-reduce"]["step_ms"], data["ddp"]["step_ms"]
        comm = data["all-reduce only"]["step_ms"]
        res.ratios[f"comm hidden ({n} ranks)"] = (seq - ddp) / comm if comm > 0 else math.nan
        res.add_ratio(f"ddp/sequential ({n} ranks)", ddp, seq)
        res.targets.append(Target(f"loop p99 lag <= 5 ms during DDP backward ({n} ranks)",
                                  data["ddp"]["p99_lag_ms"], 5.0, "ms"))
    res.notes.append("each rank runs with one BLAS thread; 4 ranks share 2 cores (oversubscribed)")
    res.seconds = time.perf_counter() - t_start
    return res


# --- the per-rank worker (run under mpiexec) -----------------------------------------------
def _worker(args: argparse.Namespace) -> None:
    import asyncio

    import numpy as np

    import asyncgrad as ag
    from asyncgrad import distributed as dist

    from .. import nets
    from ..common import Ticker, no_gc

    rank, size = dist.rank(), dist.world_size()

    class MLP(ag.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ps = nets.ag_params(nets.make_params(args.layers, args.width))
            for i, p in enumerate(self.ps):
                self.register_parameter(f"p{i}", p)

        def forward(self, x: Any) -> Any:
            return nets.ag_graph(self.ps, x)

    model = MLP()
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    x = nets.make_input(args.batch, args.width, seed=1 + rank)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    lags: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}

    async def timed(mode: str, body: Any) -> float:
        """Time ``body()`` under a 1 ms ticker on this loop; the lag goes to ``mode``."""
        ticker = Ticker(0.001)
        with no_gc():
            ticker.start()
            t0 = time.perf_counter()
            await body()
            t = time.perf_counter() - t0
            await ticker.stop()
        lags[mode].append(ticker.summary_ms())
        return t

    async def ddp_step() -> float:
        loss = ddp(x)
        await dist.barrier()
        return await timed("ddp", lambda: ag.backward(loss))

    async def sequential_step() -> float:
        loss = model(x)
        await dist.barrier()

        async def body() -> None:
            await ag.backward(loss)
            await all_reduce_grads()

        return await timed("backward then all-reduce", body)

    async def all_reduce_grads() -> None:
        flat = ag.from_numpy(np.concatenate([p.grad.numpy().ravel() for p in model.ps]))
        await dist.all_reduce(flat, op="mean")
        offset = 0
        for p in model.ps:
            n = p.numel()
            p.grad = ag.from_numpy(flat.numpy()[offset:offset + n].reshape(p.shape).copy())
            offset += n

    async def all_reduce_step() -> float:
        for p in model.ps:
            p.grad = ag.zeros_like(p)
        await dist.barrier()
        return await timed("all-reduce only", all_reduce_grads)

    async def local_step() -> float:
        loss = model(x)
        await dist.barrier()
        return await timed("local backward, all ranks", lambda: ag.backward(loss))

    async def alone_step() -> float:
        loss = model(x)
        await dist.barrier()
        t = math.nan
        if rank == 0:
            t = await timed("alone, half data", lambda: ag.backward(loss))
        await dist.barrier()
        return t

    steps = {"ddp": ddp_step, "backward then all-reduce": sequential_step, "local backward, all ranks": local_step,
             "alone, half data": alone_step, "all-reduce only": all_reduce_step}

    async def main() -> None:
        for i in range(args.rounds + 1):  # round 0 warms up
            k = i % len(MODES)
            for mode in MODES[k:] + MODES[:k]:  # rotating order: load changes hit every mode
                model.zero_grad()
                t = await steps[mode]()
                if i:
                    times[mode].append(t * 1e3)

    asyncio.run(main())
    if rank == 0:
        out: dict[str, Any] = {}
        for m in MODES:
            ls = lags[m][1:]
            out[m] = {"step_ms": median(times[m]), "rounds_ms": times[m],
                      "p99_lag_ms": median([d["p99_lag_ms"] for d in ls]),
                      "max_lag_ms": median([d["max_lag_ms"] for d in ls])}
        out["world_size"] = size
        Path(args.out).write_text(json.dumps(out))


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--width", type=int, default=1000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--bucket-mb", type=float, default=8.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    _worker(_parse())
