"""An array backend (asyncgrad/backend.py) for any namespace that follows the Python
array API standard (``array_api_strict``, ``cupy``, ``torch`` through a compatibility
layer...): ``use_backend(ArrayApiBackend(namespace))``.

The standard cannot tell a view from an array that owns its memory, so ``owns_memory`` is
always False: the engine never adopts a kernel's array as a ``.grad`` and copies it instead
(Note [Owned gradients] in autograd/task/step.py), which is always correct, only not free.
"""

from __future__ import annotations

from typing import Any

from .backend import Array


class ArrayApiMath:
    """The rules' math namespace ``m`` on one array-API namespace: the names of
    ops/_array_math.py that an MLP's rules and the engine use (matmul, transpose,
    reshape, broadcasting and its undoing, reductions, ReLU's mask, elementwise
    functions). Built-in rules with a numpy-only path still need numpy (backend.py)."""

    tensor_mode = False

    def __init__(self, namespace: Any) -> None:
        ns = self.namespace = namespace
        self.exp, self.log, self.sqrt = ns.exp, ns.log, ns.sqrt
        self.sin, self.cos, self.tanh, self.sign = ns.sin, ns.cos, ns.tanh, ns.sign
        self.matmul, self.reshape, self.broadcast_to = ns.matmul, ns.reshape, ns.broadcast_to
        self.stack, self.cat = ns.stack, ns.concat

    def where(self, condition: Array, a: Any, b: Any) -> Array:
        return self.namespace.where(condition, a, b)

    def zeros_like(self, x: Array) -> Array:
        return self.namespace.zeros_like(x)

    def constant(self, value: Any) -> Any:
        return value

    def sum_to(self, g: Array, shape: tuple[int, ...]) -> Array:
        """``g`` summed over the axes that broadcasting added or stretched to reach
        ``shape``."""
        if tuple(g.shape) == tuple(shape):
            return g
        lead = g.ndim - len(shape)
        stretched = tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
        out = self.namespace.sum(g, axis=tuple(range(lead)) + stretched, keepdims=True)
        return self.namespace.reshape(out, tuple(shape))

    def sum(self, x: Array, dim: Any = None, keepdim: bool = False) -> Array:
        return self.namespace.sum(x, axis=dim, keepdims=keepdim)

    def mean(self, x: Array, dim: Any = None, keepdim: bool = False) -> Array:
        return self.namespace.mean(x, axis=dim, keepdims=keepdim)

    def threshold_backward(self, g: Array, ans: Array) -> Array:
        """``g`` where ``ans > 0``, else +0 (relu's derivative)."""
        return self.namespace.where(ans > 0, g, self.namespace.zeros_like(g))

    def permute(self, x: Array, dims: tuple[int, ...]) -> Array:
        return self.namespace.permute_dims(x, dims)

    def transpose(self, x: Array, d0: int, d1: int) -> Array:
        dims = list(range(x.ndim))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return self.namespace.permute_dims(x, tuple(dims))

    def unsqueeze(self, x: Array, dim: int) -> Array:
        return self.namespace.expand_dims(x, axis=dim)

    def getitem(self, x: Array, index: Any) -> Array:
        return x[index]


class ArrayApiBackend:
    """The engine's operations on gradients (backend.ArrayBackend) for one array-API
    namespace."""

    def __init__(self, namespace: Any) -> None:
        self.namespace = namespace
        self.name = getattr(namespace, "__name__", type(namespace).__name__)
        self.array_type: type = type(namespace.asarray(0.0))
        self.math = ArrayApiMath(namespace)

    def asarray(self, obj: Any, dtype: Any = None) -> Array:
        return self.namespace.asarray(obj, dtype=dtype)

    def astype(self, a: Any, dtype: Any) -> Array:
        return self.namespace.astype(self.namespace.asarray(a), dtype, copy=True)

    def ones(self, shape: tuple[int, ...], dtype: Any) -> Array:
        return self.namespace.ones(shape, dtype=dtype)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Array:
        return self.namespace.zeros(shape, dtype=dtype)

    def result_type(self, *arrays: Any) -> Any:
        return self.namespace.result_type(*arrays)

    def is_floating(self, dtype: Any) -> bool:
        return bool(self.namespace.isdtype(dtype, "real floating"))

    def add_into(self, a: Array, b: Any) -> Any:
        if b.dtype != a.dtype:
            b = self.namespace.astype(b, a.dtype)
        a += b
        return a

    def sum_as(self, a: Array, b: Any) -> Array:
        out = a + b
        return out if out.dtype == a.dtype else self.namespace.astype(out, a.dtype)

    def sum_leading(self, a: Array) -> Array:
        return self.namespace.sum(a, axis=0)

    def owns_memory(self, a: Array) -> bool:
        return False  # (the standard has no views to ask about: the module's docstring)

    def writeable(self, a: Array) -> bool:
        return True

    def __repr__(self) -> str:
        return f"ArrayApiBackend({self.name})"
