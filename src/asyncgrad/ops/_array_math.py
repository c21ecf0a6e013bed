"""The math namespace ``m`` that derivative rules use in a plain (non-create_graph)
backward: numpy functions on ndarrays. ``asyncgrad._tensor_math`` offers the same names as
differentiable asyncgrad functions on Tensors for ``create_graph=True``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .kernels import compiled_path as fast
from ._broadcast import sum_to
from ._index import index_add_zeros
from .kernels.special import erf

# Note [ReLU backward by bit mask]: relu's gradient is ``g`` where ``ans > 0``, else +0,
# whatever ``g`` holds there (an infinite or NaN gradient is dropped too, as PyTorch's
# threshold_backward does), so ``g * (ans > 0)`` is not it (inf * 0 is NaN). ``np.where``
# is exact but branches on every element: on a ReLU's mask (about half set, at random)
# it took 1.5 ms for 256 x 1024 float32, 8x a multiplication, and the MLP benchmark's
# three ReLU nodes cost more than its 4.2 ms of overhead over the numpy floor. The same
# result without a branch: AND each float's bits with 0 or all ones, from the mask as
# int8 0 / -1 (widened by numpy's integer casting), 0.19 ms. With the compiled kernels
# loaded (ops/kernels/loader.py) it is one select per element instead, the same bits:
# ``numba_kernels.threshold_backward``.
_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


class ArrayMath:
    tensor_mode = False
    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    sqrt = staticmethod(np.sqrt)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    tanh = staticmethod(np.tanh)
    sign = staticmethod(np.sign)
    erf = staticmethod(erf)
    where = staticmethod(np.where)
    matmul = staticmethod(np.matmul)
    reshape = staticmethod(np.reshape)
    broadcast_to = staticmethod(np.broadcast_to)
    sum_to = staticmethod(sum_to)
    index_add = staticmethod(index_add_zeros)
    zeros_like = staticmethod(np.zeros_like)
    stack = staticmethod(np.stack)
    cat = staticmethod(np.concatenate)

    @staticmethod
    def cumsum(x: np.ndarray, dim: int) -> np.ndarray:
        return np.cumsum(x, axis=dim)

    @staticmethod
    def einsum(equation: str, *operands: Any) -> np.ndarray:
        return np.asarray(np.einsum(equation, *operands, optimize=len(operands) > 1))

    @staticmethod
    def constant(value: Any) -> Any:
        return value

    @staticmethod
    def threshold_backward(g: np.ndarray, ans: np.ndarray) -> np.ndarray:
        """``g`` where ``ans > 0``, else +0 (relu's derivative; Note [ReLU backward by
        bit mask])."""
        out = fast.threshold_backward(g, ans)  # one compiled pass, when loaded
        if out is not None:
            return out
        ints = _SAME_SIZE_INT.get(g.dtype.itemsize) if g.dtype.kind == "f" else None
        if ints is None or g.shape != ans.shape:
            return np.where(ans > 0, g, 0.0)
        keep = np.negative((ans > 0).view(np.int8))  # 0 or -1 (all bits set)
        return np.bitwise_and(g.view(ints), keep).view(g.dtype)

    @staticmethod
    def sum(x: np.ndarray, dim: Any = None, keepdim: bool = False) -> np.ndarray:
        return np.sum(x, axis=dim, keepdims=keepdim)

    @staticmethod
    def mean(x: np.ndarray, dim: Any = None, keepdim: bool = False) -> np.ndarray:
        return np.mean(x, axis=dim, keepdims=keepdim)

    @staticmethod
    def permute(x: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
        return np.transpose(x, dims)

    @staticmethod
    def transpose(x: np.ndarray, d0: int, d1: int) -> np.ndarray:
        return np.swapaxes(x, d0, d1)

    @staticmethod
    def unsqueeze(x: np.ndarray, dim: int) -> np.ndarray:
        return np.expand_dims(x, dim)

    @staticmethod
    def getitem(x: np.ndarray, index: Any) -> np.ndarray:
        return x[index]

    @staticmethod
    def prod_others(x: np.ndarray, dim: tuple[int, ...] | None) -> np.ndarray:
        """For each element, the product of the others along ``dim`` (prod's derivative)."""
        from .reductions import _prod_others

        return _prod_others(x, dim=dim)  # type: ignore[no-any-return]


ARRAY_MATH = ArrayMath()
