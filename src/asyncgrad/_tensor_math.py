"""The math namespace ``m`` for ``create_graph=True``: the same names as
``ops._array_math.ArrayMath``, as differentiable asyncgrad functions on Tensors, so every
derivative rule is itself differentiated when a backward records its own graph."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import functional as F
from . import torch_ops
from .autograd.graph.registry import register_tensor_math
from .tensor import Tensor


class TensorMath:
    tensor_mode = True
    exp = staticmethod(F.exp)
    log = staticmethod(F.log)
    sqrt = staticmethod(F.sqrt)
    sin = staticmethod(F.sin)
    cos = staticmethod(F.cos)
    tanh = staticmethod(F.tanh)
    erf = staticmethod(F.erf)
    matmul = staticmethod(F.matmul)
    reshape = staticmethod(F.reshape)
    broadcast_to = staticmethod(F.broadcast_to)
    sum_to = staticmethod(F.sum_to)
    index_add = staticmethod(F.index_add)
    permute = staticmethod(F.permute)
    transpose = staticmethod(F.transpose)
    unsqueeze = staticmethod(F.unsqueeze)
    getitem = staticmethod(F.getitem)
    stack = staticmethod(F.stack)
    cat = staticmethod(F.cat)

    @staticmethod
    def cumsum(x: Tensor, dim: int) -> Tensor:
        return torch_ops.cumsum(x, dim)

    @staticmethod
    def einsum(equation: str, *operands: Any) -> Tensor:
        return F.einsum(equation, *operands)

    @staticmethod
    def constant(value: Any) -> Any:
        return Tensor._wrap(np.asarray(value)) if isinstance(value, np.ndarray) else value

    sign = staticmethod(F.sgn)
    threshold_backward = staticmethod(F.threshold_backward)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Tensor:
        return F.where(cond, a, b)

    @staticmethod
    def sum(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        return F.sum(x, dim, keepdim)

    @staticmethod
    def mean(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        return F.mean(x, dim, keepdim)

    @staticmethod
    def prod_others(x: Tensor, dim: tuple[int, ...] | None) -> Tensor:
        return F.prod_others(x, dim)

    @staticmethod
    def zeros_like(x: Tensor) -> Tensor:
        return Tensor._wrap(np.zeros_like(x.data))


TENSOR_MATH = TensorMath()
# for a node called directly under grad mode (Note [The graph layer never imports Tensor])
register_tensor_math(TENSOR_MATH)
