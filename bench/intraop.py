"""Does splitting one large elementwise kernel over 2 threads pay here? (issue 15, item 4)

    python bench/intraop.py [--size 4194304] [--rounds 15]

For 4M float32 elements: tanh, exp, a multiply (memory-bound ufuncs) and asyncgrad's
float32 erf (24 ufuncs per block, compute-bound), and the compiled exact GELU and tanh
backward (``asyncgrad.ops.kernels``, when numba is installed), each on one thread and split
in two halves on 2 threads (numpy's ufunc loops and the compiled kernels release the GIL),
writing into a fresh output either way. Interleaved rounds, medians, the ratio split / one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import tune_malloc  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=4 * 1024 * 1024)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    from asyncgrad.ops import _kernels as K
    from asyncgrad.ops import kernels as compiled_kernels

    tune_malloc()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.size).astype(np.float32)
    y = rng.standard_normal(args.size).astype(np.float32)
    pool = ThreadPoolExecutor(2)
    half = args.size // 2

    def erf_into(out: np.ndarray, s: slice) -> None:
        out[s] = K.blockwise(K.erf_f32_block, x[s])

    # each kernel writes out[s] from the inputs' same slice s
    kernels: dict[str, Callable[[np.ndarray, slice], None]] = {
        "tanh": lambda out, s: np.tanh(x[s], out=out[s]),
        "exp": lambda out, s: np.exp(x[s], out=out[s]),
        "mul": lambda out, s: np.multiply(x[s], y[s], out=out[s]),
        "erf (asyncgrad f32)": erf_into,
    }
    if compiled_kernels.wait():
        ck = compiled_kernels.compiled()
        cdf = np.empty_like(x)
        kernels["gelu (compiled)"] = lambda out, s: ck.gelu(x[s], out[s], cdf[s])
        kernels["tanh backward (compiled)"] = lambda out, s: ck.tanh_backward(y[s], x[s], out[s])

    def one(kernel: Callable[[np.ndarray, slice], None]) -> None:
        kernel(np.empty_like(x), slice(None))

    def split(kernel: Callable[[np.ndarray, slice], None]) -> None:
        out = np.empty_like(x)
        futs = [pool.submit(kernel, out, slice(0, half)), pool.submit(kernel, out, slice(half, None))]
        for f in futs:
            f.result()

    print(f"# {args.size:,} float32, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
          f"command: python bench/intraop.py --size {args.size} --rounds {args.rounds}")
    print("| kernel | numpy, 1 thread ms | split over 2 threads ms | split / 1 thread |")
    print("|---|---:|---:|---:|")
    for name, kernel in kernels.items():
        times: dict[str, list[float]] = {"one": [], "split": []}
        for r in range(args.rounds + 1):
            order = [("one", one), ("split", split)]
            for label, fn in order if r % 2 else order[::-1]:
                t0 = time.perf_counter()
                fn(kernel)
                dt = time.perf_counter() - t0
                if r:
                    times[label].append(dt)
        a, b = statistics.median(times["one"]), statistics.median(times["split"])
        print(f"| {name} | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.2f} |")
    pool.shutdown()


if __name__ == "__main__":
    main()
