"""Compare two source trees on the same workloads, rounds interleaved (old, new, old, new...).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.compare_trees \\
        OLD_TREE NEW_TREE --rounds-each 3 -- chain deep mlp concurrent many_tasks transformer

Each round runs ``python -m bench WORKLOADS --impl asyncgrad`` in a fresh process with the
tree's ``src`` first on the path, alternating trees, so a change in the machine's load
falls on both. The table gives each asyncgrad row's median over the rounds, per tree,
and new/old (for a rate, old/new: below 1 is faster either way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

# (workload, key, higher is better)
METRICS = {
    "chain": ("backward_ms", False), "deep": ("backward_us_per_node", False),
    "mlp": ("backward_ms", False), "concurrent": ("passes_per_s", True),
    "many_tasks": ("passes_per_s", True), "transformer": ("step_ms", False),
    "wide": ("backward_ms", False),
}


def _run(tree: Path, workloads: list[str], out: Path, rounds: int | None) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    cmd = [sys.executable, "-m", "bench", *workloads, "--impl", "asyncgrad", "--json", str(out)]
    if rounds:
        cmd += ["--rounds", str(rounds)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _values(payload: dict[str, Any]) -> dict[str, float]:
    found: dict[str, float] = {}
    for w in payload["workloads"]:
        key, _ = METRICS.get(w["name"], (None, False))
        if key is None:
            continue
        for row in w["rows"]:
            if row.get(key) is not None:
                found[f"{w['name']}: {row['impl']}"] = float(row[key])
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare_trees")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--rounds-each", type=int, default=3, help="bench processes per tree")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds inside each process")
    p.add_argument("--out", type=Path, default=Path("/tmp/compare_trees"))
    p.add_argument("workloads", nargs="+")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for i in range(args.rounds_each):
        for label, tree in (("old", args.old), ("new", args.new)):
            load = os.getloadavg()[0]
            runs[label].append(_values(_run(tree.resolve(), args.workloads, args.out / f"{label}{i}.json",
                                            args.rounds)))
            print(f"# round {i} {label} done (load {load:.1f} before)", flush=True)
    print("\n| row | metric | old (median) | new (median) | new vs old |")
    print("|---|---|---|---|---|")
    for name in runs["old"][0]:
        workload = name.split(":")[0]
        key, higher = METRICS[workload]
        old = statistics.median(r[name] for r in runs["old"] if name in r)
        new = statistics.median(r[name] for r in runs["new"] if name in r)
        ratio = old / new if higher else new / old
        print(f"| {name} | {key} | {old:.4g} | {new:.4g} | {ratio:.3f}{' (rate: old/new)' if higher else ''} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
