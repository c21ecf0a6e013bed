"""The benchmark runner: ``python -m bench`` (or ``python bench/run.py``) from the repo root,
with OpenBLAS's kernel-forcing variables unset in that command alone (``bench/blas_kernels.py``):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench   # every workload, every importable peer
    python -m bench --only chain --only mlp --rounds 5
    python -m bench ops transformer      # the same as --only ops --only transformer
    python -m bench --impl asyncgrad --impl numpy   # skip the peers
    python -m bench --plot               # also draw bench/results/*.png

Each workload measures asyncgrad, PyTorch (when importable), HIPS autograd (when
importable) and a hand-written numpy backward (the floor) in this one process, with a
warm-up round, repeated rounds and medians, and reports ratios between rows of the same
run. Results go to ``--json`` (default ``bench/results/latest.json``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import blas_kernels  # noqa: E402
from bench.common import ALL_IMPLS, ASYNCGRAD, Result, about_of, format_table, select_impls  # noqa: E402

WORKLOADS = ("chain", "mlp", "wide", "loop_lag", "concurrent", "many_tasks", "contended", "deep", "ops",
             "transformer", "ddp", "cnn", "serving")
RESULTS = Path(__file__).resolve().parent / "results"


def run_workload(name: str, impls: list[str], rounds: int | None = None, **sizes: Any) -> Result:
    """Run one workload (``bench.workloads.<name>.run``) and return its :class:`Result`."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    module = importlib.import_module(f"bench.workloads.{name}")
    result: Result = module.run(impls, rounds, **sizes)
    result.about = about_of(module, name)
    return result


def _version(mod: str) -> str | None:
    try:
        m = importlib.import_module(mod)
    except Exception:
        return None
    v = getattr(m, "__version__", None)
    if v is None:
        try:
            from importlib.metadata import version

            v = version(mod)
        except Exception:
            v = "?"
    return str(v)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _blas() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        import numpy as np

        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        info["numpy_blas"] = {k: blas.get(k) for k in ("name", "version", "openblas configuration")}
        info["numpy_simd"] = cfg.get("SIMD Extensions", {}).get("found", None)
    except Exception as e:  # numpy < 1.25 has no mode="dicts"
        info["numpy_blas"] = f"unavailable ({e})"
    info["threadpools"] = blas_kernels.thread_pools()  # which kernels ran: OpenBLAS's architecture
    info["blas_env"] = blas_kernels.kernel_env()  # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, if set
    return info


def source_fingerprint() -> dict[str, Any]:
    """A hash of asyncgrad's source files and the newest one's time: which engine was measured."""
    import hashlib

    try:
        import asyncgrad

        root = Path(asyncgrad.__file__).resolve().parent
    except Exception:
        return {}
    h = hashlib.sha256()
    newest = 0.0
    for f in sorted(root.rglob("*.py")):
        h.update(f.read_bytes())
        newest = max(newest, f.stat().st_mtime)
    stamp = _dt.datetime.fromtimestamp(newest, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return {"asyncgrad_src_sha256": h.hexdigest()[:12], "asyncgrad_src_newest_utc": stamp}


def machine_info() -> dict[str, Any]:
    import numpy as np

    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "asyncgrad": _version("asyncgrad"),
        "torch": _version("torch"),
        "autograd": _version("autograd"),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        **source_fingerprint(),
        **_blas(),
    }


def summary_rows(results: list[Result]) -> list[dict[str, Any]]:
    """The issue-7 targets, one row each, for the closing table."""
    rows = []
    for r in results:
        for t in r.targets:
            rows.append({"workload": r.name, **t.as_dict()})
    return rows


def format_summary(results: list[Result]) -> str:
    lines = ["### targets (issues 7 and 33)", "", "| workload | target | asyncgrad | met |", "|---|---|---|---|"]
    for r in summary_rows(results):
        v = r["value"]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            val = "—"
        else:
            val = (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}") + f" {r['unit']}"
        met = {True: "yes", False: "**no**", None: "n/a"}[r["met"]]
        lines.append(f"| {r['workload']} | {r['name']} | {val} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                   help=f"run only these workloads (as --only): {', '.join(WORKLOADS)}")
    p.add_argument("--only", action="append", choices=WORKLOADS, metavar="NAME",
                   help=f"run only this workload (repeatable): {', '.join(WORKLOADS)}")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per measurement (default: per workload)")
    p.add_argument("--impl", action="append", choices=ALL_IMPLS, metavar="IMPL",
                   help=f"measure only this implementation (repeatable): {', '.join(ALL_IMPLS)}")
    p.add_argument("--json", default=str(RESULTS / "latest.json"), help="where to write the results")
    p.add_argument("--plot", action="store_true", help="draw bench/results/*.png with matplotlib")
    p.add_argument("--markdown", default=None, help="also write the tables as markdown to this path")
    p.add_argument("--mallopt", action="store_true",
                   help="raise glibc malloc's mmap/trim thresholds first (keeps large arrays' pages faulted in)")
    args = p.parse_args(argv)
    for name in args.workloads:
        if name not in WORKLOADS:
            p.error(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if args.mallopt:
        from bench.common import tune_malloc

        if not tune_malloc():
            print("# --mallopt: no glibc mallopt here; ignored")

    impls = select_impls(args.impl)
    missing = [i for i in (args.impl or ALL_IMPLS) if i not in impls]
    names = [*args.workloads, *(args.only or [])] or list(WORKLOADS)
    machine = machine_info()
    machine["mallopt_tuned"] = bool(args.mallopt)
    from bench.common import BLAS

    BLAS.snapshot()  # numpy's original BLAS threads, before asyncgrad's engine limits them
    machine["blas_threads_default"] = BLAS.default
    print(f"# asyncgrad benchmarks — {machine['date_utc']} UTC, {machine['nproc']} cores ({machine['cpu_model']}), "
          f"python {machine['python']}, numpy {machine['numpy']}, torch {machine['torch']}, "
          f"autograd {machine['autograd']}" + (", glibc malloc thresholds raised (--mallopt)" if args.mallopt else ""))
    print(f"# asyncgrad source {machine.get('asyncgrad_src_sha256')} "
          f"(newest file {machine.get('asyncgrad_src_newest_utc')} UTC)")
    for line in blas_kernels.header(machine):
        print(line, flush=True)
    if blas_kernels.warning(machine):
        print(f"WARNING: {blas_kernels.warning(machine)}", file=sys.stderr, flush=True)
    if missing:
        print(f"# not importable, skipped: {', '.join(missing)}")
    if ASYNCGRAD in impls:  # every workload measures one known kernel path (ASYNCGRAD_KERNELS)
        from asyncgrad.ops import kernels

        kernels.wait()
        machine["kernels"] = kernels.status()
        print(f"# {machine['kernels']}")
    load = machine["loadavg_start"]
    if load and load[0] > 0.5 * (machine["nproc"] or 1):
        print(f"# WARNING: load average {load[0]:.2f} at start: other processes compete for the cores")
    results: list[Result] = []
    t0 = time.perf_counter()
    for name in names:
        r = run_workload(name, impls, args.rounds)
        r.params["loadavg_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        results.append(r)
        print()
        print(format_table(r))
        print(f"({r.seconds:.1f} s)", flush=True)
    total = time.perf_counter() - t0
    summary = format_summary(results)
    print()
    print(summary)
    print(f"\ntotal {total:.0f} s")

    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"command": command.strip(), "machine": machine, "impls": impls, "total_seconds": total,
               "workloads": [r.as_dict() for r in results], "targets": summary_rows(results)}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(payload), indent=1, default=_json_default) + "\n")
    print(f"wrote {out}")
    if args.markdown:
        md = "\n\n".join(format_table(r) for r in results) + "\n\n" + summary + "\n"
        Path(args.markdown).write_text(md)
        print(f"wrote {args.markdown}")
    if args.plot:
        from bench.plot import plot

        for path in plot(payload, out.parent):
            print(f"wrote {path}")
    return 0


def _clean(o: Any) -> Any:
    """NaN (a missing figure) as null, so the file is strict JSON."""
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


if __name__ == "__main__":
    raise SystemExit(main())
