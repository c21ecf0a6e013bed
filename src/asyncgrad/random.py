"""asyncgrad's random generator (numpy's PCG64), with state get/set for checkpointing."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


class Generator:
    """A seeded source of random numbers; ``get_state``/``set_state`` let checkpointing
    replay the same dropout masks when it recomputes a segment."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._lock = threading.Lock()

    def manual_seed(self, seed: int) -> Generator:
        self.rng = np.random.Generator(np.random.PCG64(seed))
        return self

    def get_state(self) -> dict[str, Any]:
        return dict(self.rng.bit_generator.state)

    def set_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator; returns it."""
    return default_generator.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    """The default generator's state, to restore later with ``set_rng_state``."""
    return default_generator.get_state()


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the default generator's state saved by ``get_rng_state``."""
    default_generator.set_state(state)
