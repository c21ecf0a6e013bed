"""One DDP backward's bucket state (Note [Round protocol] in ddp.py, Note [Buckets] in
buckets.py): which gradients arrived, which buckets are launched, in order.

Filling a slot only records the gradient array: the copy into the bucket's buffer, the
all-reduce and the division by the world size all run on the communication thread
(Note [One communication thread]), so the event loop does none of that work."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .buckets import Layout

Launch = Callable[["Round", int], Any]  # (round, bucket index) -> Future of {param: average}


class Round:
    """Gradients recorded by hooks (any thread), buckets launched in index order."""

    def __init__(self, task_id: int | None, layout: Layout, launch: Launch) -> None:
        self.task_id = task_id
        self.layout = layout
        self._launch = launch
        n = len(layout.params)
        self.used = np.zeros(n, dtype=np.int64)  # 1: this rank contributes a gradient
        self.grads: list[np.ndarray | None] = [None] * n
        self.old: list[np.ndarray | None] = [None] * n  # local .grad folded in (after no_sync)
        self._filled = [False] * n
        self._missing = [len(b.params) for b in layout.buckets]
        self.futures: list[Any] = []  # one per launched bucket, in bucket order
        self.timed_out = False  # the pre-commit gave up waiting: the abort does not wait either
        self._lock = threading.Lock()

    def fill(self, i: int, grad: np.ndarray | None, old: np.ndarray | None) -> None:
        """Record parameter ``i``'s gradient (None: zeros) and ``old``, and launch every
        bucket that is now complete and next in order."""
        with self._lock:
            if self._filled[i]:
                return
            self._filled[i] = True
            self.grads[i], self.old[i] = grad, old
            self.used[i] = int(grad is not None or old is not None)
            self._missing[self.layout.slots[i].bucket] -= 1
            while len(self.futures) < len(self._missing) and self._missing[len(self.futures)] == 0:
                self.futures.append(self._launch(self, len(self.futures)))

    def fill_rest(self, old_grad: Callable[[int], np.ndarray | None]) -> None:
        """Zeros (plus any local ``.grad`` after no_sync) for parameters with no
        gradient this round; launches every remaining bucket."""
        for i in range(len(self._filled)):
            if not self._filled[i]:
                self.fill(i, None, old_grad(i))

    def pack(self, b: int) -> None:
        """Copy bucket ``b``'s gradients into its buffer (on the communication thread)."""
        layout = self.layout
        for i in layout.buckets[b].params:
            view, g, old = layout.view(i), self.grads[i], self.old[i]
            if g is None:
                view[...] = 0
            else:
                np.copyto(view, g, casting="same_kind")
            if old is not None:
                view += old

    def averages(self, b: int, size: int) -> dict[int, np.ndarray]:
        """Bucket ``b``'s reduced sums divided by ``size``, per parameter (fresh arrays:
        the buffer is reused by the next round)."""
        layout = self.layout
        avg = layout.buckets[b].buffer / size
        out = {}
        for i in layout.buckets[b].params:
            s = layout.slots[i]
            out[i] = avg[s.offset:s.offset + s.size].reshape(s.shape)
        return out
