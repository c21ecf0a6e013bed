"""Input buffers: where the gradients that reach one node are added up.

Note [Input buffers]: a node that receives several gradients (several incoming edges, or
several inputs) gets an :class:`InputBuffer` while it waits for them, with one slot per
input; it is the only thing that adds into a slot (``add``) and adds up what it
deferred (``resolve``). A node that becomes ready with its one and only gradient gets
no buffer: the gradient passes through as a one-slot list, as in PyTorch, whose
InputBuffer exists only for nodes not yet ready. This keeps the engine's hot loop as
fast as plain lists: a node with one incoming edge (most nodes) allocates nothing but
its list of inputs.

What the ready queue carries for a node, its *ready inputs*, is therefore a plain list
of gradients, or the node's InputBuffer itself while it still holds a deferred sum
(``InputBuffer.ready``). Whoever runs the node calls ``inputs_of`` (one type check) to
get the list, on the loop or on a worker thread.

Note [Deferred sums]: when several gradients reach one input of a node, they are added
in its input buffer. The GraphTask's bookkeeping runs on the event loop, where an eager
``old + g`` of two large arrays is the loop's time spent on arithmetic, and a weight
shared by many branches makes that a long stall. So, for large arrays, the buffer keeps
the gradients in a ``PendingSum`` instead, and the sum is done by the node that consumes
the buffer: on a worker thread when that node is offloaded (or when the commit, for a
leaf, is), on the loop otherwise. The additions happen in arrival order and group
exactly as the eager sums would (a pending sum inside another is added as one term), so
results are bit-for-bit those of eager summation.
"""

from __future__ import annotations

from typing import Any

from ...backend import xp

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
        """The sum, left to right, as ``((a + b) + c) + ...`` eagerly would be. The
        result is always a fresh array that nobody else holds (task/commit.py may adopt it
        as a ``.grad`` without a copy)."""
        array = xp.array_type
        out = value(self[0]) + value(self[1])
        for term in self[2:]:
            v = value(term)
            if type(out) is array and type(v) is array and v.shape == out.shape \
                    and xp.result_type(out, v) == out.dtype:
                xp.add_into(out, v)  # ``out`` is our own fresh array
            else:
                out = out + v
        return out


class InputBuffer:
    """The gradients a waiting node has received so far: one slot per input (None for
    no gradient yet), and whether a slot holds a deferred sum (Note [Input buffers])."""

    __slots__ = ("grads", "deferred")

    def __init__(self, size: int, nr: int, g: Any) -> None:
        """A buffer of ``size`` slots whose first gradient, ``g``, is for input ``nr``."""
        grads: list[Any] = [None] * size
        grads[nr] = g
        self.grads = grads
        self.deferred = False

    def add(self, nr: int, g: Any) -> None:
        """Add ``g`` (or None) into slot ``nr``, deferring the sum of large arrays."""
        total = combine(self.grads[nr], g)
        self.grads[nr] = total
        if type(total) is PendingSum:
            self.deferred = True

    def ready(self) -> ReadyInputs:
        """What the ready queue carries once the node has every gradient: the list of
        gradients, or this buffer while a sum in it is still deferred."""
        return self if self.deferred else self.grads

    def resolve(self) -> list[Any]:
        """The gradients, every deferred sum added (a new list; the buffer is spent)."""
        return [value(g) for g in self.grads]

    def __repr__(self) -> str:
        return f"InputBuffer({self.grads!r})"


#: a ready node's inputs: a list of gradients, or an InputBuffer holding a deferred sum
ReadyInputs = list[Any] | InputBuffer


def inputs_of(ready: ReadyInputs) -> list[Any]:
    """A ready node's gradients, every deferred sum added (on the thread that calls it)."""
    if isinstance(ready, InputBuffer):
        return ready.resolve()
    return ready


def slots_of(ready: ReadyInputs) -> list[Any]:
    """A ready node's gradients as they are, a deferred sum still a ``PendingSum``."""
    if isinstance(ready, InputBuffer):
        return ready.grads
    return ready


def combine(old: Any, g: Any) -> Any:
    """``old + g`` for one slot, deferred (a ``PendingSum``) when both are large arrays
    of the backend (Note [One array backend] in backend.py). None means no gradient."""
    if old is None:
        return g
    if g is None:
        return old
    if type(old) is PendingSum:
        old.append(g)
        return old
    if type(old) is xp.array_type and (type(g) is xp.array_type or type(g) is PendingSum) \
            and old.size >= LAZY_SUM_MIN:
        return PendingSum((old, g))
    return old + value(g)


def value(g: Any) -> Any:
    """One slot's gradient, its pending sum added."""
    return g.total() if type(g) is PendingSum else g
