"""The arithmetic of a fused run (Note [Fused runs] in autograd/sched/runs.py): each factor
rule's factors for many nodes at once, from their saved values stacked, and the running
products of the gradient with them, row after row."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from ._spec import GradFactor

# by factor: the rows it fills (numbered from 1) and the value it reads for each
Groups = dict[GradFactor, tuple[list[int], list[Any]]]
_shape = attrgetter("shape")


def _stacked(values: list[np.ndarray], like: np.ndarray) -> np.ndarray:
    """``values`` (arrays of ``like``'s shape, or 0-d, of its dtype) stacked on a new
    first axis; the one array, to broadcast, when they all are that array (a multiplier
    every node uses)."""
    first = values[0]
    shape = like.shape
    for v in values:
        if v is not first:
            break
    else:
        return first
    if len(shape) and set(map(_shape, values)) == {shape}:
        # (one C call: np.stack expands each array in Python first)
        return np.concatenate(values).reshape((len(values),) + shape)
    return np.stack([np.broadcast_to(v, shape) for v in values])


def error_modes() -> dict[str, Any]:
    """numpy's floating-point error modes for a run's arithmetic: each event the caller's
    modes ignore is ignored, any other raises (and the run falls back)."""
    return {event: "ignore" if mode == "ignore" else "raise" for event, mode in np.geterr().items()}


def run_product(math: Any, g: Any, rows: int, groups: Groups, modes: dict[str, Any]) -> Any:
    """``g`` times the ``rows`` factors of a run, in row order: ``groups[factor]`` holds
    the rows that factor fills and the value it reads for each (``g`` itself for no
    row). None if ``g`` is not a numpy array, or numpy met a floating-point event on the
    way that the caller's modes (``error_modes``) do not ignore."""
    if not rows:
        return g
    if type(g) is not np.ndarray:
        return None
    products = np.empty((rows + 1,) + g.shape, dtype=g.dtype)
    products[0] = g
    try:
        with np.errstate(**modes):
            for factor, (at, values) in groups.items():
                stacked = _stacked(values, g)
                products[at] = stacked if factor.fn is None else factor.fn(math, stacked)
            np.multiply.accumulate(products, axis=0, out=products)
    except FloatingPointError:
        return None
    return products[rows].copy()
