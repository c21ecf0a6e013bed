"""The waiting requests and how a batch is formed from them.

A batch is formed when ``max_rows`` rows of one kind (``batch_key``: trailing shapes
and dtypes) wait, or ``max_wait`` seconds after the oldest waiting request arrived. It
is taken from the kind whose most urgent request (highest priority, then oldest) is the
most urgent of all, in that order, up to ``max_rows`` rows (a request larger than
``max_rows`` forms a batch alone)."""

from __future__ import annotations

import math
from typing import Any

from .requests import Request


def _urgency(r: Request) -> tuple[float, int]:
    return (-r.priority, r.seq)


class RequestQueue:
    """Waiting requests grouped by kind; each group kept in urgency order."""

    def __init__(self, max_rows: int, max_wait: float) -> None:
        self.max_rows = max_rows
        self.max_wait = max_wait
        self._groups: dict[tuple[Any, ...], list[Request]] = {}
        self._rows: dict[tuple[Any, ...], int] = {}

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def push(self, r: Request) -> bool:
        """Queue ``r``; True when that may start a batch sooner (the queue was empty, or
        ``r``'s kind now has ``max_rows`` rows)."""
        was_empty = not self._groups
        group = self._groups.setdefault(r.key, [])
        at = len(group)
        while at and group[at - 1].priority < r.priority:  # (the queued ones arrived earlier: _urgency)
            at -= 1
        group.insert(at, r)
        self._rows[r.key] = self._rows.get(r.key, 0) + r.rows
        return was_empty or self._rows[r.key] >= self.max_rows

    def remove(self, r: Request) -> None:
        """Take a withdrawn request out (it may have left already)."""
        group = self._groups.get(r.key)
        if group is None or r not in group:
            return
        group.remove(r)
        self._rows[r.key] -= r.rows
        if not group:
            del self._groups[r.key], self._rows[r.key]

    def deadline(self) -> float:
        """When the oldest waiting request has waited ``max_wait``; -inf when some kind is
        full already, +inf when nothing waits."""
        if any(n >= self.max_rows for n in self._rows.values()):
            return -math.inf
        oldest = min((r.arrived for g in self._groups.values() for r in g), default=math.inf)
        return oldest + self.max_wait

    def take(self) -> list[Request]:
        """The next batch (see the module's docstring), removed from the queue."""
        key = min(self._groups, key=lambda k: _urgency(self._groups[k][0]))
        group = self._groups[key]
        batch: list[Request] = []
        rows = 0
        for r in group:
            if batch and rows + r.rows > self.max_rows:
                break
            batch.append(r)
            rows += r.rows
        del group[:len(batch)]
        self._rows[key] -= rows
        if not group:
            del self._groups[key], self._rows[key]
        return batch

    def drain(self) -> list[Request]:
        """Every waiting request, removed."""
        out = [r for g in self._groups.values() for r in g]
        self._groups.clear()
        self._rows.clear()
        return out
