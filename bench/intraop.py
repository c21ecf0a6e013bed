"""Does splitting one large elementwise kernel over 2 threads pay here? (issue 15, item 4)

    python bench/intraop.py [--size 4194304] [--rounds 15]
    python -m bench.intraop --parallel-kernels [--rounds 15]

``--parallel-kernels``: each compiled kernel with a parallel form (numba ``prange`` on the
TBB layer, Note [Intra-op threads] in ``asyncgrad/ops/kernels/intra_op.py``) against its serial form,
float32, at 16k-1M elements in the transformer's shapes (rows of 128, softmax rows of 64),
medians of interleaved rounds of 50 calls: the data behind ``_intra.MIN_*``.

    python -m bench.intraop --step [--rounds 30]

``--step``: the transformer workload's training step (bench/gpt.py; forward, backward,
AdamW) with the parallel kernels allowed and forbidden (``_intra.set_enabled``), and
PyTorch's faster path (sdpa) beside them when torch is installed, interleaved round by
round in one process; medians and the per-round ratio on/off.

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
    p.add_argument("--parallel-kernels", action="store_true", help="compiled serial vs parallel forms")
    p.add_argument("--step", action="store_true", help="the GPT training step with and without them")
    args = p.parse_args(argv)
    if args.step:
        step(args.rounds)
        return
    if args.parallel_kernels:
        parallel_kernels(args.rounds)
        return
    from asyncgrad.ops.kernels import blockwise as K
    from asyncgrad.ops.kernels.special import erf_f32_block
    from asyncgrad.ops import kernels as compiled_kernels

    tune_malloc()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.size).astype(np.float32)
    y = rng.standard_normal(args.size).astype(np.float32)
    pool = ThreadPoolExecutor(2)
    half = args.size // 2

    def erf_into(out: np.ndarray, s: slice) -> None:
        out[s] = K.blockwise(erf_f32_block, x[s])

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


def parallel_kernels(rounds: int) -> None:
    from asyncgrad.ops.kernels import intra_op as _intra
    from asyncgrad.ops import kernels as compiled_kernels

    if not compiled_kernels.wait() or not _intra.available:
        print("no parallel kernels: numba's TBB layer is not available (pip install tbb)")
        return
    k = compiled_kernels.compiled()
    assert k is not None
    rng = np.random.default_rng(0)
    f = np.float32

    def cases(n: int) -> dict[str, tuple[str, tuple[object, ...]]]:
        x = rng.standard_normal(n).astype(f)
        g = rng.standard_normal(n).astype(f)
        out, cdf = np.empty_like(x), np.empty_like(x)
        k._SERIAL["gelu"](x, out, cdf)
        rows, rows64 = x.reshape(-1, 128), x.reshape(-1, 64)
        g128, o128, o64 = g.reshape(-1, 128), np.empty_like(rows), np.empty_like(rows64)
        sm = np.empty_like(rows64)
        k._SERIAL["softmax"](rows64, sm)
        w, b = np.ones(128, f), np.zeros(128, f)
        xhat, rstd = np.empty_like(rows), np.empty((rows.shape[0], 1), f)
        k._SERIAL["layer_norm"](rows, w, b, 1e-5, o128, xhat, rstd)
        dw, db = np.empty(128, f), np.empty(128, f)
        mask = np.tril(np.ones((64, 64), bool)).reshape(-1)
        m, v = np.zeros_like(x), np.zeros_like(x)
        adam = (x.copy(), g, m, v, True, f(1), False, False, f(0), True, f(0.1), f(0.9), f(0.999), f(0.001),
                f(-1e-3), f(1), f(1e-8))
        return {
            "gelu": ("gelu", (x, out, cdf)),
            "gelu backward": ("gelu_backward", (g, x, cdf, out)),
            "tanh backward": ("tanh_backward", (g, x, out)),
            "softmax (rows of 64)": ("softmax", (rows64, o64)),
            "softmax backward": ("softmax_backward", (g.reshape(-1, 64), sm, o64)),
            "masked fill (select_rows)": ("select_rows", (x.reshape(-1, 4096), mask, True, f(-np.inf),
                                                          out.reshape(-1, 4096))),
            "layer_norm (rows of 128)": ("layer_norm", (rows, w, b, 1e-5, o128, xhat, rstd)),
            "layer_norm backward (joint)": ("layer_norm_backward_joint", (g128, xhat, rstd, w, True, o128, dw, db)),
            "adam_step (one pass)": (k.adam_step, adam),
        }

    print(f"# float32, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
          f"command: python -m bench.intraop --parallel-kernels --rounds {rounds}")
    print("| kernel | elements | serial ms | parallel ms | parallel / serial |")
    print("|---|---:|---:|---:|---:|")
    for n in (16384, 65536, 131072, 262144, 524288, 1048576):
        for name, (kern, kargs) in cases(n).items():
            forms = {"serial": k._SERIAL[kern], "parallel": k._DISPATCHING[kern].parallel}
            times: dict[str, list[float]] = {"serial": [], "parallel": []}
            for r in range(rounds + 1):
                for label in ("serial", "parallel") if r % 2 else ("parallel", "serial"):
                    fn = forms[label]
                    t0 = time.perf_counter()
                    for _ in range(50):
                        fn(*kargs)
                    if r:
                        times[label].append((time.perf_counter() - t0) / 50)
            a, b = statistics.median(times["serial"]), statistics.median(times["parallel"])
            print(f"| {name} | {n:,} | {a * 1e3:.4f} | {b * 1e3:.4f} | {b / a:.2f} |")


def step(rounds: int) -> None:
    import asyncio

    import asyncgrad as ag
    from asyncgrad.ops.kernels import intra_op as _intra
    from asyncgrad.ops import kernels as compiled_kernels
    from bench import gpt

    compiled_kernels.wait()
    cfg = gpt.GPTConfig(block=64, layers=4, heads=4, dims=128, batch=16)
    idx, targets = gpt.make_batch(cfg)
    ag.manual_seed(0)
    model = gpt.ag_model(cfg)
    opt = ag.optim.AdamW(model.parameters(), lr=1e-3)
    loop = asyncio.new_event_loop()

    phases: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}

    async def ag_step(on: bool) -> None:
        _intra.set_enabled(on)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(idx, targets)
        t1 = time.perf_counter()
        await ag.backward(loss)
        t2 = time.perf_counter()
        opt.step()
        phases[on].append((t1 - t0, t2 - t1, time.perf_counter() - t2))

    steps: dict[str, Callable[[], None]] = {
        "intra-op on": lambda: loop.run_until_complete(ag_step(True)),
        "intra-op off": lambda: loop.run_until_complete(ag_step(False)),
    }
    torch_step = gpt.torch_sdpa_steps(cfg, idx, targets)
    if torch_step is not None:
        steps["torch sdpa"] = torch_step
    for fn in steps.values():  # warm-up (and the engine's one-time set-up)
        for _ in range(3):
            fn()
    launches, was_enabled = _intra.launches, _intra.enabled()
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t0)
    _intra.set_enabled(was_enabled)
    print(f"# GPT step ({cfg.describe()}), {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"parallel kernels available: {_intra.available}, parallel launches per step "
          f"{(_intra.launches - launches) / rounds:.0f}; command: python -m bench.intraop --step --rounds {rounds}")
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t) * 1e3:.1f} ms (min {min(t) * 1e3:.1f})")
    for on in (True, False):
        ph = phases[on][-rounds:]
        print(f"  intra-op {'on' if on else 'off'}: forward / backward / optimizer medians "
              + " / ".join(f"{statistics.median(p[i] for p in ph) * 1e3:.1f}" for i in range(3)) + " ms")
    on_off = [a / b for a, b in zip(times["intra-op on"], times["intra-op off"])]
    print(f"on / off per round: median {statistics.median(on_off):.3f}")
    if "torch sdpa" in times:
        tmed = statistics.median(times["torch sdpa"])
        for name in ("intra-op on", "intra-op off"):
            print(f"{name} / torch sdpa: {statistics.median(times[name]) / tmed:.2f}")


if __name__ == "__main__":
    main()
