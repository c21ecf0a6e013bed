"""The adjoint of indexing: zeros of a shape with a gradient added at an index.

For rows picked by one integer array (an embedding lookup, ``x[idx]``), repeated rows are
summed by sorting the indices and one ``np.add.reduceat`` over the sorted gradient rows,
instead of ``np.add.at``, which adds one row at a time: 0.28 against 1.24 ms for an
embedding of 65 x 128 looked up at 16 x 64 tokens here (``np.bincount`` per column: 0.64
ms; it also loses to add.at for large vocabularies). Other indices use ``np.add.at``.
With the compiled kernels loaded (``ops/kernels/loader.py``), float rows are added by one loop
over the indices in order instead: no sort, the same summation order every time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .kernels import compiled_path as fast


def index_add_zeros(g: np.ndarray, index: Any, shape: tuple[int, ...], basic: bool) -> np.ndarray:
    """Zeros of ``shape`` (``g``'s dtype) with ``g`` added at ``index``; repeated
    positions of an advanced index accumulate."""
    out = np.zeros(shape, dtype=g.dtype)
    if basic:
        out[index] = g
    elif _row_index(index, g, shape):
        _add_rows(out.reshape(shape[0], -1), index.reshape(-1), g.reshape(index.size, -1))
    else:
        np.add.at(out, index, g)
    return out


def _row_index(index: Any, g: np.ndarray, shape: tuple[int, ...]) -> bool:
    """True for one non-empty integer array picking whole rows (axis 0) of ``shape``."""
    return (type(index) is np.ndarray and index.dtype.kind in "iu" and index.size > 0 and g.size > 0
            and len(shape) >= 1 and g.shape == index.shape + shape[1:])


def _add_rows(out: np.ndarray, rows: np.ndarray, g: np.ndarray) -> None:
    """``out[rows[i]] += g[i]`` for every i, repeated rows summed (out is 2-D, zeros)."""
    if fast.add_rows(out, rows, g):  # compiled: a loop over the rows in order
        return
    if rows.dtype.kind == "i" and rows.min() < 0:  # -1 and n-1 are one row
        rows = np.where(rows < 0, rows + out.shape[0], rows)
    order = np.argsort(rows, kind="stable")  # stable: a deterministic summation order
    sorted_rows = rows[order]
    first = np.empty(sorted_rows.size, dtype=bool)
    first[0] = True
    np.not_equal(sorted_rows[1:], sorted_rows[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    out[sorted_rows[starts]] = np.add.reduceat(g[order], starts, axis=0)
