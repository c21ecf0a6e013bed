"""Saliency (the input gradient) and SmoothGrad (input gradients averaged over noisy copies)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..creation import tensor
from ..random import Generator, default_generator
from ..tensor import Tensor
from ._batch import Model, Target, check_inputs, check_positive_int, example_targets, forward_args, input_gradients

NT_TYPES = ("smoothgrad", "smoothgrad_sq", "vargrad")


async def saliency(model: Model, inputs: Tensor, target: Target = None, *, abs: bool = True,
                   internal_batch_size: int | None = None, additional_forward_args: Any = None) -> Tensor:
    """The gradient of each example's ``target`` output with respect to that example
    (Simonyan et al. 2013; Captum's ``Saliency``), by one forward and one backward (per
    ``internal_batch_size`` examples, if given).

    Args:
        model: ``model(x, *additional_forward_args)`` returns (N, classes) or (N,); it must
            treat the examples of a batch independently (e.g. batch norm in eval mode).
        inputs: the examples, a floating Tensor of shape (N, ...).
        target: the class whose output is explained: an int, one int per example, or None
            for a model with one output per example.
        abs: return the gradients' absolute values (Captum's default) instead of the signed ones.
        internal_batch_size: at most this many examples per forward and backward.
        additional_forward_args: further arguments for ``model`` (one, or a tuple); a Tensor
            or array whose first dimension is N is split with the examples.

    Returns:
        A Tensor of ``inputs``'s shape and dtype, detached.

    Cancellation: the call stops at its next checkpoint: before its forward, or inside its
    backward (cancelled as ``ag.grad`` is); no ``.grad`` is read or written either way (the
    gradients come from ``ag.grad`` with respect to a copy of ``inputs``).

    Errors: ``ValueError`` naming the argument for bad ``inputs``, ``target`` or
    ``internal_batch_size``, or a ``model`` output of another shape; what ``model`` or its
    backward raise propagates.
    """
    x = check_inputs(inputs)
    n = x.shape[0]
    targets = example_targets(target, n)
    chunk = check_positive_int("internal_batch_size", internal_batch_size, optional=True)
    args = forward_args(additional_forward_args)
    result = np.empty_like(x)

    def keep(rows: np.ndarray, g: np.ndarray) -> None:
        result[rows] = np.abs(g) if abs else g

    await input_gradients(model, n, np.arange(n), lambda rows: x[rows], targets, args, n, chunk, keep)
    return tensor(result)


async def smoothgrad(model: Model, inputs: Tensor, target: Target = None, *, nt_samples: int = 5,
                     stdevs: float = 1.0, nt_type: str = "smoothgrad", abs: bool = False,
                     generator: Generator | None = None, internal_batch_size: int | None = None,
                     additional_forward_args: Any = None) -> Tensor:
    """The input gradient averaged over ``nt_samples`` copies of each example with Gaussian
    noise of standard deviation ``stdevs`` added (Smilkov et al. 2017; Captum's
    ``NoiseTunnel(Saliency)``). The ``nt_samples * N`` noisy copies go through the model as
    one batch: one forward and one backward (per ``internal_batch_size`` rows, if given).

    Args:
        model: as for `saliency`.
        inputs: the examples, a floating Tensor of shape (N, ...).
        target: as for `saliency`.
        nt_samples: noisy copies per example.
        stdevs: the noise's standard deviation, in the units of ``inputs`` (as Captum's;
            the paper states it as a fraction of the inputs' range: scale it yourself).
        nt_type: ``"smoothgrad"`` (the mean of the gradients), ``"smoothgrad_sq"`` (the mean
            of their squares) or ``"vargrad"`` (their variance).
        abs: take the gradients' absolute values before averaging. Off by default, as in
            the paper; Captum's ``NoiseTunnel(Saliency)`` averages absolute values unless
            it is given ``abs=False``.
        generator: the source of the noise (default: asyncgrad's default generator). The
            noise is drawn as one array of shape ``(nt_samples, *inputs.shape)``.
        internal_batch_size: at most this many noisy copies per forward and backward.
        additional_forward_args: as for `saliency`.

    Returns:
        A Tensor of ``inputs``'s shape and dtype, detached.

    Cancellation: the call stops at its next checkpoint: before each chunk's forward, or
    inside its backward (cancelled as ``ag.grad`` is); no ``.grad`` is read or written
    either way. The generator has drawn all the noise before the first checkpoint.

    Errors: ``ValueError`` naming the argument for bad ``inputs``, ``target``,
    ``nt_samples``, ``stdevs``, ``nt_type`` or ``internal_batch_size``.
    """
    x = check_inputs(inputs)
    n = x.shape[0]
    targets = example_targets(target, n)
    samples = check_positive_int("nt_samples", nt_samples)
    assert samples is not None
    chunk = check_positive_int("internal_batch_size", internal_batch_size, optional=True)
    if isinstance(stdevs, bool) or not isinstance(stdevs, int | float) or not np.isfinite(stdevs) or stdevs < 0:
        raise ValueError(f"stdevs must be a finite number >= 0, got {stdevs!r}")
    if nt_type not in NT_TYPES:
        raise ValueError(f"nt_type must be one of {', '.join(map(repr, NT_TYPES))}, got {nt_type!r}")
    if generator is not None and not isinstance(generator, Generator):
        raise ValueError(f"generator must be an asyncgrad Generator or None, got {type(generator).__name__}")
    args = forward_args(additional_forward_args)
    noise = (generator or default_generator).rng.standard_normal((samples, *x.shape)) * stdevs
    noisy = (x[None] + noise).astype(x.dtype, copy=False).reshape(samples * n, *x.shape[1:])
    total = np.zeros(x.shape, dtype=np.float64)
    squares = np.zeros(x.shape, dtype=np.float64)
    example_of_row = np.tile(np.arange(n), samples)

    def accumulate(rows: np.ndarray, g: np.ndarray) -> None:
        g = np.abs(g) if abs else g
        np.add.at(total, example_of_row[rows], g)
        if nt_type != "smoothgrad":
            np.add.at(squares, example_of_row[rows], g * g)

    await input_gradients(model, samples * n, example_of_row, lambda rows: noisy[rows], targets, args, n,
                          chunk, accumulate)
    mean = total / samples
    result = mean if nt_type == "smoothgrad" else squares / samples
    if nt_type == "vargrad":
        result = np.maximum(result - mean * mean, 0)  # (a rounding error below 0 is 0)
    return tensor(result.astype(x.dtype))
