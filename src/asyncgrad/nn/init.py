"""Parameter initialisation, as ``torch.nn.init``: each function fills a tensor in place
(under ``no_grad``, bumping its version) from asyncgrad's default generator, and returns it."""

from __future__ import annotations

import math
import numpy as np

from ..grad_mode import no_grad
from ..random import Generator, default_generator
from ..tensor import Tensor


def _fill(t: Tensor, arr: np.ndarray) -> Tensor:
    with no_grad():
        t.copy_(Tensor._wrap(np.asarray(arr, dtype=t.dtype)))
    return t


def _rng(generator: Generator | None) -> np.random.Generator:
    return (generator or default_generator).rng


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for ``nonlinearity`` (as ``torch.nn.init.calculate_gain``)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def calculate_fan_in_and_fan_out(t: Tensor) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight tensor, as PyTorch computes them."""
    if t.ndim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive = int(np.prod(t.shape[2:])) if t.ndim > 2 else 1
    return t.shape[1] * receptive, t.shape[0] * receptive


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with samples from ``U(a, b)``; returns ``t``."""
    return _fill(t, _rng(generator).uniform(a, b, t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with samples from ``N(mean, std**2)``; returns ``t``."""
    return _fill(t, _rng(generator).normal(mean, std, t.shape))


def constant_(t: Tensor, val: float) -> Tensor:
    """Fill ``t`` in place with ``val``; returns ``t``."""
    return _fill(t, np.full(t.shape, val))


def zeros_(t: Tensor) -> Tensor:
    """Fill ``t`` in place with zeros; returns ``t``."""
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    """Fill ``t`` in place with ones; returns ``t``."""
    return constant_(t, 1.0)


def kaiming_uniform_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Generator | None = None) -> Tensor:
    """U(-bound, bound) with ``bound = gain * sqrt(3 / fan)``; ``a=sqrt(5)`` (what
    ``Linear`` uses) gives ``bound = 1 / sqrt(fan_in)``."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        return t
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return uniform_(t, -bound, bound, generator)


def kaiming_normal_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with He-normal samples (``std = gain / sqrt(fan)``); returns ``t``."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        return t
    return normal_(t, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan), generator)


def xavier_uniform_(t: Tensor, gain: float = 1.0, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with Glorot-uniform samples; returns ``t``."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound, generator)


def xavier_normal_(t: Tensor, gain: float = 1.0, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with Glorot-normal samples; returns ``t``."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def trunc_normal_(t: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with normal samples kept within ``[a, b]`` (redrawn until they
    are); returns ``t``."""
    rng = _rng(generator)
    out = rng.normal(mean, std, t.shape)
    bad = (out < a) | (out > b)
    while bad.any():
        out[bad] = rng.normal(mean, std, int(bad.sum()))
        bad = (out < a) | (out > b)
    return _fill(t, out)


def orthogonal_(t: Tensor, gain: float = 1.0, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` (at least 2-D, flattened to ``(rows, rest)``) in place with a (semi-)
    orthogonal matrix times ``gain``; returns ``t``."""
    if t.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    rows = t.shape[0]
    cols = t.data.size // rows
    flat = _rng(generator).standard_normal((rows, cols))
    q, r = np.linalg.qr(flat.T if rows < cols else flat)
    q = q * np.sign(np.diag(r))  # a uniform distribution over orthogonal matrices
    return _fill(t, gain * (q.T if rows < cols else q).reshape(t.shape))


def eye_(t: Tensor) -> Tensor:
    """Fill the 2-D ``t`` in place with the identity; returns ``t``."""
    if t.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(t, np.eye(t.shape[0], t.shape[1]))


__all__ = [
    "calculate_fan_in_and_fan_out", "calculate_gain", "constant_", "eye_", "kaiming_normal_", "kaiming_uniform_",
    "normal_", "ones_", "orthogonal_", "trunc_normal_", "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_",
]
