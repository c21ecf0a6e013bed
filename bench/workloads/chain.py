"""chain: ``n`` tiny elementwise ops on 16 floats, one after the other.

The op cycle is ``sin, * c, tanh, + d`` (``c`` a constant 16-float array near 1, ``d = c - 1``),
the loss the sum of the last value; only ``x`` requires grad. Measured per implementation:

* backward only (the forward graph is built untimed before each round), in µs per op;
* the forward with the graph recorded, in µs per op (issue 7 item 3).

The numpy floor is a hand-written forward that keeps what backward needs and a
hand-written reversed loop of the derivative rules.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..common import About
from ..common import (BLAS, ASYNCGRAD, AUTOGRAD, NUMPY, TORCH, Case, Column, Result, Target, measure_cases,
                      median)

DEFAULT_ROUNDS = 15

ABOUT = About(
    title="Many tiny operations: the cost per node",
    measures="2,000 elementwise operations (sin, x c, tanh, + d) one after another on 16 floats, loss = their "
             "sum. The backward alone (the graph is built untimed before each round), in µs per node; and the "
             "forward with the graph recorded, in µs per operation. Each node's arithmetic is trivial, so this "
             "is the cost of the autograd machinery itself.",
    reading="Lower is better. The numpy row is a hand-written forward and backward with no graph at all: the "
            "floor. The gap between a library and the floor is its bookkeeping per node (finding the next node, "
            "routing gradients, hooks). If your graphs are many small operations (small batches, scalar-heavy "
            "models), this is the figure that decides your backward time.",
    plots=(("backward_us_per_node", "backward µs/node", False), ("forward_us_per_op", "forward µs/op", False)),
)
SIZE = 16


def _inputs(size: int, spread: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """``x0`` and the multiplier ``c = 1 + spread * U(-1, 1)``; the added constant is
    ``c - 1``. Near-1 multipliers and near-0 shifts keep the values small, where sin' and
    tanh' are close to 1, so the gradient stays a normal float32 through thousands of ops
    (with c ~ U(0.5, 1.5) it decays through subnormals to 0, which is not what a real
    backward computes on and makes ufuncs take microcode assists)."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal(size).astype(np.float32),
            (1.0 + spread * rng.uniform(-1.0, 1.0, size)).astype(np.float32))


# --- asyncgrad ---------------------------------------------------------------------------
def ag_forward(x0: np.ndarray, c0: np.ndarray, n: int) -> Any:
    import asyncgrad as ag

    x = ag.from_numpy(x0.copy()).requires_grad_()
    c = ag.from_numpy(c0)
    d = ag.from_numpy(c0 - np.float32(1))
    y = x
    for i in range(n):
        k = i & 3
        if k == 0:
            y = y.sin()
        elif k == 1:
            y = y * c
        elif k == 2:
            y = y.tanh()
        else:
            y = y + d
    return y.sum()


# --- PyTorch -------------------------------------------------------------------------------
def torch_forward(x0: np.ndarray, c0: np.ndarray, n: int) -> Any:
    import torch

    x = torch.from_numpy(x0.copy()).requires_grad_()
    c = torch.from_numpy(c0)
    d = torch.from_numpy(c0 - np.float32(1))
    y = x
    for i in range(n):
        k = i & 3
        if k == 0:
            y = y.sin()
        elif k == 1:
            y = y * c
        elif k == 2:
            y = y.tanh()
        else:
            y = y + d
    return y.sum()


# --- HIPS autograd -------------------------------------------------------------------------
def autograd_forward(x0: np.ndarray, c0: np.ndarray, n: int) -> Any:
    """Trace the function; returns ``(vjp, ans)`` (HIPS autograd's forward is the trace)."""
    import autograd
    import autograd.numpy as anp

    d0 = c0 - np.float32(1)

    def f(x: Any) -> Any:
        y = x
        for i in range(n):
            k = i & 3
            if k == 0:
                y = anp.sin(y)
            elif k == 1:
                y = y * c0
            elif k == 2:
                y = anp.tanh(y)
            else:
                y = y + d0
        return anp.sum(y)

    return autograd.make_vjp(f)(x0.copy())


# --- numpy floor -----------------------------------------------------------------------------
def numpy_forward(x0: np.ndarray, c0: np.ndarray, n: int) -> tuple[Any, list[np.ndarray]]:
    saved: list[np.ndarray] = []
    d0 = c0 - np.float32(1)
    y = x0.copy()
    for i in range(n):
        k = i & 3
        if k == 0:
            saved.append(y)
            y = np.sin(y)
        elif k == 1:
            y = y * c0
        elif k == 2:
            y = np.tanh(y)
            saved.append(y)
        else:
            y = y + d0
    return y.sum(), saved


def numpy_backward(saved: list[np.ndarray], c0: np.ndarray, n: int, size: int) -> np.ndarray:
    g = np.ones(size, dtype=np.float32)
    j = len(saved) - 1
    for i in range(n - 1, -1, -1):
        k = i & 3
        if k == 0:
            g = g * np.cos(saved[j])
            j -= 1
        elif k == 1:
            g = g * c0
        elif k == 2:
            a = saved[j]
            g = g * (1.0 - a * a)
            j -= 1
    return g


# --- the workload -------------------------------------------------------------------------------
def run(impls: list[str], rounds: int | None = None, n: int = 2000, size: int = SIZE) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    x0, c0 = _inputs(size)
    res = Result(
        "chain", f"{n:,} tiny elementwise ops (sin, *c, tanh, +d) on {size} floats; backward only",
        {"n": n, "size": size, "rounds": rounds, "dtype": "float32"},
        [Column("backward_us_per_node", "backward µs/node", "{:.2f}"),
         Column("forward_us_per_op", "forward µs/op", "{:.2f}"),
         Column("backward_ms", "backward ms", "{:.2f}")],
    )
    t_start = time.perf_counter()
    cases: list[Case] = []
    for impl in impls:
        if impl == ASYNCGRAD:
            import asyncgrad as ag

            cases += [Case(f"{impl}:bwd", lambda: ag_forward(x0, c0, n), ag.backward),
                      Case(f"{impl}:fwd", lambda: None, lambda _: ag_forward(x0, c0, n))]
        elif impl == TORCH:
            cases += [Case(f"{impl}:bwd", lambda: torch_forward(x0, c0, n), lambda loss: loss.backward()),
                      Case(f"{impl}:fwd", lambda: None, lambda _: torch_forward(x0, c0, n))]
        elif impl == AUTOGRAD:
            cases += [Case(f"{impl}:bwd", lambda: autograd_forward(x0, c0, n),
                           lambda va: va[0](np.ones_like(va[1]))),
                      Case(f"{impl}:fwd", lambda: None, lambda _: autograd_forward(x0, c0, n))]
        elif impl == NUMPY:
            cases += [Case(f"{impl}:bwd", lambda: numpy_forward(x0, c0, n),
                           lambda s: numpy_backward(s[1], c0, n, size)),
                      Case(f"{impl}:fwd", lambda: None, lambda _: numpy_forward(x0, c0, n))]
    times = measure_cases(cases, rounds, settle=0.0)  # tiny ops: no BLAS or OpenMP threads involved
    for impl in impls:
        if f"{impl}:bwd" not in times:
            continue
        b, f = times[f"{impl}:bwd"], times[f"{impl}:fwd"]
        res.rows.append({"impl": impl, "backward_us_per_node": median(b) / n * 1e6,
                         "forward_us_per_op": median(f) / n * 1e6, "backward_ms": median(b) * 1e3,
                         "backward_rounds_s": b, "forward_rounds_s": f})
    res.notes.append(BLAS.describe())
    res.seconds = time.perf_counter() - t_start
    a_b = res.value(ASYNCGRAD, "backward_us_per_node")
    a_f = res.value(ASYNCGRAD, "forward_us_per_op")
    res.add_ratio("asyncgrad/numpy backward", a_b, res.value(NUMPY, "backward_us_per_node"))
    res.add_ratio("asyncgrad/torch backward", a_b, res.value(TORCH, "backward_us_per_node"))
    res.add_ratio("asyncgrad/autograd backward", a_b, res.value(AUTOGRAD, "backward_us_per_node"))
    fwd_torch = res.add_ratio("asyncgrad/torch forward", a_f, res.value(TORCH, "forward_us_per_op"))
    res.add_ratio("asyncgrad/autograd forward", a_f, res.value(AUTOGRAD, "forward_us_per_op"))
    if not math.isnan(a_b):
        res.targets.append(Target("chain backward <= 2.5 µs/node", a_b, 2.5, "µs/node"))
        peers = [res.value(p, "backward_us_per_node") for p in (TORCH, AUTOGRAD)]
        peers = [p for p in peers if not math.isnan(p)]
        if peers:
            res.targets.append(Target("chain backward ahead of both peers (asyncgrad / best peer)",
                                      a_b / min(peers), 1.0, "x"))
            res.targets.append(Target("issue 33: chain backward <= 0.5x the best peer", a_b / min(peers), 0.5, "x"))
    if not math.isnan(fwd_torch):
        res.targets.append(Target("forward per op <= 2x PyTorch", fwd_torch, 2.0, "x"))
    return res
