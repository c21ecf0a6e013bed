"""The math namespace ``m`` that derivative rules use in a plain (non-create_graph)
backward: numpy functions on ndarrays. ``asyncgrad._tensor_math`` offers the same names as
differentiable asyncgrad functions on Tensors for ``create_graph=True``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._broadcast import sum_to
from ._index import index_add_zeros
from ._special import erf


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
    def constant(value: Any) -> Any:
        return value

    @staticmethod
    def threshold_backward(g: np.ndarray, ans: np.ndarray) -> np.ndarray:
        """``g`` where ``ans > 0``, else 0 (relu's derivative)."""
        return np.where(ans > 0, g, 0.0)

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
