"""The one helper that reduces a broadcast gradient back to an input's shape."""

from __future__ import annotations

import numpy as np


def sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` over the axes that broadcasting added or stretched to reach ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1
    )
    out = g.sum(axis=axes, keepdims=True) if axes else g
    if lead:
        out = out.reshape(shape)
    return out


def is_expandable_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True when ``shape`` broadcasts to ``target`` (PyTorch's ``is_expandable_to``)."""
    if len(shape) > len(target):
        return False
    for a, b in zip(reversed(shape), reversed(target)):
        if a != b and a != 1:
            return False
    return True
