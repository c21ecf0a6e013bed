"""Neural-network functions: softmax, GELU and the losses (``ops/nn.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._aliases import numpy_aliases
from ..autograd.graph.record import record
from ..ops import nn as N
from ..tensor import Tensor
from ._dispatch import _const, _dim, _tensor, _unary_params


@numpy_aliases
def softmax(x: Tensor, dim: int) -> Tensor:
    """``exp(x)`` normalised to sum to 1 along ``dim``."""
    x = _tensor(x)
    d: int | None = _dim(dim, x.ndim)
    if x.ndim == 0:
        d = None  # a 0-d tensor: over its one element
    return record(N.softmax, (x,), N.softmax.forward(x.data, dim=d), params={"dim": d})


@numpy_aliases
def log_softmax(x: Tensor, dim: int) -> Tensor:
    """The logarithm of ``softmax(x, dim)``, computed stably."""
    x = _tensor(x)
    d: int | None = _dim(dim, x.ndim)
    if x.ndim == 0:
        d = None  # a 0-d tensor: over its one element
    return record(N.log_softmax, (x,), N.log_softmax.forward(x.data, dim=d), params={"dim": d})


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU, exact (erf) unless ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate argument must be either none or tanh, got {approximate!r}")
    if approximate == "tanh":
        return _unary_params(N.gelu_tanh, x, approximate=approximate)
    x = _tensor(x)
    out, cdf = N._gelu(x.data, approximate=approximate)  # cdf: kept for the backward
    return record(N.gelu, (x,), out, aux=cdf, params={"approximate": approximate})


def nll_loss(logp: Tensor, target: Any, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """The negative log-likelihood of class indices ``target`` under log-probabilities ``logp`` (N x C)."""
    tgt = np.asarray(target.data if isinstance(target, Tensor) else target)
    if logp.ndim != 2 or tgt.shape != logp.shape[:1]:
        raise ValueError(
            f"Expected input of shape (N, C) and target of shape (N,), got {list(logp.shape)} "
            f"and {list(tgt.shape)}"
        )
    if tgt.dtype.kind not in "iu":
        raise RuntimeError(f"expected scalar type Long but found {tgt.dtype}")
    # (targets out of range raise IndexError in the kernel's pass: Note [NLL in one pass])
    out, weights = N._nll_loss(logp.data, target=tgt, reduction=reduction, ignore_index=ignore_index)
    return record(N.nll_loss, (logp,), out, aux=weights, params={"reduction": reduction})


def cross_entropy(logits: Tensor, targets: Any, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """``nll_loss(log_softmax(logits, 1), targets)`` for class-index targets."""
    return nll_loss(log_softmax(logits, 1), targets, reduction, ignore_index)


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """The squared error between ``input`` and ``target``, averaged (``reduction='mean'``) or summed."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    input = _tensor(input)
    t = target if isinstance(target, Tensor) else _const(target, input)
    td = t.data if isinstance(t, Tensor) else t
    return record(N.mse_loss, (input, t), N._mse(input.data, td, reduction=reduction),
                  params={"reduction": reduction})
