"""Saved tensors: what a node keeps of a forward value for its backward.

``save_for_backward`` makes a :class:`SavedTensor` (the array, its version and its place
in the graph), or a :class:`HookedSavedTensor` inside ``saved_tensors_hooks``; unpacking
checks the version (PyTorch's in-place modification error). ``increment_version`` marks
a change made behind autograd's back.

The Tensor class comes from the layer above by registration (Note [The graph layer never
imports Tensor] in graph/registry.py): saved tensors need it only to rebuild a Tensor when
unpacked, long after every import finished.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _context
from .registry import tensor_type

if TYPE_CHECKING:
    from ...tensor import Tensor
    from . import Node

__all__ = ["FREED_MESSAGE", "HookedSavedTensor", "SavedTensor", "increment_version", "save_for_backward",
           "saved_tensors_hooks"]

FREED_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


def _describe(data: np.ndarray) -> str:
    return f"[{data.dtype.name} tensor {list(data.shape)}]"


# What a SavedTensor refers to besides the data (``SavedTensor.kind``).
_PLAIN, _LEAF, _NONLEAF, _OUTPUT = 0, 1, 2, 3


def _graph_place(value: Tensor, is_output: bool) -> tuple[Any, int]:
    """What a saved tensor must remember to rebuild its place in the graph: the grad_fn
    of a non-leaf, the leaf itself, or nothing (an output of the saving node: the node is
    passed in at unpack time; a tensor outside the graph)."""
    if is_output:
        return None, _OUTPUT
    if value.grad_fn is not None:
        return value.grad_fn, _NONLEAF
    if value._requires_grad:
        return value, _LEAF
    return None, _PLAIN


def place_of(value: Tensor, is_output: bool = False) -> Any:
    """``SavedTensor.place`` for ``value`` (Note [One slot for a saved tensor's place])."""
    if is_output:
        return value.output_nr
    fn = value.grad_fn
    if fn is not None:
        return fn if value.output_nr == 0 else (fn, value.output_nr)
    return value if value._requires_grad else None


# Note [One slot for a saved tensor's place]: a graph holds one SavedTensor per saved
# intermediate, so its size is graph memory per node. What it remembers of the tensor's
# place in the graph (its kind, the grad_fn or leaf, the output number) is one slot,
# ``place``, whose type says the kind:
#
# * None: a tensor outside the graph (_PLAIN);
# * a Tensor: the leaf that requires grad itself (_LEAF);
# * a Node: the grad_fn of a non-leaf that is its output 0 (_NONLEAF), or a tuple
#   ``(grad_fn, output_nr)`` for another output;
# * an int: an output of the saving node, that output's number (_OUTPUT; the node is
#   passed in at unpack time).
#
# So a SavedTensor has four slots (data, version, saved_version, place); ``kind``, ``ref``
# and ``output_nr`` are read from ``place`` by properties, off the hot paths (those read
# only ``version`` and ``saved_version``, and the recording cache compares ``place`` with
# the tensor's grad_fn, which is the grad_fn of output 0 or None).
class SavedTensor:
    """A tensor saved for backward, with the version it had when saved.

    Unpacking checks that the tensor was not modified in place since (PyTorch's
    version-counter check). Like PyTorch's SavedVariable it keeps the array, the version
    counter and the tensor's place in the graph (its grad_fn and output_nr, or the leaf
    itself: Note [One slot for a saved tensor's place]), not the Tensor object, so a
    saved output is no reference cycle and a chain of saved intermediates costs little
    memory.
    """

    __slots__ = ("data", "version", "saved_version", "place")

    def __init__(self, value: Tensor, is_output: bool = False) -> None:
        self.data = value._data  # (the slot: Tensor.data is a property)
        self.version = value._version_counter
        self.saved_version = self.version.value
        self.place = place_of(value, is_output)

    @property
    def kind(self) -> int:
        """_PLAIN, _LEAF, _NONLEAF or _OUTPUT (Note [One slot for a saved tensor's place])."""
        place = self.place
        if place is None:
            return _PLAIN
        t = type(place)
        if t is int:
            return _OUTPUT
        if t is tuple or not isinstance(place, tensor_type()):
            return _NONLEAF
        return _LEAF

    @property
    def ref(self) -> Any:
        """The grad_fn of a non-leaf, the leaf itself, or None (an output; a plain tensor)."""
        place = self.place
        if type(place) is int:
            return None
        return place[0] if type(place) is tuple else place

    @property
    def output_nr(self) -> int:
        place = self.place
        if type(place) is int:
            return place
        return place[1] if type(place) is tuple else 0

    def unpack_array(self, node: Node | None = None) -> Any:
        if self.version.value != self.saved_version:
            self._raise_modified(node)
        return self.data

    def unpack_tensor(self, node: Node | None = None) -> Any:
        """The saved value as a Tensor that keeps its place in the graph (create_graph)."""
        if self.version.value != self.saved_version:
            self._raise_modified(node)
        kind = self.kind
        if kind == _LEAF:
            return self.place
        if kind == _NONLEAF:
            return tensor_type()._nonleaf(self.data, self.ref, self.output_nr, self.version)
        if kind == _OUTPUT:
            return tensor_type()._nonleaf(self.data, node, self.output_nr, self.version)
        t = tensor_type()._wrap(self.data)
        t._version_counter = self.version
        return t

    def _raise_modified(self, node: Node | None) -> None:
        kind = self.kind
        if kind == _NONLEAF:
            which = f", which is output {self.output_nr} of {self.ref.name()},"
        elif kind == _OUTPUT and node is not None:
            which = f", which is output {self.output_nr} of {node.name()},"
        else:
            which = ""
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: {_describe(self.data)}{which} is at version "
            f"{self.version.value}; expected version {self.saved_version} instead. Hint: "
            "enable anomaly detection to find the operation that failed to compute its "
            "gradient, with asyncgrad.autograd.set_detect_anomaly(True, check_nan=False)."
        )


class HookedSavedTensor:
    """A saved tensor that went through ``saved_tensors_hooks``: ``pack`` ran at save
    time and ``unpack`` runs each time backward needs the value. Like PyTorch, it keeps
    the saved tensor's place in the graph, so under ``create_graph`` the unpacked value
    is re-attached to it (and higher-order gradients flow through the saved value)."""

    __slots__ = ("packed", "unpack", "pos", "data", "ref", "kind", "output_nr")
    pos: int

    def __init__(self, value: Tensor, pack: Callable[[Any], Any], unpack: Callable[[Any], Any],
                 is_output: bool = False) -> None:
        self.packed = pack(value)
        self.unpack = unpack
        self.data = None  # nothing is kept but what pack returned
        self.output_nr = value.output_nr
        self.ref, self.kind = _graph_place(value, is_output)

    def unpack_array(self, node: Node | None = None) -> Any:
        out = self.unpack(self.packed)
        return out.data if isinstance(out, tensor_type()) else np.asarray(out)

    def unpack_tensor(self, node: Node | None = None) -> Any:
        kind = self.kind
        if kind == _PLAIN:  # outside the graph: the unpack hook's Tensor itself, as PyTorch
            out = self.unpack(self.packed)
            return out if isinstance(out, tensor_type()) else tensor_type()._wrap(np.asarray(out))
        data = self.unpack_array(node)
        if kind == _NONLEAF:
            return tensor_type()._nonleaf(data, self.ref, self.output_nr, None)
        if kind == _OUTPUT:
            return tensor_type()._nonleaf(data, node, self.output_nr, None)
        t = tensor_type()._wrap(data)  # a stand-in for the leaf that feeds its AccumulateGrad
        t._requires_grad = True
        t._acc_ref = weakref.ref(self.ref._gradient_edge()[0])
        return t


_saved_hooks = _context.saved_tensors_hooks


# Note [Shared one-entry checks]: most built-in nodes save one tensor, and a tensor saved
# by many nodes (a constant operand, a weight at every step of a chain) has one shared
# SavedTensor, which the tensor caches in ``_saved``. A node that saved one tensor holds
# its entry bare as ``OpNode._checks`` (no 1-tuple of its own: a tuple per node is graph
# memory per node), one that saved several (or its output and an input) a tuple of
# them, one that saved none ``()``: so the hot readers tell the forms by type, a
# SavedTensor (or HookedSavedTensor) against a tuple, and ``OpNode.checks`` gives a tuple
# to everyone else. Sharing the entry is sound because a SavedTensor is immutable (a
# node's release rebinds its ``_checks``, it never changes the entry), and every node
# holding it checks it the same way; the cache holds no reference back to any node or to
# the tensor, so it makes no cycle.
#
# The same goes for such a node's ``saved`` (its rule arguments ``(ans, x, y, ...)``, all
# None but this tensor's array), when the entry is the one the tensor caches: the tensor
# keeps the last such tuple in ``_saved_args``, and a node that saves it alone at the
# same position of an argument tuple of the same length (any op: the tuple holds nothing
# else) takes that tuple. It holds only the array the tensor holds anyway, and the
# version check stays with the entry, so an in-place change is still caught; a new
# ``data`` drops both caches.
def _same_place(a: Any, b: Any) -> bool:
    """Whether two ``SavedTensor.place`` values name one place (by identity: a place may
    be a Tensor, whose ``==`` is elementwise)."""
    return a is b or (type(a) is tuple and type(b) is tuple and a[0] is b[0] and a[1] == b[1])


def save_for_backward(value: Tensor, is_output: bool = False) -> SavedTensor | HookedSavedTensor:
    """Save ``value`` for backward, through the innermost ``saved_tensors_hooks`` if any.

    A tensor saved by many nodes (a constant, a weight used at every step of a chain)
    gets one SavedTensor, shared, for as long as its data, version and place in the graph
    are unchanged: a SavedTensor is immutable, so sharing it changes nothing but memory.
    The tensor keeps it in ``_saved`` (Note [Shared one-entry checks]). (Not for leaves that require grad: the
    SavedTensor refers to the leaf, and a cache on the leaf would make a reference cycle.)
    """
    hooks = _saved_hooks.get()
    if hooks:
        pack, unpack = hooks[-1]
        return HookedSavedTensor(value, pack, unpack, is_output)
    if is_output:
        return SavedTensor(value, True)
    leaf = value.grad_fn is None and value._requires_grad
    cached = value._saved
    if cached is not None and not leaf:
        if cached.data is value._data and cached.saved_version == value._version_counter.value \
                and _same_place(cached.place, place_of(value)):
            return cached
    saved = SavedTensor(value)
    if not leaf:
        value._saved = saved
    return saved


class saved_tensors_hooks:
    """Context manager: ``pack`` every tensor saved for backward inside the block, and
    ``unpack`` it when backward needs it (e.g. to compress it or move it to disk).

    Context-local (a ContextVar), so concurrent tasks keep their own hooks.
    """

    def __init__(self, pack_hook: Callable[[Tensor], Any], unpack_hook: Callable[[Any], Tensor]) -> None:
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook
        self._tokens: list[tuple[Any, tuple[Any, ...]]] = []  # (token, the stack it set) per enter

    def __enter__(self) -> saved_tensors_hooks:
        stack = _context.saved_tensors_hooks.get() + ((self.pack_hook, self.unpack_hook),)
        self._tokens.append((_context.saved_tensors_hooks.set(stack), stack))
        return self

    def __exit__(self, *exc: object) -> None:
        # Undo the enter that made the current stack: not simply the last one, which may
        # have been made (and confined) inside a backward that ran in this block, e.g. by
        # this object's own unpack hook.
        current = _context.saved_tensors_hooks.get()
        i = len(self._tokens) - 1
        while i > 0 and self._tokens[i][1] is not current:
            i -= 1
        token, _ = self._tokens.pop(i)
        _context.saved_tensors_hooks.reset(token)


def increment_version(tensor: Any) -> None:
    """Bump the version counter of ``tensor`` (or of each tensor of an iterable), as an
    in-place operation would: a saved copy of it then raises when backward unpacks it.
    For code that changes a tensor's memory behind autograd's back (through
    ``numpy()``)."""
    tensor_cls = tensor_type()
    tensors = (tensor,) if isinstance(tensor, tensor_cls) else tuple(tensor)
    for t in tensors:
        if not isinstance(t, tensor_cls):
            raise TypeError(f"increment_version expects Tensors, got {type(t).__name__}")
    for t in tensors:
        t._version_counter.value += 1
