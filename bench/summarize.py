"""Targets across several runs: on a shared machine one run can land on a noisy minute, so
run the suite a few times and look at the spread.

    python -m bench --json bench/results/run1.json   # (x3)
    python -m bench.summarize bench/results/run*.json

Prints, for every issue-7 target, asyncgrad's value in each run, the median and whether the
median meets the target, as a markdown table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def summarize(paths: list[Path]) -> str:
    runs = [json.loads(p.read_text()) for p in paths]
    order: list[tuple[str, str]] = []
    values: dict[tuple[str, str], list[float | None]] = {}
    meta: dict[tuple[str, str], dict[str, Any]] = {}
    for i, run in enumerate(runs):
        for t in run.get("targets", []):
            key = (t["workload"], t["name"])
            if key not in values:
                order.append(key)
                values[key] = [None] * len(runs)
                meta[key] = t
            values[key][i] = t["value"]
    heads = [r["machine"]["date_utc"][11:16] for r in runs]
    lines = ["| workload | target | " + " | ".join(heads) + " | median | met (median) |",
             "|---|---|" + "---|" * (len(runs) + 2)]
    for key in order:
        t = meta[key]
        vs = [v for v in values[key] if v is not None]
        med = statistics.median(vs) if vs else None
        met = None if med is None else (med >= t["limit"] if t["at_least"] else med <= t["limit"])
        cells = [("—" if v is None else _fmt(v)) for v in values[key]]
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) +
                     f" | {'—' if med is None else _fmt(med)} {t['unit']} | "
                     f"{ {True: 'yes', False: '**no**', None: 'n/a'}[met] } |")
    srcs = sorted({r["machine"].get("asyncgrad_src_sha256", "?") for r in runs})
    loads = ", ".join(f"{r['machine']['loadavg_start'][0]:.2f}" for r in runs)
    return "\n".join(lines) + f"\n\n{len(runs)} runs; asyncgrad source {', '.join(srcs)}; load average at start {loads}"


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        print(__doc__)
        return 2
    print(summarize(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
