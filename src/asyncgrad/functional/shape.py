"""Shapes and views: reshapes, transposes, squeezes, expands, joins, splits and the other
views of a tensor's memory (``ops/shape.py``)."""

from __future__ import annotations

import builtins
from typing import Any
from collections.abc import Sequence

import numpy as np

from .._aliases import numpy_aliases
from ..autograd.graph.record import record, record_views
from ..ops import shape as S
from ..tensor import VIEW_MULTI_OUTPUT, VIEW_NO_GRAD, Tensor, view_creation_meta
from ._dispatch import _dim, _dims, _grad_enabled, _py_max, _py_min, _tensor, _view
from .elementwise import clone
from .indexing import getitem


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """The same data with a new shape (one dim may be -1)."""
    x = _tensor(x)
    shape = tuple(int(s) for s in shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {x.data.size}") from None
    return _view(x, S.view, out, {"shape": x.shape})


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dimensions ``start_dim`` to ``end_dim`` merged into one."""
    x = _tensor(x)
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = _dim(start_dim, x.ndim), _dim(end_dim, x.ndim)
    shape = x.shape[:s] + (-1,) + x.shape[e + 1:]
    return reshape(x, shape)


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    """Dimensions ``dim0`` and ``dim1`` swapped (a view); ``swapaxes`` is the same function."""
    x = _tensor(x)
    d0, d1 = _dim(dim0, x.ndim), _dim(dim1, x.ndim)
    return _view(x, S.transpose, np.swapaxes(x.data, d0, d1), {"d0": d0, "d1": d1})


swapaxes = transpose


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    """The dimensions reordered as ``dims`` (a view)."""
    x = _tensor(x)
    d = _dims(tuple(dims), x.ndim)
    assert d is not None
    if sorted(d) != list(range(x.ndim)):
        raise RuntimeError(f"permute(): dims {list(dims)} is not a permutation of {x.ndim} dims")
    return _view(x, S.permute, np.transpose(x.data, d), {"dims": d})


@numpy_aliases
def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    """Dimensions of size 1 removed (only those in ``dim`` when given)."""
    x = _tensor(x)
    dims = _dims(dim, x.ndim)
    if dims is None:
        out_shape = tuple(n for n in x.shape if n != 1)
    else:
        out_shape = tuple(n for i, n in enumerate(x.shape) if not (i in dims and n == 1))
    spec = S.squeeze if dim is None else S.squeeze_dim if isinstance(dim, (int, np.integer)) else S.squeeze_dims
    return _view(x, spec, x.data.reshape(out_shape), {"shape": x.shape})


@numpy_aliases
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """A dimension of size 1 inserted at ``dim``."""
    x = _tensor(x)
    d = _dim(dim, x.ndim + 1)
    return _view(x, S.unsqueeze, np.expand_dims(x.data, d), {"shape": x.shape})


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Broadcast to ``shape`` (-1 keeps a dim) without copying."""
    x = _tensor(x)
    shape = tuple(int(s) for s in shape)
    lead = len(shape) - x.ndim
    if lead < 0:
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to "
            f"the number of dimensions in the tensor ({x.ndim})"
        )
    full = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    try:
        out = np.broadcast_to(x.data, full)
    except ValueError:
        raise RuntimeError(
            f"The expanded size of the tensor must match the existing size at non-singleton "
            f"dimension: cannot expand {list(x.shape)} to {list(full)}"
        ) from None
    return _view(x, S.expand, out, {})


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """``x`` broadcast to ``shape`` without copying."""
    return expand(x, shape)


@numpy_aliases
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along an existing dim."""
    ts = [_tensor(t) for t in tensors]
    if not ts:
        raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
    d = _dim(dim, ts[0].ndim)
    bounds = [0]
    for t in ts:
        bounds.append(bounds[-1] + t.shape[d])
    try:
        out = np.concatenate([t.data for t in ts], axis=d)
    except ValueError as e:
        raise RuntimeError(f"torch.cat(): {e}") from None
    return record(S.cat, tuple(ts), out, params={"dim": d, "bounds": tuple(bounds)})


concat = cat


@numpy_aliases
def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Stack along a new dim."""
    ts = [_tensor(t) for t in tensors]
    if not ts:
        raise RuntimeError("stack expects a non-empty TensorList")
    d = _dim(dim, ts[0].ndim + 1)
    try:
        out = np.stack([t.data for t in ts], axis=d)
    except ValueError:
        raise RuntimeError(
            f"stack expects each tensor to be equal size, but got {[list(t.shape) for t in ts]}"
        ) from None
    return record(S.stack, tuple(ts), out, params={"dim": d})


def _infer_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    """``shape`` with its one ``-1`` resolved, or PyTorch's error when it cannot hold ``size``."""
    if builtins.sum(1 for s in shape if s == -1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
    if -1 in shape:
        if known == 0 or size % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {size}")
        return tuple(size // known if s == -1 else s for s in shape)
    if known != size or any(s < 0 for s in shape):
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {size}")
    return shape


def view(x: Tensor, shape: Sequence[int]) -> Tensor:
    """The same memory with a new shape; raises (as PyTorch) when the layout of ``x``
    makes that impossible without a copy, where ``reshape`` would copy."""
    x = _tensor(x)
    shape = tuple(int(s) for s in shape)
    try:
        out = x.data.reshape(shape)  # numpy copies when it cannot make a view
    except ValueError:
        _infer_shape(shape, x.data.size)  # raises PyTorch's message for a shape that cannot fit
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {x.data.size}") from None
    if out.size and out is not x.data and not np.may_share_memory(out, x.data):
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one dimension "
            "spans across two contiguous subspaces). Use .reshape(...) instead."
        )
    return _view(x, S.view, out, {"shape": x.shape})


def view_as(x: Tensor, other: Tensor) -> Tensor:
    """``x.view(other.shape)``."""
    return view(x, other.shape)


def contiguous(x: Tensor) -> Tensor:
    """``x`` itself when its memory is C-contiguous, else a C-contiguous copy in the graph
    (CloneBackward0), as PyTorch."""
    x = _tensor(x)
    if x.data.flags.c_contiguous:
        return x
    return record(S.contiguous, (x,), S.contiguous.forward(x.data))


def _multi_view(x: Tensor, node_name: str, dim: int, indices: Sequence[Any]) -> tuple[Tensor, ...]:
    """The views ``x[..., i, ...]`` (``i`` at ``dim``) for each of ``indices``, sharing one
    node with a slot per view, as PyTorch's unbind/split; each shares ``x``'s memory and
    version counter like any view."""
    head = (slice(None),) * dim
    outs = [x.data[(*head, i, Ellipsis)] for i in indices]
    params = {"dim": dim, "shapes": tuple(o.shape for o in outs), "dtype": x.data.dtype}
    views = record_views(node_name, S.MULTI_OUTPUT_VIEWS[node_name], x, outs, params)
    base = x if x._base is None else x._base
    meta = view_creation_meta(x, VIEW_MULTI_OUTPUT if _grad_enabled.get() else VIEW_NO_GRAD)
    for t in views:
        t._version_counter = x._version_counter
        t._base = base
        t._creation_meta = meta
        if (t.grad_fn is not None and base.grad_fn is not None) or not base._requires_grad:
            base._register_view(t)  # in-place ops on the base re-point this view's grad_fn (as _view)
    return tuple(views)


def _dim_for(op: str, x: Tensor, dim: int) -> int:
    if x.ndim == 0:
        raise IndexError(f"{op}() cannot be applied to a 0-dim tensor.")
    return _dim(dim, x.ndim)


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """The view of ``length`` elements of ``dim`` from ``start`` (SliceBackward0)."""
    x = _tensor(x)
    d = _dim_for("narrow", x, dim)
    n = x.shape[d]
    start, length = int(start), int(length)
    if not -n <= start <= n:
        raise IndexError(f"start out of range (expected to be in range of [{-n}, {n}], but got {start})")
    if start < 0:
        start += n
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if start + length > n:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({n}).")
    return getitem(x, (slice(None),) * d + (slice(start, start + length),))


def select(x: Tensor, dim: int, index: int) -> Tensor:
    """The view at ``index`` of ``dim``, which is removed (SelectBackward0)."""
    x = _tensor(x)
    d = _dim_for("select", x, dim)
    n = x.shape[d]
    i = int(index)
    if not -n <= i < n:
        raise IndexError(f"select(): index {i} out of range for tensor of size {list(x.shape)} at dimension {dim}")
    return getitem(x, (slice(None),) * d + (i % n,))


def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """Every index of ``dim`` as a view with that dim removed. As in PyTorch, these views
    cannot be modified in place while they require grad."""
    x = _tensor(x)
    d = _dim_for("unbind", x, dim)
    return _multi_view(x, "UnbindBackward0", d, range(x.shape[d]))


def _split_views(x: Tensor, d: int, sizes: Sequence[int], node_name: str) -> tuple[Tensor, ...]:
    bounds = np.cumsum([0, *sizes])
    return _multi_view(x, node_name, d, [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])])


def split(x: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Views of consecutive pieces along ``dim``: of ``split_size`` each (the last may be
    smaller) or of the given sizes, which must add up to the dim's size."""
    x = _tensor(x)
    d = _dim_for("split", x, dim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = int(split_size_or_sections)
        if size < 0:
            raise RuntimeError(f"split expects split_size be non-negative, but got split_size={size}")
        if size == 0:
            if n:
                raise RuntimeError(
                    f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
            return _split_views(x, d, [0], "SplitBackward0")
        sizes = [_py_min(size, n - s) for s in range(0, _py_max(n, 1), size)]
        return _split_views(x, d, sizes, "SplitBackward0")
    sizes = [int(s) for s in split_size_or_sections]
    if builtins.sum(sizes) != n or any(s < 0 for s in sizes):
        raise RuntimeError(
            f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
            f"dimension {dim}), but got split_sizes={sizes}"
        )
    return _split_views(x, d, sizes, "SplitWithSizesBackward0")


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``split`` into ``chunks`` pieces of ``ceil(size / chunks)`` (so possibly fewer pieces)."""
    x = _tensor(x)
    if int(chunks) <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = _dim_for("chunk", x, dim)
    n = x.shape[d]
    if n == 0:  # as PyTorch: ``chunks`` empty pieces
        return _split_views(x, d, [0] * int(chunks), "SplitWithSizesBackward0")
    return split(x, -(-n // int(chunks)), d)


def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The view of the diagonal of the ``(dim1, dim2)`` planes, appended as the last dim."""
    x = _tensor(x)
    if x.ndim < 2:
        raise RuntimeError(f"diagonal(): expected a tensor with at least 2 dimensions, got {x.ndim}")
    d1, d2 = _dim(dim1, x.ndim), _dim(dim2, x.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    params = {"offset": int(offset), "dim1": d1, "dim2": d2}
    out = S.diagonal.forward(x.data, **params)
    return _view(x, S.diagonal, out, {"index": S.diagonal_index(x.shape, **params), "shape": x.shape})


def repeat(x: Tensor, sizes: Sequence[int]) -> Tensor:
    """Tile ``x`` ``sizes[i]`` times along each dim (``x`` gains leading dims when
    ``sizes`` is longer), as ``Tensor.repeat``."""
    x = _tensor(x)
    reps = tuple(int(s) for s in sizes)
    if len(reps) < x.ndim:
        raise RuntimeError(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    if any(r < 0 for r in reps):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(reps)}")
    return record(S.repeat, (x,), S.repeat.forward(x.data, reps=reps), params={"reps": reps, "shape": x.shape})


# --- PyTorch's other names (issue 32) ---------------------------------------------------------
def split_with_sizes(x: Tensor, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Views of consecutive pieces of ``split_sizes`` along ``dim`` (they must add up to its size)."""
    if isinstance(split_sizes, (int, np.integer)):
        raise TypeError("split_with_sizes(): argument 'split_size' must be a sequence of ints, not int")
    return split(x, list(split_sizes), dim)


def unfold(x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """Every window of ``size`` elements along ``dimension``, ``step`` apart, as a new
    last dim (PyTorch's ``Tensor.unfold``; a copy here, not a view)."""
    x = _tensor(x)
    d = _dim(dimension, _py_max(x.ndim, 1))
    n = x.shape[d] if x.ndim else 1
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if x.ndim == 0:
        return clone(reshape(x, (1,)))
    windows = (n - size) // step + 1
    # index arrays broadcasting to the result's shape (x's with ``windows`` at d, then
    # ``size``): along d, window w's element e is at w * step + e; elsewhere the position
    full = []
    for k in range(x.ndim):
        sh = [1] * (x.ndim + 1)
        if k == d:
            sh[k] = windows
            full.append((np.arange(windows) * step).reshape(sh) + np.arange(size).reshape([1] * x.ndim + [size]))
        else:
            sh[k] = x.shape[k]
            full.append(np.arange(x.shape[k]).reshape(sh))
    index = tuple(full)
    return record(S.unfold, (x,), x.data[index], params={"index": index, "shape": x.shape})
