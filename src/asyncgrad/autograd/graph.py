"""The backward graph: nodes, edges, saved tensors and hooks.

A :class:`Node` is one backward function. ``next_edges`` holds, for each forward input,
an edge ``(node, input_nr)`` to the node that receives that input's gradient, or
``(None, 0)`` when the input needs none. Nodes are immutable once built except for their
hooks and the release of their saved tensors, so several GraphTasks (on several loops or
threads) may run the same node at once.

Note [Sequence numbers]: ``sequence_nr`` comes from one process-wide counter
(``itertools.count`` is atomic under the GIL), so a later-created node always has a
larger number, whichever thread made it. The ready queue runs larger numbers first;
AccumulateGrad has ``2**64 - 1`` and so runs as soon as it is ready.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator

import numpy as np

from .. import _context
from .handles import HookDict, NodeHooks, RemovableHandle

__all__ = ["ACCUMULATE_GRAD_SEQUENCE_NR", "AccumulateGrad", "Edge", "GraphRoot", "HookDict", "NO_EDGE", "Node",
           "NodeHooks", "RemovableHandle", "SavedTensor", "HookedSavedTensor", "saved_tensors_hooks",
           "save_for_backward", "iter_graph", "next_sequence_nr", "register_tensor_type", "FREED_MESSAGE"]

if TYPE_CHECKING:
    from ..tensor import Tensor

Edge = tuple["Node | None", int]
NO_EDGE: Edge = (None, 0)
ACCUMULATE_GRAD_SEQUENCE_NR = 2**64 - 1

_sequence_counter = itertools.count()
next_sequence_nr: Callable[[], int] = _sequence_counter.__next__


class Node:
    """A backward function in the graph (``tensor.grad_fn``)."""

    __slots__ = ("sequence_nr", "next_edges", "_hooks", "_extra", "__weakref__")

    #: number of gradients this node receives (its forward outputs)
    num_outputs: int = 1

    def __init__(self, next_edges: tuple[Edge, ...] = ()) -> None:
        self.sequence_nr = next_sequence_nr()
        self.next_edges = next_edges
        self._hooks: NodeHooks | None = None
        # rarely used per-node data (``metadata``, the anomaly-mode trace) in one lazily
        # created dict: graph memory per node matters for deep graphs
        self._extra: dict[str, Any] | None = None

    # --- what users see -------------------------------------------------------------
    def name(self) -> str:
        return type(self).__name__

    @property
    def next_functions(self) -> tuple[Edge, ...]:
        return self.next_edges

    @property
    def metadata(self) -> dict[str, Any]:
        if self._extra is None:
            self._extra = {}
        meta: dict[str, Any] | None = self._extra.get("metadata")
        if meta is None:
            meta = self._extra["metadata"] = {}
        return meta

    @property
    def anomaly_trace(self) -> Any:
        """The forward stack (and parent) recorded for this node by anomaly mode."""
        return None if self._extra is None else self._extra.get("anomaly_trace")

    @anomaly_trace.setter
    def anomaly_trace(self, trace: Any) -> None:
        if self._extra is None:
            self._extra = {}
        self._extra["anomaly_trace"] = trace

    def register_hook(self, fn: Callable[[tuple[Any, ...], tuple[Any, ...]], Any]) -> RemovableHandle:
        """``fn(grad_inputs, grad_outputs) -> replacement grad_inputs or None``, after the node."""
        return self.hooks().post.add(fn)

    def register_prehook(self, fn: Callable[[tuple[Any, ...]], Any]) -> RemovableHandle:
        """``fn(grad_outputs) -> replacement grad_outputs or None``, before the node runs."""
        return self.hooks().pre.add(fn)

    def hooks(self) -> NodeHooks:
        if self._hooks is None:
            self._hooks = NodeHooks()
        return self._hooks

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    def __call__(self, *grads: Any) -> Any:
        """Run this backward function directly, outside any backward (PyTorch's
        ``node(grad)``): one gradient (Tensor or None) per forward output in, the
        gradients of the forward inputs out: a Tensor for a node with one input, else a
        tuple (None where an input needs no gradient). Grad mode is the caller's, so with
        it on (and a saved input that requires grad) the results are differentiable.
        No hooks run, and a node whose saved tensors were freed raises."""
        n = self.num_outputs
        if len(grads) != n:
            raise TypeError(f"expected {n} arguments, got {len(grads)} instead")
        for g in grads:
            if g is not None and not isinstance(g, _tensor_cls):
                raise TypeError(f"expected Tensor or None as gradient, but got {type(g).__name__}")
        from .._tensor_math import TENSOR_MATH
        from ..ops._array_math import ARRAY_MATH
        from .validation import validate_outputs

        tensor_mode = _context.grad_enabled.get()
        math = TENSOR_MATH if tensor_mode else ARRAY_MATH
        inputs = [g if g is None or tensor_mode else g.data for g in grads]
        try:
            outputs = validate_outputs(self, self.apply(inputs, math))
        except ValueError as e:  # numpy's broadcasting error for a wrong-shaped gradient
            raise RuntimeError(str(e)) from None
        results = tuple(None if g is None else g if isinstance(g, _tensor_cls) else _tensor_cls._wrap(np.asarray(g))
                        for g in outputs)
        return results[0] if len(results) == 1 else results

    # --- what the engine uses -------------------------------------------------------
    #: elements of work the node's kernel touches; large nodes run on worker threads
    work: int = 0
    #: the input shapes/dtypes each returned gradient is validated against
    input_shapes: tuple[tuple[int, ...] | None, ...] = ()
    input_dtypes: tuple[np.dtype | None, ...] = ()

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        """Compute the gradients of the forward inputs from ``grads`` (one per output)."""
        raise NotImplementedError

    def is_async(self) -> bool:
        """True when the engine must await ``apply_async`` instead of calling ``apply``."""
        return False

    async def apply_async(self, grads: list[Any], m: Any) -> list[Any]:
        """``apply`` for a node whose ``is_async()`` is true."""
        raise NotImplementedError

    #: False for node classes that never override ``is_async`` (set per class), so the
    #: engine's hot loop can skip the call
    maybe_async = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.maybe_async = cls.is_async is not Node.is_async

    def release_variables(self) -> None:
        """Free saved tensors once a backward without ``retain_graph`` succeeded."""


class GraphRoot(Node):
    """The synthetic first node of a backward with several roots: returns the root grads."""

    __slots__ = ("grads", "input_shapes", "input_dtypes")
    num_outputs = 0

    def __init__(self, edges: tuple[Edge, ...], grads: list[Any]) -> None:
        super().__init__(edges)
        self.grads = grads
        self.input_shapes = (None,) * len(edges)  # root grads were checked by the caller
        self.input_dtypes = (None,) * len(edges)

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        return list(self.grads)


_acc_lock = threading.Lock()


class AccumulateGrad(Node):
    """The sink for a leaf that requires grad. Shared by every use of the leaf while a
    graph holds it (the leaf keeps only a weak reference, as in PyTorch)."""

    __slots__ = ("variable", "input_shapes", "input_dtypes")

    def __init__(self, variable: Tensor) -> None:
        super().__init__(())
        self.sequence_nr = ACCUMULATE_GRAD_SEQUENCE_NR
        self.variable = variable
        self.input_shapes = (variable._data.shape,)
        self.input_dtypes = (variable._data.dtype,)

    def name(self) -> str:
        return "AccumulateGrad"

    def __call__(self, *grads: Any) -> Any:
        """Accumulate ``grad`` into the leaf's ``.grad`` now (PyTorch's ``acc(grad)``);
        returns ``()``. No hooks run."""
        if len(grads) != 1:
            raise TypeError(f"expected 1 arguments, got {len(grads)} instead")
        g = grads[0]
        if g is None:
            return ()
        if not isinstance(g, _tensor_cls):
            raise TypeError(f"expected Tensor or None as gradient, but got {type(g).__name__}")
        if g.shape != self.variable.shape:
            raise RuntimeError(
                f"Function AccumulateGrad returned an invalid gradient at index 0 - got "
                f"{list(g.shape)} but expected shape compatible with {list(self.variable.shape)}"
            )
        from .commit import COMMIT_LOCK, _accumulate  # (commit.py imports Tensor: not at the top)

        with COMMIT_LOCK:
            _accumulate(self.variable, g.data.copy(), _context.grad_enabled.get() and g._requires_grad, True)
        return ()

    @staticmethod
    def for_leaf(leaf: Tensor) -> AccumulateGrad:
        ref = leaf._acc_ref
        node = ref() if ref is not None else None
        if node is None:
            with _acc_lock:
                ref = leaf._acc_ref
                node = ref() if ref is not None else None
                if node is None:
                    node = AccumulateGrad(leaf)
                    leaf._acc_ref = weakref.ref(node)
        return node


# --------------------------------------------------------------------------------------
# Saved tensors
# --------------------------------------------------------------------------------------

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


class SavedTensor:
    """A tensor saved for backward, with the version it had when saved.

    Unpacking checks that the tensor was not modified in place since (PyTorch's
    version-counter check). Like PyTorch's SavedVariable it keeps the array, the version
    counter and the tensor's place in the graph (its grad_fn and output_nr, or the leaf
    itself), not the Tensor object, so a saved output is no reference cycle and a chain
    of saved intermediates costs little memory.
    """

    __slots__ = ("data", "version", "saved_version", "ref", "kind", "output_nr")

    def __init__(self, value: Tensor, is_output: bool = False) -> None:
        self.data = value._data  # (the slot: Tensor.data is a property)
        self.version = value._version_counter
        self.saved_version = self.version.value
        self.output_nr = value.output_nr
        self.ref, self.kind = _graph_place(value, is_output)

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
            return self.ref
        if kind == _NONLEAF:
            return _tensor_cls._nonleaf(self.data, self.ref, self.output_nr, self.version)
        if kind == _OUTPUT:
            return _tensor_cls._nonleaf(self.data, node, self.output_nr, self.version)
        t = _tensor_cls._wrap(self.data)
        t._version_counter = self.version
        return t

    def _raise_modified(self, node: Node | None) -> None:
        if self.kind == _NONLEAF:
            which = f", which is output {self.output_nr} of {self.ref.name()},"
        elif self.kind == _OUTPUT and node is not None:
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
        return out.data if isinstance(out, _tensor_cls) else np.asarray(out)

    def unpack_tensor(self, node: Node | None = None) -> Any:
        data = self.unpack_array(node)
        kind = self.kind
        if kind == _NONLEAF:
            return _tensor_cls._nonleaf(data, self.ref, self.output_nr, None)
        if kind == _OUTPUT:
            return _tensor_cls._nonleaf(data, node, self.output_nr, None)
        t = _tensor_cls._wrap(data)
        if kind == _LEAF:  # a stand-in for the leaf that feeds the leaf's AccumulateGrad
            t._requires_grad = True
            t._acc_ref = weakref.ref(AccumulateGrad.for_leaf(self.ref))
        return t


_saved_hooks = _context.saved_tensors_hooks


def save_for_backward(value: Tensor, is_output: bool = False) -> SavedTensor | HookedSavedTensor:
    """Save ``value`` for backward, through the innermost ``saved_tensors_hooks`` if any.

    A tensor saved by many nodes (a constant, a weight used at every step of a chain)
    gets one SavedTensor, shared, for as long as its data, version and place in the graph
    are unchanged: a SavedTensor is immutable, so sharing it changes nothing but memory.
    (Not for leaves that require grad: the SavedTensor refers to the leaf, and a cache
    on the leaf would make a reference cycle.)
    """
    hooks = _saved_hooks.get()
    if hooks:
        pack, unpack = hooks[-1]
        return HookedSavedTensor(value, pack, unpack, is_output)
    if is_output:
        return SavedTensor(value, True)
    cached = value._saved
    if cached is not None and cached.data is value._data and cached.ref is value.grad_fn \
            and cached.saved_version == value._version_counter.value \
            and cached.kind == (_PLAIN if value.grad_fn is None else _NONLEAF) \
            and (value.grad_fn is not None or not value._requires_grad):
        return cached
    saved = SavedTensor(value)
    if saved.kind != _LEAF:
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
        self._tokens: list[Any] = []

    def __enter__(self) -> saved_tensors_hooks:
        stack = _context.saved_tensors_hooks.get()
        self._tokens.append(
            _context.saved_tensors_hooks.set(stack + ((self.pack_hook, self.unpack_hook),))
        )
        return self

    def __exit__(self, *exc: object) -> None:
        _context.saved_tensors_hooks.reset(self._tokens.pop())


def increment_version(tensor: Any) -> None:
    """Bump the version counter of ``tensor`` (or of each tensor of an iterable), as an
    in-place operation would: a saved copy of it then raises when backward unpacks it.
    For code that changes a tensor's memory behind autograd's back (through
    ``numpy()``)."""
    tensors = (tensor,) if isinstance(tensor, _tensor_cls) else tuple(tensor)
    for t in tensors:
        if not isinstance(t, _tensor_cls):
            raise TypeError(f"increment_version expects Tensors, got {type(t).__name__}")
    for t in tensors:
        t._version_counter.value += 1


def iter_graph(root: Node | None) -> Iterator[Node]:
    """Every node reachable from ``root``, once each, without recursion."""
    if root is None:
        return
    seen = {root}
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for child, _ in node.next_edges:
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)


# Note [The graph layer never imports Tensor]: tensor.py imports this module, so this
# module cannot import tensor.py back (that ring ran half a package while tensor.py was
# half-initialised). Tensor registers itself here instead, once its class exists (as
# HIPS autograd's box types register with its tracer); saved tensors need it only to
# rebuild a Tensor when unpacked, long after every import finished.
_tensor_cls: Any = None


def register_tensor_type(cls: type) -> None:
    """Called once by tensor.py: the class saved tensors are unpacked into."""
    global _tensor_cls
    _tensor_cls = cls
