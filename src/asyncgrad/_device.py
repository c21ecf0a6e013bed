"""Devices: asyncgrad computes with numpy on the CPU, so ``cpu`` is the one device a
tensor can be on. ``device`` exists so that ported code (``x.device``, ``x.to("cpu")``,
``module.to(device, dtype)``, ``x.type()``) runs unchanged; asking for another device
raises a clear error instead of silently computing on the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np

# the device types PyTorch knows, so a misspelt one is told apart from a real one
_DEVICE_TYPES = (
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia",
    "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone",
)


class device:  # noqa: N801  (PyTorch's name)
    """A device, as ``torch.device``: ``device("cpu")``, ``device("cuda:1")``,
    ``device("cpu", 0)``. Prints like torch's (``device(type='cpu')``) and also compares
    equal to its string form (``x.device == "cpu"``)."""

    __slots__ = ("type", "index")
    type: str
    index: int | None

    def __init__(self, type: str | device, index: int | None = None) -> None:  # noqa: A002
        if isinstance(type, device):
            self.type, self.index = type.type, type.index
            return
        if not isinstance(type, str):
            raise TypeError(f"device() expects a string like 'cpu', got {type!r}")
        name, sep, idx = type.partition(":")
        if name not in _DEVICE_TYPES:
            raise RuntimeError(
                f"Expected one of {', '.join(_DEVICE_TYPES)} device type at start of device string: {type}")
        if sep:
            if index is not None:
                raise RuntimeError(f"type (string) must not include an index because index was passed "
                                   f"explicitly: {type}")
            if not idx.isdigit():
                raise RuntimeError(f"Invalid device string: '{type}'")
            index = int(idx)
        if index is not None and index < 0:
            raise RuntimeError(f"Device index must not be negative, got {index}")
        self.type, self.index = name, index

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except RuntimeError:
                return False
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))


CPU = device("cpu")


def is_device_like(value: Any) -> bool:
    """Whether ``value`` names a device (a ``device``, or a string such as ``"cpu:0"``)."""
    if isinstance(value, device):
        return True
    return isinstance(value, str) and value.partition(":")[0] in _DEVICE_TYPES


def check_device(value: Any) -> device:
    """``value`` as a device, which must be the CPU (asyncgrad has no other)."""
    d = device(value)
    if d.type != "cpu":
        raise RuntimeError(
            f"asyncgrad computes with numpy on the CPU only; it cannot put tensors on device '{d}'. "
            "Use 'cpu' (or drop the .to(device) call).")
    return d


def parse_to(args: tuple[Any, ...], kwargs: dict[str, Any], tensor_type: type) -> tuple[np.dtype | None, bool]:
    """The arguments of ``Tensor.to`` / ``Module.to``: ``to(dtype)``, ``to(device,
    dtype=None)``, ``to(tensor)``, with ``device=``, ``dtype=``, ``non_blocking=``,
    ``copy=`` keywords. Checks the device; returns ``(dtype or None, copy)``."""
    kwargs = dict(kwargs)
    dev = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    copy = bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    rest = list(args)
    if rest and isinstance(rest[0], tensor_type):
        other = rest.pop(0)
        dev, dtype = other.device, other.dtype
    elif rest and (rest[0] is None or is_device_like(rest[0])):
        dev = rest.pop(0)
    if rest and not isinstance(rest[0], bool):
        if dtype is not None:
            raise TypeError("to() received dtype twice")
        dtype = rest.pop(0)
    if rest:  # PyTorch's positional non_blocking, copy
        rest.pop(0)
        copy = bool(rest.pop(0)) if rest else copy
    if rest:
        raise TypeError(f"to() received too many arguments: {args!r}")
    if dev is not None:
        check_device(dev)
    if dtype is None:
        return None, copy
    if isinstance(dtype, str) and is_device_like(dtype):
        check_device(dtype)
        return None, copy
    try:
        return np.dtype(dtype), copy
    except TypeError:
        raise TypeError(f"to() expects a dtype or a device, got {dtype!r}") from None


# Tensor.type(): PyTorch's legacy tensor type names, under asyncgrad's module name
_TYPE_NAMES: dict[np.dtype, str] = {
    np.dtype(np.float32): "FloatTensor", np.dtype(np.float64): "DoubleTensor",
    np.dtype(np.float16): "HalfTensor", np.dtype(np.int64): "LongTensor", np.dtype(np.int32): "IntTensor",
    np.dtype(np.int16): "ShortTensor", np.dtype(np.int8): "CharTensor", np.dtype(np.uint8): "ByteTensor",
    np.dtype(np.bool_): "BoolTensor", np.dtype(np.complex64): "ComplexFloatTensor",
    np.dtype(np.complex128): "ComplexDoubleTensor",
}
_TYPES_BY_NAME = {name: dt for dt, name in _TYPE_NAMES.items()}


def type_name(dtype: np.dtype) -> str:
    """``"asyncgrad.FloatTensor"`` for float32, etc. (``torch.FloatTensor`` in PyTorch)."""
    return f"asyncgrad.{_TYPE_NAMES.get(dtype, f'Tensor[{dtype}]')}"


def dtype_of_type(value: Any) -> np.dtype:
    """The dtype named by ``value``: ``"asyncgrad.DoubleTensor"`` (or PyTorch's
    ``"torch.DoubleTensor"``), or anything ``numpy.dtype`` accepts."""
    if isinstance(value, str):
        module, _, name = value.rpartition(".")
        if module in ("asyncgrad", "torch") and name in _TYPES_BY_NAME:
            return _TYPES_BY_NAME[name]
        if module:
            raise ValueError(f"invalid type: {value!r}")
    try:
        return np.dtype(value)
    except TypeError:
        raise ValueError(f"invalid type: {value!r}") from None
