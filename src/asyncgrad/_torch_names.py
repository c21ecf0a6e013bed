"""Small names PyTorch model code reaches for that need no op of their own:
``ag.Size``, ``ag.dtype``, ``ag.is_tensor``, ``ag.numel``, ``ag.typename``, ``ag.is_nonzero``,
``ag.compile``, thread settings, and the ``ag.backends`` namespace that (with ``ag.cuda``)
say there is no GPU (so ``device = "cuda" if ag.cuda.is_available() else "cpu"`` picks
the CPU)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np

from . import _device
from .tensor import Tensor

_T = TypeVar("_T")

Size = tuple
"""``torch.Size``: shapes are plain tuples in asyncgrad (``x.shape == (2, 3)``)."""

dtype = np.dtype
"""``torch.dtype``: dtypes are numpy dtypes (``isinstance(x.dtype, ag.dtype)``)."""


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is an asyncgrad Tensor."""
    return isinstance(obj, Tensor)


def numel(t: Tensor) -> int:
    """The number of elements of ``t``."""
    return t.numel()


def typename(obj: Any) -> str:
    """``"asyncgrad.FloatTensor"`` for a float32 tensor (PyTorch's ``torch.typename``),
    else the object's qualified type name."""
    if isinstance(obj, Tensor):
        return _device.type_name(obj.dtype)
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def is_nonzero(t: Tensor) -> bool:
    """The truth value of a one-element tensor (raises for other sizes, as PyTorch)."""
    if t.numel() == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if t.numel() > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(t.data.reshape(-1)[0])


def compile(model: _T, *args: Any, **kwargs: Any) -> _T:  # noqa: A001  (PyTorch's name)
    """``torch.compile``: asyncgrad has no graph compiler, so the model or function is
    returned unchanged (its numeric kernels are compiled by numba where available)."""
    return model


def get_num_threads() -> int:
    """The number of CPU threads (asyncgrad's engine sizes its workers from it)."""
    return os.cpu_count() or 1


def set_num_threads(n: int) -> None:
    """Accepted for PyTorch code; asyncgrad's threads are the engine's
    (``ag.autograd.Engine(max_workers=...)``) and BLAS's own."""
    if int(n) < 1:
        raise RuntimeError(f"set_num_threads expects a positive integer, got {n}")


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Accepted for PyTorch code: asyncgrad's kernels are deterministic already."""


def _false(*args: Any, **kwargs: Any) -> bool:
    return False


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


backends = SimpleNamespace(
    cudnn=SimpleNamespace(enabled=False, benchmark=False, deterministic=True, allow_tf32=False,
                          is_available=_false),
    cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=False), is_built=_false),
    mps=SimpleNamespace(is_available=_false, is_built=_false),
)
"""``torch.backends``' flags: settable, with no effect (there is no GPU backend)."""
