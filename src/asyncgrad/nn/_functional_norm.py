"""``layer_norm``, ``batch_norm`` and ``group_norm`` with PyTorch's arguments and messages.

Training-mode batch norm is one node (ops/normalization.py) and updates the running
statistics in place, as PyTorch: ``running = (1 - momentum) * running + momentum * batch``,
the batch variance unbiased (``n / (n - 1)``) there though the normalisation uses the
biased one. Evaluation mode is ``x * scale + shift`` per channel. Group norm is a layer
norm over each group's channels and positions (one node), then the per-channel affine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import functional as _F
from ..autograd.graph.record import record
from ..grad_mode import no_grad
from ..ops import nn as _N
from ..ops import normalization as _B
from ..tensor import Tensor


def _per_channel(v: Any, ndim: int) -> Any:
    """A (C,) tensor or array shaped to broadcast over (N, C, *spatial)."""
    shape = (1, -1, *(1,) * (ndim - 2))
    return _F.reshape(v, shape) if isinstance(v, Tensor) else np.reshape(v, shape)


def _check_stat(name: str, stat: Tensor | None, c: int) -> None:
    if stat is not None and stat.numel() != c:
        raise RuntimeError(f"{name} should contain {c} elements not {stat.numel()}")


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each channel (dim 1) of ``input`` (N, C, *) by the batch's statistics
    (``training``) or by ``running_mean``/``running_var``, then scale by ``weight`` and shift
    by ``bias``, as ``torch.nn.functional.batch_norm``. In training, given running
    statistics are updated in place with ``momentum``."""
    x = input if type(input) is Tensor else Tensor(input)
    if x.ndim < 2:
        raise ValueError(f"Expected 2D or more input (got {x.ndim}D input)")
    c = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        _check_stat(name, t, c)
    if training:
        n = x.numel() // c
        if n <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"torch.Size({list(x.shape)})")
        return _train(x, running_mean, running_var, weight, bias, momentum, eps, n)
    if running_mean is None or running_var is None:
        raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
    inv = 1.0 / np.sqrt(running_var.data.astype(x.dtype, copy=False) + eps)
    scale: Any = inv if weight is None else _F.mul(weight, inv)
    mean = running_mean.data.astype(x.dtype, copy=False)
    shift: Any = -mean * inv if weight is None else _F.neg(_F.mul(scale, mean))
    if bias is not None:
        shift = _F.add(bias, shift)
    return _F.add(_F.mul(x, _per_channel(scale, x.ndim)), _per_channel(shift, x.ndim))


def _train(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
           bias: Tensor | None, momentum: float, eps: float, n: int) -> Tensor:
    if weight is None and bias is None:
        out, stats = _B._batch_norm(x.data, eps=eps)
        y = record(_B.batch_norm_plain, (x,), out, aux=stats, params={"eps": eps})
    else:
        c = x.shape[1]
        w = weight if weight is not None else Tensor(np.ones(c, dtype=x.dtype))
        b = bias if bias is not None else Tensor(np.zeros(c, dtype=x.dtype))
        out, stats = _B._batch_norm(x.data, w.data, b.data, eps=eps)
        y = record(_B.batch_norm, (x, w, b), out, aux=stats, params={"eps": eps})
    mean, var = stats[2], stats[3]
    with no_grad():
        if running_mean is not None:
            rm = running_mean.data
            running_mean.copy_(Tensor((1 - momentum) * rm + momentum * mean.astype(rm.dtype, copy=False)))
        if running_var is not None:
            rv = running_var.data
            unbiased = (var * (n / (n - 1))).astype(rv.dtype, copy=False)
            running_var.copy_(Tensor((1 - momentum) * rv + momentum * unbiased))
    return y


def layer_norm(input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise over the last ``len(normalized_shape)`` dims to zero mean and unit
    (biased) variance, then scale by ``weight`` and shift by ``bias``."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[input.ndim - len(shape):]) != shape:
        raise RuntimeError(
            f"Given normalized_shape={list(shape)}, expected input with shape [*, "
            f"{', '.join(map(str, shape))}], but got input of size{list(input.shape)}"
        )
    dims = tuple(range(input.ndim - len(shape), input.ndim))
    if input.dtype.kind == "f" and (bias is None or weight is not None):
        # one node (PyTorch's NativeLayerNormBackward0) instead of eight
        spec, affine = ((_N.layer_norm_plain, ()) if weight is None else
                        (_N.layer_norm_weight, (weight,)) if bias is None else
                        (_N.layer_norm, (weight, bias)))
        out, stats = _N._layer_norm(input.data, *(t.data for t in affine), dims=dims, eps=eps)
        return record(spec, (input, *affine), out, aux=stats, params={"dims": dims, "eps": eps})
    mean = _F.mean(input, dims, keepdim=True)
    var = _F.var(input, dims, correction=0, keepdim=True)
    out = _F.div(_F.sub(input, mean), _F.sqrt(_F.add(var, eps)))
    if weight is not None:
        out = _F.mul(out, weight)
    if bias is not None:
        out = _F.add(out, bias)
    return out


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise each group of ``num_groups`` consecutive channels over its channels and
    positions, then scale and shift per channel, as ``torch.nn.functional.group_norm``."""
    x = input if type(input) is Tensor else Tensor(input)
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got input of "
                           f"shape {list(x.shape)} and num_groups={num_groups}")
    n, c = x.shape[:2]
    rows = _F.reshape(x, (n, num_groups, -1))
    out = _F.reshape(layer_norm(rows, rows.shape[-1:], eps=eps), x.shape)
    if weight is not None:
        out = _F.mul(out, _per_channel(weight, x.ndim))
    if bias is not None:
        out = _F.add(out, _per_channel(bias, x.ndim))
    return out
