"""Which float32 erf: ``python bench/erf_choice.py`` (one thread each, interleaved rounds).

Compares, on 1024x512 float32 normals: the float64 Cephes routine asyncgrad used before
issue 15, ``scipy.special.erf`` (when importable), the float32 rational kernel on the whole
array and block by block (what asyncgrad uses now), and ``torch.erf`` (when importable).
Prints median ms, the ratio to torch and the worst error in float32 ulps against float64.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import tune_malloc  # noqa: E402


def main() -> None:
    from threadpoolctl import threadpool_limits

    from asyncgrad.ops.kernels import blockwise as K
    from asyncgrad.ops.kernels.special import erf_f32_block, erf_f64

    tune_malloc()
    x = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float32)
    grid = np.concatenate([np.linspace(-6, 6, 200_001), np.logspace(-30, 1, 10_000),
                           -np.logspace(-30, 1, 10_000)]).astype(np.float32)
    ref = erf_f64(grid.astype(np.float64))
    cands = {
        "cephes float64 (before)": lambda a: erf_f64(a.astype(np.float64)).astype(np.float32),
        "numpy rational f32, whole array": erf_f32_block,
        "numpy rational f32, blocks (asyncgrad)": lambda a: K.blockwise(erf_f32_block, a),
    }
    if importlib.util.find_spec("scipy"):
        from scipy.special import erf as scipy_erf

        cands["scipy.special.erf"] = scipy_erf
    if importlib.util.find_spec("torch"):
        import torch

        torch.set_num_threads(1)
        cands["torch.erf"] = lambda a: torch.erf(torch.from_numpy(a)).numpy()
    times: dict[str, list[float]] = {k: [] for k in cands}
    with threadpool_limits(1):
        for r in range(12):
            names = list(cands)
            k = r % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                cands[name](x)
                dt = time.perf_counter() - t0
                if r:
                    times[name].append(dt)
    base = statistics.median(times["torch.erf"]) if "torch.erf" in times else math.nan
    print("| erf on 1024x512 float32 | median ms | x torch | max error (float32 ulps) |")
    print("|---|---:|---:|---:|")
    for name, f in cands.items():
        y = np.asarray(f(grid), dtype=np.float64)
        ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
        med = statistics.median(times[name])
        print(f"| {name} | {med * 1e3:.2f} | {med / base:.1f} | {np.max(np.abs(y - ref) / ulp):.2f} |")


if __name__ == "__main__":
    main()
