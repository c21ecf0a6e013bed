"""The MLP used by the mlp, loop_lag and concurrent workloads, written once per
implementation: ``layers`` fused linear layers with ReLU between them, float32, loss
``mean(out * out)``; the parameters (weights and biases) require grad, the input not.

Each ``*_graph`` function runs the forward and returns what its backward needs; each
``*_backward`` runs that backward (the numpy floor's by hand).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def make_params(layers: int, width: int, seed: int = 0) -> list[np.ndarray]:
    """``[W0, b0, W1, b1, ...]`` as float32 arrays, He-style scaled."""
    rng = np.random.default_rng(seed)
    params: list[np.ndarray] = []
    for _ in range(layers):
        params.append((rng.standard_normal((width, width)) * np.sqrt(2.0 / width)).astype(np.float32))
        params.append((rng.standard_normal(width) * 0.01).astype(np.float32))
    return params


def make_input(batch: int, width: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, width)).astype(np.float32)


# --- asyncgrad ------------------------------------------------------------------------------
def ag_params(params: list[np.ndarray]) -> list[Any]:
    import asyncgrad as ag

    return [ag.from_numpy(p.copy()).requires_grad_() for p in params]


def ag_graph(params: list[Any], x: np.ndarray) -> Any:
    import asyncgrad as ag
    from asyncgrad.functional import linear

    h = ag.from_numpy(x)
    n = len(params) // 2
    for i in range(n):
        h = linear(h, params[2 * i], params[2 * i + 1])
        if i < n - 1:
            h = h.relu()
    return (h * h).mean()


# --- PyTorch ----------------------------------------------------------------------------------
def torch_params(params: list[np.ndarray]) -> list[Any]:
    import torch

    return [torch.from_numpy(p.copy()).requires_grad_() for p in params]


def torch_graph(params: list[Any], x: np.ndarray) -> Any:
    import torch
    import torch.nn.functional as F

    h = torch.from_numpy(x)
    n = len(params) // 2
    for i in range(n):
        h = F.linear(h, params[2 * i], params[2 * i + 1])
        if i < n - 1:
            h = torch.relu(h)
    return (h * h).mean()


# --- HIPS autograd ------------------------------------------------------------------------------
def autograd_loss(params: list[Any], x: np.ndarray) -> Any:
    import autograd.numpy as anp

    h = x
    n = len(params) // 2
    for i in range(n):
        h = anp.dot(h, params[2 * i].T) + params[2 * i + 1]
        if i < n - 1:
            h = anp.maximum(h, 0.0)
    return anp.mean(h * h)


def autograd_graph(params: list[np.ndarray], x: np.ndarray) -> tuple[Any, Any]:
    """HIPS autograd's forward: trace ``autograd_loss``; returns ``(vjp, loss)``."""
    import autograd

    return autograd.make_vjp(autograd_loss)(params, x)  # type: ignore[no-any-return]


def autograd_backward(vjp_ans: tuple[Any, Any]) -> Any:
    vjp, ans = vjp_ans
    return vjp(np.ones_like(ans))


# --- the numpy floor ------------------------------------------------------------------------------
def numpy_graph(params: list[np.ndarray], x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The forward, keeping each layer's input (post-ReLU) and the output."""
    h = x
    acts = []
    n = len(params) // 2
    for i in range(n):
        acts.append(h)
        h = h @ params[2 * i].T
        h += params[2 * i + 1]
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return acts, h


def numpy_backward(params: list[np.ndarray], state: tuple[list[np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """The gradients of every parameter, by hand (the input needs none)."""
    acts, out = state
    n = len(params) // 2
    g = out * np.float32(2.0 / out.size)
    grads: list[np.ndarray] = [None] * len(params)  # type: ignore[list-item]
    for i in range(n - 1, -1, -1):
        a = acts[i]
        grads[2 * i] = g.T @ a
        grads[2 * i + 1] = g.sum(axis=0)
        if i > 0:
            g = g @ params[2 * i]
            g *= a > 0  # ReLU of the layer below (its output is this layer's input)
    return grads
