"""Activation checkpointing: trade compute for memory.

``checkpoint(fn, *args)`` runs ``fn`` without keeping the tensors its backward would need,
and recomputes them during backward. ``checkpoint_sequential(functions, segments, x)``
checkpoints each of ``segments`` chunks of a sequential model except the last one.

Two forms, as in PyTorch:

* ``use_reentrant=True`` (used when ``use_reentrant`` is not passed, with PyTorch's
  warning). Forward keeps only ``fn``'s inputs (and the RNG
  state). The ``CheckpointFunctionBackward`` node recomputes ``fn`` under ``enable_grad``
  and runs a nested (reentrant) backward through the recomputed graph (see Note
  [Checkpoint backward is async]). Like PyTorch it refuses ``grad()`` and
  ``backward(inputs=...)``.
* ``use_reentrant=False``. ``fn`` runs with grad mode on inside ``saved_tensors_hooks``
  whose pack hook keeps a tiny handle instead of each saved tensor. The first unpack in a
  backward recomputes ``fn`` once (under that backward's GraphTask) and hands out the
  recomputed tensors (see Note [When recomputed values are dropped]), stopping the
  recomputation once every saved tensor is back (Note [Early stop]). The graph is an
  ordinary graph, so ``grad()``, ``inputs=`` and ``create_graph`` work, and ``fn`` may
  itself call ``ag.grad`` on what it computed.

Note [Checkpoint hooks fire once]: both forms recompute ``fn`` once per backward and fire
each parameter's hooks (tensor hooks, post-accumulate-grad hooks, AccumulateGrad node
hooks) exactly once per backward, with the full gradient, and commit ``.grad`` atomically
with the rest of the backward (so a failed or cancelled backward leaves ``.grad`` alone).

* Non-reentrant: the recomputation's graph is never differentiated; it only supplies
  saved values. Gradients flow through the original graph, whose edges lead to the
  parameters' own AccumulateGrad nodes, as without checkpointing.
* Reentrant: PyTorch's nested backward accumulates into the parameters used inside ``fn``
  by itself, so a parameter used in two checkpointed segments, or inside and outside
  one, is accumulated (and its hooks fired) once per use. asyncgrad avoids that: in
  forward, ``fn`` runs once with grad mode on under a pack hook that *discards* every
  saved tensor (so it keeps no more memory than a ``no_grad`` forward), only to find
  the tensors from outside ``fn`` that its result depends on: parameters, closure
  tensors, tensors in ``kwargs``. The checkpoint node gets one edge per input and per
  such outside tensor. Its backward recomputes ``fn`` from the inputs themselves (not
  detached copies), and its nested GraphTask (built with ``exec_info.plan_capture``) runs the recomputed
  nodes only, *capturing* the gradient that reaches each of the node's edges without
  running hooks or accumulating. The node returns those as its own gradients, so the
  outer backward's AccumulateGrad sums every use and fires the hooks once. Under
  ``create_graph`` the captured gradients are differentiable back to the inputs and
  parameters, so double backward works (PyTorch's reentrant form does not support it).

Differences from PyTorch's reentrant form, all consequences of the above: hooks fire
once per backward (not once per use); ``.grad`` is committed with the outer backward
(PyTorch's nested backward writes it before the outer one finishes); parameters used by
``fn`` get gradients even when no input requires grad (PyTorch warns "None of the inputs
have requires_grad=True. Gradients will be None" and drops them); double backward works;
and hooks registered inside ``fn`` are allowed (they fire in the recomputation's
backward). The cost: ``fn`` records a graph (without saved tensors) in forward.

RNG: with ``preserve_rng_state=True`` the state of asyncgrad's default generator is
saved when ``checkpoint`` is called and restored around the recomputation (then set back),
so random ops in ``fn`` (dropout masks) repeat exactly. Recomputations that restore the
state are serialised by a lock; random numbers drawn by *other* threads while one runs
would see the swapped state, as with PyTorch's ``fork_rng``.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from contextlib import contextmanager
from typing import Any
from collections.abc import Callable, Iterator

from .. import _context
from ..grad_mode import enable_grad
from ..random import get_rng_state, set_rng_state
from ..tensor import Tensor
from ..autograd.engine import get_engine
from ..autograd.graph import (
    FREED_MESSAGE, NO_EDGE, AccumulateGrad, Edge, GraphRoot, Node, next_sequence_nr,
    save_for_backward, saved_tensors_hooks,
)
from ..autograd.exec_info import plan_capture
from ..autograd.graph_task import GraphTask

__all__ = ["checkpoint", "checkpoint_sequential", "set_checkpoint_early_stop"]

REENTRANT_GRAD_ERROR = (
    "When use_reentrant=True, asyncgrad.utils.checkpoint is incompatible with .grad() or "
    "passing an `inputs` parameter to .backward(). To resolve this error, you can either "
    "set use_reentrant=False, or call .backward() without passing the `inputs` argument."
)
NO_OUTPUT_REQUIRES_GRAD = "none of output has requires_grad=True, this checkpoint() is not necessary"
NO_INPUT_REQUIRES_GRAD = "None of the inputs have requires_grad=True. Gradients will be None"
# PyTorch's texts (torch 2.13), with asyncgrad's module name
USE_REENTRANT_WARNING = (
    "asyncgrad.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
    "Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an exception. "
    "use_reentrant=False is recommended, but if you need to preserve the current default "
    "behavior, you can pass use_reentrant=True. Refer to docs for more details on the "
    "differences between the two variants."
)
SEQUENTIAL_USE_REENTRANT_WARNING = (
    "asyncgrad.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be "
    "passed explicitly. In version 2.9 we will raise an exception if use_reentrant is not "
    "passed. use_reentrant=False is recommended, but if you need to preserve the current "
    "default behavior, you can pass use_reentrant=True. Refer to docs for more details on the "
    "differences between the two variants."
)


def checkpoint(fn: Callable[..., Any], *args: Any, use_reentrant: bool | None = None,
               preserve_rng_state: bool = True, early_stop: bool = True, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, keeping only the inputs for backward, which recomputes
    ``fn`` (see the module docstring for the two forms). Non-tensor arguments and
    results pass through unchanged. Under ``no_grad`` this is just ``fn(*args)``.

    ``use_reentrant`` should be passed: without it, PyTorch's warning, and the
    reentrant form. ``early_stop`` (non-reentrant form; overridden by
    :func:`set_checkpoint_early_stop`) stops each recomputation as soon as every tensor
    the forward saved is back (Note [Early stop])."""
    if use_reentrant is None:
        warnings.warn(USE_REENTRANT_WARNING, UserWarning, stacklevel=2)
        use_reentrant = True
    if not _context.grad_enabled.get():
        return fn(*args, **kwargs)
    rng = get_rng_state() if preserve_rng_state else None
    if use_reentrant:
        return _checkpoint_reentrant(fn, args, kwargs, rng)
    override = _context.checkpoint_early_stop.get()
    return _checkpoint_with_hooks(fn, args, kwargs, rng, early_stop if override is None else override)


@contextmanager
def set_checkpoint_early_stop(enable: bool) -> Iterator[None]:
    """Whether non-reentrant checkpoints whose forward runs inside this block stop their
    recomputation early (the default) or run the whole function again. Only the forward
    needs to be inside; the setting is context-local (a ContextVar), like grad mode."""
    token = _context.checkpoint_early_stop.set(bool(enable))
    try:
        yield
    finally:
        _context.checkpoint_early_stop.reset(token)


def checkpoint_sequential(functions: Any, segments: int, input: Any, use_reentrant: bool | None = None,
                          **kwargs: Any) -> Any:
    """Run ``functions`` (callables, or a module with ``children()``) in sequence on
    ``input``, checkpointing each of the first ``segments - 1`` chunks; the last chunk
    runs normally, as in PyTorch. ``preserve_rng_state`` may be passed as a keyword."""
    if use_reentrant is None:
        warnings.warn(SEQUENTIAL_USE_REENTRANT_WARNING, UserWarning, stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if hasattr(functions, "children") and callable(functions.children):
        functions = functions.children()
    functions = list(functions)
    if segments < 1:
        raise ValueError(f"segments must be at least 1, got {segments}")
    segments = min(segments, len(functions)) or 1
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(_segment(functions, start, end), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return _segment(functions, end + 1, len(functions) - 1)(input)


def _segment(functions: list[Any], start: int, end: int) -> Callable[[Any], Any]:
    def forward(x: Any) -> Any:
        for j in range(start, end + 1):
            x = functions[j](x)
        return x
    return forward


_rng_lock = threading.RLock()


@contextmanager
def _restored_rng(state: dict[str, Any] | None) -> Iterator[None]:
    """Run the block with the generator in ``state``, then put the current state back."""
    if state is None:
        yield
        return
    with _rng_lock:
        current = get_rng_state()
        set_rng_state(state)
        try:
            yield
        finally:
            set_rng_state(current)


# --------------------------------------------------------------------------------------
# use_reentrant=True
# --------------------------------------------------------------------------------------

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


def _checkpoint_reentrant(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
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
        engine = parent.engine if parent is not None else get_engine()
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
        engine = parent.engine if parent is not None else get_engine()
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
        with _restored_rng(self.rng), enable_grad():
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


# --------------------------------------------------------------------------------------
# use_reentrant=False
# --------------------------------------------------------------------------------------

class _Recomputed:
    """The values a frame's recomputation saved, for one backward, and which of them
    that backward has unpacked so far."""

    __slots__ = ("values", "unseen")

    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self.unseen = set(range(len(values)))


# Per running backward, the frame whose recomputed values have all been unpacked at least
# once; see Note [When recomputed values are dropped].
_complete: weakref.WeakKeyDictionary[Any, _Frame] = weakref.WeakKeyDictionary()
_complete_lock = threading.Lock()


class _Frame:
    """One call of a non-reentrant checkpoint: what is needed to recompute it, and the
    recomputed values per running backward (GraphTask).

    Note [When recomputed values are dropped]: a node may unpack its saved tensors more
    than once in one backward (the engine computes the input gradients of a large node
    as parallel kernels, each unpacking), so a value cannot be dropped at its first
    unpack as PyTorch does. A frame's recomputed values are kept until every one of them
    has been unpacked and another frame starts unpacking in the same backward (or the
    backward ends): in a sequential model, one segment's activations at a time. Should a
    dropped frame be unpacked again (interleaved branches), it is recomputed again.
    """

    __slots__ = ("fn", "args", "kwargs", "rng", "count", "lock", "by_task", "early_stop",
                 "forward_completed", "__weakref__")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 rng: dict[str, Any] | None, early_stop: bool = True) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rng = rng
        self.early_stop = early_stop
        self.forward_completed = False
        self.count = 0
        self.lock = threading.Lock()
        self.by_task: weakref.WeakKeyDictionary[Any, _Recomputed] = weakref.WeakKeyDictionary()

    def pack(self, t: Tensor) -> _Handle:
        handle = _Handle(self, self.count)
        self.count += 1
        return handle

    def unpack(self, index: int) -> Any:
        task = _context.current_graph_task.get()
        if task is None:  # e.g. ctx.saved_tensors read outside backward
            return self._recompute()[index]
        with _complete_lock:
            done = _complete.get(task)
            if done is not None and done is not self:
                done.by_task.pop(task, None)
                del _complete[task]
        with self.lock:  # kernels of one backward may unpack from several threads at once
            rec = self.by_task.get(task)
            if rec is None:
                rec = self.by_task[task] = _Recomputed(self._recompute())
            value = rec.values[index]
            rec.unseen.discard(index)
            complete = not rec.unseen
        if complete:
            with _complete_lock:
                _complete[task] = self
        return value

    # Note [Early stop]: the recomputation needs the tensors the forward saved, in order,
    # and nothing after the last of them, so with ``early_stop`` it is cut short (by an
    # exception from the pack hook) as soon as it saved that many: trailing work that
    # saves nothing is not redone. The same bound makes a backward *inside* the forward
    # work (``fn`` calls ``ag.grad`` on what it computed so far): that backward unpacks
    # while the forward has saved only ``count`` tensors yet, and the recomputation must
    # stop there too, before it reaches the inner backward again. Without early stop,
    # tensors saved past ``count`` before the forward completed are not needed and are
    # passed through, as in PyTorch.
    def _recompute(self) -> list[Any]:
        values: list[Any] = []
        needed = self.count  # what the forward saved so far (all of it once it completed)

        def pack(t: Tensor) -> Any:
            if len(values) >= needed:
                if not self.forward_completed:
                    return t  # see Note [Early stop]
                raise RuntimeError(
                    "asyncgrad.utils.checkpoint: trying to save more tensors during recomputation "
                    "than during the original forward pass."
                )
            values.append(t)
            if self.early_stop and len(values) == needed:
                raise _StopRecomputation
            return t

        try:
            with _restored_rng(self.rng), enable_grad(), saved_tensors_hooks(pack, _identity):
                self.fn(*self.args, **self.kwargs)
        except _StopRecomputation:
            pass
        if len(values) != needed:
            raise RuntimeError(
                "asyncgrad.utils.checkpoint: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {needed}\n"
                f"Number of tensors saved during recomputation: {len(values)}"
            )
        return values


class _StopRecomputation(BaseException):
    """Ends a recomputation once it saved every tensor needed (Note [Early stop]). A
    BaseException, so that an ``except Exception`` in the user's function lets it pass."""


def _identity(packed: Any) -> Any:
    return packed


class _Handle:
    __slots__ = ("frame", "index")

    def __init__(self, frame: _Frame, index: int) -> None:
        self.frame = frame
        self.index = index


def _unpack_handle(handle: _Handle) -> Any:
    return handle.frame.unpack(handle.index)


def _checkpoint_with_hooks(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                           rng: dict[str, Any] | None, early_stop: bool) -> Any:
    frame = _Frame(fn, args, kwargs, rng, early_stop)
    with saved_tensors_hooks(frame.pack, _unpack_handle):
        result = fn(*args, **kwargs)
    frame.forward_completed = True
    return result

