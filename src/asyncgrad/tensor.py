"""``Tensor``: one numpy array plus its place in the autograd graph.

Operations live in ``asyncgrad.functional`` (the ``ag.*`` functions); the methods here
are thin delegations so that ``x.exp()`` and ``ag.exp(x)`` are the same code.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple
from collections.abc import Callable, Iterator

import numpy as np

from . import _context
from ._dtype import as_array, is_floating
from .autograd.graph import AccumulateGrad, HookDict, register_tensor_type

if TYPE_CHECKING:
    from . import functional as F
    from .autograd.graph import Edge, Node, RemovableHandle
else:
    F = None  # the ops module, bound by bind_functional (functional.py imports this one)

_NONLEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor "
    "instead. See github.com/pytorch/pytorch/pull/30531 for more information."
)


_Float = float  # the Tensor.float() method shadows the builtin inside the class body


class VersionCounter:
    """Counts in-place changes; shared by a tensor, its views and ``detach()`` results."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class Tensor:
    """An n-dimensional array that records the operations applied to it for autograd."""

    __slots__ = ("data", "_requires_grad", "grad_fn", "output_nr", "_grad", "_version_counter",
                 "_base", "_hooks", "_post_acc_hooks", "_retains_grad", "_acc_ref", "_views",
                 "_saved", "__weakref__")
    # numpy must defer to our reflected operators (ndarray * Tensor -> Tensor.__rmul__)
    __array_ufunc__ = None

    data: np.ndarray
    grad_fn: Node | None
    output_nr: int
    _requires_grad: bool
    _grad: Tensor | None
    _version_counter: VersionCounter
    _base: Tensor | None
    _hooks: HookDict | None
    _post_acc_hooks: HookDict | None
    _retains_grad: bool
    _acc_ref: Any
    _saved: Any  # the SavedTensor last made of this tensor, shared while it stays valid
    _views: dict[int, weakref.ref[Tensor]] | None  # live recording views of a non-leaf base

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
    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def dim(self) -> int:
        return self.data.ndim

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
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
        if self.grad_fn is not None and not self._retains_grad:
            warnings.warn(_NONLEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got {type(value).__name__}")
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
        return self._retains_grad

    @property
    def _version(self) -> int:
        return self._version_counter.value

    @property
    def T(self) -> Tensor:
        return F.permute(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> Tensor:
        return F.transpose(self, -2, -1)

    # --- conversions --------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The underlying array, without a copy (changes through it are not tracked)."""
        return self.data

    def item(self) -> Any:
        if self.data.size != 1:
            raise RuntimeError(
                f"a Tensor with {self.data.size} elements cannot be converted to Scalar"
            )
        return self.data.item()

    def tolist(self) -> Any:
        return self.data.tolist()

    def size(self, dim: int | None = None) -> Any:
        return self.data.shape if dim is None else self.data.shape[dim]

    def numel(self) -> int:
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

    def __hash__(self) -> int:
        return id(self)

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
    def _check_inplace(self) -> None:
        if not _context.grad_enabled.get():
            return
        if self._requires_grad and self.grad_fn is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        base = self._base
        if base is not None and base._requires_grad and base.grad_fn is None:
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
        self._check_inplace()
        records = _context.grad_enabled.get() and (
            self._requires_grad or any(isinstance(a, Tensor) and a._requires_grad for a in args)
        )
        if not records:
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
        where = _view_index(self.data, base.data)
        if where is None:
            raise RuntimeError(
                "asyncgrad cannot record an in-place operation on this view (its layout in the "
                "base's memory is not supported); use an out-of-place operation or clone() it first."
            )
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
        """Remember a recording view of this (non-leaf) base, to re-point its grad_fn when
        an in-place op rebases the base (PyTorch regenerates a view's grad_fn likewise)."""
        views = self._views
        if views is None:
            views = self._views = {}
        key = id(view)
        if key not in views:  # (a WeakSet would compare tensors with ==, which is elementwise)
            views[key] = weakref.ref(view, functools.partial(_forget_view, weakref.ref(self), key))

    def _regenerate_views(self, skip: Tensor | None) -> None:
        """After this base was rebased: make every other live view read the new base."""
        if not self._views:
            return
        from .grad_mode import enable_grad

        for ref in list(self._views.values()):
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
    def __add__(self, other: Any) -> Tensor: return F.add(self, other)
    def __radd__(self, other: Any) -> Tensor: return F.add(other, self)
    def __sub__(self, other: Any) -> Tensor: return F.sub(self, other)
    def __rsub__(self, other: Any) -> Tensor: return F.sub(other, self)
    def __mul__(self, other: Any) -> Tensor: return F.mul(self, other)
    def __rmul__(self, other: Any) -> Tensor: return F.mul(other, self)
    def __truediv__(self, other: Any) -> Tensor: return F.div(self, other)
    def __rtruediv__(self, other: Any) -> Tensor: return F.div(other, self)
    def __pow__(self, other: Any) -> Tensor: return F.pow(self, other)
    def __rpow__(self, other: Any) -> Tensor: return F.pow(other, self)
    def __matmul__(self, other: Any) -> Tensor: return F.matmul(self, other)
    def __rmatmul__(self, other: Any) -> Tensor: return F.matmul(other, self)
    def __neg__(self) -> Tensor: return F.neg(self)
    def __pos__(self) -> Tensor: return self
    def __abs__(self) -> Tensor: return F.abs(self)
    def __getitem__(self, index: Any) -> Tensor: return F.getitem(self, index)
    def __setitem__(self, index: Any, value: Any) -> None:
        self._apply_inplace(F.index_put, index, value)

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
    def add(self, other: Any, *, alpha: _Float = 1) -> Tensor:
        return F.add(self, other if alpha == 1 else F.mul(other, alpha))
    def sub(self, other: Any, *, alpha: _Float = 1) -> Tensor:
        return F.sub(self, other if alpha == 1 else F.mul(other, alpha))
    def mul(self, other: Any) -> Tensor: return F.mul(self, other)
    def div(self, other: Any) -> Tensor: return F.div(self, other)
    def pow(self, exponent: Any) -> Tensor: return F.pow(self, exponent)
    def matmul(self, other: Any) -> Tensor: return F.matmul(self, other)
    def neg(self) -> Tensor: return F.neg(self)
    def abs(self) -> Tensor: return F.abs(self)
    def exp(self) -> Tensor: return F.exp(self)
    def log(self) -> Tensor: return F.log(self)
    def sqrt(self) -> Tensor: return F.sqrt(self)
    def sin(self) -> Tensor: return F.sin(self)
    def cos(self) -> Tensor: return F.cos(self)
    def tanh(self) -> Tensor: return F.tanh(self)
    def sigmoid(self) -> Tensor: return F.sigmoid(self)
    def relu(self) -> Tensor: return F.relu(self)
    def erf(self) -> Tensor: return F.erf(self)
    def clamp(self, min: Any = None, max: Any = None) -> Tensor: return F.clamp(self, min, max)
    def clip(self, min: Any = None, max: Any = None) -> Tensor: return F.clamp(self, min, max)
    def maximum(self, other: Any) -> Tensor: return F.maximum(self, other)
    def minimum(self, other: Any) -> Tensor: return F.minimum(self, other)
    def where(self, condition: Any, other: Any) -> Tensor: return F.where(condition, self, other)
    def sum(self, dim: Any = None, keepdim: bool = False) -> Tensor: return F.sum(self, dim, keepdim)
    def mean(self, dim: Any = None, keepdim: bool = False) -> Tensor: return F.mean(self, dim, keepdim)
    def max(self, dim: Any = None, keepdim: bool = False) -> Any: return F.max(self, dim, keepdim)
    def min(self, dim: Any = None, keepdim: bool = False) -> Any: return F.min(self, dim, keepdim)
    def var(self, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
            unbiased: bool | None = None) -> Tensor:
        return F.var(self, dim, correction=correction, keepdim=keepdim, unbiased=unbiased)
    def softmax(self, dim: int) -> Tensor: return F.softmax(self, dim)
    def log_softmax(self, dim: int) -> Tensor: return F.log_softmax(self, dim)
    def reshape(self, *shape: Any) -> Tensor: return F.reshape(self, _shape_args(shape))
    def view(self, *shape: Any) -> Tensor: return F.reshape(self, _shape_args(shape))
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor: return F.flatten(self, start_dim, end_dim)
    def transpose(self, dim0: int, dim1: int) -> Tensor: return F.transpose(self, dim0, dim1)
    def t(self) -> Tensor: return F.transpose(self, 0, 1) if self.ndim == 2 else self
    def permute(self, *dims: Any) -> Tensor: return F.permute(self, _shape_args(dims))
    def squeeze(self, dim: Any = None) -> Tensor: return F.squeeze(self, dim)
    def unsqueeze(self, dim: int) -> Tensor: return F.unsqueeze(self, dim)
    def expand(self, *sizes: Any) -> Tensor: return F.expand(self, _shape_args(sizes))
    def expand_as(self, other: Tensor) -> Tensor: return F.expand(self, other.shape)
    def broadcast_to(self, shape: Any) -> Tensor: return F.broadcast_to(self, shape)
    def clone(self) -> Tensor: return F.clone(self)
    def float(self) -> Tensor: return F.to_dtype(self, np.float32)
    def double(self) -> Tensor: return F.to_dtype(self, np.float64)
    def long(self) -> Tensor: return F.to_dtype(self, np.int64)
    def to(self, dtype: Any) -> Tensor: return F.to_dtype(self, dtype)
    def type_as(self, other: Tensor) -> Tensor: return F.to_dtype(self, other.dtype)
    def argmax(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        return Tensor._wrap(np.asarray(np.argmax(self.data, axis=dim, keepdims=keepdim)))
    def argmin(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        return Tensor._wrap(np.asarray(np.argmin(self.data, axis=dim, keepdims=keepdim)))
    def isnan(self) -> Tensor: return Tensor._wrap(np.isnan(self.data))
    def all(self) -> Tensor: return Tensor._wrap(np.asarray(self.data.all()))
    def any(self) -> Tensor: return Tensor._wrap(np.asarray(self.data.any()))
    def allclose(self, other: Any, rtol: _Float = 1e-5, atol: _Float = 1e-8) -> bool:
        return bool(np.allclose(self.data, _data(other), rtol=rtol, atol=atol))
    def equal(self, other: Any) -> bool:
        return bool(np.array_equal(self.data, _data(other)))

    # in-place variants (end in _)
    def add_(self, other: Any, *, alpha: _Float = 1) -> Tensor:
        return self._apply_inplace(F.add, other if alpha == 1 else F.mul(other, alpha))
    def sub_(self, other: Any, *, alpha: _Float = 1) -> Tensor:
        return self._apply_inplace(F.sub, other if alpha == 1 else F.mul(other, alpha))
    def mul_(self, other: Any) -> Tensor: return self._apply_inplace(F.mul, other)
    def div_(self, other: Any) -> Tensor: return self._apply_inplace(F.div, other)
    def pow_(self, exponent: Any) -> Tensor: return self._apply_inplace(F.pow, exponent)
    def clamp_(self, min: Any = None, max: Any = None) -> Tensor: return self._apply_inplace(F.clamp, min, max)
    def relu_(self) -> Tensor: return self._apply_inplace(F.relu)
    def exp_(self) -> Tensor: return self._apply_inplace(F.exp)
    def neg_(self) -> Tensor: return self._apply_inplace(F.neg)
    def zero_(self) -> Tensor: return self._apply_inplace(F.zero)
    def fill_(self, value: Any) -> Tensor: return self._apply_inplace(F.fill, value)
    def copy_(self, src: Any) -> Tensor: return self._apply_inplace(F.copy_from, src)


def _init(t: Tensor, arr: np.ndarray, node: Node | None, output_nr: int,
          version: VersionCounter | None) -> None:
    t.data = arr
    t._requires_grad = False
    t.grad_fn = node
    t.output_nr = output_nr
    t._grad = None
    t._version_counter = version if version is not None else VersionCounter()
    t._base = None
    t._hooks = None
    t._post_acc_hooks = None
    t._retains_grad = False
    t._acc_ref = None
    t._saved = None
    t._views = None


def _forget_view(base_ref: weakref.ref[Tensor], key: int, _ref: Any) -> None:
    """A registered view died: drop it from its base's registry (no reference cycle)."""
    base = base_ref()
    if base is not None and base._views is not None:
        base._views.pop(key, None)


def _rebuild_leaf(data: np.ndarray, requires_grad: bool) -> Tensor:
    """Unpickling: a leaf with the pickled data (graphs are not pickled)."""
    t = Tensor._wrap(data)
    t._requires_grad = requires_grad
    return t


def _write_into(t: Tensor, value: np.ndarray) -> None:
    try:
        np.copyto(t.data, value, casting="same_kind")
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


def _view_index(view: np.ndarray, base: np.ndarray, *, writable: bool = True) -> tuple[np.ndarray, ...] | None:
    """Integer index arrays ``where`` with ``base[where]`` aliasing ``view`` element for
    element (from byte offsets), or None when the layout cannot be inverted.

    With ``writable``, raises when several elements of ``view`` share one memory location
    (an expanded view), as PyTorch does for an in-place write through one.
    """
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
    ``functional``, which imports this module: the ops the methods above delegate to."""
    global F
    F = module
