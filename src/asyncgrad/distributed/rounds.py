"""One DDP backward's bucket state (Note [Round protocol] and Note [Buckets] in ddp.py
and buckets.py): which slots are filled, which buckets are launched, in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .buckets import Layout


class Round:
    """Slots filled by gradient hooks (any thread) and launched bucket by bucket."""

    def __init__(self, task_id: int | None, layout: Layout, launch: Callable[[np.ndarray], Any]) -> None:
        self.task_id = task_id
        self.layout = layout
        self._launch = launch
        n = len(layout.params)
        self.used = np.zeros(n, dtype=np.int64)  # 1: this rank contributes a gradient
        self.old: list[np.ndarray | None] = [None] * n  # local .grad folded in (after no_sync)
        self._filled = [False] * n
        self._missing = [len(b.params) for b in layout.buckets]
        self.futures: list[Any] = []  # one per launched bucket, in bucket order
        self._lock = threading.Lock()

    def fill(self, i: int, grad: np.ndarray | None, old: np.ndarray | None) -> None:
        """Copy parameter ``i``'s gradient (None: zeros) plus ``old`` into its slot, and
        launch every bucket that is now complete and next in order."""
        with self._lock:
            if self._filled[i]:
                return
            view = self.layout.view(i)
            if grad is None:
                view[...] = 0
            else:
                np.copyto(view, grad, casting="same_kind")
                self.used[i] = 1
            if old is not None:
                view += old
                self.old[i] = old
                self.used[i] = 1
            self._filled[i] = True
            self._missing[self.layout.slots[i].bucket] -= 1
            while len(self.futures) < len(self._missing) and self._missing[len(self.futures)] == 0:
                self.futures.append(self._launch(self.layout.buckets[len(self.futures)].buffer))

    def fill_rest(self, old_grad: Callable[[int], np.ndarray | None]) -> None:
        """Zeros (plus any local ``.grad`` after no_sync) for parameters with no
        gradient this round; launches every remaining bucket."""
        for i in range(len(self._filled)):
            if not self._filled[i]:
                self.fill(i, None, old_grad(i))
