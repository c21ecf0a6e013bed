"""``ag.nn.functional``: the stateless forms of the layers, as ``torch.nn.functional``.

``relu``, ``gelu``, ``softmax``, ``log_softmax``, ``cross_entropy``, ``nll_loss``,
``mse_loss``, ``linear`` and ``layer_norm`` are asyncgrad's primitives (one node each);
``dropout`` and ``embedding`` are composites of primitives.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import numpy as np

from .. import functional as _F
from ..functional import (
    cross_entropy, gelu, linear, log_softmax, mse_loss, nll_loss, relu, sigmoid, softmax, tanh,
)
from ..autograd.recording import record
from ..ops import nn as _N
from ..random import Generator, default_generator
from ..tensor import Tensor


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False,
            generator: Generator | None = None) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``;
    the identity when not ``training``.

    The mask comes from asyncgrad's default generator (or ``generator``), so
    ``ag.manual_seed`` makes it reproducible and checkpointing, which saves and restores
    that generator's state, recomputes the same mask.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if inplace:
        raise NotImplementedError("asyncgrad's dropout has no in-place form; use inplace=False")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return _F.mul(input, 0.0)
    gen = generator or default_generator
    with gen._lock:  # one generator may serve tasks on several threads
        keep = gen.rng.random(input.shape) >= p
    scale = np.asarray(1.0 / (1.0 - p), dtype=input.dtype)
    return _F.mul(input, keep.astype(input.dtype) * scale)


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


def embedding(input: Any, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` picked by the integer ``input`` (any shape); the output has
    shape ``input.shape + (embedding_dim,)``. Rows at ``padding_idx`` get no gradient."""
    idx = np.asarray(input.data if isinstance(input, Tensor) else input)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the following scalar "
                           f"types: Long, Int; but got {idx.dtype} instead")
    n = weight.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError("index out of range in self")
    out = _F.getitem(weight, idx)
    if padding_idx is not None:
        pad = padding_idx + n if padding_idx < 0 else padding_idx
        mask = (idx == pad)[..., None]
        if mask.any():
            out = _F.where(mask, out.detach(), out)
    return out


__all__ = [
    "cross_entropy", "dropout", "embedding", "gelu", "layer_norm", "linear", "log_softmax",
    "mse_loss", "nll_loss", "relu", "sigmoid", "softmax", "tanh",
]
