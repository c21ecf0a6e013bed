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
getitem_advanced = defop("IndexBackward0", lambda x, *, index: x[index],
                         lambda m, g, ans, x, *, index, shape: m.index_add(g, index, shape, False))
index_add = defop("IndexAddBackward0", _index_add_forward,
                  lambda m, g, ans, x, *, index: m.getitem(g, index))
index_put = defop("IndexPutBackward0", _index_put,
                  lambda m, g, ans, x, v, *, index, mask: m.where(mask, 0.0, g),
                  lambda m, g, ans, x, v, *, index, mask: m.getitem(g, index))
copy_slices = replace(index_put, node_name="CopySlices")  # x[basic index] = v; in-place through a view
cat = defop("CatBackward0", _cat_forward, _cat_rule, variadic=True)
stack = defop("StackBackward0", _stack_forward, _stack_rule, variadic=True)
