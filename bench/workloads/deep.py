"""deep: a chain of 100,000 tiny nodes (the chain workload's op cycle on a 1-float tensor);
backward time per node, and the memory the recorded graph holds per node.

Time: the graph is built untimed, then one backward is timed, for ``rounds`` rounds.

Memory: measured in a fresh child process per implementation (``python -m
bench.workloads.deep --memory IMPL``) so that earlier rounds' freed memory cannot hide the
growth: after a warm-up build, the process's RSS is read before and after building the
100,000-op graph (kept alive), then the graph is dropped and rebuilt under
``tracemalloc``. RSS is the figure for every implementation; tracemalloc counts only
memory allocated through Python's allocators and numpy (it does not see PyTorch's C++
graph), so it is given for reference.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from ..common import About
from ..common import (BLAS, ASYNCGRAD, AUTOGRAD, NUMPY, TORCH, Case, Column, Result, Target, measure_cases,
                      median, rss_bytes, trim_heap)
from . import chain

DEFAULT_ROUNDS = 3

ABOUT = About(
    title="A very deep graph: 100,000 nodes",
    measures="A chain of 100,000 tiny nodes (the chain workload's operations on one float): the backward in µs "
             "per node; the memory the recorded graph holds per node (the growth of the process's resident "
             "memory while building it, in a fresh process per implementation; tracemalloc for reference, "
             "which does not see PyTorch's C++ graph); the forward in µs per operation.",
    reading="Lower is better. A deep graph shows that the backward does not recurse (no stack overflow at any "
            "depth) and what the graph costs in memory: at 100,000 nodes, every 100 bytes per node is 10 MB "
            "held until the backward frees it.",
    plots=(("backward_us_per_node", "backward µs/node", False), ("rss_bytes_per_node", "graph B/node (RSS)", False)),
)
SIZE = 1
SPREAD = 1e-4  # the multiplier 1 +- 1e-4: the gradient stays a normal float through 100,000 ops


def build(impl: str, n: int, size: int) -> Any:
    """The forward graph of ``impl`` (what its backward needs)."""
    x0, c0 = chain._inputs(size, SPREAD)
    if impl == ASYNCGRAD:
        return chain.ag_forward(x0, c0, n)
    if impl == TORCH:
        return chain.torch_forward(x0, c0, n)
    if impl == AUTOGRAD:
        return chain.autograd_forward(x0, c0, n)
    if impl == NUMPY:
        return chain.numpy_forward(x0, c0, n)
    raise ValueError(impl)


def backward_sync(impl: str, graph: Any, n: int, size: int) -> None:
    if impl == ASYNCGRAD:
        import asyncgrad as ag

        ag.backward_sync(graph)
    elif impl == TORCH:
        graph.backward()
    elif impl == AUTOGRAD:
        graph[0](np.ones_like(graph[1]))
    else:
        chain.numpy_backward(graph[1], chain._inputs(size, SPREAD)[1], n, size)


def memory_child(impl: str, n: int, size: int) -> dict[str, float]:
    """Run in a fresh process: graph memory per node by RSS and by tracemalloc."""
    g = build(impl, 1000, size)  # warm-up: imports, caches, first allocations
    backward_sync(impl, g, 1000, size)
    del g
    if impl == ASYNCGRAD:  # the compiled kernels' loader (a thread) allocates too: not graph memory
        from asyncgrad.ops import kernels

        kernels.wait()
    gc.collect()
    gc.disable()
    trim_heap()
    before = rss_bytes()
    g = build(impl, n, size)
    after = rss_bytes()
    del g
    gc.collect()
    tracemalloc.start()
    g = build(impl, n, size)
    traced, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del g
    return {"rss_bytes_per_node": (after - before) / n, "traced_bytes_per_node": traced / n}


def measure_memory(impl: str, n: int, size: int) -> dict[str, float]:
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "bench.workloads.deep", "--memory", impl, "--n", str(n), "--size", str(size)]
    try:
        out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        detail = getattr(e, "stderr", "") or ""
        print(f"deep: memory child for {impl} failed: {e} {detail[-500:]}", file=sys.stderr)
        return {"rss_bytes_per_node": math.nan, "traced_bytes_per_node": math.nan}


def run(impls: list[str], rounds: int | None = None, n: int = 100_000, size: int = SIZE,
        memory: bool = True) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    res = Result(
        "deep", f"chain of {n:,} tiny nodes ({size} float); backward time and graph memory per node",
        {"n": n, "size": size, "rounds": rounds, "dtype": "float32"},
        [Column("backward_us_per_node", "backward µs/node", "{:.2f}"),
         Column("rss_bytes_per_node", "graph B/node (RSS)", "{:,.0f}"),
         Column("traced_bytes_per_node", "B/node (tracemalloc)", "{:,.0f}"),
         Column("forward_us_per_op", "forward µs/op", "{:.2f}")],
    )
    t_start = time.perf_counter()
    impls = [i for i in impls if i in (ASYNCGRAD, TORCH, AUTOGRAD, NUMPY)]
    cases: list[Case] = []
    fwd: dict[str, list[float]] = {i: [] for i in impls}
    for impl in impls:
        def setup(impl: str = impl) -> Any:
            t0 = time.perf_counter()
            g = build(impl, n, size)
            fwd[impl].append(time.perf_counter() - t0)
            return g

        if impl == ASYNCGRAD:
            import asyncgrad as ag

            cases.append(Case(impl, setup, ag.backward))
        else:
            cases.append(Case(impl, setup, lambda g, impl=impl: backward_sync(impl, g, n, size)))
    times = measure_cases(cases, rounds, settle=0.0)  # tiny ops: no BLAS or OpenMP threads involved
    for impl in impls:
        t = times[impl]
        row: dict[str, Any] = {"impl": impl, "backward_us_per_node": median(t) / n * 1e6, "rounds_s": t,
                               "forward_us_per_op": median(fwd[impl][1:]) / n * 1e6}
        if memory:
            row.update(measure_memory(impl, n, size))
        res.rows.append(row)
    res.notes.append(BLAS.describe())
    res.seconds = time.perf_counter() - t_start
    a = res.value(ASYNCGRAD, "backward_us_per_node")
    m = res.value(ASYNCGRAD, "rss_bytes_per_node")
    res.add_ratio("asyncgrad/torch time", a, res.value(TORCH, "backward_us_per_node"))
    res.add_ratio("asyncgrad/autograd time", a, res.value(AUTOGRAD, "backward_us_per_node"))
    res.add_ratio("asyncgrad/numpy time", a, res.value(NUMPY, "backward_us_per_node"))
    res.add_ratio("asyncgrad/torch memory", m, res.value(TORCH, "rss_bytes_per_node"))
    if not math.isnan(a):
        res.targets.append(Target("deep backward <= 3 µs/node", a, 3.0, "µs/node"))
        torch_t = res.value(TORCH, "backward_us_per_node")
        if not math.isnan(torch_t):
            res.targets.append(Target("issue 33: deep backward <= 0.4x torch", a / torch_t, 0.4, "x"))
    if not math.isnan(m):
        res.targets.append(Target("deep graph <= 500 B/node", m, 500.0, "B/node"))
        torch_m = res.value(TORCH, "rss_bytes_per_node")
        if not math.isnan(torch_m):
            res.targets.append(Target("issue 33: deep graph <= 0.4x torch's bytes", m / torch_m, 0.4, "x"))
    return res


def _main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--memory", required=True)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--size", type=int, default=SIZE)
    a = p.parse_args()
    print(json.dumps(memory_child(a.memory, a.n, a.size)))


if __name__ == "__main__":
    _main()
