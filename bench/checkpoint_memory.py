"""Peak memory and time of one training step of a deep MLP, with and without
``checkpoint_sequential``.

    /work/venv/bin/python bench/checkpoint_memory.py [--layers 32] [--width 1024]
        [--batch 512] [--segments 4] [--repeat 2]

Model: ``layers`` blocks ``relu(x @ W + b)`` (float32), loss ``mean(y**2)``, one step =
forward + ``await ag.backward(loss)`` + an SGD update. Each configuration runs in a fresh
state; memory comes from ``tracemalloc`` (numpy reports its array allocations to it),
relative to the memory held before the step (the parameters and the input): the peak
over the step, and what forward keeps for backward (the activations checkpointing
drops); time is the best of ``repeat`` steps run without tracing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc

import numpy as np

import asyncgrad as ag
from asyncgrad.utils.checkpoint import checkpoint_sequential

MB = 1024 * 1024


def make_model(layers: int, width: int) -> tuple[list, list]:
    rng = np.random.default_rng(0)
    params, blocks = [], []
    for _ in range(layers):
        w = ag.from_numpy((rng.standard_normal((width, width)) * np.sqrt(2.0 / width)).astype(np.float32))
        b = ag.from_numpy(np.zeros(width, dtype=np.float32))
        w.requires_grad_()
        b.requires_grad_()
        params += [w, b]
        blocks.append(lambda x, w=w, b=b: (x @ w + b).relu())
    return params, blocks


async def step(params: list, blocks: list, x: ag.Tensor, segments: int, use_reentrant: bool,
               after_forward: list | None = None) -> float:
    if segments:
        y = checkpoint_sequential(blocks, segments, x, use_reentrant=use_reentrant)
    else:
        y = x
        for block in blocks:
            y = block(y)
    loss = (y * y).mean()
    if after_forward is not None and tracemalloc.is_tracing():
        after_forward.append(tracemalloc.get_traced_memory()[0])
    await ag.backward(loss)
    with ag.no_grad():
        for p in params:
            p.data -= 1e-3 * p.grad.data
            p.grad = None
    return float(loss.item())


def run(config: str, args: argparse.Namespace) -> dict[str, float]:
    segments = 0 if config == "plain" else args.segments
    use_reentrant = config != "checkpoint (use_reentrant=False)"
    params, blocks = make_model(args.layers, args.width)
    x = ag.from_numpy(np.random.default_rng(1).standard_normal((args.batch, args.width)).astype(np.float32))
    asyncio.run(step(params, blocks, x, segments, use_reentrant))  # warm-up (thread pool, BLAS)
    times = []
    for _ in range(args.repeat):
        gc.collect()
        t0 = time.perf_counter()
        asyncio.run(step(params, blocks, x, segments, use_reentrant))
        times.append(time.perf_counter() - t0)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    after_forward: list[int] = []
    asyncio.run(step(params, blocks, x, segments, use_reentrant, after_forward))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    held = sum(p.data.nbytes for p in params) + x.data.nbytes
    return {"peak_mb": (peak - base) / MB, "kept_mb": (after_forward[0] - base) / MB,
            "time_s": min(times), "params_mb": held / MB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    activation_mb = args.batch * args.width * 4 / MB
    print(f"MLP {args.layers} x relu(x @ W + b), width {args.width}, batch {args.batch}, float32; "
          f"one activation = {activation_mb:.1f} MB, checkpoint_sequential segments = {args.segments}")
    rows = []
    for config in ("plain", "checkpoint (use_reentrant=True)", "checkpoint (use_reentrant=False)"):
        r = run(config, args)
        rows.append((config, r))
        print(f"{config:34s} peak: {r['peak_mb']:7.1f} MB   kept for backward after forward: "
              f"{r['kept_mb']:6.1f} MB   step time: {r['time_s']:6.2f} s")
    plain = rows[0][1]
    print(f"(memory above what was held before the step: parameters + input = {plain['params_mb']:.1f} MB; "
          "the peak includes the parameter gradients)")
    for config, r in rows[1:]:
        print(f"{config}: {r['peak_mb'] / plain['peak_mb']:.2f}x the memory, "
              f"{r['time_s'] / plain['time_s']:.2f}x the time of plain")


if __name__ == "__main__":
    main()
