"""Indexing: ``x[index]`` and the writes and gradients behind it (``ops/_index.py``,
``ops/shape.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.recording import record
from ..ops import shape as S
from ..ops._spec import OpSpec
from ..tensor import Tensor
from ._dispatch import _const, _view


def _normalise_index(index: Any) -> tuple[Any, bool]:
    """Tensors in an index become arrays; returns (index, is_basic)."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    basic = True
    for it in items:
        if isinstance(it, Tensor):
            it = it.data
        if isinstance(it, (list, np.ndarray)):
            it = np.asarray(it)
            basic = False
        elif isinstance(it, bool):
            basic = False
        out.append(it)
    return (tuple(out) if isinstance(index, tuple) else out[0]), basic


def _basic_index_spec(idx: Any) -> OpSpec:
    """The node PyTorch would name: that of the last view op it applies for ``idx``."""
    items = idx if isinstance(idx, tuple) else (idx,)
    for it in reversed(items):
        if it is None:
            return S.getitem_unsqueeze
        if isinstance(it, (int, np.integer)):
            return S.getitem_select
        if isinstance(it, slice) and it != slice(None):
            return S.getitem_basic
    if any(isinstance(it, slice) for it in items):
        return S.getitem_basic
    return S.getitem_alias


def getitem(x: Tensor, index: Any) -> Tensor:
    """numpy indexing: basic (views, incl. negative steps) and advanced (copies)."""
    idx, basic = _normalise_index(index)
    try:
        out = x.data[idx]
    except IndexError as e:
        raise IndexError(f"{e} (indexing a tensor of shape {list(x.shape)})") from None
    if basic and not isinstance(out, np.ndarray):  # all ints: a 0-d view, not a numpy scalar
        out = x.data[(*idx, Ellipsis) if isinstance(idx, tuple) else (idx, Ellipsis)]
    out = np.asarray(out) if not isinstance(out, np.ndarray) else out
    if basic:
        return _view(x, _basic_index_spec(idx), out, {"index": idx, "shape": x.shape})
    return record(S.getitem_advanced, (x,), out, params={"index": idx, "shape": x.shape})


def index_add(g: Tensor, index: Any, shape: tuple[int, ...], basic: bool) -> Tensor:
    """Zeros of ``shape`` with ``g`` added at ``index`` (the adjoint of indexing)."""
    out = S.index_add.forward(g.data, index=index, shape=shape, basic=basic)
    return record(S.index_add, (g,), out, params={"index": index})


def index_put(x: Tensor, index: Any, value: Any, *, copy_slices: bool | None = None) -> Tensor:
    """A copy of ``x`` with ``value`` written at ``index`` (used by ``x[index] = value``).

    The node is PyTorch's ``CopySlices`` for basic indices (and, with ``copy_slices=True``,
    for an in-place op through a view), else ``IndexPutBackward0``."""
    idx, basic = _normalise_index(index)
    spec = S.copy_slices if (basic if copy_slices is None else copy_slices) else S.index_put
    v = value if isinstance(value, Tensor) else _const(value, x)
    vd = v.data if isinstance(v, Tensor) else v
    mask = np.zeros(x.shape, dtype=bool)
    mask[idx] = True
    out = S.index_put.forward(x.data, vd.astype(x.data.dtype, copy=False), index=idx)
    return record(spec, (x, v), out, params={"index": idx, "mask": mask})
