"""In-place changes and views: how writing into a tensor is checked and recorded.

The functions taking ``self`` are Tensor's private methods (``t._apply_inplace(...)``,
``t._rebase(node)``, ...; installed on the class in tensor.py): an in-place op runs its
out-of-place form and writes the result into the tensor's memory, and with grad recording
the new node takes the tensor's place in the graph; on a view the change is recorded on
its base (PyTorch's CopySlices) and the base's other views are re-pointed to read it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _context

if TYPE_CHECKING:
    from . import functional as F
    from .autograd.graph import Node
    from .tensor import Tensor
else:
    F = Tensor = None  # bound by bind(): functional and tensor import this module


def bind(tensor_type: type[Tensor], functional: Any) -> None:
    """Called once by ``tensor.bind_functional``: the Tensor class and the ops the
    machinery records with (``getitem``, ``index_put``)."""
    global Tensor, F
    Tensor = tensor_type  # type: ignore[misc]  # (the class itself, bound late)
    F = functional


def check_inplace(self: Tensor, args: tuple[Any, ...] = ()) -> None:
    if not _context.grad_enabled.get():
        return
    base = self._base
    if base is not None and self._creation_meta != VIEW_DEFAULT and (
            self._requires_grad or base._requires_grad
            or any(isinstance(a, Tensor) and a._requires_grad for a in args)):
        _refuse_inplace_on_view(self)
    if self._requires_grad and self.grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    # PyTorch's check: the view requires grad and its base is a leaf (the base itself
    # need not require grad: ``y = x.view(2); y.requires_grad_()`` makes y a leaf that
    # views x, and an in-place op on a view of y, recorded on x, would bypass y)
    if base is not None and base.grad_fn is None and (base._requires_grad or self._requires_grad):
        raise RuntimeError(
            "a view of a leaf Variable that requires grad is being used in an in-place operation."
        )
    if base is not None and base._requires_grad and self.grad_fn is None:
        raise RuntimeError(
            "A view was created in no_grad mode and is being modified inplace with grad mode enabled. "
            "Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify "
            "your code by moving both the view and the inplace either both inside the no_grad block "
            "(if you don't want the inplace to be tracked) or both outside (if you want the inplace "
            "to be tracked)."
        )

def apply_inplace(self: Tensor, out_of_place: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """Run ``out_of_place(self, ...)`` and write the result into self (same memory).

    With grad recording, the new node takes self's old gradient edge and self is
    rebased onto it (PyTorch: hooks stay on the old node, retain_grad moves).
    """
    self._check_inplace(args)
    records = _context.grad_enabled.get() and (
        self._requires_grad or any(isinstance(a, Tensor) and a._requires_grad for a in args)
    )
    if not records:
        if out_of_place is F.index_put and not self.data.flags.writeable:
            _write_region(self, args[0], args[1])  # e.g. one element of an expand()ed tensor
            return self
        from .grad_mode import no_grad

        with no_grad():
            out = out_of_place(self, *args, **kwargs)
        _write_into(self, out.data)
        return self
    if self._base is not None:
        return self._apply_inplace_to_view(out_of_place, args, kwargs)
    old = self._snapshot()
    out = out_of_place(old, *args, **kwargs)
    _write_into(self, out.data)
    self._rebase(out.grad_fn)
    self._regenerate_views(skip=None)
    return self

def snapshot(self: Tensor) -> Tensor:
    """A copy of the current value that keeps this tensor's place in the graph."""
    old = Tensor._nonleaf(self.data.copy(), self.grad_fn, self.output_nr, None)
    old._requires_grad = self._requires_grad
    old._acc_ref = self._acc_ref
    return old

def rebase(self: Tensor, node: Node | None) -> None:
    """Make ``node`` (output 0) this tensor's grad_fn after an in-place change."""
    old_node, old_nr = self.grad_fn, self.output_nr
    self.grad_fn = node
    self.output_nr = 0
    self._requires_grad = True
    if self._retains_grad and old_node is not None and old_node._hooks is not None:
        # a retains-grad hook follows the tensor to its new grad_fn (PyTorch 6.6)
        old_node._hooks.retains_grad.pop(old_nr, None)
        self._retains_grad = False
        self.retain_grad()

def apply_inplace_to_view(self: Tensor, out_of_place: Callable[..., Tensor], args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> Tensor:
    """An in-place op on a view, recorded on its base (PyTorch's CopySlices): the base
    becomes ``index_put(old_base, where, op(old_base[where]))`` and the view a fresh
    view of the new base. ``where`` is found from the two arrays' memory layout."""
    base = self._base
    assert base is not None
    where = _recordable_view_index(self, base)
    old_base = base._snapshot()
    out = out_of_place(F.getitem(old_base, where), *args, **kwargs)
    if out.shape != self.shape:
        raise RuntimeError(
            f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(out.shape)}"
        )
    new_base = F.index_put(old_base, where, out, copy_slices=True)
    _write_into(self, out.data)
    base._rebase(new_base.grad_fn)
    self._rebase(F.getitem(base, where).grad_fn)
    base._register_view(self)
    base._regenerate_views(skip=self)
    return self

def register_view(self: Tensor, view: Tensor) -> None:
    """Remember a view of this base, to re-point its grad_fn when an in-place op
    rebases the base (PyTorch regenerates a view's grad_fn likewise): views of a
    non-leaf base, and views of a plain tensor (which join the graph when the tensor
    is changed in place by a recorded op, ``x.add_(r)``).

    The registry is a list of weak references, so registering a view costs one
    weakref and an append (``functional._view`` inlines that for new views): dead
    views are not removed one by one (a weakref callback per view costs more than
    the view op) but pruned when the list's length reaches a power of two, and a view
    is registered once (``_apply_inplace_to_view`` registers again: checked here)."""
    views = self._views
    if views is None:
        self._views = [weakref.ref(view)]
        return
    if any(ref() is view for ref in views):
        return
    _append_view(views, view)

def regenerate_views(self: Tensor, skip: Tensor | None) -> None:
    """After this base was rebased: make every other live view read the new base."""
    if not self._views:
        return
    from .grad_mode import enable_grad

    for ref in list(self._views):
        view = ref()
        if view is None or view is skip or view._base is not self:
            continue
        where = _view_index(view.data, self.data, writable=False)
        if where is None:
            continue
        with enable_grad():
            node = F.getitem(self, where).grad_fn
        view._rebase(node)

def setitem_through_subview(self: Tensor, index: Any, value: Any) -> None:
    records = _context.grad_enabled.get() and (
        self._requires_grad or (isinstance(value, Tensor) and value._requires_grad))
    if not records:
        self._check_inplace((value,))
        _write_region(self, index, value)
        return
    idx, basic = F._normalise_index(index)
    if not basic:
        raise RuntimeError(_OVERLAP_ERROR)
    base = self._base
    assert base is not None
    sub = F.getitem(self, idx)  # a view of the base (the same memory)
    sub._apply_inplace(F.index_put, Ellipsis, value)  # recorded on the base (CopySlices)
    where = _view_index(self._data, base._data, writable=False)
    if where is not None:  # this view now reads the new base
        from .grad_mode import enable_grad

        with enable_grad():
            self._rebase(F.getitem(base, where).grad_fn)


# Note [View creation meta]: as PyTorch's CreationMeta, a view remembers how it was made
# when that forbids recording an in-place change through it: made in no_grad mode (the
# change could not be tracked), one of several views returned together (unbind, split,
# chunk: their shared backward cannot account for it), or returned by a custom Function
# (recording it would replace the Function's backward). A view of such a view inherits it;
# one made in grad mode of a no_grad view keeps its own node's name instead (a str), for
# PyTorch's "Output 0 of View is a view of a view which was created in no_grad mode".
VIEW_DEFAULT, VIEW_NO_GRAD, VIEW_MULTI_OUTPUT, VIEW_IN_CUSTOM_FUNCTION = 0, 1, 2, 3

_VIEW_REFUSALS = {
    VIEW_NO_GRAD: " Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify "
                  "your code by moving both the view and the inplace either both inside the no_grad block "
                  "(if you don't want the inplace to be tracked) or both outside (if you want the inplace "
                  "to be tracked).",
    VIEW_MULTI_OUTPUT: " This view is the output of a function that returns multiple views. Such "
                       "functions do not allow the output views to be modified inplace. You should replace "
                       "the inplace operation by an out-of-place one.",
    VIEW_IN_CUSTOM_FUNCTION: " This view was created inside a custom Function (or because an input was "
                             "returned as-is) and the autograd logic to handle view+inplace would override "
                             "the custom backward associated with the custom Function, leading to incorrect "
                             "gradients. This behavior is forbidden. You can fix this by cloning the output "
                             "of the custom Function.",
}


def view_creation_meta(base_view: Tensor, made: int, node_name: str = "") -> int | str:
    """The creation meta of a view made (``made``, by the op ``node_name``) of
    ``base_view``: a view of a view keeps its base view's unless it has its own (Note
    [View creation meta])."""
    if made != VIEW_DEFAULT or base_view._base is None:
        return made
    meta = base_view._creation_meta
    if (meta == VIEW_NO_GRAD or isinstance(meta, str)) and node_name:
        return node_name
    return meta


def _refuse_inplace_on_view(view: Tensor) -> None:
    """PyTorch's error for an in-place change through a view whose creation forbids it."""
    meta = view._creation_meta
    node = view.grad_fn
    name = meta if isinstance(meta, str) else node.name() if node is not None else None
    if isinstance(meta, str):
        meta = VIEW_NO_GRAD
    if name is None:
        head = "A view was created in no_grad mode and is being modified inplace with grad mode enabled."
    else:
        name = name[:name.rindex("Backward")] if "Backward" in name else name
        head = f"Output {view.output_nr} of {name} is a view "
        head += ("of a view which was created in no_grad mode and is being modified inplace with grad mode "
                 "enabled." if meta == VIEW_NO_GRAD else "and is being modified inplace.")
    raise RuntimeError(head + _VIEW_REFUSALS[meta])


def _append_view(views: list[weakref.ref[Tensor]], view: Tensor) -> None:
    """Append ``view`` to a base's registry, first dropping dead entries when the length
    is a power of two (at least 16): amortised O(1), and the list stays within twice the
    live views."""
    n = len(views)
    if n >= 16 and not n & (n - 1):
        views[:] = [ref for ref in views if ref() is not None]
    views.append(weakref.ref(view))


_OVERLAP_ERROR = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)


def _overlaps(arr: np.ndarray) -> bool:
    """Whether several elements of ``arr`` share memory (an expanded tensor's zero strides)."""
    return any(stride == 0 and n > 1 for n, stride in zip(arr.shape, arr.strides))


def _writable_alias(arr: np.ndarray) -> np.ndarray:
    """A writable array over ``arr``'s memory. numpy marks broadcast views (``expand``)
    read-only, where PyTorch lets a write go to the shared storage; refuses when the
    memory itself is read-only (e.g. ``from_numpy`` of a read-only array)."""
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.flags.writeable:
        offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        try:
            return np.ndarray(arr.shape, arr.dtype, buffer=root, offset=offset, strides=arr.strides)
        except (TypeError, ValueError):
            pass
    raise RuntimeError("cannot write into this tensor: its memory is read-only")


def _write_region(t: Tensor, index: Any, value: Any) -> None:
    """``t[index] = value`` for a tensor whose array numpy made read-only (a broadcast
    view) and that is not recorded: writes the indexed elements alone, allowed as in
    PyTorch unless several of them share one memory location."""
    idx, basic = F._normalise_index(index)
    target = _writable_alias(t.data)
    if not basic or _overlaps(target[idx]):
        raise RuntimeError(_OVERLAP_ERROR)
    target[idx] = value.data if isinstance(value, Tensor) else value
    t._version_counter.value += 1


def _write_into(t: Tensor, value: np.ndarray) -> None:
    target = t._data
    if not target.flags.writeable:  # a (part of a) broadcast view: see _writable_alias
        if _overlaps(target):
            raise RuntimeError(_OVERLAP_ERROR)
        target = _writable_alias(target)
    try:
        np.copyto(target, value, casting="same_kind")
    except TypeError as e:
        raise RuntimeError(
            f"result type {value.dtype} can't be cast to the desired output type {t.data.dtype}"
        ) from e
    except ValueError as e:
        raise RuntimeError(
            f"output with shape {list(t.data.shape)} doesn't match the broadcast shape "
            f"{list(np.broadcast_shapes(t.data.shape, value.shape))}"
        ) from e
    t._version_counter.value += 1


def _recordable_view_index(view: Tensor, base: Tensor) -> tuple[Any, ...]:
    """``_view_index`` of a view whose in-place change is recorded on its base, or a clear
    error when its layout cannot be inverted."""
    where = _view_index(view.data, base.data)
    if where is None:
        raise RuntimeError(
            "asyncgrad cannot record an in-place operation on this view (its layout in the "
            "base's memory is not supported); use an out-of-place operation or clone() it first."
        )
    return where


def _view_index(view: np.ndarray, base: np.ndarray, *, writable: bool = True) -> tuple[Any, ...] | None:
    """Integer index arrays ``where`` with ``base[where]`` aliasing ``view`` element for
    element (from byte offsets), or None when the layout cannot be inverted. A view of a
    0-d base (``view_as``, ``view(1)``) is its one element: ``where`` adds the view's dims.

    With ``writable``, raises when several elements of ``view`` share one memory location
    (an expanded view), as PyTorch does for an in-place write through one.
    """
    if base.ndim == 0 and view.size == 1:
        return (None,) * view.ndim if view.ndim else (Ellipsis,)
    if base.ndim == 0 or view.size == 0:
        return None
    offset = np.full(view.shape, view.__array_interface__["data"][0] - base.__array_interface__["data"][0],
                     dtype=np.int64)
    for k, (n, stride) in enumerate(zip(view.shape, view.strides)):
        axis = [1] * view.ndim
        axis[k] = n
        offset = offset + np.arange(n, dtype=np.int64).reshape(axis) * stride
    flat = offset.reshape(-1)
    if writable and np.unique(flat).size != flat.size:
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single "
            "memory location. Please clone() the tensor before performing the operation."
        )
    # decode byte offsets into base indices, largest stride first
    dims = sorted((k for k in range(base.ndim) if base.shape[k] > 1), key=lambda k: -base.strides[k])
    rest = offset
    where = [np.zeros(view.shape, dtype=np.int64) for _ in range(base.ndim)]
    for k in dims:
        stride = base.strides[k]
        if stride <= 0:
            return None
        where[k], rest = np.divmod(rest, stride)
    if rest.any() or any(((w < 0) | (w >= n)).any() for w, n in zip(where, base.shape)):
        return None
    back = sum((w * st for w, st in zip(where, base.strides)), np.zeros(view.shape, dtype=np.int64))
    if not np.array_equal(back, offset):
        return None
    return tuple(where)
