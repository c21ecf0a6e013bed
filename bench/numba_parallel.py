"""Whether numba's own parallel loops pay on this machine's cores, where splitting a kernel
over the engine's worker threads did not (docs/guides/kernels.md, "Intra-op threads").

    python -m bench.numba_parallel

An elementwise add and an exact GELU (libm's erf, so slower than asyncgrad's kernel) as
serial numba loops and as ``prange`` loops with ``parallel=True`` on 2 threads, beside
``np.add``, at 131,072 / 524,288 / 2,097,152 float32; medians of 9 rounds of 100 calls.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def main() -> None:
    import numba
    from numba import njit, prange

    @njit(cache=False)
    def gelu_serial(x: Any, out: Any) -> None:
        for i in range(x.size):
            v = x[i]
            out[i] = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))

    @njit(parallel=True, cache=False)
    def gelu_parallel(x: Any, out: Any) -> None:
        for i in prange(x.size):
            v = x[i]
            out[i] = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))

    @njit(cache=False)
    def add_serial(a: Any, b: Any, out: Any) -> None:
        for i in range(a.size):
            out[i] = a[i] + b[i]

    @njit(parallel=True, cache=False)
    def add_parallel(a: Any, b: Any, out: Any) -> None:
        for i in prange(a.size):
            out[i] = a[i] + b[i]

    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    for n in (131_072, 524_288, 2_097_152):
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        y, out = x.copy(), np.empty_like(x)
        cases: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
            ("gelu serial", gelu_serial, (x, out)), ("gelu prange", gelu_parallel, (x, out)),
            ("add serial", add_serial, (x, y, out)), ("add prange", add_parallel, (x, y, out)),
            ("np.add", np.add, (x, y, out))]
        for _, fn, args in cases:  # compile and warm
            fn(*args)
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        for _ in range(9):
            for name, fn, args in cases:
                t = time.perf_counter()
                for _ in range(100):
                    fn(*args)
                times[name].append((time.perf_counter() - t) / 100 * 1e3)
        print(f"{n:>9,} float32: " + ", ".join(f"{k} {statistics.median(v):.4f} ms" for k, v in times.items()))
    print(f"numba threading layer: {numba.threading_layer()}, threads: {numba.get_num_threads()}")


if __name__ == "__main__":
    main()
