"""Attention layers: ``MultiheadAttention``, ``TransformerEncoderLayer`` and
``TransformerEncoder``, with PyTorch's signatures, defaults, numerics and ``state_dict``
keys (``in_proj_weight``, ``in_proj_bias``, ``out_proj.weight``...; ``layers.0.self_attn...``),
so a PyTorch checkpoint loads as it is.

Masks follow ``torch.nn.MultiheadAttention``: a bool ``attn_mask`` or ``key_padding_mask``
is True where attention is *not* allowed, a float one is added to the scores. Without
``need_weights`` the attention runs through ``nn.functional.scaled_dot_product_attention``
(one node when the mask is only 0 / -inf, Note [Fused attention] in ops/attention.py).
"""

from __future__ import annotations

import copy
import math
from typing import Any
from collections.abc import Callable

import numpy as np

from .. import functional as _F
from .._dtype import get_default_dtype
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import Dropout, LayerNorm, Linear
from .module import Module, ModuleList, Parameter


def _as_float_mask(mask: Any, dtype: np.dtype, what: str) -> np.ndarray | Tensor | None:
    """A mask as a float bias: bool True (not allowed) becomes -inf; a float one is kept."""
    if mask is None:
        return None
    data = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if data.dtype == np.bool_:
        return np.where(data, -np.inf, 0.0).astype(dtype)
    if data.dtype.kind != "f":
        raise AssertionError(f"only bool and floating types of {what} are supported")
    return mask if isinstance(mask, Tensor) else data.astype(dtype)


class MultiheadAttention(Module):
    """Attention from ``num_heads`` heads of ``embed_dim // num_heads`` features each, as
    ``torch.nn.MultiheadAttention``: ``out, weights = mha(query, key, value, ...)``.

    ``query`` is ``(L, N, E)`` (``(N, L, E)`` with ``batch_first``, ``(L, E)`` unbatched);
    ``weights`` is ``(N, L, S)`` averaged over heads (``average_attn_weights``), or
    ``(N, num_heads, L, S)``, or None without ``need_weights``. ``kdim``/``vdim`` other than
    ``embed_dim`` give separate ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``.
    ``add_bias_kv`` and ``add_zero_attn`` are not supported.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads} instead")
        if embed_dim % num_heads:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("asyncgrad's MultiheadAttention has no add_bias_kv / add_zero_attn")
        if device is not None:
            from .._device import check_device

            check_device(device)
        dtype = dtype or get_default_dtype()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(np.empty((3 * embed_dim, embed_dim), dtype=dtype))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = Parameter(np.empty((embed_dim, embed_dim), dtype=dtype))
            self.k_proj_weight = Parameter(np.empty((embed_dim, self.kdim), dtype=dtype))
            self.v_proj_weight = Parameter(np.empty((embed_dim, self.vdim), dtype=dtype))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(np.empty(3 * embed_dim, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            if query is key and key is value:  # self-attention: one product
                q, k, v = _F.chunk(F.linear(query, w, b), 3, -1)
                return q, k, v
            return (F.linear(query, w[:e], bq), F.linear(key, w[e:2 * e], bk), F.linear(value, w[2 * e:], bv))
        return (F.linear(query, self.q_proj_weight, bq), F.linear(key, self.k_proj_weight, bk),
                F.linear(value, self.v_proj_weight, bv))

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                               "module method `generate_square_subsequent_mask` to create this mask.")
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {query.ndim}-D "
                                 f"query tensor, with key {key.ndim}-D and value {value.ndim}-D")
        if query.shape[-1] != self.embed_dim:
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but got "
                                 f"{query.shape[-1]}")
        self_attention = query is key and key is value
        if not batched:
            query, key, value = (_F.unsqueeze(t, 1) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = (_F.unsqueeze(key_padding_mask, 0) if isinstance(key_padding_mask, Tensor)
                                    else np.asarray(key_padding_mask)[None])
        elif self.batch_first:
            query, key, value = (_F.transpose(t, 0, 1) for t in (query, key, value))
        if self_attention:
            key = value = query
        length, batch, e = query.shape
        source = key.shape[0]
        heads, hd = self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)
        # (L, N, E) -> (N, heads, L, hd)
        q, k, v = (_F.permute(_F.reshape(t, (t.shape[0], batch, heads, hd)), (1, 2, 0, 3)) for t in (q, k, v))
        mask = self._merged_mask(attn_mask, key_padding_mask, batch, length, source, q.dtype)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            scores = _F.matmul(_F.mul(q, math.sqrt(1.0 / hd)), _F.transpose(k, -2, -1))
            if mask is not None:
                scores = _F.add(scores, mask)
            weights = _F.softmax(scores, -1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, dropout_p)
            out = _F.matmul(weights, v)
        else:
            weights = None
            allowed: Any = mask
            if mask is not None and not isinstance(mask, Tensor) and np.isin(mask, (0.0, -np.inf)).all():
                allowed = mask == 0.0  # a 0 / -inf mask as the bool mask the fused kernel takes
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
        out = _F.reshape(_F.permute(out, (2, 0, 1, 3)), (length, batch, e))
        out = self.out_proj(out)
        if weights is not None and average_attn_weights:
            weights = _F.mean(weights, 1)
        if not batched:
            out = _F.squeeze(out, 1)
            if weights is not None:
                weights = _F.squeeze(weights, 0)
        elif self.batch_first:
            out = _F.transpose(out, 0, 1)
        return out, weights

    def _merged_mask(self, attn_mask: Any, key_padding_mask: Any, batch: int, length: int, source: int,
                     dtype: np.dtype) -> Any:
        """``attn_mask`` and ``key_padding_mask`` as one float bias broadcasting to
        ``(N, heads, L, S)``, or None."""
        mask = _as_float_mask(attn_mask, dtype, "attn_mask")
        if mask is not None:
            if mask.ndim == 2:
                if tuple(mask.shape) != (length, source):
                    raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(mask.shape)}, but should be "
                                       f"{(length, source)}.")
            elif mask.ndim == 3:
                if tuple(mask.shape) != (batch * self.num_heads, length, source):
                    raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(mask.shape)}, but should be "
                                       f"{(batch * self.num_heads, length, source)}.")
                mask = _F.reshape(mask, (batch, self.num_heads, length, source)) if isinstance(mask, Tensor) \
                    else mask.reshape(batch, self.num_heads, length, source)
            else:
                raise RuntimeError(f"attn_mask's dimension {mask.ndim} is not supported")
        padding = _as_float_mask(key_padding_mask, dtype, "key_padding_mask")
        if padding is not None:
            if tuple(padding.shape) != (batch, source):
                raise AssertionError(f"expecting key_padding_mask shape of {(batch, source)}, but got "
                                     f"{tuple(padding.shape)}")
            padding = (_F.reshape(padding, (batch, 1, 1, source)) if isinstance(padding, Tensor)
                       else padding.reshape(batch, 1, 1, source))
            mask = padding if mask is None else (
                _F.add(mask, padding) if isinstance(mask, Tensor) or isinstance(padding, Tensor) else mask + padding)
        return mask

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def _activation(name: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    if callable(name):
        return name
    raise RuntimeError(f"activation should be relu/gelu, not {name}")


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, each with a residual connection and a
    LayerNorm (after each block, or before with ``norm_first``), as
    ``torch.nn.TransformerEncoderLayer``."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)
        self.batch_first = batch_first

    def forward(self, src: Tensor, src_mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = _F.add(x, self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal))
            x = _F.add(x, self._ff_block(self.norm2(x)))
        else:
            x = self.norm1(_F.add(x, self._sa_block(x, src_mask, src_key_padding_mask, is_causal)))
            x = self.norm2(_F.add(x, self._ff_block(x)))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        out = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                             need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(out)  # type: ignore[no-any-return]

    def _ff_block(self, x: Tensor) -> Tensor:
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)  # type: ignore[no-any-return]


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (deep copies, as PyTorch), then
    ``norm`` if given, as ``torch.nn.TransformerEncoder``."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Tensor, mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool | None = None) -> Tensor:
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        if self.norm is not None:
            out = self.norm(out)
        return out


def generate_square_subsequent_mask(sz: int, dtype: Any = None) -> Tensor:
    """The causal float mask ``(sz, sz)``: 0 on and below the diagonal, -inf above
    (``torch.nn.Transformer.generate_square_subsequent_mask``)."""
    dt = np.dtype(dtype or get_default_dtype())
    return Tensor._wrap(np.triu(np.full((sz, sz), -np.inf, dtype=dt), 1))


__all__ = ["MultiheadAttention", "TransformerEncoder", "TransformerEncoderLayer",
           "generate_square_subsequent_mask"]
