"""Profile a backward, export its trace, and draw the graph: the pictures of docs/debugging.md.

    python examples/debugging_tools.py --out /tmp/asyncgrad-debug
    python examples/debugging_tools.py --out docs/img          # regenerate the doc's pictures

The model is the MLP of ``train_digits.py`` (64-hidden-hidden-10, ReLU, cross-entropy) on
random digit-shaped data, so nothing needs downloading. One mini-batch is split into
``--shards`` pieces whose backward passes run concurrently (as in ``train_digits.py``)
on an engine with a low ``inline_threshold``, so the large matrix products run on
worker threads while the small nodes run inline on the event loop.

Writes into ``--out``:

* ``trace.json``: ``prof.export_chrome_trace`` (open it in https://ui.perfetto.dev or
  ``chrome://tracing``);
* ``trace.png``: a timeline drawn *from that JSON* with matplotlib (one row per thread,
  one bar per node, coloured by backward call), when matplotlib is installed;
* ``mlp_graph.png`` / ``mlp_graph.svg``: ``ag.viz.render`` of one shard's graph, labelled
  with the parameter names and coloured by the time each node took, when Graphviz is
  installed (``apt-get install graphviz``; ``pip install graphviz``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

# one BLAS thread per kernel: the engine's worker threads are the parallelism here
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import anyio  # noqa: E402
import numpy as np  # noqa: E402

import asyncgrad as ag  # noqa: E402
from asyncgrad import nn  # noqa: E402
from asyncgrad.nn import functional as F  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="debug-output", help="directory for trace.json and the pictures")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=1024, help="examples per mini-batch (split into shards)")
    p.add_argument("--shards", type=int, default=3, help="concurrent backward calls")
    p.add_argument("--inline-threshold", type=int, default=20_000,
                   help="nodes touching fewer elements run inline on the loop")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_model(hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


async def profile_backward(args: argparse.Namespace) -> tuple[Any, ag.Tensor, nn.Module]:
    ag.manual_seed(args.seed)
    model = make_model(args.hidden)
    rng = np.random.default_rng(args.seed)
    x = rng.random((args.batch, 64)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    shards = np.array_split(np.arange(args.batch), args.shards)
    losses = [F.cross_entropy(model(ag.tensor(x[s])), ag.tensor(y[s])) * (len(s) / args.batch)
              for s in shards]

    previous = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=args.inline_threshold))
    try:
        await ag.backward(losses[0], retain_graph=True)  # warm up numpy and the worker threads
        model.zero_grad()
        with ag.autograd.profiler.profile() as prof:
            async with anyio.create_task_group() as tg:
                for loss in losses:
                    tg.start_soon(lambda loss=loss: ag.backward(loss, retain_graph=True))
    finally:
        ag.autograd.set_engine(previous)
    return prof, losses[0], model


def draw_timeline(trace_path: str, png_path: str) -> None:
    """A Perfetto-like picture of an exported trace: one row per thread, one bar per node
    (from the JSON file alone, as any trace viewer would read it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(trace_path, encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    pid = next(e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
               and e["args"]["name"] == "asyncgrad threads")
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}
    order = {e["tid"]: e["args"]["sort_index"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_sort_index" and e["pid"] == pid}
    nodes = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
    rows = sorted(names, key=lambda tid: order.get(tid, 0))
    tasks = sorted({e["args"]["graph_task"] for e in nodes})
    palette = plt.get_cmap("tab10")
    colour = {gid: palette(i % 10) for i, gid in enumerate(tasks)}
    t0 = min(e["ts"] for e in nodes)
    span = max(e["ts"] + e["dur"] for e in nodes) - t0

    fig, ax = plt.subplots(figsize=(13, 1.0 + 0.75 * len(rows)), dpi=110)
    for row, tid in enumerate(rows):
        for e in (n for n in nodes if n["tid"] == tid):
            start, dur = (e["ts"] - t0) / 1000, e["dur"] / 1000
            ax.barh(row, dur, left=start, height=0.6, color=colour[e["args"]["graph_task"]],
                    edgecolor="black", linewidth=0.4)
            if dur > span / 1000 * 0.045:
                ax.text(start + dur / 2, row, e["name"].replace("Backward0", ""), ha="center",
                        va="center", fontsize=7, clip_on=True)
    ax.set_yticks(range(len(rows)), [names[tid] for tid in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time since the profile started (ms)")
    ax.set_title(f"asyncgrad backward trace: {len(nodes)} node runs, {len(tasks)} concurrent backward "
                 f"calls (drawn from {os.path.basename(trace_path)})", fontsize=10, pad=28)
    ax.legend(handles=[Patch(color=colour[g], label=f"GraphTask {g}") for g in tasks],
              loc="lower center", bbox_to_anchor=(0.5, 1.06), fontsize=8, ncol=len(tasks), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    prof, loss, model = anyio.run(profile_backward, args)
    print(prof.key_averages().table(sort_by="total_time", row_limit=12))

    trace = os.path.join(args.out, "trace.json")
    prof.export_chrome_trace(trace)
    threads = {e.thread_id for e in prof.events}
    print(f"wrote {trace}: {len(prof.events)} node runs on {len(threads)} threads, "
          f"{len({e.graph_task for e in prof.events})} graph tasks")
    try:
        draw_timeline(trace, os.path.join(args.out, "trace.png"))
        print(f"wrote {os.path.join(args.out, 'trace.png')}")
    except ImportError:
        print("matplotlib is not installed: no trace.png (pip install matplotlib)")

    params = dict(model.named_parameters())
    print(ag.viz.to_dot(loss, params=params).count("->"), "edges in the graph of one shard")
    try:
        for fmt in ("png", "svg"):
            path = ag.viz.render(loss, os.path.join(args.out, f"mlp_graph.{fmt}"), params=params,
                                 profile=prof, dpi=110 if fmt == "png" else None)
            print(f"wrote {path}")
    except ag.viz.GraphvizNotFoundError as e:
        print(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
