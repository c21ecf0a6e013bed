"""Dtypes and the process-wide default floating dtype (float32, as in PyTorch)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import xp

float32 = np.dtype(np.float32)
"""32-bit floating point: the default dtype of Python floats and factory functions."""
float64 = np.dtype(np.float64)
"""64-bit floating point (``set_default_dtype(ag.float64)`` makes it the default)."""
float16 = np.dtype(np.float16)
"""16-bit floating point."""
int64 = np.dtype(np.int64)
"""64-bit integer: the dtype of Python ints and of indices."""
int32 = np.dtype(np.int32)
"""32-bit integer."""
bool_ = np.dtype(np.bool_)
"""Boolean: the dtype of comparisons, ``isfinite``/``isinf``/``isnan``."""
int16 = np.dtype(np.int16)
"""16-bit integer."""
int8 = np.dtype(np.int8)
"""8-bit integer."""
uint8 = np.dtype(np.uint8)
"""8-bit unsigned integer."""
complex64 = np.dtype(np.complex64)
"""64-bit complex (two float32)."""
complex128 = np.dtype(np.complex128)
"""128-bit complex (two float64)."""


_default_dtype = float32


def set_default_dtype(dtype: Any) -> None:
    """Set the dtype that Python floats and factory functions produce (float32 or float64)."""
    global _default_dtype
    d = np.dtype(dtype)
    if d.kind != "f":
        raise TypeError(f"only floating-point types are supported as the default type, got {d}")
    _default_dtype = d


def get_default_dtype() -> np.dtype:
    """The current default floating dtype."""
    return _default_dtype


def is_floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f"


def as_array(value: Any, dtype: Any = None) -> np.ndarray:
    """Turn Python data into an ndarray following PyTorch's dtype rules.

    Python floats (and nested lists of them) become the default dtype, ints int64 and
    bools bool; numpy arrays keep their dtype unless ``dtype`` is given.
    """
    if isinstance(value, np.ndarray):
        return value if dtype is None else value.astype(dtype, copy=False)
    if type(value) is xp.array_type:  # another backend's array (Note [One array backend])
        return value if dtype is None else xp.astype(value, dtype)
    if isinstance(value, np.generic):
        arr = np.asarray(value)
        return arr if dtype is None else arr.astype(dtype)
    arr = np.asarray(value)
    if dtype is not None:
        return arr.astype(dtype, copy=False)
    if arr.dtype.kind == "f":
        return arr.astype(_default_dtype, copy=False)
    if arr.dtype.kind in "iu":
        return arr.astype(int64, copy=False)
    return arr


# PyTorch's names for dtypes, as its error messages print them ("Float", and C's "float")
_SCALAR_TYPE_NAMES = {
    "float16": ("Half", "c10::Half"), "float32": ("Float", "float"), "float64": ("Double", "double"),
    "int8": ("Char", "signed char"), "uint8": ("Byte", "unsigned char"), "int16": ("Short", "short int"),
    "int32": ("Int", "int"), "int64": ("Long", "long int"), "bool": ("Bool", "bool"),
    "complex64": ("ComplexFloat", "c10::complex<float>"), "complex128": ("ComplexDouble", "c10::complex<double>"),
}


def scalar_type_name(dtype: Any, c_name: bool = False) -> str:
    """PyTorch's name of ``dtype`` in error messages: ``Float`` (or C's ``float``)."""
    d = np.dtype(dtype)
    names = _SCALAR_TYPE_NAMES.get(d.name)
    if names is None:
        return d.name
    return names[1] if c_name else names[0]


def is_floating_point(t: Any) -> bool:
    """Whether the tensor's dtype is a floating-point one (float16/32/64)."""
    return bool(np.dtype(t.dtype).kind == "f")


def is_complex(t: Any) -> bool:
    """Whether the tensor's dtype is a complex one."""
    return bool(np.dtype(t.dtype).kind == "c")


def finfo(dtype: Any = None) -> np.finfo:
    """Machine limits of a floating dtype (the default dtype when omitted): ``eps``,
    ``max``, ``min``, ``tiny``, ``bits``, ``resolution`` (numpy's ``finfo``, whose fields
    have PyTorch's names)."""
    d = _default_dtype if dtype is None else np.dtype(dtype)
    if d.kind not in "fc":
        raise TypeError(f"finfo() requires a floating point input type, got {d.name}; use iinfo for it")
    return np.finfo(d)


def iinfo(dtype: Any) -> np.iinfo:
    """Machine limits of an integer dtype: ``bits``, ``max``, ``min``."""
    d = np.dtype(dtype)
    if d.kind not in "iu":
        raise TypeError(f"iinfo() requires an integer input type, got {d.name}"
                        + ("" if d.kind == "b" else "; use finfo for it"))
    return np.iinfo(d)
