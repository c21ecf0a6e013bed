"""``Tensor``: one numpy array plus its place in the autograd graph.

Operations live in ``asyncgrad.functional`` (the ``ag.*`` functions); the methods are
delegations so that ``x.exp()`` and ``ag.exp(x)`` are the same code, most of them the
function itself, installed from a table (Note [Delegated methods]). How in-place changes
and views are checked and recorded is in ``asyncgrad/_inplace.py``.
"""

from __future__ import annotations

import builtins
import inspect
import operator
import types
import warnings
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple
from collections.abc import Callable, Iterator

import numpy as np

from . import _context, _device, _inplace
from ._aliases import numpy_aliases
from ._dtype import as_array
from .backend import xp
from .autograd.graph import AccumulateGrad, HookDict, register_tensor_type
from .ops import elementwise as E
from ._inplace import (  # noqa: F401 - importable from here, as before the move
    _OVERLAP_ERROR, VIEW_DEFAULT, VIEW_IN_CUSTOM_FUNCTION, VIEW_MULTI_OUTPUT, VIEW_NO_GRAD, _append_view,
    _overlaps, _recordable_view_index, _refuse_inplace_on_view, _view_index, _writable_alias, _write_into,
    _write_region, view_creation_meta,
)

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
    # fewer than F.add -> F._binary: Note [The recording fast path] in graph/record.py)
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
    elif isinstance(value, np.ndarray) or type(value) is xp.array_type:
        arr = value
    else:
        raise TypeError(f"Variable data has to be a tensor, but got {type(value).__name__}")
    if self._requires_grad and arr.dtype.kind not in "fc":
        raise RuntimeError("data set to a tensor that requires gradients must be floating point or complex dtype")
    old = self._data
    self._data = arr
    self._saved = None  # a cached SavedTensor describes the old storage
    self._saved_args = None  # (and would keep it alive)
    if arr.shape != old.shape or arr.dtype != old.dtype:
        self._acc_ref = None  # AccumulateGrad checks gradients against the old metadata


class Tensor:
    """An n-dimensional array that records the operations applied to it for autograd."""

    __slots__ = ("_data", "_requires_grad", "grad_fn", "output_nr", "_grad", "_version_counter",
                 "_base", "_hooks", "_post_acc_hooks", "_retains_grad", "_acc_ref", "_views",
                 "_saved", "_saved_args", "_creation_meta", "__weakref__")
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
    # the SavedTensor last made of this tensor, shared while it stays valid, and the rule
    # arguments of a node that saved it alone (Note [Shared one-entry checks])
    _saved: Any
    _saved_args: tuple[Any, ...] | None
    _views: list[weakref.ref[Tensor]] | None  # views to re-point after an in-place op (see _register_view)
    _creation_meta: int | str  # how a view was made (Note [View creation meta], _inplace.py); 0 otherwise

    def __init__(self, data: Any, *, dtype: Any = None, requires_grad: bool = False) -> None:
        arr = data.data if isinstance(data, Tensor) else as_array(data, dtype)
        _init(self, arr, None, 0, None)
        if requires_grad:
            self.requires_grad_(True)

    # --- construction fast paths (no checks) ----------------------------------------
    @staticmethod
    def _wrap(arr: np.ndarray) -> Tensor:
        if type(arr) is not xp.array_type:  # (Note [One array backend] in backend.py)
            arr = xp.asarray(arr)
        t = object.__new__(Tensor)
        _init(t, arr, None, 0, None)
        return t

    @staticmethod
    def _nonleaf(arr: np.ndarray, node: Node | None, output_nr: int,
                 version: VersionCounter | None) -> Tensor:
        if type(arr) is not xp.array_type:  # (Note [One array backend] in backend.py)
            arr = xp.asarray(arr)
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
        if requires_grad and not xp.is_floating(self.data.dtype):
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
        _context.engine_entry["backward_sync"](self, gradient, retain_graph=retain_graph, create_graph=create_graph,
                                               inputs=inputs)

    # --- in-place machinery (asyncgrad/_inplace.py) --------------------------------------------
    _check_inplace = _inplace.check_inplace
    _apply_inplace = _inplace.apply_inplace
    _snapshot = _inplace.snapshot
    _rebase = _inplace.rebase
    _apply_inplace_to_view = _inplace.apply_inplace_to_view
    _register_view = _inplace.register_view
    _regenerate_views = _inplace.regenerate_views
    _setitem_through_subview = _inplace.setitem_through_subview

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
    # Those that are a function applied to the tensor, with the function's own parameters, are
    # installed by bind_functional from the tables below the class (Note [Delegated methods]);
    # here they are named for type checkers and IDEs, which read each one's signature there.
    if TYPE_CHECKING:
        pow = F.pow
        neg = F.neg
        abs = F.abs
        exp = F.exp
        log = F.log
        sqrt = F.sqrt
        sin = F.sin
        cos = F.cos
        tanh = F.tanh
        sigmoid = F.sigmoid
        relu = F.relu
        erf = F.erf
        clamp = F.clamp
        clip = F.clamp
        sum = F.sum
        mean = F.mean
        max = F.max
        min = F.min
        var = F.var
        softmax = F.softmax
        log_softmax = F.log_softmax
        flatten = F.flatten
        transpose = F.transpose
        squeeze = F.squeeze
        unsqueeze = F.unsqueeze
        broadcast_to = F.broadcast_to
        clone = F.clone
        view_as = F.view_as
        contiguous = F.contiguous
        narrow = F.narrow
        select = F.select
        unbind = F.unbind
        chunk = F.chunk
        diagonal = F.diagonal
        prod = F.prod
        masked_fill = F.masked_fill
        tril = F.tril
        triu = F.triu
        topk = F.topk
        median = F.median
        nanmedian = F.nanmedian
        std = F.std
        norm = F.norm
        isfinite = F.isfinite
        isinf = F.isinf
        split_with_sizes = F.split_with_sizes
        gather = F.gather
        index_select = F.index_select
        unfold = F.unfold
        amax = F.amax
        amin = F.amin
        scatter = F.scatter
        scatter_add = F.scatter_add
        pow_ = F.pow
        clamp_ = F.clamp
        relu_ = F.relu
        exp_ = F.exp
        neg_ = F.neg
        zero_ = F.zero
        fill_ = F.fill
        copy_ = F.copy_from
        masked_fill_ = F.masked_fill
        tril_ = F.tril
        triu_ = F.triu
        scatter_ = F.scatter
        scatter_add_ = F.scatter_add
        sigmoid_ = F.sigmoid
        tanh_ = F.tanh
        abs_ = F.abs
        sqrt_ = F.sqrt
        log_ = F.log
        sin_ = F.sin
        cos_ = F.cos
        clip_ = F.clamp
        normal_ = sampling.normal_
        bernoulli_ = sampling.bernoulli_
        bernoulli = sampling.bernoulli
        multinomial = sampling.multinomial
        new_tensor = creation.new_tensor
        new_full = creation.new_full

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
    def matmul(self, other: Any) -> Tensor:
        """The matrix product ``self @ other`` (vectors, matrices and batches, as ``numpy.matmul``)."""
        return F.matmul(self, other)
    def maximum(self, other: Any) -> Tensor:
        """The larger of ``self`` and ``other``, elementwise, broadcasting."""
        return F.maximum(self, other)
    def minimum(self, other: Any) -> Tensor:
        """The smaller of ``self`` and ``other``, elementwise, broadcasting."""
        return F.minimum(self, other)
    def where(self, condition: Any, other: Any) -> Tensor:
        """``self`` where ``condition`` is true, else ``other`` (``ag.where(condition, self, other)``)."""
        return F.where(condition, self, other)
    def reshape(self, *shape: Any) -> Tensor:
        """The same elements in a new shape (one size may be -1)."""
        return F.reshape(self, _shape_args(shape))
    def view(self, *shape: Any) -> Tensor:
        """The same elements in a new shape, sharing memory; raises if that needs a copy (then use ``reshape``)."""
        return F.view(self, _shape_args(shape))
    def t(self) -> Tensor:
        """The transpose of a matrix (a 0-d or 1-d tensor is returned as is)."""
        return F.transpose(self, 0, 1) if self.ndim == 2 else self
    def permute(self, *dims: Any) -> Tensor:
        """The dimensions reordered as ``dims`` (a view)."""
        return F.permute(self, _shape_args(dims))
    def expand(self, *sizes: Any) -> Tensor:
        """Broadcast to ``sizes`` without copying (-1 keeps a dimension)."""
        return F.expand(self, _shape_args(sizes))
    def expand_as(self, other: Tensor) -> Tensor:
        """Broadcast to ``other``'s shape without copying."""
        return F.expand(self, other.shape)
    def is_contiguous(self) -> bool:
        """Whether the data is laid out C-contiguously."""
        return bool(self.data.flags.c_contiguous)
    def split(self, split_size: Any, dim: int = 0) -> tuple[Tensor, ...]:
        """Views of ``split_size`` elements along ``dim`` (or of the listed sizes)."""
        return F.split(self, split_size, dim)
    def repeat(self, *sizes: Any) -> Tensor:
        """The tensor tiled ``sizes`` times along each dimension (a copy)."""
        return F.repeat(self, _shape_args(sizes))
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

    # random fills and sampling (see asyncgrad.sampling)
    def uniform_(self, a: builtins.float = 0.0, b: builtins.float = 1.0, *, generator: Any = None) -> Tensor:
        """In place: uniform samples from ``[a, b)``; returns self."""
        return sampling.uniform_(self, a, b, generator=generator)

    # factories with this tensor's dtype (see asyncgrad.creation)
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

    # --- PyTorch's other names (issue 32): conversions, dtype queries ---------------------
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
    t._saved_args = None
    t._views = None
    t._creation_meta = 0


def _rebuild_leaf(data: np.ndarray, requires_grad: bool) -> Tensor:
    """Unpickling: a leaf with the pickled data (graphs are not pickled)."""
    t = Tensor._wrap(data)
    t._requires_grad = requires_grad
    return t


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


register_tensor_type(Tensor, VersionCounter, _init)  # (Note [The graph layer never imports Tensor])


# Note [Delegated methods]: most methods are a function of ``functional`` (or of ``sampling``,
# ``creation``) applied to the tensor. Where the function's parameters after the tensor are
# the method's (names, kinds, defaults, numpy aliases), the method is that function's code
# itself (a function object sharing its code, closure and defaults: no extra call), shown
# with the function's signature, its first parameter named ``self``, and its docstring.
# The in-place ones are ``x._apply_inplace(op, ...)`` with ``op``'s signature. The class
# body names all of them under TYPE_CHECKING for type checkers; a test holds these tables,
# those names and the signatures to each other.
FUNCTIONAL_METHODS = (
    "pow", "neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu", "erf", "clamp", "clip",
    "sum", "mean", "max", "min", "var", "softmax", "log_softmax", "flatten", "transpose", "squeeze", "unsqueeze",
    "broadcast_to", "clone", "view_as", "contiguous", "narrow", "select", "unbind", "chunk", "diagonal", "prod",
    "masked_fill", "tril", "triu", "topk", "median", "nanmedian", "std", "norm", "isfinite", "isinf",
    "split_with_sizes", "gather", "index_select", "unfold", "amax", "amin", "scatter", "scatter_add",
)
IN_PLACE_METHODS = {  # method: the functional op it applies in place
    "pow_": "pow", "clamp_": "clamp", "relu_": "relu", "exp_": "exp", "neg_": "neg", "zero_": "zero",
    "fill_": "fill", "copy_": "copy_from", "masked_fill_": "masked_fill", "tril_": "tril", "triu_": "triu",
    "scatter_": "scatter", "scatter_add_": "scatter_add", "sigmoid_": "sigmoid", "tanh_": "tanh", "abs_": "abs",
    "sqrt_": "sqrt", "log_": "log", "sin_": "sin", "cos_": "cos", "clip_": "clamp",
}
SAMPLING_METHODS = ("normal_", "bernoulli_", "bernoulli", "multinomial")
CREATION_METHODS = ("new_tensor", "new_full")


def _in_place(name: str, op: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """The method ``name``: ``op`` applied in place (``self._apply_inplace(op, ...)``), with
    ``op``'s signature. Arguments given by keyword are bound to their positions first, as
    ``_apply_inplace`` looks for tensors that require grad among the positional ones."""
    signature = inspect.signature(op)
    first, *rest = signature.parameters.values()

    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if kwargs:
            bound = signature.bind(self, *args, **kwargs)
            args, kwargs = bound.args[1:], bound.kwargs
        return self._apply_inplace(op, *args, **kwargs)

    method.__name__, method.__qualname__ = name, f"Tensor.{name}"
    method.__doc__ = f"In place: ``{op.__name__}``, written into this tensor; returns self."
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(name="self", annotation=inspect.Parameter.empty), *rest])
    return method


def _as_method(name: str, fn: Callable[..., Any], origin: str) -> Callable[..., Any]:
    """The method ``name``: ``fn``'s code, closure and defaults in a function object of its
    own (the same code runs: no extra call), with ``fn``'s signature (its first parameter,
    the tensor, named ``self``) and docstring."""
    method = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    method.__kwdefaults__ = fn.__kwdefaults__
    # (not a numpy_aliases wrapper's ``__wrapped__``: the signature below is the method's)
    method.__dict__.update({k: v for k, v in fn.__dict__.items() if k != "__wrapped__"})
    method.__qualname__, method.__module__ = f"Tensor.{name}", __name__
    signature = inspect.signature(fn)
    first, *rest = signature.parameters.values()
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(name="self", annotation=inspect.Parameter.empty), *rest])
    wrapped = getattr(fn, "__wrapped__", fn)
    method.__doc__ = (f"{(fn.__doc__ or '').rstrip()}\n\n"
                      f"(``{origin}.{wrapped.__name__}`` with this tensor as ``{first.name}``.)")
    return method


def _install_methods(functional: Any, sampling_module: Any, creation_module: Any) -> None:
    """Note [Delegated methods]: the tables above, installed on Tensor."""
    for name in FUNCTIONAL_METHODS:
        setattr(Tensor, name, _as_method(name, getattr(functional, name), "ag.functional"))
    for name, op in IN_PLACE_METHODS.items():
        setattr(Tensor, name, _in_place(name, getattr(functional, op)))
    for module, origin, names in ((sampling_module, "ag.sampling", SAMPLING_METHODS),
                                  (creation_module, "ag.creation", CREATION_METHODS)):
        for name in names:
            setattr(Tensor, name, _as_method(name, getattr(module, name), origin))


def bind_functional(module: Any, torch_ops: Any, creation_module: Any, sampling_module: Any) -> None:
    """Called once by the package (``asyncgrad/__init__.py``) once it has imported them:
    the ops the methods above delegate to (``functional``, ``torch_ops``) and the
    factories (``creation``, ``sampling``). Each of them imports this module, so this one
    imports none of them back: they are handed in."""
    global F, T, creation, sampling, _binary, _unary
    F = module
    _binary, _unary = module._binary, module._unary
    creation, sampling, T = creation_module, sampling_module, torch_ops
    _inplace.bind(Tensor, module)
    _install_methods(module, sampling_module, creation_module)
