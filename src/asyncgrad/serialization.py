"""``ag.save`` / ``ag.load``: checkpoints of state dicts, as ``torch.save`` / ``torch.load``.

    ag.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3}, "ckpt.pt")
    model.load_state_dict(ag.load("ckpt.pt")["model"])

The file is a pickle (protocol 4) of the object: Tensors (as leaves: data and
``requires_grad``, no graph), numpy arrays, numbers, strings and containers.
``load(..., weights_only=True)`` (the default, as PyTorch's since 2.6) unpickles through
an allow-list of those types only, so a file cannot run code when it is read;
``weights_only=False`` unpickles anything (only for files you trust).

``load`` also reads the zip files ``torch.save`` writes (without importing torch): their
tensors become asyncgrad Tensors, so a PyTorch checkpoint loads into the same model
written with asyncgrad (``model.load_state_dict(ag.load("torch_model.pt"))``).
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import Counter, OrderedDict
from typing import IO, Any

import numpy as np

from .tensor import Tensor, _rebuild_leaf

FileLike = str | os.PathLike[str] | IO[bytes]

# what a weights-only load may construct: (module, name) -> object
_SAFE: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("collections", "Counter"): Counter,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("asyncgrad.tensor", "_rebuild_leaf"): _rebuild_leaf,
}
# numpy pickles arrays and scalars through these two functions (under numpy.core in numpy 1,
# numpy._core in numpy 2), read from its own reducers rather than its private modules
_RECONSTRUCT = np.ones(1).__reduce__()[0]
_SCALAR = np.float64(0).__reduce__()[0]
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _SAFE[(_mod, "_reconstruct")] = _RECONSTRUCT
    _SAFE[(_mod, "scalar")] = _SCALAR


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = _SAFE.get((module, name))
        if obj is None and module == "numpy.dtypes" and name.endswith("DType"):
            obj = getattr(np.dtypes, name, None)  # numpy 2's dtype classes
        if obj is None:
            raise pickle.UnpicklingError(
                f"Weights only load failed: {module}.{name} is not an allowed type (Tensors, numpy arrays, "
                "numbers, strings and containers are). Use weights_only=False only for a file you trust.")
        return obj


def save(obj: Any, f: FileLike, pickle_protocol: int = 4) -> None:
    """Write ``obj`` (a state dict, or nested dicts/lists/tuples of Tensors, arrays and
    numbers) to the path or binary file ``f``. Tensors are saved as leaves: a tensor with
    a graph is saved detached."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            _Pickler(fh, protocol=pickle_protocol).dump(obj)
    else:
        _Pickler(f, protocol=pickle_protocol).dump(obj)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is Tensor:  # also non-leaves (their data, detached), which deepcopy refuses
            return _rebuild_leaf, (obj.data, obj.grad_fn is None and obj.requires_grad)
        return NotImplemented


def load(f: FileLike, map_location: Any = None, weights_only: bool | None = None, mmap: bool | None = None,
         **pickle_load_args: Any) -> Any:
    """Read an object written by :func:`save` (or by ``torch.save``) from the path or
    binary file ``f``. ``weights_only`` (default True) allows only Tensors, arrays,
    numbers, strings and containers; ``map_location`` may only name the CPU."""
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        from ._device import check_device

        check_device(map_location)
    safe = True if weights_only is None else bool(weights_only)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            data = fh.read()
    else:
        data = f.read()
    if data[:4] == b"PK\x03\x04":
        return _load_torch_zip(data, safe)
    unpickler = _SafeUnpickler(io.BytesIO(data)) if safe else pickle.Unpickler(io.BytesIO(data))
    return unpickler.load()


# --- files written by torch.save ----------------------------------------------------------------
_TORCH_STORAGES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_, "ComplexFloatStorage": np.complex64,
    "ComplexDoubleStorage": np.complex128,
}


class _TorchStorage:
    """A storage of a torch zip file: its dtype and key (its bytes are read on use)."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)


def _rebuild_torch_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                          requires_grad: bool, backward_hooks: Any, metadata: Any = None) -> Tensor:
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * item for s in stride))
    t = Tensor._wrap(np.array(view))  # a copy: tensors sharing a storage get their own arrays
    t._requires_grad = bool(requires_grad) and t.dtype.kind in "fc"
    return t


def _rebuild_torch_parameter(data: Tensor, requires_grad: bool, backward_hooks: Any) -> Tensor:
    data._requires_grad = bool(requires_grad)
    return data


def _load_torch_zip(data: bytes, safe: bool) -> Any:
    archive = zipfile.ZipFile(io.BytesIO(data))
    names = archive.namelist()
    pkl = next((n for n in names if n.endswith("data.pkl")), None)
    if pkl is None:
        raise RuntimeError("not a checkpoint asyncgrad can read: a zip file without data.pkl")
    root = pkl[: -len("data.pkl")]
    order = root + "byteorder"
    big = order in names and archive.read(order).strip() == b"big"
    storages: dict[str, np.ndarray] = {}

    class TorchUnpickler(_SafeUnpickler if safe else pickle.Unpickler):  # type: ignore[misc]
        def find_class(self, module: str, name: str) -> Any:
            if module == "torch" and name in _TORCH_STORAGES:
                return _TORCH_STORAGES[name]
            if module == "torch._utils" and name == "_rebuild_tensor_v2":
                return _rebuild_torch_tensor
            if module == "torch._utils" and name == "_rebuild_parameter":
                return _rebuild_torch_parameter
            if module == "torch" and name in ("BFloat16Storage",):
                raise pickle.UnpicklingError("bfloat16 tensors have no numpy dtype; convert them to float32 "
                                             "in PyTorch before saving")
            return super().find_class(module, name)

        def persistent_load(self, pid: Any) -> Any:
            kind, dtype, key, _location, _numel = pid
            if kind != "storage":
                raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
            if key not in storages:
                dt = np.dtype(dtype).newbyteorder(">" if big else "<")
                storages[key] = np.frombuffer(archive.read(f"{root}data/{key}"), dtype=dt).astype(np.dtype(dtype))
            return storages[key]

    return TorchUnpickler(io.BytesIO(archive.read(pkl))).load()


__all__ = ["load", "save"]
