"""wide: ``branches`` independent branches, each ``ops`` elementwise ops on ``size`` floats,
the branch sums added into one loss; backward only.

Each branch is its own leaf ``x_i`` through the op cycle ``sin, * c, tanh, + c``. The
branches share nothing, so an engine may run them at the same time; numpy releases the
GIL inside its loops on large arrays, so worker threads can overlap. The numpy floor runs
the hand-written branch backwards one by one, and on a pool of 2 threads.

asyncgrad runs with the default engine (nodes at or above ``inline_threshold`` elements
of work go to worker threads, up to ``max_workers`` = cores at once, and mid-size ones
too while another node is ready or on a worker); "asyncgrad inline" is the same graph with every node
on the loop, one by one, for reference. The arrays are 500,000 floats (issue 33's
workload): below the inline threshold, so only the mid-size rule sends them to workers.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..common import About
from ..common import (BLAS, ASYNCGRAD, AUTOGRAD, NUMPY, TORCH, Case, Column, Result, Target, measure_cases,
                      median)

DEFAULT_ROUNDS = 5

ABOUT = About(
    title="Independent branches: a parallel backward",
    measures="16 independent branches of 8 elementwise operations each on 500,000 floats, the branch sums "
             "added into one loss: one backward. \"asyncgrad\" runs nodes of this size on worker threads while "
             "another node is ready, so nodes of different branches run side by side; \"asyncgrad inline\" "
             "runs every node on the event loop, one by one; the floor runs the hand-written branch "
             "backwards one by one and on a pool of 2 threads.",
    reading="Lower is better. \"numpy 2 threads\" is what hand-written parallel code reaches on this machine: "
            "elementwise work on large arrays is limited by memory bandwidth, which the cores share, so two "
            "threads gain little here. Compare \"asyncgrad\" with \"asyncgrad inline\" to see what running "
            "nodes on worker threads buys (or costs) on your hardware.",
    plots=(("backward_ms", "backward ms", False),),
)


def _inputs(branches: int, size: int, dtype: Any = np.float32) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(size).astype(dtype) for _ in range(branches)]
    return xs, rng.uniform(0.5, 1.5, size).astype(dtype)


def _branch(y: Any, c: Any, ops: int, sin: Any, tanh: Any) -> Any:
    for i in range(ops):
        k = i & 3
        if k == 0:
            y = sin(y)
        elif k == 1:
            y = y * c
        elif k == 2:
            y = tanh(y)
        else:
            y = y + c
    return y


def ag_graph(xs0: list[np.ndarray], c0: np.ndarray, ops: int) -> Any:
    import asyncgrad as ag

    c = ag.from_numpy(c0)
    loss = None
    for x0 in xs0:
        b = _branch(ag.from_numpy(x0).requires_grad_(), c, ops, ag.sin, ag.tanh).sum()
        loss = b if loss is None else loss + b
    return loss


def torch_graph(xs0: list[np.ndarray], c0: np.ndarray, ops: int) -> Any:
    import torch

    c = torch.from_numpy(c0)
    loss = None
    for x0 in xs0:
        b = _branch(torch.from_numpy(x0).requires_grad_(), c, ops, torch.sin, torch.tanh).sum()
        loss = b if loss is None else loss + b
    return loss


def autograd_graph(xs0: list[np.ndarray], c0: np.ndarray, ops: int) -> Any:
    import autograd
    import autograd.numpy as anp

    def f(xs: list[Any]) -> Any:
        loss = 0.0
        for x in xs:
            loss = loss + anp.sum(_branch(x, c0, ops, anp.sin, anp.tanh))
        return loss

    return autograd.make_vjp(f)(list(xs0))


def numpy_forward_branch(x0: np.ndarray, c0: np.ndarray, ops: int) -> list[np.ndarray]:
    saved = []
    y = x0
    for i in range(ops):
        k = i & 3
        if k == 0:
            saved.append(y)
            y = np.sin(y)
        elif k == 1:
            y = y * c0
        elif k == 2:
            y = np.tanh(y)
            saved.append(y)
        else:
            y = y + c0
    return saved


def numpy_backward_branch(saved: list[np.ndarray], c0: np.ndarray, ops: int) -> np.ndarray:
    g = np.ones_like(c0)  # d loss / d branch output (the sum's gradient)
    j = len(saved) - 1
    for i in range(ops - 1, -1, -1):
        k = i & 3
        if k == 0:
            g = g * np.cos(saved[j])
            j -= 1
        elif k == 1:
            g = g * c0
        elif k == 2:
            a = saved[j]
            g = g * (1.0 - a * a)
            j -= 1
    return g


def run(impls: list[str], rounds: int | None = None, branches: int = 16, ops: int = 8,
        size: int = 500_000, threads: int = 2) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    xs0, c0 = _inputs(branches, size)
    res = Result(
        "wide", f"{branches} independent branches x {ops} elementwise ops on {size:,} floats, summed; backward",
        {"branches": branches, "ops": ops, "size": size, "rounds": rounds, "dtype": "float32",
         "numpy_threads": threads},
        [Column("backward_ms", "backward ms", "{:.1f}"),
         Column("x_floor", "x numpy one by one", "{:.2f}"),
         Column("page_faults", "page faults", "{:,.0f}"),
         Column("hops", "hops", "{:.0f}"),
         Column("niced", "rounds niced", "{:.0%}")],
    )
    t_start = time.perf_counter()
    cases: list[Case] = []
    extra: dict[str, dict[str, Any]] = {}
    hop_counts: list[float] = []  # per asyncgrad round (warm-up included)
    niced: list[bool] = []
    pool = ThreadPoolExecutor(threads)

    def np_setup() -> list[list[np.ndarray]]:
        return [numpy_forward_branch(x0, c0, ops) for x0 in xs0]

    for impl in impls:
        if impl == ASYNCGRAD:
            import asyncgrad as ag
            from asyncgrad.autograd import Engine, get_engine, set_engine

            default = get_engine()
            inline = Engine(inline_threshold=2**62)

            async def ag_inline(loss: Any, inline: Any = inline, default: Any = default) -> None:
                set_engine(inline)
                try:
                    await ag.backward(loss)
                finally:
                    set_engine(default)

            from asyncgrad.autograd.sched.placement import worker_niceness

            async def ag_default(loss: Any, default: Any = default) -> None:
                # diagnostics (outside nothing the engine does): the hops this call took and
                # whether its kernels ran niced (Note [Niced kernels on the cores others leave])
                hops = default.statistics().thread_hops
                niced.append(worker_niceness(default.max_workers, default.worker_nice) > 0)
                await ag.backward(loss)
                hop_counts.append(default.statistics().thread_hops - hops)

            cases.append(Case(impl, lambda: ag_graph(xs0, c0, ops), ag_default))
            cases.append(Case("asyncgrad inline", lambda: ag_graph(xs0, c0, ops), ag_inline))
            extra[impl] = {"max_workers": default.max_workers, "inline_threshold": default.inline_threshold}
        elif impl == TORCH:
            import torch

            cases.append(Case(impl, lambda: torch_graph(xs0, c0, ops), lambda loss: loss.backward()))
            extra[impl] = {"intra_op_threads": torch.get_num_threads()}
        elif impl == AUTOGRAD:
            cases.append(Case(impl, lambda: autograd_graph(xs0, c0, ops), lambda va: va[0](np.ones_like(va[1]))))
        elif impl == NUMPY:
            cases.append(Case("numpy one by one", np_setup,
                              lambda ss: [numpy_backward_branch(s, c0, ops) for s in ss]))
            cases.append(Case(f"numpy {threads} threads", np_setup,
                              lambda ss: list(pool.map(lambda s: numpy_backward_branch(s, c0, ops), ss))))
    faults: dict[str, list[int]] = {}
    try:
        times = measure_cases(cases, rounds, faults=faults)
    finally:
        pool.shutdown()
    for case in cases:
        t = times[case.name]
        res.rows.append({"impl": case.name, "backward_ms": median(t) * 1e3, "rounds_s": t,
                         "page_faults": median(faults[case.name]),
                         **extra.get(case.name, {})})
    if hop_counts:
        row = next(r for r in res.rows if r["impl"] == ASYNCGRAD)
        row["hops"] = median(hop_counts[1:] or hop_counts)
        row["niced"] = sum(niced) / len(niced)
    res.notes.append(BLAS.describe())
    res.seconds = time.perf_counter() - t_start
    floor = res.value("numpy one by one", "backward_ms")
    for r in res.rows:
        r["x_floor"] = r["backward_ms"] / floor if not math.isnan(floor) else None
    a = res.value(ASYNCGRAD, "backward_ms")
    ratio = res.add_ratio("asyncgrad/numpy one by one", a, floor)
    pooled = res.value(f"numpy {threads} threads", "backward_ms")
    res.add_ratio(f"asyncgrad/numpy {threads} threads", a, pooled)
    best = min((v for v in (floor, pooled) if not math.isnan(v)), default=math.nan)
    best_ratio = res.add_ratio("asyncgrad/best numpy floor", a, best)
    res.add_ratio("asyncgrad/torch", a, res.value(TORCH, "backward_ms"))
    res.add_ratio("asyncgrad/autograd", a, res.value(AUTOGRAD, "backward_ms"))
    res.add_ratio("asyncgrad inline/offload (speed-up)", res.value("asyncgrad inline", "backward_ms"), a)
    if not math.isnan(ratio):
        res.targets.append(Target("wide backward <= 0.8x numpy one by one", ratio, 0.8, "x"))
    if not math.isnan(best_ratio):  # issue 15's target: the better of the two numpy floors
        res.targets.append(Target(f"wide backward <= 1.0x the best of numpy one by one and on {threads} threads",
                                  best_ratio, 1.0, "x"))
    return res
