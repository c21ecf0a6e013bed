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

import numpy as np

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
        out["bias"] = seg.sum(g3.sum(1))
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


register_per_sample_rule(Linear, linear)
register_per_sample_rule(Embedding, embedding)
register_per_sample_rule(LayerNorm, layer_norm)
