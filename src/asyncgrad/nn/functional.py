"""``ag.nn.functional``: the stateless forms of the layers, as ``torch.nn.functional``.

``relu``, ``gelu``, ``softmax``, ``log_softmax``, ``cross_entropy``, ``nll_loss``,
``mse_loss``, ``linear`` and ``layer_norm`` are asyncgrad's primitives (one node each);
``scaled_dot_product_attention`` is one where PyTorch's fused kernel applies (Note [Fused
attention] in ops/attention.py) and a composite otherwise; ``dropout`` and ``embedding``
are composites of primitives.
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence

import numpy as np

from .. import functional as _F
from ..functional import (
    cross_entropy, gelu, linear, log_softmax, mse_loss, nll_loss, sigmoid, softmax, tanh,
)
from ..autograd.recording import record
from ..ops import attention as _A
from ..ops import nn as _N
from ..random import Generator, default_generator
from ..tensor import Tensor
from ._functional_conv import conv1d, conv2d, conv_transpose2d
from ._functional_norm import batch_norm, group_norm
from ._functional_pooling import adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d
from ._functional_resample import interpolate, pad


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """``max(input, 0)``; with ``inplace``, written into ``input`` (which is returned),
    with the usual in-place rules (not on a leaf that requires grad)."""
    return input.relu_() if inplace else _F.relu(input)


def relu_(input: Tensor) -> Tensor:
    """``relu`` in place."""
    return input.relu_()


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


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``softmax(query @ key.mT * scale + mask) @ value`` over the last two dims, as
    ``torch.nn.functional.scaled_dot_product_attention`` (its math reference).

    ``attn_mask`` is a bool mask (True: may attend) or a float bias added to the scores
    (differentiable), broadcast to ``(..., L, S)``; ``is_causal`` masks the upper triangle
    (and excludes ``attn_mask``). ``scale`` defaults to ``1 / sqrt(E)``. A query row that
    may attend to nothing gives zeros (and zero gradients), as PyTorch does. ``dropout_p``
    drops attention weights with asyncgrad's default generator (always, as PyTorch: pass
    0.0 in eval). ``enable_gqa`` lets ``key``/``value`` have fewer heads (dim -3) than
    ``query``, each shared by a group of query heads.

    Without dropout, a float mask or broadcast batch dims, float32/float64 attention is
    one node (``ScaledDotProductFlashAttentionForCpuBackward0``, PyTorch's name for its
    CPU kernel); otherwise it is recorded as the primitives above.
    """
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(
            f"Expected query, key, and value to have the same dtype, but got query.dtype: {query.dtype} "
            f"key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(
            f"scaled_dot_product_attention: query {list(query.shape)}, key {list(key.shape)} and value "
            f"{list(value.shape)} do not fit: need query[-1] == key[-1] and key[-2] == value[-2]")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if heads % kv_heads or value.shape[-3] != kv_heads:
            raise RuntimeError(
                f"scaled_dot_product_attention: number of heads in key/value ({kv_heads}/{value.shape[-3]}) "
                f"must divide the number of heads in query ({heads})")
        groups = np.repeat(np.arange(kv_heads), heads // kv_heads)  # repeat_interleave
        key = _F.getitem(key, (Ellipsis, groups, slice(None), slice(None)))
        value = _F.getitem(value, (Ellipsis, groups, slice(None), slice(None)))
    length, source = query.shape[-2], key.shape[-2]
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    fused = _fused_attention(query, key, value, attn_mask, dropout_p, is_causal, factor)
    if fused is not None:
        return fused
    scores = _F.mul(_F.matmul(query, _F.transpose(key, -2, -1)), factor)
    allowed: np.ndarray | None = None
    if is_causal:
        allowed = np.tri(length, source, 0, dtype=bool)
    elif attn_mask is not None:
        mask_data = attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        if mask_data.dtype == np.bool_:
            allowed = mask_data
        else:
            scores = _F.add(scores, attn_mask)
    if allowed is not None:
        scores = _F.where(allowed, scores, -np.inf)
    # PyTorch's safe softmax: a row with no finite score attends to nothing
    empty = np.isneginf(scores.data).all(axis=-1, keepdims=True)
    if empty.any():
        scores = _F.where(empty, 0.0, scores)
    weights = _F.softmax(scores, -1)
    if empty.any():
        weights = _F.where(empty, 0.0, weights)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p, training=True)
    return _F.matmul(weights, value)


def _fused_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any, dropout_p: float,
                     is_causal: bool, scale: float) -> Tensor | None:
    """Attention as one node (Note [Fused attention] in ops/attention.py) where it
    applies: no dropout, no mask, a causal mask or a bool mask that broadcasts to the
    scores; else None (the composite)."""
    if dropout_p > 0.0 or not _A.fusable(query.data, key.data, value.data):
        return None
    allowed = None
    if attn_mask is not None:
        allowed = np.asarray(attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask)
        scores = (*query.shape[:-1], key.shape[-2])
        if allowed.dtype != np.bool_ or allowed.ndim > len(scores):
            return None
        try:
            if np.broadcast_shapes(allowed.shape, scores) != scores:
                return None
        except ValueError:
            return None
        allowed = allowed.copy()  # the node keeps it: later changes to the caller's mask do not reach it
    params = {"scale": scale, "causal": is_causal, "allowed": allowed}
    out, weights = _A._attention(query.data, key.data, value.data, **params)
    return record(_A.attention, (query, key, value), out, aux=weights, params=params)


__all__ = [
    "cross_entropy", "dropout", "embedding", "gelu", "layer_norm", "linear", "log_softmax",
    "mse_loss", "nll_loss", "relu", "relu_", "scaled_dot_product_attention", "sigmoid", "softmax", "tanh",
]
__all__ += [  # image layers (issue 32)
    "adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool2d", "batch_norm", "conv1d", "conv2d",
    "conv_transpose2d", "group_norm", "interpolate", "max_pool2d", "pad",
]


# More activations, vector functions and losses (issue 32; in nn/activations.py)
from .activations import (  # noqa: E402
    binary_cross_entropy, binary_cross_entropy_with_logits, celu, cosine_similarity, elu, glu,
    hardsigmoid, hardswish, hardtanh, huber_loss, kl_div, l1_loss, leaky_relu, logsigmoid, mish,
    normalize, one_hot, pairwise_distance, relu6, selu, silu, smooth_l1_loss, softmin, softplus,
    softsign, tanhshrink,
)
__all__ += [
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "celu", "cosine_similarity", "elu",
    "glu", "hardsigmoid", "hardswish", "hardtanh", "huber_loss", "kl_div", "l1_loss", "leaky_relu",
    "logsigmoid", "mish", "normalize", "one_hot", "pairwise_distance", "relu6", "selu", "silu",
    "smooth_l1_loss", "softmin", "softplus", "softsign", "tanhshrink"
]
