"""Which BLAS kernels a benchmark ran, and whether its environment forced them.

OpenBLAS picks its kernels for the CPU at load time, unless ``OPENBLAS_CORETYPE`` names a
core type (then it runs that core's kernels: ``Haswell``'s AVX2 ones on a CPU with
AVX-512, at less than half the single-thread GEMM rate) or ``OPENBLAS_L2_SIZE`` overrides
the cache size its blocking is tuned for. A user's machine sets neither, so a benchmark run
with either set measures kernels users do not get. The runner records the variables and
threadpoolctl's view of every thread pool (``internal_api``, ``architecture``,
``num_threads``, ``version``) in the run, prints them, and the benchmarks page shows them,
with a loud warning when a variable was set. Run the benchmarks with both unset in that
command alone (never in tests or CI)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

KERNEL_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # variables that change which kernels OpenBLAS runs
UNSET = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE"
COMMAND = f"{UNSET} python -m bench"
POOL_KEYS = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads")


def kernel_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The kernel-forcing variables set in ``environ`` (the process's environment by
    default), with their values; empty when none is."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in KERNEL_ENV if name in env}


def thread_pools() -> list[dict[str, Any]] | str:
    """threadpoolctl's description of every native thread pool loaded now (BLAS, OpenMP),
    or why there is none."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return [{k: p.get(k) for k in POOL_KEYS} for p in threadpool_info()]


def describe_pool(pool: Mapping[str, Any]) -> str:
    """One pool in a line: ``openblas 0.3.31 (libscipy_openblas), architecture SkylakeX, 2 threads``."""
    name = pool.get("internal_api") or pool.get("user_api") or "?"
    text = f"{name} {pool.get('version') or ''}".strip()
    if pool.get("prefix"):
        text += f" ({pool['prefix']})"
    if pool.get("architecture"):
        text += f", architecture {pool['architecture']}"
    if pool.get("num_threads") is not None:
        text += f", {pool['num_threads']} thread{'s' if pool['num_threads'] != 1 else ''}"
    return text


def blas_pools(machine: Mapping[str, Any]) -> list[str]:
    """The BLAS pools of a run's ``machine`` record, one line each (the kernels that ran)."""
    pools = machine.get("threadpools")
    if not isinstance(pools, list):
        return [str(pools or "not recorded")]
    return [describe_pool(p) for p in pools if p.get("user_api") == "blas"] or ["no BLAS pool found"]


def warning(machine: Mapping[str, Any]) -> str | None:
    """The warning for a run whose environment forced OpenBLAS's kernels, else None."""
    env = machine.get("blas_env")
    if not env:
        return None
    settings = ", ".join(f"{k}={v}" for k, v in env.items())
    return (f"{settings} was set in this run's environment: numpy's OpenBLAS ran the kernels it forces, not the "
            f"ones it chooses for this CPU, which users get. Its times are not what users see; rerun with "
            f"`{COMMAND} ...`.")


def header(machine: Mapping[str, Any]) -> list[str]:
    """The runner's lines about BLAS, for the console: each BLAS pool, and the warning."""
    lines = [f"# BLAS: {line}" for line in blas_pools(machine)]
    text = warning(machine)
    if text:
        lines += ["#" * 100, f"# WARNING: {text}", "#" * 100]
    return lines
