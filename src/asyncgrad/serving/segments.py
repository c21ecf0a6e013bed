"""A batch's rows as consecutive segments, one per request, and the sums over them.

Every per-request quantity is a sum over the request's rows of a per-row quantity, so
the few contractions here (a segment sum, a segment sum of outer products) are all the
per-sample rules need. None loops over rows; the outer products loop over requests only
when their row counts differ (equal ones are one batched matrix product)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Segments:
    """Requests of ``sizes`` rows each, in batch order. Never changed once made (a pass
    may reuse the Segments of an earlier batch of the same sizes)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = _frozen(np.asarray(sizes, dtype=np.int64))
        self.count = len(self.sizes)
        self.rows = int(self.sizes.sum())
        ends = np.cumsum(self.sizes)
        self.starts = _frozen(ends - self.sizes)
        self.cuts = [(int(a), int(b)) for a, b in zip(self.starts, ends)]  # each request's rows, as slice bounds
        self.equal = bool((self.sizes == self.sizes[0]).all())
        self.owner = _frozen(np.repeat(np.arange(self.count), self.sizes))  # the request of each row
        self._weights: dict[np.dtype[Any], np.ndarray] = {}

    def split(self, a: np.ndarray) -> list[np.ndarray]:
        """``a``'s rows, one piece (a view) per request."""
        return [a[s:e] for s, e in self.cuts]

    def weights(self, dtype: np.dtype[Any]) -> np.ndarray:
        """``1 / rows`` of its request for each row (read-only): the weights that make
        the sum of the rows' losses the sum of the requests' mean losses."""
        w = self._weights.get(dtype)
        if w is None:
            w = self._weights[dtype] = _frozen(np.repeat(1.0 / self.sizes, self.sizes).astype(dtype))
        return w

    def sum(self, a: np.ndarray) -> np.ndarray:
        """``(rows, ...) -> (requests, ...)``: each request's rows summed."""
        if self.equal:
            return a.reshape(self.count, -1, *a.shape[1:]).sum(1)
        return np.add.reduceat(a, self.starts, axis=0)

    def rows_with(self, mask: np.ndarray) -> np.ndarray:
        """Which requests have a row where ``mask`` (one bool per row) holds."""
        return self.sum(mask.astype(np.int64)) > 0

    def contract(self, subscripts: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per request, ``einsum(subscripts)`` of ``a`` and ``b`` (``subscripts`` written for
        one row, without the row index) summed over the request's rows."""
        ins, out = subscripts.split("->")
        left, right = ins.split(",")
        if self.equal:
            shape = (self.count, -1)
            return np.einsum(f"Rn{left},Rn{right}->R{out}", a.reshape(*shape, *a.shape[1:]),
                             b.reshape(*shape, *b.shape[1:]), optimize=True)
        return np.stack([np.einsum(f"n{left},n{right}->{out}", a[s:s + n], b[s:s + n], optimize=True)
                         for s, n in zip(self.starts, self.sizes)])

    def outer_sum(self, g: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``g (rows, m, o)``, ``x (rows, m, i)`` -> ``(requests, o, i)``: per request the sum
        over its rows and ``m`` of ``g[..., :, None] * x[..., None, :]``."""
        o, i = g.shape[-1], x.shape[-1]
        if self.equal:
            gs = g.reshape(self.count, -1, o)
            xs = x.reshape(self.count, -1, i)
            return np.matmul(gs.transpose(0, 2, 1), xs)
        out = np.empty((self.count, o, i), dtype=np.result_type(g, x))
        for r, (a, n) in enumerate(zip(self.starts, self.sizes)):
            np.matmul(g[a:a + n].reshape(-1, o).T, x[a:a + n].reshape(-1, i), out=out[r])
        return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
