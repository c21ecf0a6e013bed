"""The backward graph: nodes and edges, GraphRoot and AccumulateGrad.

A :class:`Node` is one backward function. ``next_edges`` holds, for each forward input,
an edge ``(node, input_nr)`` to the node that receives that input's gradient, or
``(None, 0)`` when the input needs none (kept in the slot ``_edges``, which for a
built-in node may hold a shorter form: Note [An OpNode's one edge in its slot] in
op_node.py). Nodes are immutable once built except for their
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

from ... import _context
from ...ops._array_math import ARRAY_MATH
from .accumulate import COMMIT_LOCK, _accumulate
from .handles import HookDict, NodeHooks, RemovableHandle
from .registry import register_tensor_type, tensor_math, tensor_type
from .saved import (FREED_MESSAGE, HookedSavedTensor, SavedTensor, increment_version, save_for_backward,
                    saved_tensors_hooks)
from .validate import validate_outputs

__all__ = ["ACCUMULATE_GRAD_SEQUENCE_NR", "AccumulateGrad", "Edge", "GraphRoot", "HookDict", "NO_EDGE", "Node",
           "NodeHooks", "RemovableHandle", "SavedTensor", "HookedSavedTensor", "saved_tensors_hooks",
           "save_for_backward", "iter_graph", "next_sequence_nr", "register_tensor_type", "FREED_MESSAGE",
           "increment_version"]  # (saved tensors live in graph/saved.py; their public path is this module too)

if TYPE_CHECKING:
    from ...tensor import Tensor

Edge = tuple["Node | None", int]
NO_EDGE: Edge = (None, 0)
ACCUMULATE_GRAD_SEQUENCE_NR = 2**64 - 1

_sequence_counter = itertools.count()
next_sequence_nr: Callable[[], int] = _sequence_counter.__next__


class Node:
    """A backward function in the graph (``tensor.grad_fn``)."""

    __slots__ = ("sequence_nr", "_edges", "_hooks", "__weakref__")

    #: number of gradients this node receives (its forward outputs)
    num_outputs: int = 1

    def __init__(self, next_edges: tuple[Edge, ...] = ()) -> None:
        self.sequence_nr = next_sequence_nr()
        self._edges: Any = next_edges
        self._hooks: NodeHooks | None = None  # (and the rare data: Note [Rare per-node data])

    # --- what users see -------------------------------------------------------------
    def name(self) -> str:
        return type(self).__name__

    @property
    def next_edges(self) -> tuple[Edge, ...]:
        """One edge ``(node, input_nr)`` per forward input (``(None, 0)``: none needed)."""
        edges: tuple[Edge, ...] = self._edges
        return edges

    @property
    def next_functions(self) -> tuple[Edge, ...]:
        return self.next_edges

    # Note [Rare per-node data]: every node of a graph pays for each of its slots, and a
    # deep graph has many nodes, so data that few nodes have (``metadata``, the
    # anomaly-mode trace) takes no slot of its own: it lives in the node's NodeHooks
    # (``extra``), made on first use like the hooks. A node that has such data and no
    # hook then has a NodeHooks with no hook in it: the engine takes its hooked path for
    # it, which runs the same kernel and no hook (correct, only not the fastest path).
    def _extra(self, create: bool) -> dict[str, Any] | None:
        hooks = self._hooks
        if hooks is None:
            if not create:
                return None
            hooks = self.hooks()
        if hooks.extra is None and create:
            hooks.extra = {}
        return hooks.extra

    @property
    def metadata(self) -> dict[str, Any]:
        """A dict for the user's own data about this node (PyTorch's ``Node.metadata``)."""
        extra = self._extra(True)
        assert extra is not None
        meta: dict[str, Any] | None = extra.get("metadata")
        if meta is None:
            meta = extra["metadata"] = {}
        return meta

    @property
    def anomaly_trace(self) -> Any:
        """The forward stack (and parent) recorded for this node by anomaly mode."""
        extra = self._extra(False)
        return None if extra is None else extra.get("anomaly_trace")

    @anomaly_trace.setter
    def anomaly_trace(self, trace: Any) -> None:
        extra = self._extra(True)
        assert extra is not None
        extra["anomaly_trace"] = trace

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
        tensor = tensor_type()
        n = self.num_outputs
        if len(grads) != n:
            raise TypeError(f"expected {n} arguments, got {len(grads)} instead")
        for g in grads:
            if g is not None and not isinstance(g, tensor):
                raise TypeError(f"expected Tensor or None as gradient, but got {type(g).__name__}")
        tensor_mode = _context.grad_enabled.get()
        math = tensor_math() if tensor_mode else ARRAY_MATH
        inputs = [g if g is None or tensor_mode else g.data for g in grads]
        try:
            outputs = validate_outputs(self, self.apply(inputs, math))
        except ValueError as e:  # numpy's broadcasting error for a wrong-shaped gradient
            raise RuntimeError(str(e)) from None
        results = tuple(None if g is None else g if isinstance(g, tensor) else tensor._wrap(np.asarray(g))
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
_weakref = weakref.ref


class AccumulateGrad(Node):
    """The sink for a leaf that requires grad. Shared by every use of the leaf while a
    graph holds it (the leaf keeps only a weak reference, as in PyTorch)."""

    __slots__ = ("variable", "input_shapes", "input_dtypes")

    def __init__(self, variable: Tensor) -> None:
        # Node.__init__'s slots, set here: its sequence number (a counter's draw) would be
        # overwritten, and every forward that uses a parameter makes its node anew
        self.sequence_nr = ACCUMULATE_GRAD_SEQUENCE_NR
        self._edges = ()
        self._hooks = None
        self.variable = variable
        data = variable._data
        self.input_shapes = (data.shape,)
        self.input_dtypes = (data.dtype,)

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
        if not isinstance(g, tensor_type()):
            raise TypeError(f"expected Tensor or None as gradient, but got {type(g).__name__}")
        if g.shape != self.variable.shape:
            raise RuntimeError(
                f"Function AccumulateGrad returned an invalid gradient at index 0 - got "
                f"{list(g.shape)} but expected shape compatible with {list(self.variable.shape)}"
            )
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
                    leaf._acc_ref = _weakref(node)
        return node


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
