"""Gradient utilities, as ``torch.nn.utils``: clipping by total norm or by value."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..tensor import Tensor


def _with_grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p for p in params if p.grad is not None]


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale the ``.grad`` of ``parameters`` so that their joint ``norm_type`` norm is at
    most ``max_norm``; returns the total norm before clipping, as a 0-d tensor.

    As PyTorch: the gradients are multiplied by ``min(1, max_norm / (norm + 1e-6))``, so a
    NaN or infinite norm turns them into NaNs (or zeros) unless ``error_if_nonfinite=True``,
    which raises ``RuntimeError`` instead and leaves every ``.grad`` unchanged: the way to
    refuse an optimizer step on a non-finite gradient. ``foreach`` is accepted for
    compatibility; numpy has no fused multi-tensor kernels, so it changes nothing.
    """
    params = _with_grads(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not params:
        return Tensor._wrap(np.asarray(0.0, dtype=np.float32))
    grads = [p.grad.data for p in params]  # type: ignore[union-attr]
    with np.errstate(over="ignore", invalid="ignore"):  # overflow becomes an inf norm, reported below
        if math.isinf(norm_type):
            total = max(float(np.abs(g).max(initial=0.0)) for g in grads)
        else:
            total = float(sum(float((np.abs(g.astype(np.float64)) ** norm_type).sum()) for g in grads))
            total = total ** (1 / norm_type)
    with np.errstate(over="ignore"):
        result = np.asarray(total, dtype=params[0].dtype)  # a norm beyond float32's range is inf, as in PyTorch
    if error_if_nonfinite and not np.isfinite(result):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                           "so it cannot be clipped. To disable this error and scale the gradients by the "
                           "non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # also when coef is NaN: PyTorch multiplies by clamp(coef, max=1) regardless
        with np.errstate(invalid="ignore"):
            for p in params:
                p.grad = Tensor._wrap(p.grad.data * p.grad.dtype.type(coef))  # type: ignore[union-attr]
    return Tensor._wrap(result)


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every ``.grad`` element of ``parameters`` to ``[-clip_value, clip_value]`` (NaNs
    stay NaN, as in PyTorch); ``foreach`` is accepted for compatibility and changes nothing."""
    for p in _with_grads(parameters):
        p.grad = Tensor._wrap(np.clip(p.grad.data, -clip_value, clip_value))  # type: ignore[union-attr]


__all__ = ["clip_grad_norm_", "clip_grad_value_"]
