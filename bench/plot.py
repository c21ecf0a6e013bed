"""Draw the comparison from a results payload (``bench/results/latest.json``) with matplotlib.

    python -m bench.plot [bench/results/latest.json]   # redraw without re-running

Writes ``bench.png`` (every panel) and ``bench_<workload>.png`` next to the JSON file.
Each panel is a horizontal bar per implementation, asyncgrad highlighted, with the issue-7
target drawn as a dashed line where there is one.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

# (workload, metric, title, unit, log scale, target as a function of the rows or None)
PANELS: list[tuple[str, str, str, str, bool, Any]] = [
    ("chain", "backward_us_per_node", "chain: backward", "µs/node", False, lambda rows: 2.5),
    ("chain", "forward_us_per_op", "chain: forward (graph recorded)", "µs/op", False,
     lambda rows: 2.0 * rows["torch"] if "torch" in rows else None),
    ("mlp", "backward_ms", "mlp: backward (256x1024, 4 layers)", "ms", False,
     lambda rows: 1.10 * rows["numpy"] if "numpy" in rows else None),
    ("wide", "backward_ms", "wide: 16 branches x 8 ops on 1M", "ms", False,
     lambda rows: 0.8 * rows["numpy one by one"] if "numpy one by one" in rows else None),
    ("loop_lag", "p99_lag_ms", "loop lag during 10 MLP backwards (p99)", "ms, log", True, lambda rows: 1.0),
    ("concurrent", "passes_per_s", "32 tasks x small MLP fwd+bwd", "passes/s", False, lambda rows: 3000.0),
    ("deep", "backward_us_per_node", "deep (100k nodes): backward", "µs/node", False, lambda rows: 3.0),
    ("deep", "rss_bytes_per_node", "deep (100k nodes): graph memory", "B/node (RSS)", False, lambda rows: 500.0),
]

COLORS = {"asyncgrad": "#d62728", "torch": "#1f77b4", "autograd": "#2ca02c", "numpy": "#7f7f7f"}


def _color(impl: str) -> str:
    for key, c in COLORS.items():
        if impl.startswith(key):
            return c
    return "#9467bd"


def _panel(ax: Any, workload: dict[str, Any], metric: str, title: str, unit: str, log: bool,
           target_fn: Any) -> bool:
    rows = [(r["impl"], r.get(metric)) for r in workload["rows"]]
    rows = [(i, v) for i, v in rows if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not rows:
        return False
    labels = [i for i, _ in rows]
    values = [v for _, v in rows]
    y = list(range(len(rows)))[::-1]
    bars = ax.barh(y, values, color=[_color(i) for i in labels],
                   edgecolor=["black" if i.startswith("asyncgrad") else "none" for i in labels])
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(unit, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    if log:
        ax.set_xscale("log")
    for b, v in zip(bars, values):
        label = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        ax.annotate(label, (b.get_width(), b.get_y() + b.get_height() / 2), xytext=(2, 0),
                    textcoords="offset points", va="center", fontsize=7)
    target = target_fn({i: v for i, v in rows}) if target_fn else None
    if target:
        ax.axvline(target, color="black", linestyle="--", linewidth=1)
        ax.annotate("target", (target, y[0] + 0.45), fontsize=7, ha="left")
    ax.margins(x=0.25)
    return True


def plot(payload: dict[str, Any], outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = {w["name"]: w for w in payload["workloads"]}
    panels = [p for p in PANELS if p[0] in by_name]
    if not panels:
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.6 * rows), squeeze=False)
    for ax, (name, metric, title, unit, log, tgt) in zip(axes.flat, panels):
        if not _panel(ax, by_name[name], metric, title, unit, log, tgt):
            ax.set_visible(False)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    m = payload.get("machine", {})
    fig.suptitle(f"asyncgrad vs PyTorch {m.get('torch')} vs HIPS autograd {m.get('autograd')} vs numpy floor — "
                 f"{m.get('nproc')} cores, {m.get('cpu_model')}, {m.get('date_utc')} UTC", fontsize=9)
    fig.tight_layout()
    path = outdir / "bench.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    for name in by_name:
        mine = [p for p in panels if p[0] == name]
        if not mine:
            continue
        fig, axes = plt.subplots(1, len(mine), figsize=(5.5 * len(mine), 2.8), squeeze=False)
        for ax, (_n, metric, title, unit, log, tgt) in zip(axes.flat, mine):
            _panel(ax, by_name[name], metric, title, unit, log, tgt)
        fig.tight_layout()
        path = outdir / f"bench_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results" / "latest.json"
    for p in plot(json.loads(src.read_text()), src.parent):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
