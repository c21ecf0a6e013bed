"""``checkpoint(..., use_reentrant=True)``: a ``CheckpointFunctionBackward`` node that
recomputes ``fn`` and runs a nested backward through the recomputation, capturing the
gradients at its edges through the public capture seam (``exec_info.plan_capture`` and
``GraphTask.set_roots(plan=...)``); see Note [Checkpoint hooks fire once] in
checkpoint.py.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any, cast

from .. import _context
from ..autograd.engine import Engine, get_engine
from ..autograd.task.exec_info import plan_capture
from ..autograd.graph import (
    FREED_MESSAGE, NO_EDGE, AccumulateGrad, Edge, GraphRoot, Node, next_sequence_nr,
    save_for_backward, saved_tensors_hooks,
)
from ..autograd.task.graph_task import GraphTask
from ..grad_mode import enable_grad
from ..tensor import Tensor
from .checkpoint_rng import restored_rng

REENTRANT_GRAD_ERROR = (
    "When use_reentrant=True, asyncgrad.utils.checkpoint is incompatible with .grad() or "
    "passing an `inputs` parameter to .backward(). To resolve this error, you can either "
    "set use_reentrant=False, or call .backward() without passing the `inputs` argument."
)
NO_OUTPUT_REQUIRES_GRAD = "none of output has requires_grad=True, this checkpoint() is not necessary"
NO_INPUT_REQUIRES_GRAD = "None of the inputs have requires_grad=True. Gradients will be None"



def _discard(t: Tensor) -> None:
    return None


def _discarded(packed: Any) -> Any:
    # Only reachable when the checkpointed function itself runs a backward through what
    # it computed (``ag.grad`` inside ``fn``): the reentrant form's forward keeps nothing.
    raise RuntimeError("asyncgrad.utils.checkpoint: with use_reentrant=True the checkpointed "
                       "function cannot run a backward (ag.grad) through its own computation in "
                       "forward; use use_reentrant=False")


def _detach_args(args: tuple[Any, ...]) -> list[Any]:
    out = []
    for a in args:
        if isinstance(a, Tensor):
            d = a.detach()
            d._requires_grad = a._requires_grad
            out.append(d)
        else:
            out.append(a)
    return out


def _outside_edges(outputs: tuple[Any, ...], detached: list[Any], start: int
                   ) -> dict[Edge, tuple[Any, Any]]:
    """The edges from the graph built by ``fn`` (its nodes have sequence_nr > ``start``)
    to tensors from outside ``fn``, with the shape and dtype of each such tensor."""
    inputs = {id(d) for d in detached if isinstance(d, Tensor)}
    found: dict[Edge, tuple[Any, Any]] = {}
    seen: set[Node] = set()
    stack: list[Node] = []

    def visit(edge: Edge, shape: Any, dtype: Any) -> None:
        node = edge[0]
        if node is None:
            return
        if type(node) is AccumulateGrad:
            if id(node.variable) not in inputs:
                found.setdefault(edge, (shape, dtype))
        elif node.sequence_nr > start:
            if node not in seen:
                seen.add(node)
                stack.append(node)
        else:
            found.setdefault(edge, (shape, dtype))

    for o in outputs:
        if isinstance(o, Tensor) and o._requires_grad:
            visit(o._gradient_edge(), o.data.shape, o.data.dtype)
    while stack:
        node = stack.pop()
        shapes, dtypes = node.input_shapes, node.input_dtypes
        for i, edge in enumerate(node.next_edges):
            visit(edge, shapes[i] if i < len(shapes) else None, dtypes[i] if i < len(dtypes) else None)
    return found


def checkpoint_reentrant(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                          rng: dict[str, Any] | None) -> Any:
    detached = _detach_args(args)
    start = next_sequence_nr()
    with saved_tensors_hooks(_discard, _discarded):  # see Note [Checkpoint hooks fire once]
        result = fn(*detached, **kwargs)
    is_tuple = isinstance(result, tuple)
    outputs = result if is_tuple else (result,)
    outside = _outside_edges(outputs, detached, start)
    requires = tuple(isinstance(a, Tensor) and a._requires_grad for a in args)
    position = {id(d): i for i, d in enumerate(detached) if isinstance(d, Tensor)}
    if not any(requires) and not outside:
        warnings.warn(NO_INPUT_REQUIRES_GRAD, UserWarning, stacklevel=3)
        plain = tuple(args[position[id(o)]] if id(o) in position else o for o in outputs)
        return plain if is_tuple else plain[0]

    edges = [a._gradient_edge() if r else NO_EDGE for a, r in zip(args, requires)]
    edges.extend(outside)
    node = CheckpointFunctionBackward(tuple(edges))
    node.fn = fn
    node.kwargs = kwargs
    node.rng = rng
    node.requires = requires
    node.tensor_args = tuple(isinstance(a, Tensor) for a in args)
    node.saved = [save_for_backward(a) if isinstance(a, Tensor) else a for a in args]
    shapes = [a.data.shape if r else None for a, r in zip(args, requires)]
    dtypes = [a.data.dtype if r else None for a, r in zip(args, requires)]
    for shape, dtype in outside.values():
        shapes.append(shape)
        dtypes.append(dtype)
    node.input_shapes = tuple(shapes)
    node.input_dtypes = tuple(dtypes)
    node.num_outputs = len(outputs)

    wrapped: list[Any] = []
    done: dict[int, Tensor] = {}
    work = sum(a.data.size for a in args if isinstance(a, Tensor))
    for i, o in enumerate(outputs):
        if not isinstance(o, Tensor):
            wrapped.append(o)
            continue
        if id(o) not in done:
            j = position.get(id(o))
            if j is not None:  # an input returned as-is: a view of it, as for a Function
                src = args[j]
                new = Tensor._nonleaf(src.data, node, i, src._version_counter)
                new._base = src._base if src._base is not None else src
            else:
                new = Tensor._nonleaf(o.data, node, i, None)
            done[id(o)] = new
            work += o.data.size
        wrapped.append(done[id(o)])
    # Recomputation costs about as much as the forward: always worth a worker thread.
    node.work = max(work, get_engine().inline_threshold)
    return tuple(wrapped) if is_tuple else wrapped[0]


class CheckpointFunctionBackward(Node):
    """Recomputes a checkpointed function and differentiates it (reentrant form)."""

    __slots__ = ("fn", "kwargs", "rng", "requires", "tensor_args", "saved", "num_outputs", "input_shapes",
                 "input_dtypes", "work")

    def __init__(self, edges: tuple[Edge, ...]) -> None:
        Node.__init__(self, edges)
        self.fn: Callable[..., Any] = _discard
        self.kwargs: dict[str, Any] = {}
        self.rng: dict[str, Any] | None = None
        self.requires: tuple[bool, ...] = ()
        self.tensor_args: tuple[bool, ...] = ()
        self.saved: list[Any] | None = None
        self.num_outputs = 1
        self.work = 0

    def release_variables(self) -> None:
        self.saved = None
        self.kwargs = {}

    # Note [Checkpoint backward is async]: the node is an async node, so its nested
    # backward runs on the event loop like any GraphTask (its large kernels go to worker
    # threads, in parallel), and cancelling the outer backward reaches it promptly. The
    # recomputation itself (a forward) runs on a worker thread when it is large. The
    # synchronous drivers run it through the engine's blocking helper.
    def is_async(self) -> bool:
        return True

    async def apply_async(self, grads: list[Any], m: Any) -> list[Any]:
        _check_checkpoint_valid()
        parent = _context.current_graph_task.get()
        engine = cast(Engine, parent.engine) if parent is not None else get_engine()
        if self.work >= engine.inline_threshold:
            task = await engine.offload(self._recompute, grads, m, engine)  # the engine's worker threads
        else:
            task = self._recompute(grads, m, engine)
        if task is None:
            return [None] * len(self.next_edges)
        await engine.execute(task)
        return list(task.captured)

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        """The same, blocking (for callers that run nodes synchronously)."""
        _check_checkpoint_valid()
        parent = _context.current_graph_task.get()
        engine = cast(Engine, parent.engine) if parent is not None else get_engine()
        task = self._recompute(grads, m, engine)
        if task is None:
            return [None] * len(self.next_edges)
        engine.execute_sync(task)
        return list(task.captured)

    def _recompute(self, grads: list[Any], m: Any, engine: Any) -> GraphTask | None:
        """Run ``fn`` again and plan the nested backward through what it built (None
        when no gradient reaches an output)."""
        saved = self.saved
        if saved is None:
            raise RuntimeError(FREED_MESSAGE)
        # Recompute from the inputs themselves, so the recomputed graph leads to their
        # edges, which are capture targets (and, under create_graph, the gradients we
        # return are differentiable all the way back). An input whose unpacked value lost
        # its place in the graph (a saved_tensors_hooks unpack) is replaced by a fresh leaf.
        inputs: list[Any] = []
        targets: list[Edge] = list(self.next_edges)
        for i, (entry, is_tensor, r) in enumerate(zip(saved, self.tensor_args, self.requires)):
            if not is_tensor:
                inputs.append(entry)  # a non-tensor argument, kept as is
                continue
            t = entry.unpack_tensor(self)
            if r and not (t._requires_grad and t._gradient_edge() == targets[i]):
                t = t.detach()
                t._requires_grad = True
                targets[i] = (AccumulateGrad.for_leaf(t), 0)
            inputs.append(t)
        start = next_sequence_nr()
        with restored_rng(self.rng), enable_grad():
            result = self.fn(*inputs, **self.kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        roots: list[Edge] = []
        root_grads: list[Any] = []
        any_requires = False
        for o, g in zip(outputs, grads):
            if isinstance(o, Tensor) and o._requires_grad:
                any_requires = True
                if g is not None:
                    roots.append(o._gradient_edge())
                    root_grads.append(g)
        if not any_requires:
            raise RuntimeError(NO_OUTPUT_REQUIRES_GRAD)
        if not roots:
            return None
        # the nested backward runs the recomputed nodes only and captures, without hooks,
        # the gradient reaching each target edge (see Note [Checkpoint hooks fire once])
        root = GraphRoot(tuple(roots), root_grads)
        task = GraphTask(engine, keep_graph=False, create_graph=bool(m.tensor_mode), accumulate=False)
        task.set_roots([(root, 0)], [None], targets, plan=plan_capture(root, targets, _recomputed_only(start)))
        _recompute_tasks.add(task)
        return task


def _check_checkpoint_valid() -> None:
    """PyTorch's ``_is_checkpoint_valid``: every GraphTask on the reentrant stack must be
    a plain ``backward()`` without ``inputs=`` (our own recomputations excepted)."""
    task = _context.current_graph_task.get()
    while task is not None:
        if task not in _recompute_tasks and (not task.accumulate or task.exec_info is not None):
            raise RuntimeError(REENTRANT_GRAD_ERROR)
        task = task.parent


_recompute_tasks: weakref.WeakSet[GraphTask] = weakref.WeakSet()


def _recomputed_only(start: int) -> Callable[[Node], None]:
    """For ``plan_capture``: the recomputation's backward may only reach nodes that the
    recomputation built (their sequence numbers are above ``start``)."""
    def expand(child: Node) -> None:
        if type(child) is AccumulateGrad or child.sequence_nr <= start:
            raise RuntimeError(
                "asyncgrad.utils.checkpoint: the recomputation reached "
                f"{child.name()}, which the original forward did not use (was a "
                "tensor used by the checkpointed function modified in place, or does "
                "the function depend on something other than its inputs and state?)"
            )
    return expand
