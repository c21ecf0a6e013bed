"""Named tuples returned by ops with several results, named as ``torch.return_types``."""

from __future__ import annotations

from typing import NamedTuple

from .tensor import Tensor


class topk(NamedTuple):  # noqa: N801  (PyTorch's name)
    """``(values, indices)`` of ``topk``."""

    values: Tensor
    indices: Tensor


class median(NamedTuple):  # noqa: N801
    """``(values, indices)`` of ``median(dim)``."""

    values: Tensor
    indices: Tensor


class nanmedian(NamedTuple):  # noqa: N801
    """``(values, indices)`` of ``nanmedian(dim)``."""

    values: Tensor
    indices: Tensor


class sort(NamedTuple):  # noqa: N801
    """``(values, indices)`` of ``sort``."""

    values: Tensor
    indices: Tensor
