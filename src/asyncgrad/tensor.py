"""``Tensor``: one numpy array plus its place in the autograd graph.

Operations live in ``asyncgrad.functional`` (the ``ag.*`` functions); the methods here
are thin delegations so that ``x.exp()`` and ``ag.exp(x)`` are the same code.
"""

from __future__ import annotations

import builtins
import operator
import warnings
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple
from collections.abc import Callable, Iterator

import numpy as np

from . import _context, _device
from ._aliases import numpy_aliases
from ._dtype import as_array, is_floating
from .autograd.graph import AccumulateGrad, HookDict, register_tensor_type
from .ops import elementwise as E

if TYPE_CHECKING:
    from . import creation, sampling
    from . import functional as F
    from . import torch_ops as T
    from .functional import _binary, _unary
    from .autograd.graph import Edge, Node, RemovableHandle
else:
    # bound by bind_functional: these modules import this one
    F = T = creation = sampling = None
    # functional's dispatch helpers, called directly by the hottest methods (one frame
    # fewer than F.add -> F._binary: Note [The recording fast path] in recording.py)
    _binary = _unary = None

_NONLEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor "
    "instead. See github.com/pytorch/pytorch/pull/30531 for more information."
)


class VersionCounter:
    """Counts in-place changes; shared by a tensor, its views and ``detach()`` results."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


def _set_data(self: Tensor, value: Any) -> None:
    """``x.data = y``, as in PyTorch: x keeps its identity, graph place, ``.grad`` and
    version counter and takes y's storage (shape and dtype included); a later in-place
    change of x is one of y too. ``y`` is a Tensor or an ndarray."""
    if isinstance(value, Tensor):
        arr = value._data
    elif isinstance(value, np.ndarray):
        arr = value
    else:
        raise TypeError(f"Variable data has to be a tensor, but got {type(value).__name__}")
    if self._requires_grad and arr.dtype.kind not in "fc":
        raise RuntimeError("data set to a tensor that requires gradients must be floating point or complex dtype")
    old = self._data
    self._data = arr
    self._saved = None  # a cached SavedTensor describes the old storage
    if arr.shape != old.shape or arr.dtype != old.dtype:
        self._acc_ref = None  # AccumulateGrad checks gradients against the old metadata


class Tensor:
    """An n-dimensional array that records the operations applied to it for autograd."""

    __slots__ = ("_data", "_requires_grad", "grad_fn", "output_nr", "_grad", "_version_counter",
                 "_base", "_hooks", "_post_acc_hooks", "_retains_grad", "_acc_ref", "_views",
                 "_saved", "_creation_meta", "__weakref__")
    # numpy must defer to our reflected operators (ndarray * Tensor -> Tensor.__rmul__)
    __array_ufunc__ = None

    _data: np.ndarray  # the array; ``data`` reads it (see the property below)
    grad_fn: Node | None
    """The node of the operation that produced this tensor (None for a leaf)."""
    output_nr: int
    """Which output of ``grad_fn`` this tensor is."""
    _requires_grad: bool
    _grad: Tensor | None
    _version_counter: VersionCounter
    _base: Tensor | None
    _hooks: HookDict | None
    _post_acc_hooks: HookDict | None
    _retains_grad: bool
    _acc_ref: Any
    _saved: Any  # the SavedTensor last made of this tensor, shared while it stays valid
    _views: list[weakref.ref[Tensor]] | None  # views to re-point after an in-place op (see _register_view)
    _creation_meta: int | str  # how a view was made (Note [View creation meta]); 0 otherwise

    def __init__(self, data: Any, *, dtype: Any = None, requires_grad: bool = False) -> None:
        arr = data.data if isinstance(data, Tensor) else as_array(data, dtype)
        _init(self, arr, None, 0, None)
        if requires_grad:
            self.requires_grad_(True)

    # --- construction fast paths (no checks) ----------------------------------------
    @staticmethod
    def _wrap(arr: np.ndarray) -> Tensor:
        if type(arr) is not np.ndarray:
            arr = np.asarray(arr)
        t = object.__new__(Tensor)
        _init(t, arr, None, 0, None)
        return t

    @staticmethod
    def _nonleaf(arr: np.ndarray, node: Node | None, output_nr: int,
                 version: VersionCounter | None) -> Tensor:
        if type(arr) is not np.ndarray:
            arr = np.asarray(arr)
        t = object.__new__(Tensor)
        _init(t, arr, node, output_nr, version)
        t._requires_grad = node is not None
        return t

    # --- attributes -------------------------------------------------------------------
    #: The underlying ndarray (API.md §1; ``numpy()`` returns the same array). Reading is
    #: a C-level attribute getter; assigning goes through ``_set_data`` (PyTorch's
    #: ``x.data = y``: x takes y's storage).
    data = property(operator.attrgetter("_data"), _set_data, doc="The underlying ndarray.")

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each dimension, as a tuple of ints (``torch.Size`` in PyTorch)."""
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        """The element type, a numpy dtype (``ag.float32``, ``ag.int64``, ...)."""
        return self._data.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self._data.ndim

    @property
    def device(self) -> _device.device:
        """Always the CPU: asyncgrad computes with numpy (see asyncgrad._device)."""
        return _device.CPU

    @property
    def is_cpu(self) -> bool:
        """Always True."""
        return True

    @property
    def is_cuda(self) -> bool:
        """Always False."""
        return False

    def dim(self) -> int:
        """The number of dimensions (as ``ndim``)."""
        return self.data.ndim

    @property
    def is_leaf(self) -> bool:
        """True for a tensor no recorded operation produced (``grad_fn is None``); backward fills leaves' ``.grad``."""
        return self.grad_fn is None

    @property
    def requires_grad(self) -> bool:
        """Whether operations on this tensor are recorded for autograd."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        """Set on a leaf (as ``requires_grad_``); only floating tensors can require gradients."""
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` on a leaf (in place); returns self."""
        if self.grad_fn is not None:
            if requires_grad:
                return self
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use "
                "a computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach()."
            )
        if requires_grad and not is_floating(self.data.dtype):
            raise RuntimeError(
                f"only Tensors of floating point dtype can require gradients (got {self.data.dtype})"
            )
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> Tensor | None:
        """The accumulated gradient of a leaf (or of a ``retain_grad()`` tensor); None until a backward writes it."""
        if self.grad_fn is not None and not self._retains_grad:
            warnings.warn(_NONLEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        """Replace the gradient: a Tensor of this tensor's shape and dtype, or None."""
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got {type(value).__name__}")
            if value is self:  # the next backward would accumulate into x's own values
                raise RuntimeError("can't assign Variable as its own grad")
            if value.shape != self.shape:
                raise RuntimeError(
                    f"attempting to assign a gradient of size '{list(value.shape)}' to a tensor of "
                    f"size '{list(self.shape)}'. Please ensure that the gradient and the tensor "
                    "are the same size"
                )
            if value.dtype != self.dtype:
                raise RuntimeError(
                    f"attempting to assign a gradient with dtype '{value.dtype}' to a tensor "
                    f"with dtype '{self.dtype}'. Please ensure that the gradient and the tensor "
                    "have the same dtype"
                )
        self._grad = value

    @property
    def retains_grad(self) -> bool:
        """True when ``retain_grad()`` made this non-leaf keep its ``.grad``."""
        return self._retains_grad

    @property
    def _version(self) -> int:
        return self._version_counter.value

    @property
    def T(self) -> Tensor:
        """All dimensions reversed (a view; the transpose of a matrix)."""
        return F.permute(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> Tensor:
        """The last two dimensions swapped (a view): a batch of transposed matrices."""
        return F.transpose(self, -2, -1)

    # --- conversions --------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The underlying array, without a copy (changes through it are not tracked)."""
        return self.data

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        if self.data.size != 1:
            raise RuntimeError(
                f"a Tensor with {self.data.size} elements cannot be converted to Scalar"
            )
        return self.data.item()

    def tolist(self) -> Any:
        """The data as (nested) Python lists of Python numbers."""
        return self.data.tolist()

    @numpy_aliases
    def size(self, dim: int | None = None) -> Any:
        """The shape, or the size of dimension ``dim`` (``axis`` works too)."""
        return self.data.shape if dim is None else self.data.shape[dim]

    def numel(self) -> int:
        """The number of elements."""
        return int(self.data.size)

    def __len__(self) -> int:
        if self.data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return len(self.data)

    def __iter__(self) -> Iterator[Tensor]:
        if self.data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(len(self.data)))

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise RuntimeError(
                "Boolean value of Tensor with more than one value is ambiguous"
            )
        return bool(self.data)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.data.dtype.kind not in "iu" or self.data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.data.item())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.data if dtype is None else self.data.astype(dtype)

    # by identity (``==`` is elementwise): object's own C-level hash, not a Python method,
    # since the engine keys dicts and sets by tensors on every backward (.grad staging)
    __hash__ = object.__hash__

    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        """A new leaf with a copy of the data (and of ``.grad``); it shares nothing with
        this tensor's graph. Only leaves can be deep-copied, as in PyTorch."""
        if self.grad_fn is not None:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                "deepcopy protocol at the moment. If you were attempting to deepcopy a "
                "module, this may be because of a torch.nn.utils.weight_norm usage"
            )
        import copy

        t = Tensor._wrap(self.data.copy())
        t._requires_grad = self._requires_grad
        if self._grad is not None:
            t._grad = copy.deepcopy(self._grad, memo)
        memo[id(self)] = t
        return t

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_leaf, (self.data, self._requires_grad))

    def __repr__(self) -> str:
        body = np.array2string(self.data, separator=", ", prefix="tensor(")
        extra = ""
        if self.data.dtype != np.dtype(np.float32) and self.data.dtype != np.dtype(np.int64):
            extra += f", dtype={self.data.dtype}"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{self.grad_fn.name()}>"
        elif self._requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    # --- graph ----------------------------------------------------------------------------
    def _gradient_edge(self) -> Edge:
        if self.grad_fn is not None:
            return (self.grad_fn, self.output_nr)
        return (AccumulateGrad.for_leaf(self), 0)

    def detach(self) -> Tensor:
        """A new leaf sharing this tensor's data and version counter."""
        t = Tensor._wrap(self.data)
        t._version_counter = self._version_counter
        return t

    def detach_(self) -> Tensor:
        """Make this tensor a leaf that does not require grad, in place; returns self."""
        if self._base is not None and self._base._requires_grad:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self.grad_fn = None
        self.output_nr = 0
        self._requires_grad = False
        return self

    def retain_grad(self) -> None:
        """Keep ``.grad`` for this non-leaf after backward (a no-op on leaves)."""
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None or self._retains_grad:
            return
        self.grad_fn.hooks().retains_grad[self.output_nr] = weakref.ref(self)
        self._retains_grad = True

    def register_hook(self, hook: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """``hook(grad) -> replacement or None`` runs when this tensor's gradient is ready."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is None:
            if self._hooks is None:
                self._hooks = HookDict()
            return self._hooks.add(hook)
        per_slot = self.grad_fn.hooks().tensor_pre
        hooks = per_slot.get(self.output_nr)
        if hooks is None:
            hooks = per_slot[self.output_nr] = HookDict()
        return hooks.add(hook)

    def register_post_accumulate_grad_hook(self, hook: Callable[[Tensor], None]) -> RemovableHandle:
        """``hook(tensor)`` runs after ``.grad`` of this leaf was updated by a backward."""
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._post_acc_hooks is None:
            self._post_acc_hooks = HookDict()
        return self._post_acc_hooks.add(hook)

    def backward(self, gradient: Any = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs: Any = None) -> None:
        """Synchronous backward (``ag.backward_sync(self, ...)``); ``await ag.backward`` in
        async code."""
        from .autograd.api import backward_sync

        backward_sync(self, gradient, retain_graph=retain_graph, create_graph=create_graph,
                      inputs=inputs)

    # --- in-place machinery ---------------------------------------------------------------
    def _check_inplace(self, args: tuple[Any, ...] = ()) -> None:
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

    def _apply_inplace(self, out_of_place: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
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

    def _snapshot(self) -> Tensor:
        """A copy of the current value that keeps this tensor's place in the graph."""
        old = Tensor._nonleaf(self.data.copy(), self.grad_fn, self.output_nr, None)
        old._requires_grad = self._requires_grad
        old._acc_ref = self._acc_ref
        return old

    def _rebase(self, node: Node | None) -> None:
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

    def _apply_inplace_to_view(self, out_of_place: Callable[..., Tensor], args: tuple[Any, ...],
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

    def _register_view(self, view: Tensor) -> None:
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

    def _regenerate_views(self, skip: Tensor | None) -> None:
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

    # --- operators -------------------------------------------------------------------------
    def __add__(self, other: Any) -> Tensor: return _binary(E.add, self, other)
    def __radd__(self, other: Any) -> Tensor: return _binary(E.add, other, self)
    def __sub__(self, other: Any) -> Tensor: return _binary(E.sub, self, other)
    def __rsub__(self, other: Any) -> Tensor: return F.sub(other, self)
    def __mul__(self, other: Any) -> Tensor: return _binary(E.mul, self, other)
    def __rmul__(self, other: Any) -> Tensor: return _binary(E.mul, other, self)
    def __truediv__(self, other: Any) -> Tensor: return F.div(self, other)
    def __rtruediv__(self, other: Any) -> Tensor: return F.div(other, self)
    def __pow__(self, other: Any) -> Tensor: return F.pow(self, other)
    def __rpow__(self, other: Any) -> Tensor: return F.pow(other, self)
    def __mod__(self, other: Any) -> Tensor: return T.remainder(self, other)
    def __rmod__(self, other: Any) -> Tensor: return T.remainder(other, self)
    def __floordiv__(self, other: Any) -> Tensor: return T.floor_divide(self, other)
    def __rfloordiv__(self, other: Any) -> Tensor: return T.floor_divide(other, self)
    def __matmul__(self, other: Any) -> Tensor: return F.matmul(self, other)
    def __rmatmul__(self, other: Any) -> Tensor: return F.matmul(other, self)
    def __neg__(self) -> Tensor: return _unary(E.neg, self)
    def __pos__(self) -> Tensor: return self
    def __abs__(self) -> Tensor: return F.abs(self)
    def __getitem__(self, index: Any) -> Tensor: return F.getitem(self, index)
    def __setitem__(self, index: Any, value: Any) -> None:
        if self._base is not None and _overlaps(self._data):
            # An expanded view: several elements share memory, but the indexed ones may
            # not (``g[0] = 0``, allowed in PyTorch). Write through the view of just them.
            self._setitem_through_subview(index, value)
            return
        self._apply_inplace(F.index_put, index, value)

    def _setitem_through_subview(self, index: Any, value: Any) -> None:
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

    def __iadd__(self, other: Any) -> Tensor: return self._apply_inplace(F.add, other)
    def __isub__(self, other: Any) -> Tensor: return self._apply_inplace(F.sub, other)
    def __imul__(self, other: Any) -> Tensor: return self._apply_inplace(F.mul, other)
    def __itruediv__(self, other: Any) -> Tensor: return self._apply_inplace(F.div, other)

    # comparisons: non-differentiable bool tensors
    def __lt__(self, other: Any) -> Tensor: return F.compare(np.less, self, other)
    def __le__(self, other: Any) -> Tensor: return F.compare(np.less_equal, self, other)
    def __gt__(self, other: Any) -> Tensor: return F.compare(np.greater, self, other)
    def __ge__(self, other: Any) -> Tensor: return F.compare(np.greater_equal, self, other)
    def __eq__(self, other: Any) -> Tensor: return F.compare(np.equal, self, other)  # type: ignore[override]
    def __ne__(self, other: Any) -> Tensor: return F.compare(np.not_equal, self, other)  # type: ignore[override]
    def __and__(self, other: Any) -> Tensor: return F.compare(np.logical_and, self, other)
    def __or__(self, other: Any) -> Tensor: return F.compare(np.logical_or, self, other)
    def __rand__(self, other: Any) -> Tensor: return F.compare(np.logical_and, other, self)
    def __ror__(self, other: Any) -> Tensor: return F.compare(np.logical_or, other, self)
    def __invert__(self) -> Tensor: return Tensor._wrap(np.logical_not(self.data))

    # --- methods (see asyncgrad.functional for docs) -----------------------------------------
    def add(self, other: Any, *, alpha: builtins.float = 1) -> Tensor:
        """``self + alpha * other``, broadcasting."""
        return F.add(self, other if alpha == 1 else F.mul(other, alpha))
    def sub(self, other: Any, *, alpha: builtins.float = 1) -> Tensor:
        """``self - alpha * other``, broadcasting."""
        return F.sub(self, other if alpha == 1 else F.mul(other, alpha))
    def mul(self, other: Any) -> Tensor:
        """``self * other``, broadcasting."""
        return F.mul(self, other)
    def div(self, other: Any) -> Tensor:
        """``self / other`` (true division), broadcasting."""
        return F.div(self, other)
    def pow(self, exponent: Any) -> Tensor:
        """``self ** exponent``, broadcasting."""
        return F.pow(self, exponent)
    def matmul(self, other: Any) -> Tensor:
        """The matrix product ``self @ other`` (vectors, matrices and batches, as ``numpy.matmul``)."""
        return F.matmul(self, other)
    def neg(self) -> Tensor:
        """``-self``."""
        return _unary(E.neg, self)
    def abs(self) -> Tensor:
        """The absolute value, elementwise."""
        return _unary(E.abs_, self)
    def exp(self) -> Tensor:
        """``e ** self``, elementwise."""
        return _unary(E.exp, self)
    def log(self) -> Tensor:
        """The natural logarithm, elementwise."""
        return _unary(E.log, self)
    def sqrt(self) -> Tensor:
        """The square root, elementwise."""
        return _unary(E.sqrt, self)
    def sin(self) -> Tensor:
        """The sine, elementwise."""
        return _unary(E.sin, self)
    def cos(self) -> Tensor:
        """The cosine, elementwise."""
        return _unary(E.cos, self)
    def tanh(self) -> Tensor:
        """The hyperbolic tangent, elementwise."""
        return _unary(E.tanh, self)
    def sigmoid(self) -> Tensor:
        """The logistic function ``1 / (1 + exp(-self))``, elementwise."""
        return _unary(E.sigmoid, self)
    def relu(self) -> Tensor:
        """``max(self, 0)``, elementwise."""
        return _unary(E.relu, self)
    def erf(self) -> Tensor:
        """The error function, elementwise."""
        return _unary(E.erf, self)
    def clamp(self, min: Any = None, max: Any = None) -> Tensor:
        """Each element limited to ``[min, max]`` (either bound may be None)."""
        return F.clamp(self, min, max)
    def clip(self, min: Any = None, max: Any = None) -> Tensor:
        """Alias of ``clamp``."""
        return F.clamp(self, min, max)
    def maximum(self, other: Any) -> Tensor:
        """The larger of ``self`` and ``other``, elementwise, broadcasting."""
        return F.maximum(self, other)
    def minimum(self, other: Any) -> Tensor:
        """The smaller of ``self`` and ``other``, elementwise, broadcasting."""
        return F.minimum(self, other)
    def where(self, condition: Any, other: Any) -> Tensor:
        """``self`` where ``condition`` is true, else ``other`` (``ag.where(condition, self, other)``)."""
        return F.where(condition, self, other)
    @numpy_aliases
    def sum(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The sum over ``dim`` (all elements when None); ``axis``/``keepdims`` work too."""
        return F.sum(self, dim, keepdim)
    @numpy_aliases
    def mean(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The mean over ``dim`` (all elements when None); ``axis``/``keepdims`` work too."""
        return F.mean(self, dim, keepdim)
    @numpy_aliases
    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        """The maximum; with ``dim``, a ``(values, indices)`` named tuple; with a tensor, ``maximum``."""
        return F.max(self, dim, keepdim)
    @numpy_aliases
    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        """The minimum; with ``dim``, a ``(values, indices)`` named tuple; with a tensor, ``minimum``."""
        return F.min(self, dim, keepdim)
    @numpy_aliases
    def var(self, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
            unbiased: bool | None = None) -> Tensor:
        """The variance over ``dim`` with Bessel's ``correction`` (1 by default, as PyTorch)."""
        return F.var(self, dim, correction=correction, keepdim=keepdim, unbiased=unbiased)
    @numpy_aliases
    def softmax(self, dim: int) -> Tensor:
        """``exp(self)`` normalised to sum to 1 along ``dim``."""
        return F.softmax(self, dim)
    @numpy_aliases
    def log_softmax(self, dim: int) -> Tensor:
        """The logarithm of ``softmax`` along ``dim``, computed stably."""
        return F.log_softmax(self, dim)
    def reshape(self, *shape: Any) -> Tensor:
        """The same elements in a new shape (one size may be -1)."""
        return F.reshape(self, _shape_args(shape))
    def view(self, *shape: Any) -> Tensor:
        """The same elements in a new shape, sharing memory; raises if that needs a copy (then use ``reshape``)."""
        return F.view(self, _shape_args(shape))
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Dimensions ``start_dim`` to ``end_dim`` merged into one."""
        return F.flatten(self, start_dim, end_dim)
    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Dimensions ``dim0`` and ``dim1`` swapped (a view)."""
        return F.transpose(self, dim0, dim1)
    def t(self) -> Tensor:
        """The transpose of a matrix (a 0-d or 1-d tensor is returned as is)."""
        return F.transpose(self, 0, 1) if self.ndim == 2 else self
    def permute(self, *dims: Any) -> Tensor:
        """The dimensions reordered as ``dims`` (a view)."""
        return F.permute(self, _shape_args(dims))
    @numpy_aliases
    def squeeze(self, dim: Any = None) -> Tensor:
        """Dimensions of size 1 removed (only ``dim`` when given)."""
        return F.squeeze(self, dim)
    @numpy_aliases
    def unsqueeze(self, dim: int) -> Tensor:
        """A dimension of size 1 inserted at ``dim``."""
        return F.unsqueeze(self, dim)
    def expand(self, *sizes: Any) -> Tensor:
        """Broadcast to ``sizes`` without copying (-1 keeps a dimension)."""
        return F.expand(self, _shape_args(sizes))
    def expand_as(self, other: Tensor) -> Tensor:
        """Broadcast to ``other``'s shape without copying."""
        return F.expand(self, other.shape)
    def broadcast_to(self, shape: Any) -> Tensor:
        """Broadcast to ``shape`` without copying."""
        return F.broadcast_to(self, shape)
    def clone(self) -> Tensor:
        """A copy of the data that stays in the graph (gradients flow back to ``self``)."""
        return F.clone(self)
    def view_as(self, other: Tensor) -> Tensor:
        """``view`` with ``other``'s shape."""
        return F.view_as(self, other)
    def contiguous(self) -> Tensor:
        """Self when C-contiguous, else a contiguous copy that stays in the graph."""
        return F.contiguous(self)
    def is_contiguous(self) -> bool:
        """Whether the data is laid out C-contiguously."""
        return bool(self.data.flags.c_contiguous)
    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        """The view of ``length`` elements of ``dim`` starting at ``start``."""
        return F.narrow(self, dim, start, length)
    def select(self, dim: int, index: int) -> Tensor:
        """The view at ``index`` of ``dim``, with that dimension removed."""
        return F.select(self, dim, index)
    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        """The views along ``dim``, one per index, with that dimension removed."""
        return F.unbind(self, dim)
    def split(self, split_size: Any, dim: int = 0) -> tuple[Tensor, ...]:
        """Views of ``split_size`` elements along ``dim`` (or of the listed sizes)."""
        return F.split(self, split_size, dim)
    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """``chunks`` views of (nearly) equal size along ``dim``."""
        return F.chunk(self, chunks, dim)
    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The view of the diagonal ``offset`` of dimensions ``dim1`` and ``dim2``."""
        return F.diagonal(self, offset, dim1, dim2)
    def repeat(self, *sizes: Any) -> Tensor:
        """The tensor tiled ``sizes`` times along each dimension (a copy)."""
        return F.repeat(self, _shape_args(sizes))
    @numpy_aliases
    def prod(self, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        """The product over ``dim`` (all elements when None)."""
        return F.prod(self, dim, keepdim, dtype=dtype)
    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        """``value`` where ``mask`` is true, else self."""
        return F.masked_fill(self, mask, value)
    def tril(self, diagonal: int = 0) -> Tensor:
        """The lower triangle (below diagonal ``diagonal``); the rest zero."""
        return F.tril(self, diagonal)
    def triu(self, diagonal: int = 0) -> Tensor:
        """The upper triangle (above diagonal ``diagonal``); the rest zero."""
        return F.triu(self, diagonal)
    @numpy_aliases
    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
        """The ``k`` largest (or smallest) elements along ``dim``: a ``(values, indices)`` named tuple."""
        return F.topk(self, k, dim, largest, sorted)
    @numpy_aliases
    def median(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """The median (the lower of the two middle values); with ``dim``, ``(values, indices)``."""
        return F.median(self, dim, keepdim)
    @numpy_aliases
    def nanmedian(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """``median`` ignoring NaN."""
        return F.nanmedian(self, dim, keepdim)
    @numpy_aliases
    def std(self, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
            unbiased: bool | None = None) -> Tensor:
        """The standard deviation over ``dim`` with Bessel's ``correction``."""
        return F.std(self, dim, correction=correction, keepdim=keepdim, unbiased=unbiased)
    @numpy_aliases
    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        """The ``p``-norm over ``dim`` (all elements when None; Frobenius by default)."""
        return F.norm(self, p, dim, keepdim, dtype=dtype)
    def eq(self, other: Any) -> Tensor:
        """``self == other``, elementwise (bool)."""
        return F.eq(self, other)
    def ne(self, other: Any) -> Tensor:
        """``self != other``, elementwise (bool)."""
        return F.ne(self, other)
    def lt(self, other: Any) -> Tensor:
        """``self < other``, elementwise (bool)."""
        return F.lt(self, other)
    def le(self, other: Any) -> Tensor:
        """``self <= other``, elementwise (bool)."""
        return F.le(self, other)
    def gt(self, other: Any) -> Tensor:
        """``self > other``, elementwise (bool)."""
        return F.gt(self, other)
    def ge(self, other: Any) -> Tensor:
        """``self >= other``, elementwise (bool)."""
        return F.ge(self, other)
    def float(self) -> Tensor:
        """Cast to float32 (differentiable)."""
        return F.to_dtype(self, np.float32)
    def double(self) -> Tensor:
        """Cast to float64 (differentiable)."""
        return F.to_dtype(self, np.float64)
    def long(self) -> Tensor:
        """Cast to int64 (outside the graph)."""
        return F.to_dtype(self, np.int64)
    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        """``to(dtype)``, ``to(device, dtype=None)``, ``to(other)``, as PyTorch; the device
        must be the CPU (a no-op). Returns self unless the dtype changes or ``copy=True``."""
        dtype, copy = _device.parse_to(args, kwargs, Tensor)
        out = self if dtype is None else F.to_dtype(self, dtype)
        return F.clone(out) if copy and out is self else out
    def cpu(self) -> Tensor:
        """Self: asyncgrad computes on the CPU."""
        return self
    def type(self, dtype: Any = None, non_blocking: bool = False) -> Any:
        """With no argument, the type name (``"asyncgrad.FloatTensor"`` for float32, as
        PyTorch's ``"torch.FloatTensor"``); else this tensor cast to that type or dtype."""
        if dtype is None:
            return _device.type_name(self.data.dtype)
        return F.to_dtype(self, _device.dtype_of_type(dtype))
    def type_as(self, other: Tensor) -> Tensor:
        """Cast to ``other``'s dtype."""
        return F.to_dtype(self, other.dtype)
    @numpy_aliases
    def argmax(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The index of the maximum (over the flattened tensor, or along ``dim``)."""
        return Tensor._wrap(np.asarray(np.argmax(self.data, axis=dim, keepdims=keepdim)))
    @numpy_aliases
    def argmin(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The index of the minimum (over the flattened tensor, or along ``dim``)."""
        return Tensor._wrap(np.asarray(np.argmin(self.data, axis=dim, keepdims=keepdim)))
    def isnan(self) -> Tensor:
        """A bool tensor, True where the value is NaN."""
        return Tensor._wrap(np.isnan(self.data))
    def isfinite(self) -> Tensor:
        """A bool tensor, True where the value is neither NaN nor infinite."""
        return F.isfinite(self)
    def isinf(self) -> Tensor:
        """A bool tensor, True where the value is +inf or -inf."""
        return F.isinf(self)
    def allclose(self, other: Any, rtol: builtins.float = 1e-5, atol: builtins.float = 1e-8) -> bool:
        """Whether every element is within ``atol + rtol * |other|`` of ``other`` (a Python bool)."""
        return bool(np.allclose(self.data, _data(other), rtol=rtol, atol=atol))
    def equal(self, other: Any) -> bool:
        """Whether ``other`` has the same shape and elements (a Python bool)."""
        return bool(np.array_equal(self.data, _data(other)))

    # in-place variants (end in _)
    def add_(self, other: Any, *, alpha: builtins.float = 1) -> Tensor:
        """In place: ``self += alpha * other``; returns self."""
        return self._apply_inplace(F.add, other if alpha == 1 else F.mul(other, alpha))
    def sub_(self, other: Any, *, alpha: builtins.float = 1) -> Tensor:
        """In place: ``self -= alpha * other``; returns self."""
        return self._apply_inplace(F.sub, other if alpha == 1 else F.mul(other, alpha))
    def mul_(self, other: Any) -> Tensor:
        """In place: ``self *= other``; returns self."""
        return self._apply_inplace(F.mul, other)
    def div_(self, other: Any) -> Tensor:
        """In place: ``self /= other``; returns self."""
        return self._apply_inplace(F.div, other)
    def pow_(self, exponent: Any) -> Tensor:
        """In place: ``self **= exponent``; returns self."""
        return self._apply_inplace(F.pow, exponent)
    def clamp_(self, min: Any = None, max: Any = None) -> Tensor:
        """In place: each element limited to ``[min, max]``; returns self."""
        return self._apply_inplace(F.clamp, min, max)
    def relu_(self) -> Tensor:
        """In place: ``max(self, 0)``; returns self."""
        return self._apply_inplace(F.relu)
    def exp_(self) -> Tensor:
        """In place: ``e ** self``; returns self."""
        return self._apply_inplace(F.exp)
    def neg_(self) -> Tensor:
        """In place: ``-self``; returns self."""
        return self._apply_inplace(F.neg)
    def zero_(self) -> Tensor:
        """In place: every element set to 0; returns self."""
        return self._apply_inplace(F.zero)
    def fill_(self, value: Any) -> Tensor:
        """In place: every element set to ``value``; returns self."""
        return self._apply_inplace(F.fill, value)
    def copy_(self, src: Any) -> Tensor:
        """In place: ``src``'s values (broadcast and cast) copied into self; returns self."""
        return self._apply_inplace(F.copy_from, src)
    def masked_fill_(self, mask: Any, value: Any) -> Tensor:
        """In place: ``value`` where ``mask`` is true; returns self."""
        return self._apply_inplace(F.masked_fill, mask, value)
    def tril_(self, diagonal: int = 0) -> Tensor:
        """In place: ``tril``; returns self."""
        return self._apply_inplace(F.tril, diagonal)
    def triu_(self, diagonal: int = 0) -> Tensor:
        """In place: ``triu``; returns self."""
        return self._apply_inplace(F.triu, diagonal)

    # random fills and sampling (see asyncgrad.sampling)
    def uniform_(self, a: builtins.float = 0.0, b: builtins.float = 1.0, *, generator: Any = None) -> Tensor:
        """In place: uniform samples from ``[a, b)``; returns self."""
        return sampling.uniform_(self, a, b, generator=generator)
    def normal_(self, mean: builtins.float = 0.0, std: builtins.float = 1.0, *, generator: Any = None) -> Tensor:
        """In place: normal samples with ``mean`` and ``std``; returns self."""
        return sampling.normal_(self, mean, std, generator=generator)
    def bernoulli_(self, p: Any = 0.5, *, generator: Any = None) -> Tensor:
        """In place: 0/1 samples, 1 with probability ``p``; returns self."""
        return sampling.bernoulli_(self, p, generator=generator)
    def bernoulli(self, p: builtins.float | None = None, *, generator: Any = None) -> Tensor:
        """0/1 samples, 1 with the probability in each element (or ``p``)."""
        return sampling.bernoulli(self, p, generator=generator)
    def multinomial(self, num_samples: int, replacement: bool = False, *, generator: Any = None) -> Tensor:
        """``num_samples`` indices drawn per row with the row's weights."""
        return sampling.multinomial(self, num_samples, replacement, generator=generator)

    # factories with this tensor's dtype (see asyncgrad.creation)
    def new_tensor(self, data: Any, *, dtype: Any = None, requires_grad: bool = False,
                   device: Any = None) -> Tensor:
        """A new tensor from ``data`` with this tensor's dtype unless ``dtype``."""
        return creation.new_tensor(self, data, dtype=dtype, requires_grad=requires_grad, device=device)
    def new_full(self, size: Any, fill_value: Any, *, dtype: Any = None, requires_grad: bool = False,
                 device: Any = None) -> Tensor:
        """A tensor of ``size`` filled with ``fill_value``, this tensor's dtype unless ``dtype``."""
        return creation.new_full(self, size, fill_value, dtype=dtype, requires_grad=requires_grad, device=device)
    def new_zeros(self, *size: Any, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
        """Zeros of ``size`` with this tensor's dtype unless ``dtype``."""
        return creation.new_full(self, _shape_args(size), 0, dtype=dtype, requires_grad=requires_grad, device=device)
    def new_ones(self, *size: Any, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
        """Ones of ``size`` with this tensor's dtype unless ``dtype``."""
        return creation.new_full(self, _shape_args(size), 1, dtype=dtype, requires_grad=requires_grad, device=device)
    def new_empty(self, *size: Any, dtype: Any = None, requires_grad: bool = False, device: Any = None) -> Tensor:
        """An uninitialised tensor of ``size`` with this tensor's dtype unless ``dtype``."""
        creation._check_device(device)
        return creation._finish(np.empty(_shape_args(size), dtype=dtype or self.dtype), requires_grad)
    def new(self, *args: Any) -> Tensor:
        """PyTorch's legacy constructor with this tensor's dtype: ``x.new(2, 3)`` is
        uninitialised of that shape, ``x.new()`` empty, ``x.new(data)`` a copy of ``data``."""
        if not args:
            return Tensor._wrap(np.empty((0,), dtype=self.dtype))
        if all(isinstance(a, (int, np.integer)) and not isinstance(a, builtins.bool) for a in args):
            return Tensor._wrap(np.empty(tuple(builtins.int(a) for a in args), dtype=self.dtype))
        if len(args) > 1:
            raise TypeError("new() takes sizes (ints) or one sequence of data")
        return creation.new_tensor(self, args[0])

    # --- PyTorch's other names (issue 32): conversions, dtype queries, split_with_sizes -----
    def int(self) -> Tensor:
        """Cast to int32 (outside the graph)."""
        return F.to_dtype(self, np.int32)
    def half(self) -> Tensor:
        """Cast to float16 (differentiable)."""
        return F.to_dtype(self, np.float16)
    def bool(self) -> Tensor:
        """Cast to bool (outside the graph)."""
        return F.to_dtype(self, np.bool_)
    def byte(self) -> Tensor:
        """Cast to uint8 (outside the graph)."""
        return F.to_dtype(self, np.uint8)
    def char(self) -> Tensor:
        """Cast to int8 (outside the graph)."""
        return F.to_dtype(self, np.int8)
    def short(self) -> Tensor:
        """Cast to int16 (outside the graph)."""
        return F.to_dtype(self, np.int16)
    def is_floating_point(self) -> builtins.bool:
        """Whether the dtype is a floating-point one."""
        return builtins.bool(self._data.dtype.kind == "f")
    def is_complex(self) -> builtins.bool:
        """Whether the dtype is a complex one."""
        return builtins.bool(self._data.dtype.kind == "c")
    def split_with_sizes(self, split_sizes: Any, dim: builtins.int = 0) -> tuple[Tensor, ...]:
        """Views of consecutive pieces of the given sizes along ``dim`` (they must add up)."""
        return F.split_with_sizes(self, split_sizes, dim)
    def gather(self, dim: builtins.int, index: Any) -> Tensor:
        """The elements at ``index`` along ``dim`` (``out[i][j] = self[i][index[i][j]]``)."""
        return F.gather(self, dim, index)
    def index_select(self, dim: builtins.int, index: Any) -> Tensor:
        """The entries at ``index`` (a vector) along ``dim``."""
        return F.index_select(self, dim, index)
    def unfold(self, dimension: builtins.int, size: builtins.int, step: builtins.int) -> Tensor:
        """Windows of ``size`` along ``dimension``, ``step`` apart, as a new last dim."""
        return F.unfold(self, dimension, size, step)
    @numpy_aliases
    def amax(self, dim: Any = (), keepdim: builtins.bool = False) -> Tensor:
        """The maximum over ``dim`` (an int or a tuple of them; all dims when empty)."""
        return F.amax(self, dim, keepdim)
    @numpy_aliases
    def amin(self, dim: Any = (), keepdim: builtins.bool = False) -> Tensor:
        """The minimum over ``dim`` (an int or a tuple of them; all dims when empty)."""
        return F.amin(self, dim, keepdim)
    def scatter(self, dim: builtins.int, index: Any, src: Any = None, *, value: Any = None) -> Tensor:
        """A copy with ``src`` (or ``value``) written at ``index`` along ``dim``."""
        return F.scatter(self, dim, index, src, value=value)
    def scatter_(self, dim: builtins.int, index: Any, src: Any = None, *, value: Any = None) -> Tensor:
        """In place: ``scatter``; returns self."""
        return self._apply_inplace(F.scatter, dim, index, src, value=value)
    def scatter_add(self, dim: builtins.int, index: Any, src: Any) -> Tensor:
        """A copy with ``src`` added at ``index`` along ``dim``."""
        return F.scatter_add(self, dim, index, src)
    def scatter_add_(self, dim: builtins.int, index: Any, src: Any) -> Tensor:
        """In place: ``scatter_add``; returns self."""
        return self._apply_inplace(F.scatter_add, dim, index, src)

    # --- more of PyTorch's Tensor methods (issue 32; the ops are in asyncgrad.torch_ops) ----
    def rsqrt(self) -> Tensor:
        """``1 / sqrt(self)``."""
        return T.rsqrt(self)
    def log1p(self) -> Tensor:
        """``log(1 + self)``."""
        return T.log1p(self)
    def expm1(self) -> Tensor:
        """``exp(self) - 1``."""
        return T.expm1(self)
    def log2(self) -> Tensor:
        """The base-2 logarithm."""
        return T.log2(self)
    def log10(self) -> Tensor:
        """The base-10 logarithm."""
        return T.log10(self)
    def exp2(self) -> Tensor:
        """``2 ** self``."""
        return T.exp2(self)
    def sinh(self) -> Tensor:
        """The hyperbolic sine."""
        return T.sinh(self)
    def cosh(self) -> Tensor:
        """The hyperbolic cosine."""
        return T.cosh(self)
    def asin(self) -> Tensor:
        """The inverse sine."""
        return T.asin(self)
    def acos(self) -> Tensor:
        """The inverse cosine."""
        return T.acos(self)
    def atan(self) -> Tensor:
        """The inverse tangent."""
        return T.atan(self)
    def reciprocal(self) -> Tensor:
        """``1 / self``."""
        return T.reciprocal(self)
    def erfc(self) -> Tensor:
        """``1 - erf(self)``."""
        return T.erfc(self)
    def floor(self) -> Tensor:
        """Rounded down."""
        return T.floor(self)
    def ceil(self) -> Tensor:
        """Rounded up."""
        return T.ceil(self)
    def trunc(self) -> Tensor:
        """Rounded towards zero."""
        return T.trunc(self)
    def frac(self) -> Tensor:
        """``self - trunc(self)``."""
        return T.frac(self)
    def sign(self) -> Tensor:
        """-1, 0 or 1 by sign."""
        return T.sign(self)
    def square(self) -> Tensor:
        """``self * self``."""
        return T.square(self)
    def fliplr(self) -> Tensor:
        """``flip(1)``."""
        return T.fliplr(self)
    def flipud(self) -> Tensor:
        """``flip(0)``."""
        return T.flipud(self)
    def trace(self) -> Tensor:
        """The sum of the diagonal."""
        return T.trace(self)
    def nonzero(self) -> Tensor:
        """The indices of the nonzero elements."""
        return T.nonzero(self)
    def argwhere(self) -> Tensor:
        """The indices of the nonzero elements."""
        return T.argwhere(self)
    def logical_not(self) -> Tensor:
        """Elementwise ``not``."""
        return T.logical_not(self)
    def atan2(self, other: Any) -> Tensor:
        """The angle of ``(other, self)``."""
        return T.atan2(self, other)
    def remainder(self, other: Any) -> Tensor:
        """Python's modulus."""
        return T.remainder(self, other)
    def fmod(self, other: Any) -> Tensor:
        """C's remainder."""
        return T.fmod(self, other)
    def floor_divide(self, other: Any) -> Tensor:
        """``floor(self / other)``."""
        return T.floor_divide(self, other)
    def true_divide(self, other: Any) -> Tensor:
        """``self / other``."""
        return T.true_divide(self, other)
    def clamp_min(self, min: Any) -> Tensor:  # noqa: A002
        """``max(self, min)``."""
        return T.clamp_min(self, min)
    def clamp_max(self, max: Any) -> Tensor:  # noqa: A002
        """``min(self, max)``."""
        return T.clamp_max(self, max)
    def hypot(self, other: Any) -> Tensor:
        """``sqrt(self**2 + other**2)``."""
        return T.hypot(self, other)
    def logaddexp(self, other: Any) -> Tensor:
        """``log(exp(self) + exp(other))``."""
        return T.logaddexp(self, other)
    def xlogy(self, other: Any) -> Tensor:
        """``self * log(other)``."""
        return T.xlogy(self, other)
    def outer(self, other: Any) -> Tensor:
        """The outer product."""
        return T.outer(self, other)
    def dot(self, other: Any) -> Tensor:
        """The inner product of vectors."""
        return T.dot(self, other)
    def bmm(self, other: Any) -> Tensor:
        """Batched matrix product."""
        return T.bmm(self, other)
    def mv(self, vec: Any) -> Tensor:
        """Matrix times vector."""
        return T.mv(self, vec)
    def logical_and(self, other: Any) -> Tensor:
        """Elementwise ``and``."""
        return T.logical_and(self, other)
    def logical_or(self, other: Any) -> Tensor:
        """Elementwise ``or``."""
        return T.logical_or(self, other)
    def logical_xor(self, other: Any) -> Tensor:
        """Elementwise ``xor``."""
        return T.logical_xor(self, other)
    def masked_select(self, mask: Any) -> Tensor:
        """The elements where ``mask`` is true."""
        return T.masked_select(self, mask)
    def sigmoid_(self) -> Tensor:
        """In place: ``sigmoid``; returns self."""
        return self._apply_inplace(F.sigmoid)
    def tanh_(self) -> Tensor:
        """In place: ``tanh``; returns self."""
        return self._apply_inplace(F.tanh)
    def abs_(self) -> Tensor:
        """In place: ``abs``; returns self."""
        return self._apply_inplace(F.abs)
    def sqrt_(self) -> Tensor:
        """In place: ``sqrt``; returns self."""
        return self._apply_inplace(F.sqrt)
    def log_(self) -> Tensor:
        """In place: ``log``; returns self."""
        return self._apply_inplace(F.log)
    def sin_(self) -> Tensor:
        """In place: ``sin``; returns self."""
        return self._apply_inplace(F.sin)
    def cos_(self) -> Tensor:
        """In place: ``cos``; returns self."""
        return self._apply_inplace(F.cos)
    def floor_(self) -> Tensor:
        """In place: ``floor``; returns self."""
        return self._apply_inplace(T.floor)
    def ceil_(self) -> Tensor:
        """In place: ``ceil``; returns self."""
        return self._apply_inplace(T.ceil)
    def round_(self) -> Tensor:
        """In place: ``round``; returns self."""
        return self._apply_inplace(T.round)
    def trunc_(self) -> Tensor:
        """In place: ``trunc``; returns self."""
        return self._apply_inplace(T.trunc)
    def square_(self) -> Tensor:
        """In place: ``square``; returns self."""
        return self._apply_inplace(T.square)
    def reciprocal_(self) -> Tensor:
        """In place: ``reciprocal``; returns self."""
        return self._apply_inplace(T.reciprocal)
    def rsqrt_(self) -> Tensor:
        """In place: ``rsqrt``; returns self."""
        return self._apply_inplace(T.rsqrt)
    def log1p_(self) -> Tensor:
        """In place: ``log1p``; returns self."""
        return self._apply_inplace(T.log1p)
    def expm1_(self) -> Tensor:
        """In place: ``expm1``; returns self."""
        return self._apply_inplace(T.expm1)
    def sign_(self) -> Tensor:
        """In place: ``sign``; returns self."""
        return self._apply_inplace(T.sign)
    def frac_(self) -> Tensor:
        """In place: ``frac``; returns self."""
        return self._apply_inplace(T.frac)
    def round(self, *, decimals: builtins.int = 0) -> Tensor:
        """Rounded half to even (to ``decimals`` places)."""
        return T.round(self, decimals=decimals)
    def clip_(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
        """In place: ``clamp``; returns self."""
        return self._apply_inplace(F.clamp, min, max)
    def clamp_min_(self, min: Any) -> Tensor:  # noqa: A002
        """In place: ``clamp_min``; returns self."""
        return self._apply_inplace(F.clamp, min, None)
    def clamp_max_(self, max: Any) -> Tensor:  # noqa: A002
        """In place: ``clamp_max``; returns self."""
        return self._apply_inplace(F.clamp, None, max)
    def lerp(self, end: Any, weight: Any) -> Tensor:
        """``self + weight * (end - self)``."""
        return T.lerp(self, end, weight)
    def lerp_(self, end: Any, weight: Any) -> Tensor:
        """In place: ``lerp``; returns self."""
        return self._apply_inplace(T.lerp, end, weight)
    def addcmul(self, t1: Any, t2: Any, *, value: builtins.float = 1) -> Tensor:
        """``self + value * t1 * t2``."""
        return T.addcmul(self, t1, t2, value=value)
    def addcmul_(self, t1: Any, t2: Any, *, value: builtins.float = 1) -> Tensor:
        """In place: ``addcmul``; returns self."""
        return self._apply_inplace(T.addcmul, t1, t2, value=value)
    def addcdiv(self, t1: Any, t2: Any, *, value: builtins.float = 1) -> Tensor:
        """``self + value * t1 / t2``."""
        return T.addcdiv(self, t1, t2, value=value)
    def addcdiv_(self, t1: Any, t2: Any, *, value: builtins.float = 1) -> Tensor:
        """In place: ``addcdiv``; returns self."""
        return self._apply_inplace(T.addcdiv, t1, t2, value=value)
    def addmm(self, m1: Any, m2: Any, *, beta: builtins.float = 1, alpha: builtins.float = 1) -> Tensor:
        """``beta * self + alpha * (m1 @ m2)``."""
        return T.addmm(self, m1, m2, beta=beta, alpha=alpha)
    def baddbmm(self, b1: Any, b2: Any, *, beta: builtins.float = 1, alpha: builtins.float = 1) -> Tensor:
        """``beta * self + alpha * bmm(b1, b2)``."""
        return T.baddbmm(self, b1, b2, beta=beta, alpha=alpha)
    def nan_to_num(self, nan: builtins.float = 0.0, posinf: builtins.float | None = None,
                   neginf: builtins.float | None = None) -> Tensor:
        """NaN and infinities replaced by finite values."""
        return T.nan_to_num(self, nan, posinf, neginf)
    @numpy_aliases
    def logsumexp(self, dim: Any, keepdim: builtins.bool = False) -> Tensor:
        """``log(sum(exp(self), dim))`` without overflow."""
        return T.logsumexp(self, dim, keepdim)
    def cumsum(self, dim: builtins.int, *, dtype: Any = None) -> Tensor:
        """The running sum along ``dim``."""
        return T.cumsum(self, dim, dtype=dtype)
    def diff(self, n: builtins.int = 1, dim: builtins.int = -1) -> Tensor:
        """Differences of neighbours along ``dim``."""
        return T.diff(self, n, dim)
    def flip(self, *dims: Any) -> Tensor:
        """A copy with ``dims`` reversed."""
        return T.flip(self, dims[0] if len(dims) == 1 and not isinstance(dims[0], builtins.int) else dims)
    def roll(self, shifts: Any, dims: Any = None) -> Tensor:
        """Elements shifted along ``dims``, wrapping around."""
        return T.roll(self, shifts, dims)
    def movedim(self, source: Any, destination: Any) -> Tensor:
        """Dims ``source`` moved to ``destination``."""
        return T.movedim(self, source, destination)
    moveaxis = movedim
    def swapdims(self, dim0: builtins.int, dim1: builtins.int) -> Tensor:
        """``transpose(dim0, dim1)``."""
        return F.transpose(self, dim0, dim1)
    swapaxes = swapdims
    def unflatten(self, dim: builtins.int, sizes: Any) -> Tensor:
        """Dim ``dim`` split into ``sizes``."""
        return T.unflatten(self, dim, sizes)
    def tile(self, *dims: Any) -> Tensor:
        """``repeat`` with leading 1s as needed."""
        return T.tile(self, _shape_args(dims))
    def repeat_interleave(self, repeats: Any, dim: builtins.int | None = None) -> Tensor:
        """Each element repeated ``repeats`` times along ``dim``."""
        return T.repeat_interleave(self, repeats, dim)
    def take_along_dim(self, indices: Any, dim: builtins.int | None = None) -> Tensor:
        """``gather`` with the index broadcast."""
        return T.take_along_dim(self, indices, dim)
    def diag(self, diagonal: builtins.int = 0) -> Tensor:
        """A vector's diagonal matrix, or a matrix's diagonal."""
        return T.diag(self, diagonal)
    def diag_embed(self) -> Tensor:
        """Each last-dim vector as a diagonal matrix."""
        return T.diag_embed(self)
    def isclose(self, other: Any, rtol: builtins.float = 1e-5, atol: builtins.float = 1e-8,
                equal_nan: builtins.bool = False) -> Tensor:
        """Elementwise closeness to ``other``."""
        return T.isclose(self, other, rtol, atol, equal_nan)
    @numpy_aliases
    def all(self, dim: Any = None, keepdim: builtins.bool = False) -> Tensor:
        """Whether every element (along ``dim``) is nonzero."""
        return T.all(self, dim, keepdim)
    @numpy_aliases
    def any(self, dim: Any = None, keepdim: builtins.bool = False) -> Tensor:
        """Whether some element (along ``dim``) is nonzero."""
        return T.any(self, dim, keepdim)
    @numpy_aliases
    def count_nonzero(self, dim: Any = None) -> Tensor:
        """The number of nonzero elements (along ``dim``)."""
        return T.count_nonzero(self, dim)
    def sort(self, dim: builtins.int = -1, descending: builtins.bool = False, stable: builtins.bool = False) -> Any:
        """``(values, indices)`` sorted along ``dim``."""
        return T.sort(self, dim, descending, stable)
    def argsort(self, dim: builtins.int = -1, descending: builtins.bool = False,
                stable: builtins.bool = False) -> Tensor:
        """The indices that sort along ``dim``."""
        return T.argsort(self, dim, descending, stable)
    def unique(self, sorted: builtins.bool = True, return_inverse: builtins.bool = False,  # noqa: A002
               return_counts: builtins.bool = False, dim: builtins.int | None = None) -> Any:
        """The distinct elements."""
        return T.unique(self, sorted, return_inverse, return_counts, dim)
    def reshape_as(self, other: Tensor) -> Tensor:
        """Reshaped to ``other``'s shape."""
        return F.reshape(self, other.shape)
    def nelement(self) -> builtins.int:
        """The number of elements."""
        return builtins.int(self._data.size)
    def ndimension(self) -> builtins.int:
        """The number of dims."""
        return self._data.ndim
    def element_size(self) -> builtins.int:
        """Bytes per element."""
        return builtins.int(self._data.itemsize)
    def stride(self, dim: builtins.int | None = None) -> Any:
        """Strides in elements (not bytes), as PyTorch."""
        st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[dim]
    def data_ptr(self) -> builtins.int:
        """The address of the first element."""
        return builtins.int(self._data.__array_interface__["data"][0])
    def pin_memory(self) -> Tensor:
        """Self (there is no GPU to pin memory for)."""
        return self
    def is_pinned(self) -> builtins.bool:
        """False (there is no GPU)."""
        return False
    def share_memory_(self) -> Tensor:
        """Self (asyncgrad shares memory between threads, not processes)."""
        return self
    def is_shared(self) -> builtins.bool:
        """False."""
        return False
    def cuda(self, device: Any = None, non_blocking: builtins.bool = False) -> Tensor:
        """Refused: asyncgrad computes on the CPU (``ag.cuda.is_available()`` is False)."""
        _device.check_device("cuda")
        return self
    def tan(self) -> Tensor:
        """The tangent."""
        return T.tan(self)
    def mm(self, other: Any) -> Tensor:
        """Matrix product."""
        return F.matmul(self, other)
    def inner(self, other: Any) -> Tensor:
        """The inner product of vectors."""
        return T.dot(self, other)
    def ger(self, other: Any) -> Tensor:
        """The outer product."""
        return T.outer(self, other)
    def ravel(self) -> Tensor:
        """The elements as a 1-D tensor."""
        return T.ravel(self)
    def fix(self) -> Tensor:
        """``trunc``."""
        return T.trunc(self)
    def divide(self, other: Any) -> Tensor:
        """``self / other``."""
        return F.div(self, other)
    def multiply(self, other: Any) -> Tensor:
        """``self * other``."""
        return F.mul(self, other)
    def subtract(self, other: Any, *, alpha: builtins.float = 1) -> Tensor:
        """``self - alpha * other``."""
        return F.sub(self, other, alpha=alpha)
    def negative(self) -> Tensor:
        """``-self``."""
        return F.neg(self)
    def positive(self) -> Tensor:
        """``self``."""
        return self
    def greater(self, other: Any) -> Tensor:
        """``self > other``."""
        return F.gt(self, other)
    def greater_equal(self, other: Any) -> Tensor:
        """``self >= other``."""
        return F.ge(self, other)
    def less(self, other: Any) -> Tensor:
        """``self < other``."""
        return F.lt(self, other)
    def less_equal(self, other: Any) -> Tensor:
        """``self <= other``."""
        return F.le(self, other)
    def not_equal(self, other: Any) -> Tensor:
        """``self != other``."""
        return F.ne(self, other)
    def isneginf(self) -> Tensor:
        """True where -inf."""
        return T.isneginf(self)
    def isposinf(self) -> Tensor:
        """True where +inf."""
        return T.isposinf(self)
    def histc(self, bins: builtins.int = 100, min: Any = 0, max: Any = 0) -> Tensor:  # noqa: A002
        """A histogram of equal bins."""
        return T.histc(self, bins, min, max)
    def index_add(self, dim: builtins.int, index: Any, source: Any, *, alpha: builtins.float = 1) -> Tensor:
        """A copy with ``alpha * source`` added at ``index`` along ``dim``."""
        return T.index_add(self, dim, index, source, alpha=alpha)
    def index_add_(self, dim: builtins.int, index: Any, source: Any, *, alpha: builtins.float = 1) -> Tensor:
        """In place: ``index_add``; returns self."""
        return self._apply_inplace(T.index_add, dim, index, source, alpha=alpha)
    def index_fill(self, dim: builtins.int, index: Any, value: Any) -> Tensor:
        """A copy with ``value`` at ``index`` along ``dim``."""
        return T.index_fill(self, dim, index, value)
    def index_fill_(self, dim: builtins.int, index: Any, value: Any) -> Tensor:
        """In place: ``index_fill``; returns self."""
        return self._apply_inplace(T.index_fill, dim, index, value)
    @numpy_aliases
    def nansum(self, dim: Any = None, keepdim: builtins.bool = False) -> Tensor:
        """The sum, NaN counted as 0."""
        return T.nansum(self, dim, keepdim)
    @numpy_aliases
    def nanmean(self, dim: Any = None, keepdim: builtins.bool = False) -> Tensor:
        """The mean of the non-NaN elements."""
        return T.nanmean(self, dim, keepdim)
    def tensor_split(self, indices_or_sections: Any, dim: builtins.int = 0) -> tuple[Tensor, ...]:
        """Split into nearly equal parts, or at indices."""
        return T.tensor_split(self, indices_or_sections, dim)
    def sum_to_size(self, *size: Any) -> Tensor:
        """Summed down to ``size`` (broadcast-compatible)."""
        return F.sum_to(self, _shape_args(size))
    def sgn(self) -> Tensor:
        """``sign``."""
        return T.sign(self)


_new_counter = object.__new__


def _init(t: Tensor, arr: np.ndarray, node: Node | None, output_nr: int,
          version: VersionCounter | None) -> None:
    t._data = arr
    t._requires_grad = False
    t.grad_fn = node
    t.output_nr = output_nr
    t._grad = None
    if version is None:  # VersionCounter(), without the call of its __init__
        version = _new_counter(VersionCounter)
        version.value = 0
    t._version_counter = version
    t._base = None
    t._hooks = None
    t._post_acc_hooks = None
    t._retains_grad = False
    t._acc_ref = None
    t._saved = None
    t._views = None
    t._creation_meta = 0


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


def _rebuild_leaf(data: np.ndarray, requires_grad: bool) -> Tensor:
    """Unpickling: a leaf with the pickled data (graphs are not pickled)."""
    t = Tensor._wrap(data)
    t._requires_grad = requires_grad
    return t


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


def _shape_args(args: tuple[Any, ...]) -> tuple[int, ...]:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _data(x: Any) -> Any:
    return x.data if isinstance(x, Tensor) else x


class MinMax(NamedTuple):
    """``(values, indices)`` as returned by ``max(dim)`` / ``min(dim)``."""

    values: Tensor
    indices: Tensor


register_tensor_type(Tensor)


def bind_functional(module: Any) -> None:
    """Called once by the package (``asyncgrad/__init__.py``) after importing
    ``functional``, which imports this module: the ops the methods above delegate to, and
    the factories (``creation``, ``sampling``) that import this module too."""
    global F, T, creation, sampling, _binary, _unary
    from . import creation as creation_module, sampling as sampling_module, torch_ops

    F = module
    _binary, _unary = module._binary, module._unary
    creation, sampling, T = creation_module, sampling_module, torch_ops
