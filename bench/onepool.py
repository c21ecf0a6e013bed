"""Does one thread pool close the transformer step's gap to PyTorch at default threads? (issue 15)

    python -m bench.onepool [--rounds 20] [--steps 3]

The transformer workload's training step (bench/gpt.py; forward, backward, AdamW) in five
configurations, and PyTorch's faster path (sdpa) beside them, interleaved round by round
in one process (each round runs every configuration once, in a rotating order, each
timing ``--steps`` steps back to back); medians, and each configuration's median per-round
ratio to ``main``:

* ``main``: the defaults (numpy's OpenBLAS with its 2 threads, the engine's adaptive BLAS
  policy, compiled kernels serial);
* ``kernels``: the parallel elementwise/row kernels on (``_intra.set_enabled``), BLAS as main;
* ``blas1``: BLAS pinned at one thread (``BLAS.pinned(1)``), kernels serial (the engine
  splits a product node's input gradients over its workers meanwhile);
* ``blas1+kernels``: BLAS at one thread and the parallel kernels on (``_intra.set_one_pool``
  without its products);
* ``one pool``: BLAS at one thread, the parallel kernels on and the 2-D products split
  in row blocks over TBB's pool too (Note [One pool] in ``asyncgrad/ops/kernels/intra_op.py``).

    python -m bench.onepool --forward   # the no-grad forward pass in main, blas1, one pool
    python -m bench.onepool --product   # one 1024 x 128 by 128 x 384 float32 product

``OPENBLAS_THREAD_TIMEOUT`` (set before the run) changes how long OpenBLAS's helper
thread spins after a product in ``main`` and ``kernels``. Needs numba's TBB layer (``pip
install tbb``) for all but ``main`` and ``blas1``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=3, help="steps per timed round")
    p.add_argument("--only", action="append", help="configurations to run (default: all)")
    p.add_argument("--forward", action="store_true", help="the forward pass alone (no grad), 5 per round")
    p.add_argument("--product", action="store_true", help="one product: numpy 1 thread, split over TBB")
    args = p.parse_args(argv)
    if args.product:
        one_product(args.rounds)
        return

    import asyncgrad as ag
    from asyncgrad.autograd.policy import BLAS
    from asyncgrad.ops.kernels import intra_op as _intra
    from asyncgrad.ops import kernels as compiled_kernels
    from bench import gpt

    compiled_kernels.wait()
    if _intra.build_product is not None:  # (built on first use: Note [One pool])
        _intra.build_product()
    product = _intra.product
    cfg = gpt.GPTConfig(block=64, layers=4, heads=4, dims=128, batch=16)
    idx, targets = gpt.make_batch(cfg)
    ag.manual_seed(0)
    model = gpt.ag_model(cfg)
    opt = ag.optim.AdamW(model.parameters(), lr=1e-3)
    loop = asyncio.new_event_loop()

    @contextmanager
    def setting(kernels: bool, blas1: bool, products: bool) -> Iterator[None]:
        _intra.product = product if products else None
        if kernels and blas1:
            _intra.set_one_pool(True)  # (pins BLAS at one thread itself)
        else:
            _intra.set_enabled(kernels)
        with BLAS.pinned(1) if blas1 and not kernels else nullcontext():
            yield
        _intra.set_one_pool(False)
        _intra.set_enabled(False)
        _intra.product = product

    async def ag_steps() -> None:
        for _ in range(args.steps):
            opt.zero_grad()
            loss = model(idx, targets)
            await ag.backward(loss)
            opt.step()

    if args.forward:
        async def ag_forwards() -> None:  # (the same configurations; an async def for ag_config)
            with ag.no_grad():
                for _ in range(5):
                    model(idx, targets)
        ag_steps = ag_forwards  # noqa: F811
        args.steps = 5

    def ag_config(kernels: bool, blas1: bool, products: bool) -> Callable[[], None]:
        def run() -> None:
            with setting(kernels, blas1, products):
                loop.run_until_complete(ag_steps())
        return run

    configs: dict[str, Callable[[], None]] = {"main": ag_config(False, False, False)}
    if _intra.available:
        configs["kernels"] = ag_config(True, False, False)
    configs["blas1"] = ag_config(False, True, False)
    if _intra.available:
        configs["blas1+kernels"] = ag_config(True, True, False)
        if product is not None:
            configs["one pool"] = ag_config(True, True, True)
    torch_steps = gpt.torch_sdpa_steps(cfg, idx, targets, args.steps)
    if torch_steps is not None:
        configs["torch sdpa"] = torch_steps
    if args.forward:
        configs = {k: v for k, v in configs.items() if k in ("main", "blas1", "one pool")}
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only or k == "main"}
    for fn in configs.values():  # warm-up (and the engine's one-time set-up)
        fn()
    launches = _intra.launches
    times: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            configs[name]()
            times[name].append((time.perf_counter() - t0) / args.steps)
    print(f"# GPT step ({cfg.describe()}), {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT', '(default)')}, "
          f"parallel launches {(_intra.launches - launches) / args.rounds / args.steps:.0f} per step; "
          f"command: python -m bench.onepool --rounds {args.rounds} "
          + ("--forward" if args.forward else f"--steps {args.steps}"))
    print("| configuration | median ms per step | min | / main (per round, median) | / torch sdpa |")
    print("|---|---:|---:|---:|---:|")
    tmed = statistics.median(times["torch sdpa"]) if "torch sdpa" in times else None
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, times["main"]))
        vs_torch = f"{statistics.median(t) / tmed:.2f}" if tmed else "-"
        print(f"| {name} | {statistics.median(t) * 1e3:.1f} | {min(t) * 1e3:.1f} | {ratio:.3f} | {vs_torch} |")


def one_product(rounds: int) -> None:
    """numpy's product at one thread against the split one (``_intra.product``), interleaved."""
    import numpy as np

    from asyncgrad.ops.kernels import intra_op as _intra
    from asyncgrad.ops import kernels as compiled_kernels

    compiled_kernels.wait()
    if _intra.build_product is not None:
        _intra.build_product()
    if _intra.product is None:
        print("no split product: numba's TBB layer or numpy's CBLAS gemm not found")
        return
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 128)).astype(np.float32)
    b = rng.standard_normal((384, 128)).astype(np.float32).T
    out = np.empty((1024, 384), np.float32)
    _intra.set_one_pool(True)
    cases = {"numpy, 1 thread": lambda: np.matmul(a, b, out=out), "split over TBB": lambda: _intra.product(a, b, out)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            times[name].append((time.perf_counter() - t0) / 20)
    _intra.set_one_pool(False)
    _intra.set_enabled(False)
    print(f"# 1024 x 128 @ 128 x 384 float32 (BLAS at one thread), load {os.getloadavg()[0]:.2f}; "
          f"command: python -m bench.onepool --product --rounds {rounds}")
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
