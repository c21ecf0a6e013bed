"""Where asyncgrad's backward time goes, on the chain and mlp workloads.

    python -m bench.profile chain            # per-node breakdown by direct timing
    python -m bench.profile mlp
    python -m bench.profile chain --pyspy    # also sample with py-spy: top frames, categories

The breakdown times the same graph several ways, each a median of rounds:

chain (µs per op node):
  floor        the hand-written numpy backward (the rules' arithmetic only)
  apply        every node's ``apply`` called in order by a bare loop (rule + unpacking saved values)
  + validate   ``validate_outputs`` added (PyTorch's shape/dtype check of each gradient)
  sync engine  ``backward_sync``: the engine's synchronous driver (adds ready queue, buffers, routing,
               GraphTask setup, commit)
  async engine ``await backward``: the driver on the event loop (adds the coroutine and its checkpoints)

mlp (ms):
  floor, ``backward_sync`` (every node on the calling thread), ``await backward`` with everything
  inline on the loop, and the default engine (big nodes on worker threads); then the profiler's
  per-node kernel times beside the floor's steps.

These use engine internals (``node.apply``, ``validate_outputs``) only to attribute time; they
are read-only and may need updating when the engine's internals move.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgrad as ag  # noqa: E402
from bench import nets  # noqa: E402
from bench.common import ASYNCGRAD, BLAS, Case, measure_cases, median, no_gc  # noqa: E402
from bench.workloads import chain  # noqa: E402


def _validate() -> Any:
    try:
        from asyncgrad.autograd.graph.validate import validate_outputs  # type: ignore[import-not-found]
    except ImportError:
        from asyncgrad.autograd.task.graph_task import validate_outputs
    return validate_outputs


async def _sync_on_thread(loss: Any) -> None:
    """``backward_sync`` refuses to block a running loop: run it on a plain thread (the
    hop costs ~0.1 ms per backward, < 0.05 µs per node of the chain)."""
    await asyncio.to_thread(ag.backward_sync, loss)


def _chain_nodes(loss: Any) -> list[Any]:
    """The op nodes of a chain from the loss's node down, in the order backward runs them."""
    nodes = []
    node = loss.grad_fn
    while node is not None and node.name() != "AccumulateGrad":
        nodes.append(node)
        node = next((n for n, _ in node.next_edges if n is not None), None)
    return nodes


def chain_breakdown(n: int = 2000, rounds: int = 15) -> dict[str, float]:
    from asyncgrad.ops._array_math import ARRAY_MATH

    validate = _validate()
    x0, c0 = chain._inputs(16)
    keep = chain.ag_forward(x0, c0, n)  # one graph reused by the bare loops (nothing is freed)
    nodes = _chain_nodes(keep)
    g0 = np.ones((), dtype=np.float32)

    def apply_only(_: Any) -> None:
        g = [g0]
        for node in nodes:
            g = [node.apply(g, ARRAY_MATH)[0]]

    def apply_validate(_: Any) -> None:
        g = [g0]
        for node in nodes:
            g = [validate(node, node.apply(g, ARRAY_MATH))[0]]

    cases = [
        Case("floor", lambda: chain.numpy_forward(x0, c0, n), lambda s: chain.numpy_backward(s[1], c0, n, 16)),
        Case("apply", lambda: None, apply_only),
        Case("apply + validate", lambda: None, apply_validate),
        Case("sync engine", lambda: chain.ag_forward(x0, c0, n), _sync_on_thread),
        Case("async engine", lambda: chain.ag_forward(x0, c0, n), ag.backward),
    ]
    times = measure_cases(cases, rounds)
    per = {k: median(v) / n * 1e6 for k, v in times.items()}
    print(f"chain: {n} ops on 16 floats, {len(nodes)} op nodes walked; µs per node (median of {rounds})")
    rows = [
        ("rule arithmetic (numpy floor)", per["floor"], per["floor"]),
        ("node.apply (rule + saved-value unpacking + call overhead)", per["apply"], per["apply"] - per["floor"]),
        ("validate_outputs", per["apply + validate"], per["apply + validate"] - per["apply"]),
        ("engine, sync driver (queue, buffers, routing, setup, commit)", per["sync engine"],
         per["sync engine"] - per["apply + validate"]),
        ("engine, async driver on the loop", per["async engine"], per["async engine"] - per["sync engine"]),
    ]
    print(f"  {'step':<62} {'cumulative':>10} {'this step':>10}")
    for name, cum, step in rows:
        print(f"  {name:<62} {cum:>10.2f} {step:>10.2f}")
    return per


def mlp_breakdown(rounds: int = 9) -> dict[str, float]:
    from asyncgrad.autograd import Engine, get_engine, set_engine

    params = nets.make_params(4, 1024)
    x = nets.make_input(256, 1024)
    ps = nets.ag_params(params)
    default = get_engine()
    inline = Engine(inline_threshold=2**62)

    def setup() -> Any:
        for p in ps:
            p.grad = None
        return nets.ag_graph(ps, x)

    async def on_loop(loss: Any) -> None:
        set_engine(inline)
        try:
            await ag.backward(loss)
        finally:
            set_engine(default)

    cases = [
        Case("numpy floor", lambda: nets.numpy_graph(params, x), lambda s: nets.numpy_backward(params, s)),
        Case("asyncgrad backward_sync (one plain thread)", setup, _sync_on_thread),
        Case("asyncgrad await, all inline on the loop", setup, on_loop),
        Case("asyncgrad await, default engine (offload)", setup, ag.backward),
    ]
    times = measure_cases(cases, rounds)
    ms = {k: median(v) * 1e3 for k, v in times.items()}
    floor = ms["numpy floor"]
    print(f"mlp: 4 layers, batch 256, width 1024, float32; ms (median of {rounds})")
    for k, v in ms.items():
        print(f"  {k:<46} {v:>8.2f} ms  {v / floor:>5.2f}x floor")
    print(f"  ({BLAS.describe()})")

    # the floor's steps, one by one (numpy's own BLAS threads)
    BLAS.enter("numpy")
    acts, out = nets.numpy_graph(params, x)
    steps: Counter[str] = Counter()
    for _ in range(rounds):
        g = out * np.float32(2.0 / out.size)
        for i in range(3, -1, -1):
            a = acts[i]
            t0 = time.perf_counter()
            g.T @ a
            t1 = time.perf_counter()
            g.sum(axis=0)
            t2 = time.perf_counter()
            steps["dW = g.T @ a"] += t1 - t0
            steps["db = g.sum(0)"] += t2 - t1
            if i > 0:
                t0 = time.perf_counter()
                g = g @ params[2 * i]
                t1 = time.perf_counter()
                g *= a > 0
                t2 = time.perf_counter()
                steps["dx = g @ W"] += t1 - t0
                steps["relu mask"] += t2 - t1
    print("  floor steps (total per backward):")
    for k, v in steps.items():
        print(f"    {k:<24} {v / rounds * 1e3:>8.2f} ms")

    # asyncgrad's kernels, as its profiler sees them (on the loop thread and on workers)
    from asyncgrad.autograd import profiler

    async def prof(inline_engine: bool) -> Any:
        BLAS.enter(ASYNCGRAD)
        if inline_engine:
            set_engine(inline)
        try:
            for _ in range(2):
                await ag.backward(setup())
            with profiler.profile() as p:
                for _ in range(rounds):
                    loss = setup()
                    with no_gc():
                        await ag.backward(loss)
            return p
        finally:
            set_engine(default)

    for label, inl in (("default engine (offload)", False), ("all inline", True)):
        p = asyncio.run(prof(inl))
        print(f"  asyncgrad kernels, {label} — profiler key averages over {rounds} backwards:")
        print("    " + p.key_averages().table(sort_by="total_time", row_limit=12).replace("\n", "\n    "))
    return ms


# --- sampling with py-spy ----------------------------------------------------------------------------
CATEGORIES = [
    ("rule arithmetic (ops/*.py rules, numpy)", ("/ops/", "numpy/")),
    ("node.apply / unpacking (graph/record.py)", ("graph/record.py",)),
    ("validate_outputs", ("graph/validate.py", "validate_outputs")),
    ("routing / ready queue (task/graph_task.py)", ("task/graph_task.py",)),
    ("engine loop (engine.py)", ("engine.py",)),
    ("anyio / asyncio / sniffio", ("anyio/", "asyncio/", "sniffio/")),
    ("threads / concurrent.futures", ("threading.py", "concurrent/")),
]


IDLE = {"Condition.wait", "Event.wait", "wait", "select", "EpollSelector.select", "_worker", "get"}


def _loop_target(workload: str, seconds: float) -> None:
    """What py-spy samples: backwards only (graphs built in batches, outside the filter)."""
    if workload == "chain":
        x0, c0 = chain._inputs(16)

        def build() -> Any:
            return chain.ag_forward(x0, c0, 2000)
    else:
        params = nets.make_params(4, 1024)
        x = nets.make_input(256, 1024)
        ps = nets.ag_params(params)

        def build() -> Any:
            return nets.ag_graph(ps, x)

    async def main() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            graphs = [build() for _ in range(10)]
            with no_gc():
                for g in graphs:
                    await ag.backward(g)

    asyncio.run(main())


def pyspy(workload: str, seconds: float = 8.0, top: int = 15) -> None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        print("py-spy not found: pip install py-spy")
        return
    raw = Path(tempfile.mkdtemp()) / f"{workload}.raw"
    cmd = [exe, "record", "-r", "1000", "-f", "raw", "-o", str(raw), "--threads", "--",
           sys.executable, "-m", "bench.profile", workload, "--loop", str(seconds)]
    subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True)
    selfc: Counter[str] = Counter()
    cats: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        if not _in_backward(frames):
            continue  # the forward that builds graphs, imports
        leaf_name = frames[-1].split(" (")[0]
        if leaf_name in IDLE or any("_find_and_load" in f for f in frames):
            continue  # a worker thread waiting for work, the loop in select(), a first-use import
        n = int(count)
        total += n
        threads[frames[0]] += n
        leaf = frames[-1]
        name = leaf.split(" (")[0]
        where = leaf.rsplit("/", 1)[-1].split(":")[0] if "/" in leaf else ""
        selfc[f"{name} ({where})"] += n
        for cat, keys in CATEGORIES:
            if any(k in leaf for k in keys):
                cats[cat] += n
                break
        else:
            cats["other: " + where] += n
    print(f"py-spy, {workload}: {total} samples in backward at 1 kHz (self time = the innermost Python frame; "
          "numpy's C time counts to the Python line that called it)")
    print("  by thread:")
    for t, c in threads.most_common(6):
        print(f"    {100 * c / total:5.1f}%  {t}")
    print("  top frames (self):")
    for f, c in selfc.most_common(top):
        print(f"    {100 * c / total:5.1f}%  {f}")
    print("  by category:")
    for f, c in cats.most_common():
        print(f"    {100 * c / total:5.1f}%  {f}")
    print("  hottest engine lines (innermost frame in asyncgrad/autograd/; callees included):")
    for (path, line, func), c in _engine_lines(raw).most_common(top):
        src = Path(path) if Path(path).is_absolute() else Path(ag.__file__).resolve().parents[1] / path
        try:
            text = src.read_text().splitlines()[line - 1].strip()
        except (OSError, IndexError):
            text = "?"
        print(f"    {100 * c / total:5.1f}%  {Path(path).name}:{line} {func}: {text[:90]}")


def _in_backward(frames: list[str]) -> bool:
    """A sample taken inside a backward: under ``api.backward`` on the loop thread, or a
    kernel on a worker thread."""
    return any("backward (" in f and "autograd/api.py" in f for f in frames) or any(
        "run_kernel" in f or "worker" in f.lower() for f in frames)


def _engine_lines(raw: Path) -> Counter[tuple[str, int, str]]:
    """Samples per source line of the innermost frame inside ``asyncgrad/autograd/``: the
    line of the engine's hot loop that was running (its callees, e.g. a rule, included)."""
    out: Counter[tuple[str, int, str]] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        if frames[-1].split(" (")[0] in IDLE or any("_find_and_load" in f for f in frames):
            continue
        if not _in_backward(frames):
            continue
        for f in reversed(frames):
            if "asyncgrad/autograd/" in f:
                func, _, loc = f.partition(" (")
                path, _, ln = loc.rstrip(")").rpartition(":")
                if ln.isdigit():
                    out[(path, int(ln), func)] += int(count)
                break
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="profile asyncgrad's backward on chain / mlp")
    p.add_argument("workload", choices=("chain", "mlp"))
    p.add_argument("--pyspy", action="store_true", help="also sample with py-spy")
    p.add_argument("--loop", type=float, default=None, help=argparse.SUPPRESS)  # the py-spy target
    p.add_argument("--rounds", type=int, default=None)
    a = p.parse_args(argv)
    if a.loop is not None:
        _loop_target(a.workload, a.loop)
        return 0
    print(f"asyncgrad {ag.__version__}; load average {os.getloadavg()[0]:.2f}")
    if a.workload == "chain":
        chain_breakdown(rounds=a.rounds or 15)
    else:
        mlp_breakdown(rounds=a.rounds or 9)
    if a.pyspy:
        pyspy(a.workload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
