"""The order in which a loop's runner serves backward calls, and admits new ones.

Note [Task order]: each backward call has a ``priority`` (an int, default 0; a nested
backward inherits its parent's, Note [Reentrant backwards] in engine.py). The runner's
queue of GraphTasks, the admission line and the worker threads' queue of kernels are
each a ``TaskOrder``: every time an entry joins (a GraphTask queued, or sent to the back
after its turn; a caller lining up; a kernel waiting for a thread) it takes the next
number of the order's counter, ``seq``, and is served in order of
``seq - priority * TURNS_PER_PRIORITY``, smallest first. So:

* equal priorities are served first come, first served, and a GraphTask whose turn ran
  out goes behind the others: round robin, as a FIFO queue with rotation did;
* one priority level more is a head start of ``TURNS_PER_PRIORITY`` places: a
  higher-priority call overtakes the lower ones that joined fewer than that many
  entries before it, so while higher-priority calls have ready nodes they run first;
* a waiting entry's effective priority rises with every entry that joins after it
  (aging): once ``TURNS_PER_PRIORITY * (p_high - p_low)`` entries joined since a
  lower-priority entry did, no newcomer overtakes it. A lower-priority call is slowed,
  never starved, however many higher-priority calls keep arriving.

The key of an entry never changes while it waits (aging is in the counter, not in the
entries), so the order is a heap, and removing an entry marks it dead in place.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Iterator
from heapq import heappop, heappush
from typing import TypeVar

TURNS_PER_PRIORITY = 16  # places of head start per priority level

T = TypeVar("T", bound=Hashable)


def check_priority(priority: object) -> int:
    """``priority`` as given to ``backward``/``grad``: an int, else ``TypeError``."""
    if type(priority) is int:
        return priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    return operator.index(priority)


class TaskOrder(dict[T, list[object]]):
    """Entries served by priority with aging (Note [Task order]). An entry is in the
    order at most once; ``push`` of one already in it does nothing. The order is a
    dict of its entries (``in``, ``len`` and truth are the dict's, at C speed) beside
    the heap that serves them."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[list[object]] = []  # [key, seq, item or None (removed)]
        self._seq = itertools.count()

    def push(self, item: T, priority: int = 0) -> None:
        """Queue ``item`` behind the entries of its priority that joined before it."""
        if item in self:
            return
        seq = next(self._seq)
        entry: list[object] = [seq - priority * TURNS_PER_PRIORITY, seq, item]
        self[item] = entry
        heappush(self._heap, entry)

    def first(self) -> T | None:
        """The entry served next, or None when the order is empty."""
        heap = self._heap
        if heap:
            item = heap[0][2]
            if item is not None:  # (the common case: no removed entry on top)
                return item  # type: ignore[return-value]
            while heap and heap[0][2] is None:
                heappop(heap)
            if heap:
                return heap[0][2]  # type: ignore[return-value]
        return None

    def take_first(self) -> T | None:
        """Remove and return the entry served next (None when empty)."""
        item = self.first()
        if item is not None:
            heappop(self._heap)
            del self[item]
        return item

    def drop_first(self, item: T) -> None:
        """Remove ``item``, which ``first()`` just returned."""
        heappop(self._heap)
        del self[item]

    def requeue_first(self, priority: int = 0) -> None:
        """Send the first entry to the back of its priority (its turn ran out)."""
        item = self.take_first()
        if item is not None:
            self.push(item, priority)

    def remove(self, item: T) -> bool:
        """Take ``item`` out; False when it was not in the order."""
        entry = dict.pop(self, item, None)
        if entry is None:
            return False
        entry[2] = None
        if len(self._heap) > 2 * len(self) + 8:  # mostly dead: rebuild
            self._heap = [e for e in self._heap if e[2] is not None]
            self._heap.sort()
        return True

    def in_order(self) -> Iterator[T]:
        """The entries in the order they would be served (first one first)."""
        first = self.first()
        if first is None:
            return
        yield first
        rest = sorted(e for e in self._heap if e[2] is not None and e[2] is not first)  # type: ignore[type-var]
        for entry in rest:
            if entry[2] is not None:
                yield entry[2]  # type: ignore[misc]
