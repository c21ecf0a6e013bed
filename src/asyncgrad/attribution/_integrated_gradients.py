"""Integrated Gradients (Sundararajan et al. 2017): the path integral of the input gradient
from a baseline to the input, by a quadrature rule over ``n_steps`` points of the path."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..creation import tensor
from ..tensor import Tensor
from ._batch import (
    Model, Target, check_inputs, check_positive_int, check_targets_against, example_targets, forward_args,
    input_gradients, rows_of_args, run_model, selected_outputs,
)

METHODS = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


def legendre_and_derivative(n: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``P_n(x)`` and ``P_n'(x)`` by the three-term recurrence (for |x| < 1)."""
    previous, p = np.ones_like(x), x.copy()
    for j in range(2, n + 1):
        previous, p = p, ((2 * j - 1) * x * p - (j - 1) * previous) / j
    return p, n * (x * p - previous) / (x * x - 1)


@functools.lru_cache(maxsize=16)
def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodes (ascending) and weights of the n-point Gauss-Legendre rule on [-1, 1]: the
    roots of ``P_n`` by Newton's method from Tricomi's approximation, in ``O(n^2)``: numpy's
    ``leggauss`` takes the eigenvalues of an n x n matrix, ``O(n^3)``, which would hold the
    event loop for long at thousands of steps. Cached: a service asks for the same rules."""
    if n == 1:
        return np.zeros(1), np.full(1, 2.0)
    x = np.cos(np.pi * (np.arange(n, 0, -1) - 0.25) / (n + 0.5))
    for _ in range(100):
        p, dp = legendre_and_derivative(n, x)
        step = p / dp
        x = x - step
        if np.abs(step).max() < 1e-15:
            break
    _, dp = legendre_and_derivative(n, x)
    return x, 2 / ((1 - x * x) * dp * dp)


def quadrature(method: str, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The points ``alphas`` in [0, 1] and weights of ``method``'s rule for ``integral_0^1 f``."""
    if method == "gausslegendre":
        nodes, weights = gauss_legendre(n_steps)
        return (nodes + 1) / 2, weights / 2
    if method == "riemann_trapezoid":
        if n_steps < 2:
            raise ValueError(f"n_steps must be >= 2 for method='riemann_trapezoid', got {n_steps}")
        weights = np.full(n_steps, 1 / (n_steps - 1))
        weights[[0, -1]] /= 2
        return np.linspace(0, 1, n_steps), weights
    offset = {"riemann_left": 0.0, "riemann_right": 1.0, "riemann_middle": 0.5}[method]
    return (np.arange(n_steps) + offset) / n_steps, np.full(n_steps, 1 / n_steps)


def check_baselines(baselines: Any, x: np.ndarray) -> np.ndarray:
    if baselines is None:
        return np.zeros_like(x)
    if isinstance(baselines, bool):
        raise ValueError(f"baselines must be None, a number or a Tensor broadcastable to {x.shape}, got {baselines!r}")
    raw = baselines.detach().numpy() if isinstance(baselines, Tensor) else baselines
    arr = np.asarray(raw)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"baselines must be None, a number or a Tensor broadcastable to {x.shape}, got {baselines!r}")
    try:
        return np.broadcast_to(arr, x.shape).astype(x.dtype)
    except ValueError:
        raise ValueError(f"baselines of shape {arr.shape} do not broadcast to the inputs' shape {x.shape}") from None


async def integrated_gradients(model: Model, inputs: Tensor, baselines: Any = None, target: Target = None, *,
                               n_steps: int = 50, method: str = "gausslegendre",
                               internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                               return_convergence_delta: bool = False,
                               additional_forward_args: Any = None) -> Tensor | tuple[Tensor, Tensor]:
    """``(inputs - baselines) * integral_0^1 grad f(baselines + a (inputs - baselines)) da``
    for each example, with the integral taken by ``method`` over ``n_steps`` points (Captum's
    ``IntegratedGradients``). The ``n_steps * N`` points of the paths go through the model as
    one batch: one forward and one backward (per ``internal_batch_size`` rows, if given).

    Completeness: each example's attributions sum to ``f(inputs) - f(baselines)`` for its
    target, up to the quadrature's error, which falls as ``n_steps`` grows (and is zero for
    a linear model, whose gradient is the same all along the path).

    Args:
        model: as for `saliency`.
        inputs: the examples, a floating Tensor of shape (N, ...).
        baselines: where the paths start: None (zeros), a number, or a Tensor or array
            broadcastable to ``inputs``'s shape (e.g. one baseline of shape ``inputs.shape[1:]``).
        target: as for `saliency`.
        n_steps: the points on each path.
        method: the quadrature rule: ``"gausslegendre"`` (Captum's default, and the most
            accurate for a smooth model), ``"riemann_trapezoid"``, ``"riemann_middle"``,
            ``"riemann_left"`` or ``"riemann_right"``. The trapezoid rule here weighs its
            points (``1 / (n_steps - 1)`` apart) by ``1 / (n_steps - 1)``, halved at the ends,
            so it is exact for a linear model; Captum's weighs them by ``1 / n_steps``.
        internal_batch_size: at most this many path points per forward and backward.
        multiply_by_inputs: multiply the integral by ``inputs - baselines`` (IG's
            definition); without it the result is the integral of the gradients alone.
        return_convergence_delta: also return each example's ``sum(attributions) -
            (f(inputs) - f(baselines))``, from one more forward (without grad) of the inputs
            and baselines.
        additional_forward_args: as for `saliency`.

    Returns:
        The attributions, a Tensor of ``inputs``'s shape and dtype, detached; with
        ``return_convergence_delta``, the pair ``(attributions, delta)``, delta of shape (N,).

    Cancellation: the call stops at its next checkpoint: before each chunk's forward, or
    inside its backward (cancelled as ``ag.grad`` is); no ``.grad`` is read or written
    either way.

    Errors: ``ValueError`` naming the argument for bad ``inputs``, ``baselines``,
    ``target``, ``n_steps``, ``method`` or ``internal_batch_size``.
    """
    x = check_inputs(inputs)
    n = x.shape[0]
    base = check_baselines(baselines, x)
    targets = example_targets(target, n)
    steps = check_positive_int("n_steps", n_steps)
    assert steps is not None
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    alphas, weights = quadrature(method, steps)
    chunk = check_positive_int("internal_batch_size", internal_batch_size, optional=True)
    args = forward_args(additional_forward_args)
    path = x - base
    example_of_row = np.tile(np.arange(n), steps)  # row r: step r // n of example r % n
    step_of_row = np.repeat(np.arange(steps), n)
    broadcast = (slice(None),) + (None,) * (x.ndim - 1)

    def points(rows: np.ndarray) -> np.ndarray:
        e = example_of_row[rows]
        return (base[e] + alphas[step_of_row[rows]][broadcast] * path[e]).astype(x.dtype, copy=False)

    integral = np.zeros(x.shape, dtype=np.float64)

    def accumulate(rows: np.ndarray, g: np.ndarray) -> None:
        np.add.at(integral, example_of_row[rows], weights[step_of_row[rows]][broadcast] * g)

    await input_gradients(model, steps * n, example_of_row, points, targets, args, n, chunk, accumulate)
    attributions = integral * path if multiply_by_inputs else integral
    result = tensor(attributions.astype(x.dtype))
    if not return_convergence_delta:
        return result
    ends = np.concatenate([x, base])
    out = run_model(model, tensor(ends), rows_of_args(args, np.tile(np.arange(n), 2), n), record=False)
    f = out.numpy()
    check_targets_against(f.shape, targets)
    scores = selected_outputs(f, None if targets is None else np.tile(targets, 2))
    delta = attributions.reshape(n, -1).sum(axis=1) - (scores[:n] - scores[n:])
    return result, tensor(delta.astype(x.dtype))
