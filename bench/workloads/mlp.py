"""mlp: 4 fused linear layers (ReLU between), batch 256, width 1024, float32; backward only.

The forward graph is built untimed before each round and the parameters' ``.grad`` reset,
so each round times one backward that writes fresh gradients. Reported in ms and as a
ratio to the hand-written numpy backward measured in the same run.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .. import nets
from ..common import About
from ..common import (BLAS, ASYNCGRAD, AUTOGRAD, NUMPY, TORCH, Case, Column, Result, Target, measure_cases,
                      median)

DEFAULT_ROUNDS = 9

ABOUT = About(
    title="A large MLP: heavy matrix products",
    measures="4 linear layers with ReLU between them, batch 256, width 1024, float32: one backward (the "
             "forward is built untimed before each round), in ms and as a multiple of the hand-written numpy "
             "backward (x numpy floor), with the minor page faults per backward.",
    reading="Lower is better. Nearly all the time is in BLAS matrix products, which every numpy-based "
            "implementation calls the same way, so the multiple of the floor is what the autograd layer adds. "
            "PyTorch uses its own BLAS (MKL/oneDNN) where the others use numpy's, so part of its difference "
            "is the BLAS library, not the autograd.",
    plots=(("backward_ms", "backward ms", False),),
)


def run(impls: list[str], rounds: int | None = None, layers: int = 4, batch: int = 256,
        width: int = 1024) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    params = nets.make_params(layers, width)
    x = nets.make_input(batch, width)
    res = Result(
        "mlp", f"{layers} linear layers, batch {batch}, width {width}, float32; backward only",
        {"layers": layers, "batch": batch, "width": width, "rounds": rounds, "dtype": "float32"},
        [Column("backward_ms", "backward ms", "{:.2f}"),
         Column("x_floor", "x numpy floor", "{:.2f}"),
         Column("page_faults", "page faults", "{:,.0f}")],
    )
    t_start = time.perf_counter()
    cases: list[Case] = []
    for impl in impls:
        if impl == ASYNCGRAD:
            import asyncgrad as ag

            ps = nets.ag_params(params)

            def ag_setup(ps: list[Any] = ps) -> Any:
                for p in ps:
                    p.grad = None
                return nets.ag_graph(ps, x)

            cases.append(Case(impl, ag_setup, ag.backward))
        elif impl == TORCH:
            tps = nets.torch_params(params)

            def torch_setup(tps: list[Any] = tps) -> Any:
                for p in tps:
                    p.grad = None
                return nets.torch_graph(tps, x)

            cases.append(Case(impl, torch_setup, lambda loss: loss.backward()))
        elif impl == AUTOGRAD:
            # imported here, before asyncgrad's first backward starts its set-up thread:
            # HIPS autograd's import walks numpy's namespace, which a lazy numpy import on
            # that thread can change meanwhile ("dictionary changed size during iteration")
            import autograd  # noqa: F401

            cases.append(Case(impl, lambda: nets.autograd_graph(params, x), nets.autograd_backward))
        elif impl == NUMPY:
            cases.append(Case(impl, lambda: nets.numpy_graph(params, x), lambda s: nets.numpy_backward(params, s)))
    faults: dict[str, list[int]] = {}
    times = measure_cases(cases, rounds, faults=faults)
    for impl in impls:
        if impl in times:
            t = times[impl]
            res.rows.append({"impl": impl, "backward_ms": median(t) * 1e3, "rounds_s": t,
                             "page_faults": median(faults[impl])})
    res.notes.append(BLAS.describe())
    res.seconds = time.perf_counter() - t_start
    floor = res.value(NUMPY, "backward_ms")
    for r in res.rows:
        r["x_floor"] = r["backward_ms"] / floor if not math.isnan(floor) else None
    a = res.value(ASYNCGRAD, "backward_ms")
    ratio = res.add_ratio("asyncgrad/numpy", a, floor)
    res.add_ratio("torch/numpy", res.value(TORCH, "backward_ms"), floor)
    res.add_ratio("autograd/numpy", res.value(AUTOGRAD, "backward_ms"), floor)
    res.add_ratio("asyncgrad/torch", a, res.value(TORCH, "backward_ms"))
    if not math.isnan(ratio):
        res.targets.append(Target("mlp backward <= 1.10x numpy floor", ratio, 1.10, "x"))
    return res
