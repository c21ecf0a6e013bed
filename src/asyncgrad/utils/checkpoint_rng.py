"""The RNG state around a checkpoint's recomputation (``preserve_rng_state``), shared
by both checkpoint forms."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..random import get_rng_state, set_rng_state

_rng_lock = threading.RLock()


@contextmanager
def restored_rng(state: dict[str, Any] | None) -> Iterator[None]:
    """Run the block with the generator in ``state``, then put the current state back."""
    if state is None:
        yield
        return
    with _rng_lock:
        current = get_rng_state()
        set_rng_state(state)
        try:
            yield
        finally:
            set_rng_state(current)
