"""The GPT training step (bench/gpt.py) on one thread each, with asyncgrad's engine set
three ways, beside PyTorch's manual-attention step, interleaved rounds, medians:

    python -m bench.engine_configs [--rounds 9]

Shows how much of the transformer step is the engine's scheduling (large nodes hop to
worker threads, niced only while no other process is busy unless ``worker_nice`` fixes it)
rather than the kernels.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import gpt  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    import asyncgrad as ag
    from asyncgrad.autograd.engine import Engine

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")
    cfg = gpt.GPTConfig()
    idx, tgt = gpt.make_batch(cfg)
    torch.manual_seed(0)
    tm = gpt.torch_model(cfg)
    am = gpt.ag_model(cfg)
    gpt.copy_weights(tm, am)
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-3)
    aopt = ag.optim.AdamW(am.parameters(), lr=1e-3)
    ti, tt = torch.from_numpy(idx), torch.from_numpy(tgt)
    engines = {"asyncgrad, default engine": Engine(), "asyncgrad, Engine(worker_nice=0)": Engine(worker_nice=0),
               "asyncgrad, every node inline": Engine(inline_threshold=2**62)}

    async def ag_step(engine: Engine) -> None:
        ag.autograd.set_engine(engine)
        aopt.zero_grad()
        loss = am(idx, tgt)
        await ag.backward(loss)
        aopt.step()

    async def t_step() -> None:
        topt.zero_grad()
        tm(ti, tt).backward()
        topt.step()

    async def run() -> dict[str, list[float]]:
        cases = {**{k: (lambda e=e: ag_step(e)) for k, e in engines.items()}, "torch manual attention": t_step}
        times: dict[str, list[float]] = {k: [] for k in cases}
        names = list(cases)
        for r in range(args.rounds + 1):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                await cases[name]()
                if r:
                    times[name].append(time.perf_counter() - t0)
        return times

    times = asyncio.run(run())
    base = statistics.median(times["torch manual attention"])
    print(f"# one thread each, load {os.getloadavg()[0]:.2f}; python -m bench.engine_configs --rounds {args.rounds}")
    print("| GPT step, 1 thread each | median ms | x torch |")
    print("|---|---:|---:|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t) * 1e3:.1f} | {statistics.median(t) / base:.2f} |")


if __name__ == "__main__":
    main()
