"""Indexing: ``x[index]`` and the writes and gradients behind it (``ops/_index.py``,
``ops/shape.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.graph.record import record
from ..ops import shape as S
from ..ops._spec import OpSpec
from ..tensor import Tensor
from ._dispatch import _const, _dim, _py_max, _tensor, _view
from .elementwise import add, clone


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


# --- gather and scatter (issue 32) ------------------------------------------------------------
def _index_array(index: Any, op: str) -> np.ndarray:
    idx = index.data if isinstance(index, Tensor) else np.asarray(index)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"{op}(): Expected dtype int64 for index" if op == "gather"
                           else f"{op}(): Expected dtype int32 or int64 for index")
    return idx


def _check_bounds(idx: np.ndarray, n: int, dim: int) -> None:
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx.max() if idx.max() >= n else idx.min()
        raise RuntimeError(f"index {bad} is out of bounds for dimension {dim} with size {n}")


def _full_index(shape: tuple[int, ...], dim: int, along: np.ndarray) -> tuple[np.ndarray, ...]:
    """Index arrays picking ``x[..., along[...], ...]`` elementwise (``along`` at ``dim``,
    broadcast index ranges elsewhere): the advanced index behind gather and scatter."""
    nd = along.ndim
    out = []
    for k in range(len(shape)):
        if k == dim:
            out.append(along)
        else:
            sh = [1] * nd
            sh[k] = shape[k]
            out.append(np.arange(shape[k]).reshape(sh))
    return tuple(out)


def gather(x: Tensor, dim: int, index: Any, *, sparse_grad: bool = False) -> Tensor:
    """``out[i][j] = x[i][index[i][j]]`` for ``dim=1`` (and likewise for any dim):
    ``index`` has ``x``'s number of dims and is no larger than ``x`` outside ``dim``."""
    x = _tensor(x)
    idx = _index_array(index, "gather")
    d = _dim(dim, _py_max(x.ndim, 1))
    if idx.ndim != x.ndim:
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    for k, (n, m) in enumerate(zip(idx.shape, x.shape)):
        if k != d and n > m:
            raise RuntimeError(f"Size does not match at dimension {k} expected index {list(idx.shape)} to be "
                               f"no larger than self {list(x.shape)} apart from dimension {d}")
    if x.ndim == 0:
        return clone(x)
    _check_bounds(idx, x.shape[d], d)
    full = _full_index(idx.shape, d, idx.astype(np.intp, copy=False))
    return record(S.gather, (x,), x.data[full], params={"index": full, "shape": x.shape})


def index_select(x: Tensor, dim: int, index: Any) -> Tensor:
    """The entries of ``x`` at ``index`` (a vector of ints) along ``dim``."""
    x = _tensor(x)
    idx = _index_array(index, "index_select")
    if idx.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    d = _dim(dim, _py_max(x.ndim, 1))
    n = x.shape[d] if x.ndim else 1
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError("index out of range in self")
    if x.ndim == 0:
        return clone(x.reshape(idx.shape))  # (Tensor's method: shape.py imports this module)
    where = (slice(None),) * d + (idx.reshape(-1).astype(np.intp, copy=False),)
    return record(S.index_select, (x,), x.data[where], params={"index": where, "shape": x.shape})


def scatter_add(x: Tensor, dim: int, index: Any, src: Any) -> Tensor:
    """A copy of ``x`` with ``src[i][j]`` added at ``[i][index[i][j]]`` (``dim=1``)."""
    x = _tensor(x)
    src = _tensor(src)
    full = _scatter_index(x, dim, index, src, "scatter_add")
    return add(x, index_add(_leading_part(src, full), full, x.shape, False))


def scatter(x: Tensor, dim: int, index: Any, src: Any = None, *, value: Any = None, reduce: Any = None) -> Tensor:
    """A copy of ``x`` with ``src[i][j]`` (or ``value``) written at ``[i][index[i][j]]``."""
    if reduce is not None:
        raise NotImplementedError("scatter(reduce=...) is not supported; use scatter_add")
    x = _tensor(x)
    if src is None:
        src = value
    if not isinstance(src, Tensor):
        src = Tensor._wrap(np.full(np.shape(index.data if isinstance(index, Tensor) else index), src,
                                   dtype=x.dtype))
    full = _scatter_index(x, dim, index, src, "scatter")
    return index_put(x, full, _leading_part(src, full))


def _leading_part(src: Tensor, full: tuple[np.ndarray, ...]) -> Tensor:
    """The part of ``src`` that a scatter reads: the leading block of the index's shape."""
    shape = np.broadcast_shapes(*(a.shape for a in full))
    return src if src.shape == shape else getitem(src, tuple(slice(0, n) for n in shape))


def _scatter_index(x: Tensor, dim: int, index: Any, src: Tensor, op: str) -> tuple[np.ndarray, ...]:
    idx = _index_array(index, "gather")
    d = _dim(dim, _py_max(x.ndim, 1))
    if idx.ndim != x.ndim or src.ndim != x.ndim:
        raise RuntimeError("Index tensor must have the same number of dimensions as self tensor")
    for k, n in enumerate(idx.shape):
        if (k != d and n > x.shape[k]) or n > src.shape[k]:
            raise RuntimeError(f"Expected index {list(idx.shape)} to be no larger than self {list(x.shape)} "
                               f"apart from dimension {d} and to be no larger size than src {list(src.shape)}")
    _check_bounds(idx, x.shape[d], d)
    return _full_index(idx.shape, d, idx.astype(np.intp, copy=False))
