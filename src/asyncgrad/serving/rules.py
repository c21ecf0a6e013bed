"""Per-sample gradient rules: one row per layer type, from the layer's input and the
gradient arriving at its output to each request's own gradient of its parameters.

A rule is ``rule(layer, x, g, segments) -> {parameter name: (requests, *shape) array}``
with ``x`` the layer's first input and ``g`` the gradient of the batch's loss with
respect to its output (both with the batch's rows first). It holds because rows of
different requests do not interact: a request's parameter gradient is the sum of the
per-row terms over its own rows, which ``Segments`` computes for all requests at once.
A layer type without a row here (or a parameter used outside its layer) is served by
one backward per request instead (``batched_pass``). A rule for a new layer is one
``register_per_sample_rule`` call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import nn
from ..nn import Embedding, LayerNorm, Linear, Module
from .segments import Segments

PerSampleRule = Callable[[Module, np.ndarray, np.ndarray, Segments], dict[str, np.ndarray]]

RULES: dict[type[Module], PerSampleRule] = {}


def register_per_sample_rule(layer_type: type[Module], rule: PerSampleRule) -> None:
    """Serve ``per_request_param_grads`` for layers of exactly ``layer_type`` with
    ``rule`` (see the module's docstring for its contract)."""
    if not (isinstance(layer_type, type) and issubclass(layer_type, Module)):
        raise TypeError(f"layer_type must be an ag.nn.Module subclass, got {layer_type!r}")
    if not callable(rule):
        raise TypeError(f"rule must be callable, got {type(rule).__name__}")
    RULES[layer_type] = rule


def rule_for(layer: Module) -> PerSampleRule | None:
    """The rule for ``layer``'s exact type (a subclass may compute something else)."""
    return RULES.get(type(layer))


def _rows_by_features(a: np.ndarray, features: int) -> np.ndarray:
    """``(rows, ..., features) -> (rows, m, features)``."""
    return a.reshape(a.shape[0], -1, features)


def linear(layer: Module, x: np.ndarray, g: np.ndarray, seg: Segments) -> dict[str, np.ndarray]:
    # y = x W^T + b: dW = sum g x^T, db = sum g, over each request's rows (and middle dims)
    w = layer.weight
    g3 = _rows_by_features(g, w.shape[0])
    out = {"weight": seg.outer_sum(g3, _rows_by_features(x, w.shape[1]))}
    if layer.bias is not None:
        out["bias"] = seg.sum(g3[:, 0] if g3.shape[1] == 1 else g3.sum(1))
    return out


def embedding(layer: Module, idx: np.ndarray, g: np.ndarray, seg: Segments) -> dict[str, np.ndarray]:
    # y = W[idx]: each looked-up row of W gets the gradient of its output row
    n, d = layer.weight.shape
    out = np.zeros((seg.count, n, d), dtype=g.dtype)
    owner = np.broadcast_to(seg.owner.reshape(-1, *(1,) * (idx.ndim - 1)), idx.shape)
    np.add.at(out, (owner.ravel(), idx.ravel()), g.reshape(-1, d))
    if layer.padding_idx is not None:
        out[:, layer.padding_idx] = 0
    return {"weight": out}


def layer_norm(layer: Module, x: np.ndarray, g: np.ndarray, seg: Segments) -> dict[str, np.ndarray]:
    # y = x_hat * w + b: dw = sum g * x_hat, db = sum g (x_hat recomputed from x)
    shape = tuple(layer.normalized_shape)
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(dims, keepdims=True)
    x_hat = (x - mean) / np.sqrt(x.var(dims, keepdims=True) + layer.eps)
    per_row = (x.shape[0], -1, *shape)
    out = {}
    if layer.weight is not None:
        out["weight"] = seg.sum((g * x_hat).reshape(per_row).sum(1))
    if layer.bias is not None:
        out["bias"] = seg.sum(g.reshape(per_row).sum(1))
    return out


def _conv_padding(layer: Module, dims: int) -> list[tuple[int, int]]:
    """(before, after) per spatial dim, as the layer pads its input."""
    widths = getattr(layer, "_reversed_padding_repeated_twice", None)
    if widths is None:
        pad = layer.padding if isinstance(layer.padding, tuple) else (0,) * dims
        return [(p, p) for p in pad]
    pairs = [(widths[2 * i], widths[2 * i + 1]) for i in range(dims)]
    return pairs[::-1]


_NUMPY_PAD: dict[str, Any] = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def conv(layer: Module, x: np.ndarray, g: np.ndarray, seg: Segments) -> dict[str, np.ndarray]:
    # y[o, p] = sum_{c, k} W[o, c, k] x_window[c, p, k] (+ b[o]), per group: dW = sum g x_window
    w = layer.weight
    dims = w.ndim - 2
    groups = layer.groups
    xp = np.pad(x, [(0, 0), (0, 0), *_conv_padding(layer, dims)], mode=_NUMPY_PAD[layer.padding_mode])
    spans = [d * (k - 1) + 1 for d, k in zip(layer.dilation, layer.kernel_size)]
    win = np.lib.stride_tricks.sliding_window_view(xp, spans, axis=tuple(range(2, 2 + dims)))
    out_shape = g.shape[2:]
    index = (slice(None), slice(None), *(slice(0, o * s, s) for o, s in zip(out_shape, layer.stride)),
             *(slice(None, None, d) for d in layer.dilation))
    win = win[index]  # (rows, C_in, *out, *kernel)
    n, c_in = x.shape[:2]
    positions, taps = int(np.prod(out_shape)), int(np.prod(layer.kernel_size))
    win = win.reshape(n, groups, c_in // groups, positions, taps)
    g5 = g.reshape(n, groups, -1, positions)
    dw = seg.contract("gop,gcpk->gock", g5, win)  # (requests, groups, C_out/g, C_in/g, taps)
    out = {"weight": dw.reshape(seg.count, *w.shape)}
    if layer.bias is not None:
        out["bias"] = seg.sum(g.reshape(n, g.shape[1], -1).sum(2))
    return out


def group_norm(layer: Module, x: np.ndarray, g: np.ndarray, seg: Segments) -> dict[str, np.ndarray]:
    # y = x_hat * w[c] + b[c], x_hat normalised per (row, group): dw = sum g * x_hat over positions
    n, c = x.shape[:2]
    xg = x.reshape(n, layer.num_groups, -1)
    x_hat = ((xg - xg.mean(2, keepdims=True)) / np.sqrt(xg.var(2, keepdims=True) + layer.eps)).reshape(x.shape)
    out = {}
    if layer.weight is not None:
        out["weight"] = seg.sum((g * x_hat).reshape(n, c, -1).sum(2))
    if layer.bias is not None:
        out["bias"] = seg.sum(g.reshape(n, c, -1).sum(2))
    return out


# the rules above, each returning new arrays (no view of ``x``, ``g`` or another result)
FRESH_RULES: frozenset[PerSampleRule] = frozenset({linear, embedding, layer_norm, conv, group_norm})

register_per_sample_rule(Linear, linear)
register_per_sample_rule(Embedding, embedding)
register_per_sample_rule(LayerNorm, layer_norm)
register_per_sample_rule(nn.Conv1d, conv)
register_per_sample_rule(nn.Conv2d, conv)
register_per_sample_rule(nn.GroupNorm, group_norm)
