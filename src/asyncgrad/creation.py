"""Factory functions: ``tensor``, ``zeros``, ``ones``, ``full``, ``arange``, ``eye``,
the random ones, and ``from_numpy``. Floats default to the default dtype (float32)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dtype import as_array, get_default_dtype
from .random import Generator, default_generator
from .tensor import Tensor


def _shape(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(int(s) for s in shape[0])
    return tuple(int(s) for s in shape)


def _finish(arr: np.ndarray, requires_grad: bool) -> Tensor:
    t = Tensor._wrap(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data: Any, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor holding a copy of ``data``."""
    if isinstance(data, Tensor):
        data = data.data
    arr = np.array(as_array(data, dtype), copy=True)
    return _finish(arr, requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with ``array`` (keeps its dtype)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    return Tensor._wrap(array)


def zeros(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros of the given shape (default floating dtype unless ``dtype``)."""
    return _finish(np.zeros(_shape(shape), dtype=dtype or get_default_dtype()), requires_grad)


def ones(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones of the given shape."""
    return _finish(np.ones(_shape(shape), dtype=dtype or get_default_dtype()), requires_grad)


def full(shape: Any, fill_value: Any, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (its dtype follows the value, as PyTorch)."""
    if dtype is None:
        dtype = (np.bool_ if isinstance(fill_value, bool) else np.int64 if isinstance(fill_value, int)
                 else get_default_dtype())
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _finish(np.full(shape, fill_value, dtype=dtype), requires_grad)


def empty(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of the given shape with uninitialised values."""
    return _finish(np.empty(_shape(shape), dtype=dtype or get_default_dtype()), requires_grad)


def zeros_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Zeros with ``t``'s shape and dtype."""
    return _finish(np.zeros_like(t.data, dtype=dtype), requires_grad)


def ones_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Ones with ``t``'s shape and dtype."""
    return _finish(np.ones_like(t.data, dtype=dtype), requires_grad)


def full_like(t: Tensor, fill_value: Any, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` with ``t``'s shape and dtype."""
    return _finish(np.full_like(t.data, fill_value, dtype=dtype), requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None,
           requires_grad: bool = False) -> Tensor:
    """Like ``torch.arange``: int64 for integer arguments, else the default dtype."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
        dtype = np.int64 if ints else get_default_dtype()
    return _finish(np.arange(start, end, step, dtype=dtype), requires_grad)


def linspace(start: float, end: float, steps: int, *, dtype: Any = None,
             requires_grad: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end``, both included."""
    return _finish(np.linspace(start, end, steps, dtype=dtype or get_default_dtype()), requires_grad)


def eye(n: int, m: int | None = None, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """An ``n`` x ``m`` (default ``n`` x ``n``) matrix with ones on the diagonal."""
    return _finish(np.eye(n, m, dtype=dtype or get_default_dtype()), requires_grad)


def randn(*shape: Any, generator: Generator | None = None, dtype: Any = None,
          requires_grad: bool = False) -> Tensor:
    """Standard normal samples from asyncgrad's generator (seed with ``manual_seed``)."""
    gen = generator or default_generator
    arr = gen.rng.standard_normal(_shape(shape)).astype(dtype or get_default_dtype())
    return _finish(arr, requires_grad)


def rand(*shape: Any, generator: Generator | None = None, dtype: Any = None,
         requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1)."""
    gen = generator or default_generator
    arr = gen.rng.random(_shape(shape)).astype(dtype or get_default_dtype())
    return _finish(arr, requires_grad)


def randint(low: int, high: int | None = None, size: Any = (), *,
            generator: Generator | None = None) -> Tensor:
    """Random integers in ``[low, high)`` (``[0, low)`` with one bound) of shape ``size``, int64."""
    if high is None:
        low, high = 0, low
    gen = generator or default_generator
    return Tensor._wrap(gen.rng.integers(low, high, size=tuple(size), dtype=np.int64))


def randperm(n: int, *, generator: Generator | None = None) -> Tensor:
    """A random permutation of ``0 .. n-1``, int64."""
    gen = generator or default_generator
    return Tensor._wrap(gen.rng.permutation(n).astype(np.int64))
