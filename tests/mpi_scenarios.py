"""DDP scenarios run under ``mpiexec -n 2 python -m mpi4py tests/mpi_scenarios.py NAME BACKEND OUTDIR``
by tests/test_distributed.py. Each rank writes its result as ``OUTDIR/<rank>.json``; the test
process recomputes the expected values on one process and compares. The model and the
data are defined here so both sides build the same ones."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

import asyncgrad as ag

ag.set_default_dtype(np.float64)
BATCH = 6


class Inject(ag.autograd.Function):
    """Identity whose backward can fail or stall, to hurt one rank."""

    @staticmethod
    def forward(ctx, x, mode):
        ctx.mode = mode
        return x.clone()

    @staticmethod
    async def backward(ctx, g):
        if ctx.mode == "fail":
            raise ValueError("injected failure")
        if ctx.mode == "stall":
            await anyio.sleep(30)
        if ctx.mode == "yield":  # stay in flight a while so other backward calls interleave
            await anyio.sleep(0.2)
        return g, None


class Net(ag.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = ag.nn.Linear(5, 7)
        self.l2 = ag.nn.Linear(7, 3)
        self.extra = ag.nn.Linear(7, 3)  # used only when use_extra
        self.never = ag.nn.Linear(2, 2)  # used by no rank
        self.mode = None
        self.use_extra = False

    def forward(self, x):
        h = self.l1(x).tanh()
        if self.mode is not None:
            h = Inject.apply(h, self.mode)
        out = self.l2(h)
        if self.use_extra:
            out = out + self.extra(h)
        return out


def batch(rank: int, step: int = 0) -> tuple[Any, Any]:
    rs = np.random.RandomState(100 * step + rank)
    return ag.tensor(rs.randn(BATCH, 5)), ag.tensor(rs.randn(BATCH, 3))


def loss_of(out, y):
    return ((out - y) ** 2).mean()


def grads(model) -> dict[str, Any]:
    return {n: None if p.grad is None else p.grad.numpy().tolist() for n, p in model.named_parameters()}


def params(model) -> dict[str, Any]:
    return {n: p.numpy().tolist() for n, p in model.named_parameters()}


# --- scenarios: each returns this rank's JSON-able result ------------------------------------
async def average(dist, r):
    ag.manual_seed(r)  # different initial weights: wrapping must broadcast rank 0's
    model = Net()
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-4)  # a bucket per parameter
    x, y = batch(r)
    await ag.backward(loss_of(ddp(x), y))
    return {"params": params(model), "grads": grads(model), "buckets": ddp.bucket_sizes}


async def failure(dist, r):
    """Round 1: a node fails on rank 1. Round 2: rank 0 is cancelled. Round 3: succeeds."""
    ag.manual_seed(0)
    model = Net()
    ddp = dist.DistributedDataParallel(model, timeout=20)
    for p in model.parameters():
        p.grad = ag.full(p.shape, 7.0)
    before = grads(model)
    out: dict[str, Any] = {"params": params(model), "before": before}
    x, y = batch(r)

    model.mode = "fail" if r == 1 else None
    try:
        await ag.backward(loss_of(ddp(x), y))
        out["round1"] = "ok"
    except Exception as e:
        out["round1"] = [type(e).__name__, str(e), list(getattr(e, "failed_ranks", []))]
    out["after1"] = grads(model)

    model.mode = "stall" if r == 0 else None
    try:
        with anyio.move_on_after(0.5 if r == 0 else 30) as scope:  # only rank 0 is cancelled
            await ag.backward(loss_of(ddp(x), y))
        out["round2"] = "cancelled" if scope.cancelled_caught else "ok"
    except Exception as e:
        out["round2"] = [type(e).__name__, str(e), list(getattr(e, "failed_ranks", []))]
    out["after2"] = grads(model)

    model.mode = None
    await ag.backward(loss_of(ddp(x), y))
    out["after3"] = grads(model)
    return out


async def unused(dist, r):
    """extra.* is used on rank 1 only: on rank 0 its average must be written by the
    commit itself, so extra's post-accumulate-grad hook (run for what the commit wrote)
    and a final callback queued before DDP's pre-commit runs (so before any callback
    it could queue) both see it."""
    ag.manual_seed(0)
    model = Net()
    model.use_extra = r == 1
    ddp = dist.DistributedDataParallel(model)
    x, y = batch(r)
    seen: dict[str, Any] = {}
    loss = loss_of(ddp(x), y)

    def after_accumulate(p):
        seen["hook"] = p.grad.numpy().tolist()

    def look():
        g = model.extra.weight.grad
        seen["callback"] = None if g is None else g.numpy().tolist()

    model.extra.weight.register_post_accumulate_grad_hook(after_accumulate)
    loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_callback(look))
    await ag.backward(loss)
    return {"params": params(model), "grads": grads(model), "seen": seen}


def loss_node(out, mode):
    """A node of the loss, recorded after ``ddp(x)``: it runs before any DDP node."""
    return Inject.apply(out, mode) if mode is not None else out


async def loss_failures(dist, r):
    """Failures outside the model, before any DDP node runs. Round 1: a loss node fails
    on rank 1. Round 2: the same under the blocking form, on both ranks. Round 3: rank
    0 is cancelled in a loss node. Round 4 succeeds: the ranks are still in step."""
    ag.manual_seed(0)
    model = Net()
    ddp = dist.DistributedDataParallel(model, timeout=20)
    for p in model.parameters():
        p.grad = ag.full(p.shape, 7.0)
    out: dict[str, Any] = {"params": params(model), "before": grads(model)}
    x, y = batch(r)

    def described(e):
        return [type(e).__name__, str(e), list(getattr(e, "failed_ranks", []))]

    def outcome(run):
        try:
            run()
            return "ok"
        except Exception as e:
            return described(e)

    async def run_async(loss):
        try:
            await ag.backward(loss)
            return "ok"
        except Exception as e:
            return described(e)

    out["round1"] = await run_async(loss_of(loss_node(ddp(x), "fail" if r == 1 else None), y))
    out["after1"] = grads(model)

    loss = loss_of(loss_node(ddp(x), "fail" if r == 1 else None), y)
    out["round2"] = await anyio.to_thread.run_sync(outcome, loss.backward)  # a thread without a loop
    out["after2"] = grads(model)

    loss = loss_of(loss_node(ddp(x), "stall" if r == 0 else None), y)
    with anyio.move_on_after(0.5 if r == 0 else 30) as scope:  # only rank 0 is cancelled
        out["round3"] = await run_async(loss)
    if scope.cancelled_caught:
        out["round3"] = "cancelled"
    out["after3"] = grads(model)

    out["round4"] = await run_async(loss_of(ddp(x), y))
    out["after4"] = grads(model)
    return out


async def no_sync(dist, r):
    ag.manual_seed(0)
    model = Net()
    ddp = dist.DistributedDataParallel(model)
    with ddp.no_sync():
        for step in (0, 1):
            x, y = batch(r, step)
            await ag.backward(loss_of(ddp(x), y))
    local = grads(model)
    x, y = batch(r, 2)
    await ag.backward(loss_of(ddp(x), y))
    return {"params": params(model), "local": local, "grads": grads(model)}


async def concurrent_grad(dist, r):
    """A request's ag.grad on the same parameters while a DDP backward is in flight."""
    ag.manual_seed(0)
    model = Net()
    ddp = dist.DistributedDataParallel(model)
    x, y = batch(r)
    xq, yq = batch(r, 5)
    request: dict[str, Any] = {}

    async def serve_request():
        await anyio.sleep(0.05)  # the DDP backward is now parked in the "yield" node
        model.mode = None
        names = [n for n, _ in model.named_parameters()][:4]
        ps = [p for _, p in model.named_parameters()][:4]
        gs = await ag.grad(loss_of(model(xq), yq), ps)
        request.update({n: g.numpy().tolist() for n, g in zip(names, gs)})
        gd = await ag.grad(loss_of(ddp(xq), yq), ps)  # through the DDP, but a grad(): not synced
        request.update({"ddp_" + n: g.numpy().tolist() for n, g in zip(names, gd)})

    model.mode = "yield"
    loss = loss_of(ddp(x), y)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_request)
        await ag.backward(loss)
    return {"params": params(model), "grads": grads(model), "request": request}


async def two_forwards_and_sync(dist, r):
    """One backward through two forwards of the DDP; then the blocking form."""
    ag.manual_seed(0)
    model = Net()
    ddp = dist.DistributedDataParallel(model)
    (x0, y0), (x1, y1) = batch(r, 0), batch(r, 1)
    await ag.backward(loss_of(ddp(x0), y0) + loss_of(ddp(x1), y1))
    out = {"params": params(model), "two": grads(model)}
    model.zero_grad()
    x, y = batch(r, 2)
    loss = loss_of(ddp(x), y)
    await anyio.to_thread.run_sync(loss.backward)  # the blocking form, from a thread without a loop
    out["sync"] = grads(model)
    return out


async def collectives(dist, r):
    out: dict[str, Any] = {"rank": dist.rank(), "size": dist.world_size()}
    for op in ("sum", "mean", "max", "min"):
        t = ag.tensor([1.0 + r, 10.0 - 3 * r])
        await dist.all_reduce(t, op=op)
        out[op] = t.tolist()
    t = ag.tensor([float(r), float(r)])
    v = t._version
    await dist.broadcast(t, src=1)
    out["broadcast"], out["bumped"] = t.tolist(), t._version > v
    await dist.barrier()
    errors = []
    for call in (lambda: dist.all_reduce(ag.tensor([1.0]), op="prod"),
                 lambda: dist.broadcast(ag.tensor([1.0]), src=2),
                 lambda: dist.all_reduce([1.0]),
                 lambda: dist.DistributedDataParallel(Net(), comm="world")):
        try:
            result = call()
            if hasattr(result, "__await__"):
                await result
        except Exception as e:
            errors.append([type(e).__name__, str(e)])
    out["errors"] = errors
    t = ag.tensor([5.0])
    with anyio.move_on_after(0):  # cancelled before it completes: t is left alone
        await dist.all_reduce(t)
    out["cancelled"] = t.tolist()
    await dist.barrier()
    return out


async def timeout(dist, r):
    """Rank 1 stalls past the timeout before its backward; then both carry on."""
    ag.manual_seed(0)
    model = Net()
    ddp = dist.DistributedDataParallel(model, timeout=1.0)
    x, y = batch(r)
    out: dict[str, Any] = {"params": params(model)}
    if r == 1:
        await anyio.sleep(2.5)
        out["woke_at"] = time.time()  # (one machine: the ranks share this clock)
    t0 = anyio.current_time()
    try:
        await ag.backward(loss_of(ddp(x), y))
        out["round1"] = "ok"
    except Exception as e:
        out["round1"] = [type(e).__name__, str(e), list(getattr(e, "failed_ranks", []))]
    out["waited"] = anyio.current_time() - t0
    out["raised_at"] = time.time()
    out["after1"] = grads(model)
    await dist.barrier()  # rank 0 waits for rank 1 to catch up; then a round succeeds again
    await ag.backward(loss_of(ddp(x), y))
    out["after2"] = grads(model)
    return out


SCENARIOS = {f.__name__: f for f in (average, failure, unused, loss_failures, no_sync, concurrent_grad,
                                     two_forwards_and_sync, collectives, timeout)}


def main() -> None:
    from asyncgrad import distributed as dist

    name, backend, outdir = sys.argv[1:4]
    r = dist.rank()
    result = anyio.run(SCENARIOS[name], dist, r, backend=backend)
    with open(os.path.join(outdir, f"{r}.json"), "w") as f:
        json.dump({"rank": r, **result}, f)


if __name__ == "__main__":
    main()
