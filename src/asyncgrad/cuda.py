"""``ag.cuda``: asyncgrad computes on the CPU only, so there is no CUDA device. These are
the calls ported code makes to find out (``ag.cuda.is_available()`` is False) and the
seeding calls it makes anyway (no-ops, as PyTorch's without a GPU)."""

from __future__ import annotations


def is_available() -> bool:
    """False: asyncgrad has no GPU backend."""
    return False


def device_count() -> int:
    """0: no CUDA devices."""
    return 0


def manual_seed(seed: int) -> None:
    """A no-op (no CUDA generators to seed), as PyTorch's without a GPU."""


def manual_seed_all(seed: int) -> None:
    """A no-op (no CUDA generators to seed), as PyTorch's without a GPU."""


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: no CUDA device."""
    return False


def is_initialized() -> bool:
    """False: no CUDA context."""
    return False


def synchronize(device: object = None) -> None:
    """A no-op: no device work to wait for."""


def empty_cache() -> None:
    """A no-op: no device memory cache."""


__all__ = [
    "device_count", "empty_cache", "is_available", "is_bf16_supported", "is_initialized", "manual_seed",
    "manual_seed_all", "synchronize",
]
