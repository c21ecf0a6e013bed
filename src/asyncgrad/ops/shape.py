"""Shape and indexing primitives. Views stay numpy views (no copy) in forward.

Each rule maps the output gradient back to the input's layout; ``shape`` is the input's
shape, passed by the caller. ``getitem`` and ``index_add`` are each other's adjoint,
which is what makes indexing twice-differentiable.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ._broadcast import sum_to as _sum_to_array
from ._index import index_add_zeros
from ._spec import defop


def _invert(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def _cat_forward(*arrays, dim):  # type: ignore[no-untyped-def]
    return np.concatenate(arrays, axis=dim)


def _cat_rule(m, g, ans, *xs, index, dim, bounds):  # type: ignore[no-untyped-def]
    sl: list[Any] = [slice(None)] * len(g.shape)
    sl[dim] = slice(bounds[index], bounds[index + 1])
    return m.getitem(g, tuple(sl))


def _stack_forward(*arrays, dim):  # type: ignore[no-untyped-def]
    return np.stack(arrays, axis=dim)


def _stack_rule(m, g, ans, *xs, index, dim):  # type: ignore[no-untyped-def]
    sl: list[Any] = [slice(None)] * len(g.shape)
    sl[dim] = index
    return m.getitem(g, tuple(sl))


def _index_put(x, v, *, index):  # type: ignore[no-untyped-def]
    out = x.copy()
    out[index] = v
    return out


def _index_add_forward(g, *, index, shape, basic):  # type: ignore[no-untyped-def]
    return index_add_zeros(g, index, shape, basic)


# name ------------ node name ------------ forward ------------------- derivative ----------
view = defop("ViewBackward0", lambda x, *, shape: x.reshape(shape),
             lambda m, g, ans, x, *, shape: m.reshape(g, shape), cost=0.0)
transpose = defop("TransposeBackward0", lambda x, *, d0, d1: np.swapaxes(x, d0, d1),
                  lambda m, g, ans, x, *, d0, d1: m.transpose(g, d0, d1), cost=0.0)
permute = defop("PermuteBackward0", lambda x, *, dims: np.transpose(x, dims),
                lambda m, g, ans, x, *, dims: m.permute(g, _invert(dims)), cost=0.0)
squeeze = defop("SqueezeBackward0", lambda x, *, out_shape: x.reshape(out_shape),
                lambda m, g, ans, x, *, shape: m.reshape(g, shape), cost=0.0)
squeeze_dim = replace(squeeze, node_name="SqueezeBackward1")  # PyTorch: squeeze(int)
squeeze_dims = replace(squeeze, node_name="SqueezeBackward2")  # PyTorch: squeeze(tuple)
unsqueeze = defop("UnsqueezeBackward0", lambda x, *, dim: np.expand_dims(x, dim),
                  lambda m, g, ans, x, *, shape: m.reshape(g, shape), cost=0.0)
expand = defop("ExpandBackward0", lambda x, *, shape: np.broadcast_to(x, shape),
               lambda m, g, ans, x: g)  # summed down to the input's shape by the engine
sum_to = defop("SumBackward1", lambda x, *, shape: _sum_to_array(x, shape),
               lambda m, g, ans, x, *, shape: m.broadcast_to(g, shape))
getitem_basic = defop("SliceBackward0", lambda x, *, index: x[index],
                      lambda m, g, ans, x, *, index, shape: m.index_add(g, index, shape, True))
# PyTorch names basic indexing after the last view op it applies (full slices are skipped)
getitem_select = replace(getitem_basic, node_name="SelectBackward0")
getitem_unsqueeze = replace(getitem_basic, node_name="UnsqueezeBackward0")
getitem_alias = replace(getitem_basic, node_name="AliasBackward0")
getitem_advanced = replace(defop("IndexBackward0", lambda x, *, index: x[index],
                                 lambda m, g, ans, x, *, index, shape: m.index_add(g, index, shape, False)),
                           saves_params=True)
index_add = defop("IndexAddBackward0", _index_add_forward,
                  lambda m, g, ans, x, *, index: m.getitem(g, index))
index_put = replace(defop("IndexPutBackward0", _index_put,
                          lambda m, g, ans, x, v, *, index, mask: m.where(mask, 0.0, g),
                          lambda m, g, ans, x, v, *, index, mask: m.getitem(g, index)), saves_params=True)
# x[basic index] = v; in-place through a view (a basic index holds no tensors)
copy_slices = replace(index_put, node_name="CopySlices", saves_params=False)
# ops that pick elements by a full advanced index (built in functional.py): indexing's
# rules under PyTorch's node names
gather = replace(getitem_advanced, node_name="GatherBackward0")
index_select = replace(getitem_advanced, node_name="IndexSelectBackward0")
unfold = replace(getitem_advanced, node_name="UnfoldBackward0")
cat = defop("CatBackward0", _cat_forward, _cat_rule, variadic=True)
stack = defop("StackBackward0", _stack_forward, _stack_rule, variadic=True)


# --- views added for PyTorch parity -------------------------------------------------------
def diagonal_index(shape: tuple[int, ...], offset: int, dim1: int, dim2: int) -> tuple[np.ndarray, ...]:
    """The advanced index that picks ``diagonal(x, offset, dim1, dim2)`` out of ``x``:
    the other dims in order, then the diagonal as the last dim (PyTorch's layout)."""
    rest = [k for k in range(len(shape)) if k not in (dim1, dim2)]
    n = max(0, min(shape[dim1] - max(-offset, 0), shape[dim2] - max(offset, 0)))
    out_ndim = len(rest) + 1
    index: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(shape)
    for pos, k in enumerate(rest):
        index[k] = np.arange(shape[k]).reshape([-1 if j == pos else 1 for j in range(out_ndim)])
    diag = np.arange(n).reshape([1] * (out_ndim - 1) + [-1])
    index[dim1] = diag + max(-offset, 0)
    index[dim2] = diag + max(offset, 0)
    return tuple(index)


def _diagonal_view(x, *, offset, dim1, dim2):  # type: ignore[no-untyped-def]
    """A writable strided view of the diagonal (numpy's ``diagonal`` is read-only, and
    in-place ops through the view must reach ``x``)."""
    from numpy.lib.stride_tricks import as_strided

    y = np.moveaxis(x, (dim1, dim2), (-2, -1))
    y = y[..., :, max(offset, 0):] if offset >= 0 else y[..., -offset:, :]
    n = max(0, min(y.shape[-2], y.shape[-1]))
    return as_strided(y, shape=y.shape[:-2] + (n,), strides=y.strides[:-2] + (y.strides[-2] + y.strides[-1],))


def _take_rule(m, g, ans, x, *, index, shape):  # type: ignore[no-untyped-def]
    # ``index`` is a full advanced index without duplicates, so assignment is a scatter-add
    return m.index_add(g, index, shape, True)


def _pieces(m, grads, shapes, dtype):  # type: ignore[no-untyped-def]
    # an output that got no gradient contributes zeros (PyTorch's undefined grads)
    return [m.constant(np.zeros(sh, dtype)) if g is None else g for g, sh in zip(grads, shapes)]


def unbind_backward(m, grads, *, dim, shapes, dtype):  # type: ignore[no-untyped-def]
    """The gradient of ``unbind``'s input from those of all its outputs, in one node."""
    return m.stack(_pieces(m, grads, shapes, dtype), dim)


def split_backward(m, grads, *, dim, shapes, dtype):  # type: ignore[no-untyped-def]
    """The gradient of ``split``'s / ``chunk``'s input from those of all its outputs."""
    return m.cat(_pieces(m, grads, shapes, dtype), dim)


# Several views returned together (unbind, split, chunk) share one node with one gradient
# slot per view, as PyTorch's: rule(m, grads, **params) -> the input's gradient. PyTorch
# forbids in-place changes through such views (see Tensor._check_inplace).
MULTI_OUTPUT_VIEWS = {
    "UnbindBackward0": unbind_backward,
    "SplitBackward0": split_backward,
    "SplitWithSizesBackward0": split_backward,
}
diagonal = defop("DiagonalBackward0", _diagonal_view, _take_rule)
contiguous = defop("CloneBackward0", np.ascontiguousarray, lambda m, g, ans, x: g, cost=0.0)


def _repeat_rule(m, g, ans, x, *, reps, shape):  # type: ignore[no-untyped-def]
    # the output is laid out as (r0, s0, r1, s1, ...): sum over every r axis
    padded = (1,) * (len(reps) - len(shape)) + tuple(shape)
    g = m.reshape(g, tuple(v for r, s in zip(reps, padded) for v in (r, s)))
    return m.reshape(m.sum(g, tuple(range(0, 2 * len(reps), 2))), shape)


repeat = defop("RepeatBackward0", lambda x, *, reps: np.tile(x, reps), _repeat_rule)
