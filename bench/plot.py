"""Draw the comparison from a results payload (``bench/results/latest.json``) with matplotlib.

    python -m bench.plot [bench/results/latest.json]   # redraw without re-running

Writes ``bench.png`` (every panel) and ``bench_<workload>.png`` next to the JSON file (or
into ``outdir``). Each panel is a horizontal bar per implementation, asyncgrad
highlighted; a workload's panels are the ``plots`` of its ``About`` (default: its first
column), so a new workload appears without changes here.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

COLORS = {"asyncgrad": "#d62728", "torch": "#1f77b4", "autograd": "#2ca02c", "numpy": "#7f7f7f"}


def _color(impl: str) -> str:
    for key, c in COLORS.items():
        if impl.startswith(key):
            return c
    return "#9467bd"


def panels(workload: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """``(metric, axis label, log scale)`` for each panel of one workload of a run."""
    about = workload.get("about") or {}
    declared = [tuple(p) for p in about.get("plots") or []]
    if declared:
        return declared  # type: ignore[return-value]
    cols = workload.get("columns") or []
    return [(cols[0]["key"], cols[0]["label"], False)] if cols else []


def _panel(ax: Any, workload: dict[str, Any], metric: str, label: str, log: bool) -> bool:
    rows = [(r["impl"], r.get(metric)) for r in workload["rows"]]
    rows = [(i, v) for i, v in rows if isinstance(v, (int, float)) and not math.isnan(v)]
    if not rows:
        return False
    labels = [i for i, _ in rows]
    values = [v for _, v in rows]
    y = list(range(len(rows)))[::-1]
    bars = ax.barh(y, values, color=[_color(i) for i in labels],
                   edgecolor=["black" if i.startswith("asyncgrad") else "none" for i in labels])
    ax.set_yticks(y, labels, fontsize=8)
    title = (workload.get("about") or {}).get("title") or workload["name"]
    ax.set_title(f"{workload['name']}: {title}", fontsize=9)
    ax.set_xlabel(label, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    if log:
        ax.set_xscale("log")
    for b, v in zip(bars, values):
        text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        ax.annotate(text, (b.get_width(), b.get_y() + b.get_height() / 2), xytext=(2, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.margins(x=0.25)
    return True


def plot(payload: dict[str, Any], outdir: Path) -> list[Path]:
    """Draw every workload of ``payload`` into ``outdir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    todo = [(w, p) for w in payload["workloads"] for p in panels(w)]
    if not todo:
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    cols = 2
    rows = math.ceil(len(todo) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.6 * rows), squeeze=False)
    for ax, (w, (metric, label, log)) in zip(axes.flat, todo):
        if not _panel(ax, w, metric, label, log):
            ax.set_visible(False)
    for ax in list(axes.flat)[len(todo):]:
        ax.set_visible(False)
    m = payload.get("machine", {})
    fig.suptitle(f"asyncgrad vs PyTorch {m.get('torch')} vs HIPS autograd {m.get('autograd')} vs numpy floor — "
                 f"{m.get('nproc')} cores, {m.get('cpu_model')}, {m.get('date_utc')} UTC", fontsize=9)
    fig.tight_layout()
    path = outdir / "bench.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    for w in payload["workloads"]:
        mine = panels(w)
        if not mine:
            continue
        fig, axes = plt.subplots(1, len(mine), figsize=(5.5 * len(mine), 2.8), squeeze=False)
        for ax, (metric, label, log) in zip(axes.flat, mine):
            _panel(ax, w, metric, label, log)
        fig.tight_layout()
        path = outdir / f"bench_{w['name']}.png"
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
