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
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale the ``.grad`` of ``parameters`` in place so that their joint ``norm_type``
    norm is at most ``max_norm``; returns the norm before clipping (as PyTorch: the
    scale is ``max_norm / (norm + 1e-6)``, applied only when it is below 1)."""
    params = _with_grads(parameters)
    if not params:
        return Tensor._wrap(np.asarray(0.0))
    grads = [p.grad.data for p in params]  # type: ignore[union-attr]
    if math.isinf(norm_type):
        total = max(float(np.abs(g).max(initial=0.0)) for g in grads)
    else:
        total = float(sum(float((np.abs(g.astype(np.float64)) ** norm_type).sum()) for g in grads)) ** (1 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                           "so it cannot be clipped. To disable this error and scale the gradients by the "
                           "non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for p in params:
            p.grad = Tensor._wrap(p.grad.data * p.grad.dtype.type(coef))  # type: ignore[union-attr]
    return Tensor._wrap(np.asarray(total, dtype=params[0].dtype))


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every ``.grad`` element of ``parameters`` to ``[-clip_value, clip_value]``."""
    for p in _with_grads(parameters):
        p.grad = Tensor._wrap(np.clip(p.grad.data, -clip_value, clip_value))  # type: ignore[union-attr]


__all__ = ["clip_grad_norm_", "clip_grad_value_"]
