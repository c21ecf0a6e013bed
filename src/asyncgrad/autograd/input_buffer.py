"""Input-buffer sums of large gradients, deferred to whoever consumes them.

Note [Deferred sums]: when several gradients reach one input of a node, they are added
in the node's input buffer. The GraphTask's bookkeeping runs on the event loop, so an
eager ``old + g`` of two 4 MB arrays is ~1 ms of the loop's time spent on arithmetic,
and a weight shared by many branches makes that a long stall. So, for large arrays, the
buffer keeps the gradients in a ``PendingSum`` instead, and the sum is done by the node
that consumes the buffer: on a worker thread when that node is offloaded (or when the
commit, for a leaf, is), on the loop otherwise. The additions happen in arrival order
and group exactly as the eager sums would (a pending sum inside another is added as one
term), so results are bit-for-bit those of eager summation.

Note [Input buffers]: an input buffer is a ``list`` with one slot per input of its node
(a gradient, or None). A buffer that holds a ``PendingSum`` is re-typed
``LazyBuffer``, so the engine's hot loop notices it with one type check per node; a
plain list is kept for every other buffer because the hot loop creates one per node and
a list subclass costs four times as much to create. Only this module adds into buffers
(``add_to_buffer``) and resolves them (``resolve``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

LAZY_SUM_MIN = 65_536  # elements; below this, adding on the loop is cheaper than deferring


class PendingSum(list[Any]):
    """Gradients for one input, in arrival order, not yet added together."""

    __slots__ = ()

    @property
    def size(self) -> int:
        """Elements of the sum (what the engine weighs to decide where to add it)."""
        size: int = getattr(self[0], "size", 0)
        return size

    def total(self) -> Any:
        """The sum, left to right, as ``((a + b) + c) + ...`` eagerly would be."""
        out = value(self[0]) + value(self[1])
        for term in self[2:]:
            v = value(term)
            if type(out) is np.ndarray and type(v) is np.ndarray and v.shape == out.shape \
                    and np.result_type(out, v) == out.dtype:
                np.add(out, v, out=out)  # ``out`` is our own fresh array
            else:
                out = out + v
        return out


class LazyBuffer(list[Any]):
    """An input buffer with at least one ``PendingSum`` slot."""

    __slots__ = ()


def combine(old: Any, g: Any) -> Any:
    """``old + g`` for a buffer slot, deferred (a ``PendingSum``) when both are large
    numpy arrays. None means no gradient."""
    if old is None:
        return g
    if g is None:
        return old
    if type(old) is PendingSum:
        old.append(g)
        return old
    if type(old) is np.ndarray and (type(g) is np.ndarray or type(g) is PendingSum) \
            and old.size >= LAZY_SUM_MIN:
        return PendingSum((old, g))
    return old + value(g)


def add_to_buffer(buf: list[Any], nr: int, g: Any) -> list[Any]:
    """Add ``g`` into slot ``nr`` of ``buf``; returns the buffer, re-typed LazyBuffer
    when the sum was deferred."""
    total = combine(buf[nr], g)
    buf[nr] = total
    if type(total) is PendingSum and type(buf) is not LazyBuffer:
        return LazyBuffer(buf)
    return buf


def resolve(buf: list[Any]) -> list[Any]:
    """A plain buffer with every pending sum added (a plain buffer is returned as is)."""
    if type(buf) is not LazyBuffer:
        return buf
    return [value(g) for g in buf]


def value(g: Any) -> Any:
    """One slot's gradient, its pending sum added."""
    return g.total() if type(g) is PendingSum else g
