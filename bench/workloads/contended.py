"""contended: the concurrent and many_tasks workloads again, with one busy process on the
machine the whole time: a shared server, where another program holds one of the cores;
and the transformer training step (one large backward at a time, each library's faster
attention path, default threads), where BLAS's threads meet the busy core.

asyncgrad (awaited) beside PyTorch through ``asyncio.to_thread``, in the same run and
under the same contention. The busy process is a pure-Python loop in a child
interpreter (one core at 100%), started before the first measurement and killed after
the last; it also ends by itself if this process dies. Target (issue 11): asyncgrad's
passes/s at least torch to_thread's, in both workloads and at every N.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..common import ASYNCGRAD, TORCH, About, Column, Result, Target
from . import concurrent, many_tasks, transformer

ABOUT = About(
    title="Under contention: one busy process beside the service",
    measures="The two workloads above (32 tasks each running forward+backward passes; N tasks each awaiting "
             "backward of prebuilt graphs) again, while another process keeps one of the 2 cores busy the "
             "whole time: passes per second and how late a 1 ms timer on the loop fires. asyncgrad (awaited) "
             "beside PyTorch through asyncio.to_thread. Then the transformer training step (training steps "
             "per second, each library's faster attention path, default threads).",
    reading="Higher passes/s is better. On a shared server the cores are not all yours: a library whose "
            "threads (BLAS helpers, a thread pool) expect every core waits for the one that is taken. "
            "Compare the rows with each other, and with the uncontended tables above.",
    plots=(("passes_per_s", "passes/s", False), ("p99_lag_ms", "loop p99 lag ms", False)),
)

DEFAULT_ROUNDS = 3

# The child spins until its parent is gone (a killed benchmark leaves no busy process).
BUSY_LOOP = ("import os\n"
             "parent = os.getppid()\n"
             "while os.getppid() == parent:\n"
             "    for _ in range(200_000):\n"
             "        pass\n")


@contextmanager
def busy_process() -> Iterator[subprocess.Popen[bytes]]:
    """One child process spinning on a core while the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)  # past the interpreter's start-up: spinning from the first round on
        yield proc
    finally:
        proc.kill()
        proc.wait()


def run(impls: list[str], rounds: int | None = None, tasks: int = 32, transformer_step: bool = True,
        **transformer_size: int) -> Result:
    """``transformer_size``: the GPT's sizes (``transformer.run``'s keywords), for smoke tests."""
    rounds = rounds or DEFAULT_ROUNDS
    impls = [i for i in impls if i in (ASYNCGRAD, TORCH)]
    res = Result(
        "contended", "concurrent (32 tasks x small MLP forward+backward) and many_tasks (N tasks awaiting "
                     "prebuilt backward) with one busy process on the machine",
        {"rounds": rounds, "tasks": tasks, "busy_processes": 1},
        [Column("tasks", "tasks", "{:.0f}"), Column("passes_per_s", "passes/s", "{:,.0f}"),
         Column("p99_lag_ms", "loop p99 lag ms", "{:.2f}"), Column("max_lag_ms", "loop max lag ms", "{:.2f}")],
    )
    t_start = time.perf_counter()
    with busy_process():
        conc = concurrent.run(impls, rounds, tasks=tasks, batched=False)
        many = many_tasks.run(impls, rounds)
        step = transformer.run(impls, rounds, one_thread=False, **transformer_size) if transformer_step else None
    res.seconds = time.perf_counter() - t_start
    # rows named implementation first, as every workload's (the page and the plots
    # highlight the rows that start with "asyncgrad")
    ours, peer = "asyncgrad (awaited)", "torch to_thread"
    cases = ["concurrent"] + [f"many_tasks N={n}" for n in many_tasks.COUNTS]
    for case in cases:
        for name in (ours, peer):
            row = conc.row(name) if case == "concurrent" else many.row(f"{name} {case.split()[-1]}")
            if row is not None:
                res.rows.append({**row, "impl": f"{name}: {case}", "tasks": row.get("tasks", tasks)})
    for case in cases:
        ratio = res.add_ratio(f"{case}: asyncgrad / torch to_thread passes/s",
                              res.value(f"{ours}: {case}", "passes_per_s"),
                              res.value(f"{peer}: {case}", "passes_per_s"))
        if not math.isnan(ratio):  # (both rows measured)
            res.targets.append(Target(f"contended {case}: asyncgrad passes/s >= torch to_thread's",
                                      ratio, 1.0, "x", at_least=True))
    if step is not None:  # steps per second of each library's faster path
        for lib in (ASYNCGRAD, TORCH):
            times = [r["step_ms"] for r in step.rows if r["impl"].startswith(lib + " ")]
            if times:
                res.rows.append({"impl": f"{lib}: transformer step", "tasks": 1, "passes_per_s": 1e3 / min(times),
                                 "p99_lag_ms": None, "max_lag_ms": None})
        res.add_ratio("transformer step: asyncgrad / torch steps/s", res.value(f"{ASYNCGRAD}: transformer step",
                                                                                 "passes_per_s"),
                      res.value(f"{TORCH}: transformer step", "passes_per_s"))
    res.notes.extend(conc.notes)
    return res
