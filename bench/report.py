"""The benchmarks page of the docs, rendered from one run's JSON, so it cannot go stale.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench --json docs/benchmarks.json   # one full run
    python -m bench.report docs/benchmarks.json --plots docs/img > docs/benchmarks.md

Every workload present in the run is rendered the same way, from what the workload module
declares next to its code (``ABOUT = About(...)``: title, what it measures, how to read
it, which metrics to plot) and from its rows, columns, ratios and notes. A workload that
declares nothing is rendered from its docstring, so new workloads need no change here.
``--plots DIR`` also (re)draws the figures of the same run into ``DIR`` (the page links to
``img/bench.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import blas_kernels  # noqa: E402

PEERS = {"torch": "PyTorch", "autograd": "HIPS autograd", "numpy": "a hand-written numpy backward (the floor)"}

INTRO = """\
asyncgrad measured beside PyTorch, HIPS autograd and hand-written numpy code, all in one run
of `python -m bench` on the machine described below. Every table and figure on this page
comes from that one run ([its raw results](benchmarks.json)); the page is generated from them
by `python -m bench.report`.

The *floor* is a hand-written numpy forward that keeps what its backward needs, and a
hand-written backward of the same derivative rules: what the arithmetic costs with no
autograd at all. PyTorch runs its own C++ kernels and BLAS (MKL/oneDNN); HIPS autograd and
asyncgrad run numpy's.
"""

CHOOSING = """\
## What the numbers mean for choosing asyncgrad

* **Responsiveness is what asyncgrad is for.** In an asyncio or trio service, a blocking
  backward (PyTorch's `loss.backward()` called in a handler) holds up every other request
  until it finishes; running it through a thread avoids that but leaves the threads to you.
  `await ag.backward(loss)` keeps the loop answering while large backwards run: compare the
  *responsive event loop* and *concurrent requests* tables below.
* **On heavy math, the BLAS decides.** When the time is in large matrix products, every
  numpy-based library is close to the floor, and PyTorch's own kernels may be faster still:
  see *a large MLP*. For training large models, or on a GPU, use PyTorch.
* **On many small operations, the bookkeeping per node decides.** The *cost per node* and
  *very deep graph* tables show what each library adds to each node of the graph, and how
  much memory a recorded graph holds per node.
* **Absolute times move, ratios hold.** The machine is a shared 2-core VM: absolute times
  move by up to ±50% from one run to the next, but every implementation of a workload is
  measured in the same process with interleaved rounds, so the ratios within one run are
  the figures to compare. Run the suite on your own machine before deciding on numbers.
"""

# What was measured when the engine's design notes chose their ideas (the Notes state
# the problem and the idea; their figures live here).
_NOTES_FIGURES_ROWS = [  # (Note (module), what was measured)
    ('[Worker chains] (`sched/placement.py`)',
     'MLP backward 1.30x -> 1.07x the numpy floor, hop per layer vs one chain, in one run; a GPT backward '
     "went from three hops per block (~0.3 ms each) to one; a view's or pass-through's rule costs 5-10 us "
     'each (`python -m bench.step_trace`)'),
    ('[BLAS hysteresis] (`runtime/blas.py`)',
     "OpenBLAS's helper threads spin ~0.1 s after a product (`OPENBLAS_THREAD_TIMEOUT`'s default, 2^28 "
     'cycles); a service whose requests came one by one, then together, in rounds of ~60 ms ran its '
     'concurrent rounds 1.17-1.39x slower than with BLAS pinned at one thread, its helper burning 50-69 ms'
     ' of CPU per round; with the half-second rule that CPU is 0 (`python -m bench.blas_spin`)'),
    ('[Page faults] (`runtime/blas.py`)',
     "freeing the wide workload's saved tensors (~190 MB) took 4-12 ms on the loop with a 128 MB trim "
     'threshold, 0.1 ms with 256 MB'),
    ("[Niced kernels on the cores others leave] (`sched/placement.py`)",
     "10 MLP backwards (4 x 1024, batch 256) under a 1 ms ticker, medians of 9 interleaved rounds "
     "(`python -m bench.worker_nice [--busy]`, 2026-12-02 06:30 UTC): on a near-idle machine the default "
     "(niced) 139.5 ms, ticker p99 / max 1.08 / 1.10 ms, the loop waiting 0.6 ms for a CPU, against "
     "`worker_nice=0` 146.8 ms, 1.05 / 4.27 ms, 4.6 ms (idle loop 0.21 / 1.33); beside one spinning process, "
     "niced 242.9 ms, 1.06 / 1.10 ms against 240.3 ms, 1.08 / 3.66 ms, but a graph of 8 parallel 1 M-float "
     "branches took 1.46x as long niced (474 vs 325 ms; in another run, on one niced thread, 409 vs 279), "
     "so beside a busy process the default keeps the process's priority; beside more than a core's worth of "
     "others' work niced MLP backwards took 2.5-6x as long (1318 vs 529 ms). A loop woken 100 times a second from "
     "another thread, with no work at all, has a ticker p99 of 1.06-1.08 ms (epoll's whole milliseconds)"),
    ("[Other processes' load] (`runtime/cpu_load.py`)",
     'a (1024 x 512)^T (1024 x 128) float32 product: 0.9 ms on two threads on a quiet machine, 8-20 ms '
     "with one busy process beside it, 1.1-2.0 ms on one thread (medians of 30 calls; PyTorch's: 10-24 ms "
     'against 1.1)'),
    ('[A task group only for async nodes] (`engine.py`)',
     "a task group's cancel scope cost ~20 us to enter and ~20 us to leave, both on the critical path of a"
     " large backward's one hop"),
    ('[The fixed cost of a call] (`engine.py`)',
     '160 -> 140 Python calls per trivial backward'),
    ('[A turn the loop just had] (`sched/loop.py`)',
     "a large backward's hop is ~20 ms; renewing the slice at the arrival saved ~0.2 ms of the MLP "
     'backward'),
    ('[Start the hop before the turn] (`sched/loop.py`)',
     "the submission adds tens of microseconds to the loop's time between two turns; on the MLP the loss's"
     " two elementwise nodes end the slice and the first layer's hop follows them"),
    ("[The loop takes a small split's first part] (`task/split_node.py`)",
     "attention's att @ v (GPT-small, BLAS at one thread): both parts on workers, submit -> start "
     '0.13-0.18 ms and 0.45 ms, kernels 0.92 and 0.39 ms vs 0.42 and 0.22 alone, arrival 0.1-0.18 ms, 1.83'
     ' ms in all (one kernel on one worker: 2.05); first part on the loop 1.75 -> 1.48 ms (inline 1.16); q'
     ' @ k^T 1.58 -> 1.36 (inline 1.12)'),
    ('[A tensor times itself] (`task/step.py`)',
     'on the MLP loss (256 x 1024 float32) about 0.4 ms of its ~2 ms of engine time beside the numpy floor'),
    ("`SMALL_EXPANDED_GRAD` (`ops/reductions.py`)",
     "a sum's gradient of 16 floats (timeit, 2026-12-02): np.broadcast_to 1.9 us, np.empty then a fill 0.3 "
     "us"),
    ("[Mean's gradient as a view] (`task/step.py`)",
     "writing mean's gradient out: 0.38 ms for 256 x 1024 float32, 0.20 ms as a view"),
    ("[One slot for a saved tensor's place], [Shared one-entry checks] (`graph/saved.py`)",
     "the deep workload's graph (100,000 nodes of sin, x c, tanh, + d on 1 float; `python -m bench --only deep`, "
     "2026-12-02 18:20-20:05 UTC, 12 interleaved processes per tree): 507 -> 471 B/node by RSS, 462 -> 426 by "
     "tracemalloc; a SavedTensor 80 -> 64 B (4 slots), one 48-B checks tuple and one 64-B argument tuple fewer per "
     "x c node (c's, shared). What is left (B/node, pymalloc block sizes): OpNode 128, saved arrays 88 (header, "
     "data and dims, two per four nodes), next_edges 120 (the pairs 64, the outer tuples 56), sequence_nr 32, saved "
     "tuples 32, SavedTensors 32, checks tuples 24, version counters 24"),
    ("[An OpNode's one edge in its slot] (`graph/op_node.py`), "
     "[Shared one-entry checks] (`graph/saved.py`, one check held bare)",
     "the deep workload (`python -m bench deep --rounds 9`, 2026-12-03 13:27-13:31 UTC, load 2.0, one process "
     "per tree): 471 -> 326 B/node by RSS (0.53x -> 0.37x torch's 884), 426 -> 294 by tracemalloc (the edge "
     "tuples 120, the checks 1-tuples 24 per node fewer), backward 2.96 -> 1.60 us/node (0.31x -> 0.17x "
     "torch); the chain workload's backward by callgrind (2,000 ops on 16 floats, numpy kernels, "
     "OPENBLAS_NUM_THREADS=1, 5 rounds, with minus without): 10,197 -> 8,483 instructions per node, its flat "
     "walk 3,751 -> 2,648 (with the walk going on to a one-edge node's child without the stack); `python -m "
     "bench chain --rounds 15` twice per tree (load 1.6-2.0): asyncgrad / best peer 0.57, 0.45 -> 0.45, 0.41. "
     "A factor's rows as an `array('q')` for the fused runs' index cost more (+143 instructions per node: "
     "`array.append` parses its argument) than numpy's conversion of a list saves"),
    ("[Max pooling row by row] (`ops/kernels/numba_kernels.py`)",
     "a window at a time took ~5 ns per tap (AMD EPYC, Zen 3); row by row, `pooling._max_pool` alone, median of "
     "60 calls, the two trees alternated twice, load 2 (2026-12-03): 1.77 -> 1.30 ms (2x2) and 2.75 -> 2.37 ms "
     "(3x3 stride 2 pad 1) on 16 x 16 x 32 x 32, 3.64 -> 2.64 and 5.53 -> 4.65 ms on 32 x 64 x 16 x 16"),
    ("[Convolution by image chunks] (`ops/conv.py`)",
     "512 kB L2 (AMD EPYC), BLAS on one thread, one process alternating the sizes, minima of 40 rounds of thread "
     "CPU time, load 3-6 (2026-12-03), chunks of L2/2 -> 2 x L2: the 3-channel stem of the cnn workload (32 "
     "images of 32 x 32) 1.39 -> 1.14 ms forward and 1.69 -> 1.39 ms weight gradient; 8 channels 2.0 -> 1.8 and "
     "3.0 -> 2.2 ms; a grouped 32-channel layer 3.6 -> 3.0 and 3.8 -> 3.1 ms; 4 MB chunks slower again"),
    ("[Sampling off the caller's path] (`autograd/runtime/cpu_load.py`)",
     "reading /proc/stat, medians warm / cold (after gc.collect): open-read-close 37 / 240 us, one pread of the "
     "kept-open file 12 / 55 us, pread and parsing the CPUs' lines 21 / 97 us; a cold tiny backward (`env -u "
     "OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.cold_backward --calls 40 --gap 0 [--cpu] --cases "
     "tiny`, the trees alternated twice, load 4-6, 2026-12-03): 706, 758 -> 571, 579 us wall, 848, 815 -> 623, "
     "667 us of the calling thread's CPU time"),
]
NOTES_FIGURES = "\n".join([
    '## Figures behind the Notes',
    '',
    "The engine's design notes (`Note [...]` in `src/asyncgrad/autograd/`) state a problem and",
    'the idea that solves it; what was measured when each idea was chosen is kept here, as',
    'measured then (2-core machine, the workloads above unless said otherwise).',
    "",
    "| Note (module) | measured |",
    "|---|---|",
    *(f"| {note} | {figures} |" for note, figures in _NOTES_FIGURES_ROWS),
]) + "\n"

# The engine redesign (issue 30) against the engine before it, one interleaved run
# (bench.compare_trees: tree processes alternating, 4 per tree, medians), 2026-12-02
# 01:45-01:55 UTC, load average 0.5-1.1, OpenBLAS choosing its own kernels.
_REDESIGN_ROWS = [
    ("chain: backward ms", "9.86", "8.31", "0.84"),
    ("deep: backward µs/node", "3.48", "3.22", "0.92"),
    ("mlp: backward ms", "17.23", "14.25", "0.83"),
    ("concurrent: passes/s (awaited)", "2,645", "2,930", "0.90"),
    ("concurrent: passes/s (requests batched)", "6,655", "6,655", "1.00"),
    ("many_tasks N=1: passes/s", "7,053", "7,840", "0.90"),
    ("many_tasks N=8: passes/s", "6,769", "6,266", "1.08"),
    ("many_tasks N=64: passes/s", "6,100", "6,435", "0.95"),
    ("many_tasks N=256: passes/s", "5,656", "6,244", "0.91"),
    ("transformer manual: step ms", "40.89", "38.66", "0.95"),
    ("transformer sdpa: step ms", "37.45", "35.54", "0.95"),
    ("transformer manual, 1 thread: step ms", "52.33", "52.07", "1.00"),
    ("transformer sdpa, 1 thread: step ms", "53.11", "51.83", "0.98"),
]
_REDESIGN_FINAL_ROWS = [
    ("chain: backward ms", "6.81", "6.16", "0.91"),
    ("deep: backward µs/node", "2.75", "2.84", "1.03"),
    ("many_tasks N=1: passes/s", "9,831", "9,606", "1.02"),
    ("many_tasks N=8: passes/s", "9,128", "8,793", "1.04"),
    ("many_tasks N=64: passes/s", "7,441", "7,614", "0.98"),
    ("many_tasks N=256: passes/s", "7,959", "7,169", "1.11"),
]
def _before_after(rows: list[tuple[str, str, str, str]]) -> list[str]:
    """A before/after table's lines: row, old, new, new vs old."""
    return ["| row | old | new | new vs old |", "|---|---|---|---|",
            *(f"| {row} | {old} | {new} | {ratio} |" for row, old, new, ratio in rows)]


REDESIGN = "\n".join([
    "## The engine redesign, before and after",
    "",
    "The engine in layers (one core loop, one router, one driver sequence: "
    "[architecture](architecture.md)) against the flat engine before it (commit 741ad05), in one "
    "interleaved run: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.compare_trees OLD NEW "
    "--rounds-each 4 -- chain deep mlp concurrent many_tasks transformer` (each round a fresh process, the "
    "trees alternating; medians of 4; 2026-12-02 01:45-01:55 UTC, load average 0.5-1.1). \"new vs old\" is "
    "new/old for a time and old/new for a rate: below 1 is faster. Rounds on this shared machine vary by "
    "10-20%, so ratios within about 0.1 of 1 are the same speed.",
    "",
    *_before_after(_REDESIGN_ROWS),
    "",
    "The per-node rows again after the last change of the fused step (its saved tensors' version check "
    "inlined), the same command with `--rounds-each 6 -- chain deep many_tasks`, 2026-12-02 02:22 UTC, load "
    "average 0.7-0.9. Python calls per node of the chain's backward (cProfile, deterministic): 12.3 before "
    "the redesign, 13.2 after.",
    "",
    *_before_after(_REDESIGN_FINAL_ROWS),
]) + "\n"

# bench.node_budget: the chain workload's backward taken apart, one interleaved run (issue 33's
# per-node target; the page itself names no targets)
# (2026-12-02 06:47 UTC, load average 1.7, OpenBLAS choosing its own kernels)
_NODE_BUDGET_ROWS = [
    ("asyncgrad: `await ag.backward(loss)`", "2.57"),
    ("its walk alone (finding the graph, counting edges, the sort)", "0.33"),
    ("the rules alone, called in order on the saved values", "0.76"),
    ("the least loop: walk, version check, rules, a dict of gradients", "1.45"),
    ("numpy: the hand-written backward", "0.52"),
    ("HIPS autograd", "2.63"),
]
NODE_BUDGET = "\n".join([
    "## Where a tiny node's time goes",
    "",
    "The chain workload's graph (2,000 elementwise ops on 16 floats) taken apart in one process, rounds "
    "interleaved, medians of 21: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.node_budget "
    "--rounds 21` (2026-12-02 06:47 UTC, load average 1.7). The \"least loop\" is the least a Python engine "
    "running these rules does: no ownership records for `.grad`, no shape or dtype check of what a rule "
    "returns, no turns for the loop, no saved tensors freed.",
    "",
    "| part | µs per node |",
    "|---|---|",
    *(f"| {part} | {us} |" for part, us in _NODE_BUDGET_ROWS),
    "",
    "Half the best peer's time per node would be 1.32 µs here. The least loop takes 1.45: the rules "
    "(0.76) and the walk (0.33) alone are 0.41x HIPS autograd, and the loop that calls them adds 0.35. "
    "What the engine adds beyond the least loop (1.12 µs per node) is what API.md asks of it: the "
    "in-place modification error, gradients summed and cast to their input's shape and dtype, `.grad` "
    "arrays owned or copied, the loop's turns, saved tensors kept until the commit. Even without those, "
    "a loop in Python takes more than half the best peer's time; a compiled core loop would not.",
]) + "\n"

# bench.first_backward, in a fresh virtualenv with ``pip install .`` only (numpy, anyio,
# threadpoolctl) and in the development one (numba too), 2026-12-02 07:02 UTC, load average 1.5
FIRST_BACKWARD = "\n".join([
    "## The first backward of a process",
    "",
    "How late a 1 ms asyncio ticker fires during a process's first `await ag.backward` (a 512 x 512 float32 "
    "product and tanh; the graph built before the ticker starts), against the second one: `env -u "
    "OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.first_backward --runs 5`, five fresh processes "
    "each (2026-12-02 07:02 UTC, load average 1.5). With numba installed (the `fast` extra), the first "
    "backward starts the compiled kernels' loader, whose import shares the GIL with the loop "
    "([kernels](guides/kernels.md)).",
    "",
    "| install | first backward: worst lag ms | second backward: worst lag ms |",
    "|---|---|---|",
    "| `pip install .` | 2.1, 2.3, 2.9, 4.0, 4.6 | 0.9, 1.0, 1.4, 2.4, 2.5 |",
    "| with numba (`fast` extra) | 12.4, 12.4, 12.7, 20.2, 22.1 | 1.3, 2.1, 2.1, 2.4, 2.5 |",
]) + "\n"

RUNNING = """\
## How to run it

```sh
pip install -e ".[bench]"          # matplotlib, HIPS autograd, threadpoolctl
pip install torch==2.13.0          # optional peer (a CPU wheel); skipped when not installed
# every workload, a few minutes; results in bench/results/
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench --plot
# one workload (repeatable); --impl asyncgrad --impl numpy: some rows
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench --only mlp
python -m bench.report bench/results/latest.json --plots docs/img > docs/benchmarks.md   # this page
```

`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` runs the benchmark on the BLAS kernels users
get: either variable makes numpy's OpenBLAS run other kernels than the ones it picks for the
CPU (`OPENBLAS_CORETYPE=Haswell` forces AVX2 kernels on a CPU with AVX-512). The runner
records both, and which kernels ran, and this page warns when either was set.

Other options: `--rounds N` (timed rounds per measurement), `--json PATH`, `--markdown PATH`,
`--mallopt` (raise glibc malloc's thresholds first, for every implementation).

## How it measures

* **Same process, interleaved rounds.** All implementations of a workload run in one
  process; round 1 runs each once, round 2 again in a rotated order, and so on, so a change
  in the machine's load hits every row alike. One warm-up round first; tables show medians.
* **What is timed.** For backward-only workloads the forward graph is built untimed before
  each round, then one backward is timed. The cyclic garbage collector is collected before
  and disabled during each timed region, as `timeit` does.
* **Each library as you would call it.** asyncgrad: `await ag.backward(loss)` on an asyncio
  loop with the default engine; PyTorch: `loss.backward()`; HIPS autograd: its `vjp`.
  Each keeps its own BLAS thread count, and each measurement starts after a short pause so
  the previous library's BLAS threads have stopped spinning.
* Everything is float32 (asyncgrad's and PyTorch's default).
"""


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, str):
        return value
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _table(workload: dict[str, Any]) -> list[str]:
    cols = workload.get("columns") or []
    head = ["implementation"] + [c["label"] for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in workload.get("rows") or []:
        cells = [f"**{r['impl']}**" if str(r["impl"]).startswith("asyncgrad") else str(r["impl"])]
        cells += [_cell(r.get(c["key"]), c.get("fmt", "{:.3g}")) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _about(workload: dict[str, Any]) -> dict[str, Any]:
    about = workload.get("about")
    if about:
        return about
    # a run saved before workloads declared ABOUT: ask the module, as the runner does now
    try:
        import importlib

        from bench.common import about_of

        return about_of(importlib.import_module(f"bench.workloads.{workload['name']}"), workload["name"])
    except ImportError:
        return {"title": workload.get("description", workload["name"]), "measures": workload.get("description", "")}


def _escape(text: str) -> str:
    return text.replace("*", "\\*").replace("_", "\\_")


def render_workload(workload: dict[str, Any], figures: str | None = None) -> str:
    """One workload's section: title, what it measures, how to run it, its table, the
    ratios and notes of the run, and how to read it."""
    name = workload["name"]
    about = _about(workload)
    out = [f"### {about.get('title') or name}", ""]
    out += [about.get("measures") or workload.get("description", ""), ""]
    out += [f"Run it alone: `{about.get('run') or f'python -m bench --only {name}'}` "
            f"(this run: {_escape(workload.get('description', name))}).", ""]
    out += _table(workload)
    ratios = workload.get("ratios") or {}
    bullets = [f"* {label.replace('/', ' / ')}: **{value:.2f}**" for label, value in ratios.items()]
    bullets += [f"* {note}" for note in workload.get("notes") or []]
    if bullets:
        head = ("In this run (ratios between rows of the table: for times, below 1 means the first row is faster; "
                "for rates such as passes/s, above 1):" if ratios else "In this run:")
        out += ["", head, "", *bullets]
    out += _targets(workload)
    if about.get("reading"):
        out += ["", f"**How to read it.** {about['reading']}"]
    if figures:
        out += ["", f"![{_escape(about.get('title') or name)}]({figures}/bench_{name}.png)"]
    return "\n".join(out)


def _targets(workload: dict[str, Any]) -> list[str]:
    """The issues' targets for this workload, as this run measured them."""
    rows = [t for t in workload.get("targets") or [] if t.get("value") is not None]
    if not rows:
        return []
    out = ["", "Targets in this run:", "", "| target | asyncgrad | met |", "|---|---|---|"]
    for t in rows:
        value = t["value"]
        shown = "n/a" if isinstance(value, float) and math.isnan(value) else f"{value:.3g} {t.get('unit', '')}".strip()
        met = {True: "yes", False: "**no**"}.get(t.get("met"), "n/a")
        out.append(f"| {_escape(t['name'])} | {shown} | {met} |")
    return out


def _load_warning(payload: dict[str, Any]) -> list[str]:
    """A note when other work competed for the cores during the run (from its load average)."""
    m = payload.get("machine", {})
    load, cores = m.get("loadavg_start"), m.get("nproc") or 1
    if not load or load[0] <= 0.5 * cores:
        return []
    return ['!!! warning "Other work shared the machine during this run"',
            f"    The load average was {load[0]:.2f} on {cores} cores when the run started, so other processes "
            "competed for the cores. Every row of a table was measured under the same conditions, so the ratios "
            "still compare the libraries, but absolute times are slower than on a quiet machine, and "
            "multi-threaded BLAS (numpy's OpenBLAS, used by asyncgrad, HIPS autograd and the floor) suffers most "
            "from the competition.", ""]


def _blas_env_text(machine: dict[str, Any]) -> str:
    if "blas_env" not in machine:
        return "not recorded in this run (whether OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE were set)"
    env = machine["blas_env"]
    if not env:
        return "neither OPENBLAS_CORETYPE nor OPENBLAS_L2_SIZE set: OpenBLAS chose its kernels for this CPU"
    return ", ".join(f"`{k}={v}`" for k, v in env.items()) + " (**forced**: see the warning below)"


def _blas_env_warning(payload: dict[str, Any]) -> list[str]:
    """A loud note when the run's environment forced OpenBLAS's kernels."""
    text = blas_kernels.warning(payload.get("machine", {}))
    if not text:
        return []
    return ['!!! danger "This run measured BLAS kernels that users do not get"', f"    {text}", ""]


def _machine(payload: dict[str, Any]) -> str:
    m = payload.get("machine", {})
    load = m.get("loadavg_start")
    blas = m.get("numpy_blas")
    blas_text = f"{blas.get('name')} {blas.get('version')}" if isinstance(blas, dict) else str(blas)
    rows = [
        ("date", f"{m.get('date_utc')} UTC"),
        ("command", f"`{payload.get('command', 'python -m bench')}`, {payload.get('total_seconds', 0):.0f} s in all"),
        ("cores", f"{m.get('nproc')} ({m.get('cpu_model')})"),
        ("load average at start", f"{load[0]:.2f} (other work shares this machine)" if load else "—"),
        ("Python / numpy", f"{m.get('python')} / {m.get('numpy')}"),
        ("numpy's BLAS", blas_text),
        ("BLAS kernels that ran (threadpoolctl)", "; ".join(blas_kernels.blas_pools(m))),
        ("BLAS environment", _blas_env_text(m)),
        ("PyTorch", str(m.get("torch") or "not installed")),
        ("HIPS autograd", str(m.get("autograd") or "not installed")),
        ("asyncgrad", f"{m.get('asyncgrad')} (source sha256 `{m.get('asyncgrad_src_sha256', '?')}`)"),
    ]
    return "\n".join(f"* **{k}**: {v}" for k, v in rows)


def render(payload: dict[str, Any], figures: str | None = "img") -> str:
    """The whole page for one run's ``payload`` (the JSON ``python -m bench`` writes);
    ``figures`` is where the page finds ``bench.png`` and ``bench_<workload>.png`` (None:
    no figures)."""
    workloads = payload.get("workloads") or []
    parts = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m bench.report` from one run of `python -m bench`: edit bench/report.py or a "
        "workload's ABOUT, then regenerate; do not edit this file by hand. -->",
        "",
        INTRO,
        CHOOSING,
        "## The run",
        "",
        _machine(payload),
        "",
        *_blas_env_warning(payload),
        *_load_warning(payload),
        "## Results",
        "",
    ]
    if figures:
        parts += [f"![Every workload of this run: asyncgrad (outlined) beside its peers]({figures}/bench.png)", ""]
    contents = [f"* [{(_about(w).get('title') or w['name'])}](#{_anchor(_about(w).get('title') or w['name'])})"
                for w in workloads]
    parts += [*contents, ""]
    for w in workloads:
        parts += [render_workload(w, figures), ""]
    parts += [NOTES_FIGURES, REDESIGN, NODE_BUDGET, FIRST_BACKWARD, RUNNING]
    return "\n".join(parts).rstrip() + "\n"


def _anchor(title: str) -> str:
    """The id Python-Markdown's toc gives a heading (what MkDocs links to)."""
    import re
    import unicodedata

    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n")[0])
    p.add_argument("run", help="a run's JSON, as written by python -m bench --json PATH")
    p.add_argument("--plots", metavar="DIR", default=None,
                   help="also draw the run's figures into DIR (needs matplotlib); the page links img/bench.png")
    p.add_argument("--figures", default="img", help="the figures' directory as the page links it (default: img)")
    p.add_argument("--output", "-o", default=None, help="write the page here instead of stdout")
    args = p.parse_args(argv)
    payload = json.loads(Path(args.run).read_text())
    if not payload.get("workloads"):
        p.error(f"{args.run} holds no workloads")
    if args.plots:
        from bench.plot import plot

        for path in plot(payload, Path(args.plots)):
            print(f"wrote {path}", file=sys.stderr)
    page = render(payload, args.figures)
    if args.output:
        Path(args.output).write_text(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
