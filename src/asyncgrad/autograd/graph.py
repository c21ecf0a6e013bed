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

if TYPE_CHECKING:
    from ..tensor import Tensor

Edge = tuple["Node | None", int]
NO_EDGE: Edge = (None, 0)
ACCUMULATE_GRAD_SEQUENCE_NR = 2**64 - 1

_sequence_counter = itertools.count()
next_sequence_nr: Callable[[], int] = _sequence_counter.__next__


class RemovableHandle:
    """Returned by every ``register_*hook``; ``remove()`` unregisters (idempotent)."""

    __slots__ = ("_hooks_ref", "id")
    _ids = itertools.count()

    def __init__(self, hooks: dict[int, Any]) -> None:
        self.id = next(RemovableHandle._ids)
        self._hooks_ref = weakref.ref(hooks) if hasattr(hooks, "__weakref__") else (lambda: hooks)

    def remove(self) -> None:
        hooks = self._hooks_ref()
        if hooks is not None:
            hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class HookDict(dict):  # type: ignore[type-arg]
    """A dict of hooks keyed by handle id; weak-referenceable so handles don't keep it."""

    __slots__ = ("__weakref__",)

    def add(self, fn: Callable[..., Any]) -> RemovableHandle:
        handle = RemovableHandle(self)
        self[handle.id] = fn
        return handle


class NodeHooks:
    """The hooks of one node, created only when a first hook is registered.

    Order inside one node (PyTorch's NOTE [Hooks ordering]): tensor pre-hooks per slot,
    then retains-grad hooks, then node pre-hooks, the node, then post-hooks.
    """

    __slots__ = ("tensor_pre", "retains_grad", "pre", "post")

    def __init__(self) -> None:
        self.tensor_pre: dict[int, HookDict] = {}
        self.retains_grad: dict[int, weakref.ref[Tensor]] = {}
        self.pre = HookDict()
        self.post = HookDict()


class Node:
    """A backward function in the graph (``tensor.grad_fn``)."""

    __slots__ = ("sequence_nr", "next_edges", "_hooks", "_metadata", "anomaly_trace", "__weakref__")

    #: number of gradients this node receives (its forward outputs)
    num_outputs: int = 1

    def __init__(self, next_edges: tuple[Edge, ...] = ()) -> None:
        self.sequence_nr = next_sequence_nr()
        self.next_edges = next_edges
        self._hooks: NodeHooks | None = None
        self._metadata: dict[str, Any] | None = None
        self.anomaly_trace: Any = None

    # --- what users see -------------------------------------------------------------
    def name(self) -> str:
        return type(self).__name__

    @property
    def next_functions(self) -> tuple[Edge, ...]:
        return self.next_edges

    @property
    def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

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
        raise RuntimeError("call backward through asyncgrad.backward / asyncgrad.grad")

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
        return False

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
        self.input_shapes = (variable.data.shape,)
        self.input_dtypes = (variable.data.dtype,)

    def name(self) -> str:
        return "AccumulateGrad"

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


class SavedTensor:
    """A tensor saved for backward, with the version it had when saved.

    Unpacking checks that the tensor was not modified in place since (PyTorch's
    version-counter check). An output saved by its own node keeps only its array and
    version counter, not the Tensor, so that output -> node -> saved -> output is no cycle.
    """

    __slots__ = ("tensor", "data", "version", "saved_version", "output_of", "packed", "unpack_hook")

    def __init__(self, value: Any, is_output_of: Node | None = None) -> None:
        from ..tensor import Tensor

        self.unpack_hook: Callable[[Any], Any] | None = None
        self.packed: Any = None
        self.output_of: str | None = None
        self.data: Any
        self.version: Any
        if isinstance(value, Tensor):
            self.version = value._version_counter
            self.saved_version = self.version.value
            if is_output_of is not None:
                self.tensor = None
                self.data = value.data
                self.output_of = is_output_of.name()
            else:
                self.tensor = value
                self.data = value.data
                if value.grad_fn is not None:
                    self.output_of = value.grad_fn.name()
            hooks = _context.saved_tensors_hooks.get()
            if hooks:
                pack, unpack = hooks[-1]
                self.packed = pack(value)
                self.unpack_hook = unpack
                self.data = None
                self.tensor = None
        else:  # a constant (non-tensor operand): nothing to check
            self.tensor = None
            self.data = value
            self.version = None
            self.saved_version = 0

    def unpack_array(self) -> Any:
        if self.unpack_hook is not None:
            return _as_array(self.unpack_hook(self.packed))
        v = self.version
        if v is not None and v.value != self.saved_version:
            self._raise_modified()
        return self.data

    def unpack_tensor(self, node: Node | None = None, output_nr: int = 0) -> Any:
        """The saved value as a Tensor that keeps its place in the graph (create_graph)."""
        from ..tensor import Tensor

        if self.unpack_hook is not None:
            out = self.unpack_hook(self.packed)
            return out if isinstance(out, Tensor) else Tensor._wrap(np.asarray(out))
        v = self.version
        if v is not None and v.value != self.saved_version:
            self._raise_modified()
        if self.tensor is not None:
            return self.tensor
        if self.version is None:  # constant
            return Tensor._wrap(np.asarray(self.data))
        return Tensor._nonleaf(self.data, node, output_nr, self.version)

    def _raise_modified(self) -> None:
        data = self.data if self.data is not None else np.empty(0)
        which = f", which is output 0 of {self.output_of}," if self.output_of else ""
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: {_describe(data)}{which} is at version "
            f"{self.version.value}; expected version {self.saved_version} instead. Hint: "  # type: ignore[union-attr]
            "enable anomaly detection to find the operation that failed to compute its "
            "gradient, with asyncgrad.autograd.set_detect_anomaly(True, check_nan=False)."
        )

    @property
    def numel(self) -> int:
        d = self.data
        return int(d.size) if isinstance(d, np.ndarray) else 1


def _as_array(value: Any) -> Any:
    from ..tensor import Tensor

    return value.data if isinstance(value, Tensor) else np.asarray(value)


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
