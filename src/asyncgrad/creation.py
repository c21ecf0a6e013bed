"""Factory functions: ``tensor``, ``zeros``, ``ones``, ``full``, ``arange``, ``eye``,
the random ones, and ``from_numpy``. Floats default to the default dtype (float32)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dtype import as_array, get_default_dtype
from ._device import check_device
from .random import Generator, default_generator
from .tensor import Tensor


def _shape(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(int(s) for s in shape[0])
    return tuple(int(s) for s in shape)


def _check_device(device: Any) -> None:
    """Factories accept ``device=`` as PyTorch's do; the CPU is the only one."""
    if device is not None:
        check_device(device)


def _finish(arr: np.ndarray, requires_grad: bool) -> Tensor:
    t = Tensor._wrap(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data: Any, *, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """A new leaf tensor holding a copy of ``data``."""
    _check_device(device)
    if isinstance(data, Tensor):
        data = data.data
    arr = np.array(as_array(data, dtype), copy=True)
    return _finish(arr, requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with ``array`` (keeps its dtype)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    return Tensor._wrap(array)


def zeros(*shape: Any, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """A tensor of zeros of the given shape (default floating dtype unless ``dtype``)."""
    _check_device(device)
    return _finish(np.zeros(_shape(shape), dtype=dtype or get_default_dtype()), requires_grad)


def ones(*shape: Any, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """A tensor of ones of the given shape."""
    _check_device(device)
    return _finish(np.ones(_shape(shape), dtype=dtype or get_default_dtype()), requires_grad)


def full(shape: Any, fill_value: Any, *, dtype: Any = None, requires_grad: bool = False,
         device: Any = None) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (its dtype follows the value, as PyTorch)."""
    _check_device(device)
    if dtype is None:
        dtype = (np.bool_ if isinstance(fill_value, bool) else np.int64 if isinstance(fill_value, int)
                 else get_default_dtype())
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _finish(np.full(shape, fill_value, dtype=dtype), requires_grad)


def empty(*shape: Any, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """A tensor of the given shape with uninitialised values."""
    _check_device(device)
    return _finish(np.empty(_shape(shape), dtype=dtype or get_default_dtype()), requires_grad)


def zeros_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """Zeros with ``t``'s shape and dtype."""
    _check_device(device)
    return _finish(np.zeros_like(t.data, dtype=dtype), requires_grad)


def ones_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """Ones with ``t``'s shape and dtype."""
    _check_device(device)
    return _finish(np.ones_like(t.data, dtype=dtype), requires_grad)


def full_like(t: Tensor, fill_value: Any, *, dtype: Any = None, requires_grad: bool = False,
              device: Any = None) -> Tensor:
    """``fill_value`` with ``t``'s shape and dtype."""
    _check_device(device)
    return _finish(np.full_like(t.data, fill_value, dtype=dtype), requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None,
           requires_grad: bool = False, device: Any = None) -> Tensor:
    """Like ``torch.arange``: int64 for integer arguments, else the default dtype."""
    _check_device(device)
    if end is None:
        start, end = 0, start
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
        dtype = np.int64 if ints else get_default_dtype()
    return _finish(np.arange(start, end, step, dtype=dtype), requires_grad)


def linspace(start: float, end: float, steps: int, *, dtype: Any = None,
             requires_grad: bool = False, device: Any = None) -> Tensor:
    _check_device(device)
    return _finish(np.linspace(start, end, steps, dtype=dtype or get_default_dtype()), requires_grad)


def eye(n: int, m: int | None = None, *, dtype: Any = None, requires_grad: bool = False,
        device: Any = None) -> Tensor:
    """An ``n`` x ``m`` (default ``n`` x ``n``) matrix with ones on the diagonal."""
    _check_device(device)
    return _finish(np.eye(n, m, dtype=dtype or get_default_dtype()), requires_grad)


def randn(*shape: Any, generator: Generator | None = None, dtype: Any = None,
          requires_grad: bool = False, device: Any = None) -> Tensor:
    """Standard normal samples from asyncgrad's generator (seed with ``manual_seed``)."""
    _check_device(device)
    gen = generator or default_generator
    arr = gen.rng.standard_normal(_shape(shape)).astype(dtype or get_default_dtype())
    return _finish(arr, requires_grad)


def rand(*shape: Any, generator: Generator | None = None, dtype: Any = None,
         requires_grad: bool = False, device: Any = None) -> Tensor:
    """Uniform samples in [0, 1)."""
    _check_device(device)
    gen = generator or default_generator
    arr = gen.rng.random(_shape(shape)).astype(dtype or get_default_dtype())
    return _finish(arr, requires_grad)


def randint(low: int, high: int | None = None, size: Any = (), *,
            generator: Generator | None = None, device: Any = None) -> Tensor:
    _check_device(device)
    if high is None:
        low, high = 0, low
    gen = generator or default_generator
    return Tensor._wrap(gen.rng.integers(low, high, size=tuple(size), dtype=np.int64))


def randperm(n: int, *, generator: Generator | None = None, device: Any = None) -> Tensor:
    """A random permutation of ``0 .. n-1``, int64."""
    _check_device(device)
    gen = generator or default_generator
    return Tensor._wrap(gen.rng.permutation(n).astype(np.int64))


def _random_like(op: str, t: Tensor, dtype: Any, requires_grad: bool, generator: Generator | None,
                 draw: Any) -> Tensor:
    d = np.dtype(dtype) if dtype is not None else t.dtype
    if d.kind != "f":
        raise NotImplementedError(f"{op}() samples floating point values only, got dtype {d}; pass a floating dtype=")
    gen = generator or default_generator
    with gen._lock:  # one generator may serve tasks on several threads
        arr = draw(gen.rng, t.shape).astype(d)
    return _finish(arr, requires_grad)


def randn_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False,
               generator: Generator | None = None, device: Any = None) -> Tensor:
    """Standard normal samples with the shape (and, unless given, the dtype) of ``t``."""
    _check_device(device)
    return _random_like("randn_like", t, dtype, requires_grad, generator, lambda rng, s: rng.standard_normal(s))


def rand_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False,
              generator: Generator | None = None, device: Any = None) -> Tensor:
    """Uniform samples in [0, 1) with the shape (and, unless given, the dtype) of ``t``."""
    _check_device(device)
    return _random_like("rand_like", t, dtype, requires_grad, generator, lambda rng, s: rng.random(s))


def new_tensor(t: Tensor, data: Any, *, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
    """A new leaf holding a copy of ``data``, with ``t``'s dtype unless ``dtype`` is given."""
    _check_device(device)
    if isinstance(data, Tensor):
        data = data.data
    return _finish(np.array(data, dtype=dtype or t.dtype, copy=True), requires_grad)


def new_full(t: Tensor, size: Any, fill_value: Any, *, dtype: Any = None, requires_grad: bool = False,
             device: Any = None) -> Tensor:
    """A new leaf of ``size`` filled with ``fill_value``, with ``t``'s dtype by default."""
    _check_device(device)
    size = (size,) if isinstance(size, int) else tuple(size)
    return _finish(np.full(_shape(size), fill_value, dtype=dtype or t.dtype), requires_grad)
