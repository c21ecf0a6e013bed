"""``backward`` and ``grad``: argument checking, root gradients, and handing a GraphTask
to the engine. The async forms are the main API; the ``*_sync`` forms block.

Errors: bad arguments raise before anything runs (PyTorch's messages). An exception
raised by a node propagates from the ``await`` with its own type and traceback, plus a
note naming the node; every ``.grad`` is then as it was before the call.

Cancellation: cancelling the awaiting task stops the backward promptly; the ``await``
ends after every kernel it started has finished; nothing is committed or freed.
"""

from __future__ import annotations

import warnings
from typing import Any
from collections.abc import Callable

from .. import _context
from ..backend import Array, xp
from ..tensor import Tensor
from .engine import get_engine
from .graph import Edge
from .task.graph_task import GraphTask
from .sched.admission import UNHELD, admission
from .runtime.task_order import check_priority
from .runtime.threads import in_event_loop_thread, running_graph_task

_CREATE_GRAPH_WARNING = (
    "Using backward() with create_graph=True will create a reference cycle between the "
    "parameter and its gradient which can cause a memory leak. We recommend using "
    "autograd.grad when creating the graph to avoid this. If you have to use this function, "
    "make sure to reset the .grad fields of your parameters to None after use to break the "
    "cycle and avoid the leak."
)


def _as_tuple(x: Any) -> tuple[Any, ...]:
    if isinstance(x, Tensor):
        return (x,)
    if x is None:
        return ()
    return tuple(x)


def _make_grads(outputs: tuple[Tensor, ...], grads: tuple[Any, ...], create_graph: bool) -> list[Any]:
    """PyTorch's ``_make_grads``: check or create the gradient of each root."""
    out: list[Any] = []
    for i, (o, g) in enumerate(zip(outputs, grads)):
        if isinstance(g, Tensor):
            if g.shape != o.shape:
                raise RuntimeError(
                    f"Mismatch in shape: grad_output[{i}] has a shape of {list(g.shape)} and "
                    f"output[{i}] has a shape of {list(o.shape)}."
                )
            arr = g.data if g.dtype == o.dtype else g.data.astype(o.dtype)
            if create_graph:
                out.append(g if g.dtype == o.dtype else g.to(o.dtype))
            else:
                out.append(arr)
        elif g is None:
            if o._requires_grad:
                if o.data.size != 1:
                    raise RuntimeError("grad can be implicitly created only for scalar outputs")
                if not xp.is_floating(o.dtype):
                    raise RuntimeError(
                        f"grad can be implicitly created only for real scalar outputs but got {o.dtype}"
                    )
                ones = xp.ones(o.data.shape, o.dtype)
                out.append(Tensor._wrap(ones) if create_graph else ones)
            else:
                out.append(None)
        else:
            raise TypeError(f"gradients can be either Tensors or None, but got {type(g).__name__}")
    return out


def _root_edges(outputs: tuple[Tensor, ...]) -> list[Edge]:
    edges = []
    for i, o in enumerate(outputs):
        if not isinstance(o, Tensor):
            raise TypeError(f"element {i} of tensors is not a Tensor but {type(o).__name__}")
        if not o._requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        edges.append(o._gradient_edge())
    return edges


def _input_edges(inputs: tuple[Tensor, ...]) -> list[Edge]:
    edges = []
    for t in inputs:
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs must be Tensors, got {type(t).__name__}")
        edges.append(t._gradient_edge() if t._requires_grad else (None, 0))
    return edges


def _prepare_backward(tensors: Any, grad_tensors: Any, retain_graph: bool | None,
                      create_graph: bool, inputs: Any, priority: int = 0) -> GraphTask:
    if type(tensors) is Tensor and grad_tensors is None and inputs is None and not create_graph:
        return _prepare_scalar_backward(tensors, retain_graph, priority)
    outputs = _as_tuple(tensors)
    grads = _as_tuple(grad_tensors) if grad_tensors is not None else (None,) * len(outputs)
    if len(grads) != len(outputs):
        raise RuntimeError(f"grad_tensors has {len(grads)} elements but tensors has {len(outputs)}")
    if create_graph:
        warnings.warn(_CREATE_GRAPH_WARNING, UserWarning, stacklevel=3)
    input_list = None
    if inputs is not None:
        input_list = _as_tuple(inputs)
        if not input_list:
            raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
    roots = _root_edges(outputs)
    root_grads = _make_grads(outputs, grads, create_graph)
    if input_list is not None:
        # PyTorch: non-leaf inputs get .grad filled in. Checked first, so that a call
        # that fails leaves no retain_grad behind.
        for t in input_list:
            if not isinstance(t, Tensor):
                raise TypeError(f"inputs must be Tensors, got {type(t).__name__}")
            if not t._requires_grad:
                raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        for t in input_list:
            t.retain_grad()
    keep = create_graph if retain_graph is None else retain_graph
    task = GraphTask(get_engine(), keep_graph=keep, create_graph=create_graph, accumulate=True,
                     priority=priority)
    task.set_roots(roots, root_grads, _input_edges(input_list) if input_list is not None else None)
    return task


def _prepare_scalar_backward(t: Tensor, retain_graph: bool | None, priority: int) -> GraphTask:
    """``_prepare_backward`` of the most common call, ``backward(loss)``: the same
    checks and errors, in the same order, without the general bookkeeping."""
    if not t._requires_grad:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    data = t._data
    if data.size != 1:
        raise RuntimeError("grad can be implicitly created only for scalar outputs")
    if not xp.is_floating(data.dtype):
        raise RuntimeError(f"grad can be implicitly created only for real scalar outputs but got {t.dtype}")
    task = GraphTask(get_engine(), keep_graph=False if retain_graph is None else retain_graph,
                     create_graph=False, accumulate=True, priority=priority)
    task.set_roots([t._gradient_edge()], [_one(data.shape, data.dtype)])
    return task


_ONES: dict[tuple[Any, tuple[int, ...], Any], Array] = {}  # one element each: (), (1,), (1, 1)...


def _one(shape: tuple[int, ...], dtype: Any) -> Array:
    """A fresh ``ones(shape, dtype)`` of one element: a copy of a kept one (numpy's
    ``ones`` is a Python function: ``empty``, then ``copyto``; a copy is one C call)."""
    key = (xp.array_type, shape, dtype)
    one = _ONES.get(key)
    if one is None:
        one = _ONES[key] = xp.ones(shape, dtype)
    return xp.astype(one, dtype)


def _prepare_grad(outputs: Any, inputs: Any, grad_outputs: Any, retain_graph: bool | None,
                  create_graph: bool, allow_unused: bool | None, materialize_grads: bool,
                  priority: int = 0) -> tuple[GraphTask, tuple[Tensor, ...], bool]:
    if materialize_grads and allow_unused is False:
        raise ValueError(
            "Expected allow_unused to be True or not passed when materialize_grads=True, "
            "but got: allow_unused=False."
        )
    if allow_unused is None:
        allow_unused = materialize_grads
    outs = _as_tuple(outputs)
    ins = _as_tuple(inputs)
    if not ins:
        raise RuntimeError("`inputs` argument to `grad()` cannot be empty.")
    for t in ins:
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs must be Tensors, got {type(t).__name__}")
        if not t._requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    grads = _as_tuple(grad_outputs) if grad_outputs is not None else (None,) * len(outs)
    if len(grads) != len(outs):
        raise RuntimeError(f"grad_outputs has {len(grads)} elements but outputs has {len(outs)}")
    roots = _root_edges(outs)
    root_grads = _make_grads(outs, grads, create_graph)
    keep = create_graph if retain_graph is None else retain_graph
    task = GraphTask(get_engine(), keep_graph=keep, create_graph=create_graph, accumulate=False,
                     priority=priority)
    task.set_roots(roots, root_grads, _input_edges(ins))
    return task, ins, allow_unused


def _grad_results(task: GraphTask, inputs: tuple[Tensor, ...], allow_unused: bool,
                  materialize_grads: bool, create_graph: bool) -> tuple[Tensor | None, ...]:
    results: list[Tensor | None] = []
    for i, (t, g) in enumerate(zip(inputs, task.captured)):
        if g is None:
            if not allow_unused:
                raise RuntimeError(
                    f"The differentiated Tensor at index {i} appears to not have been used in the "
                    "graph. Set allow_unused=True if this is the desired behavior."
                )
            if materialize_grads:
                z = Tensor._wrap(xp.zeros(t.data.shape, t.dtype))
                if create_graph:
                    z.requires_grad_(True)
                results.append(z)
            else:
                results.append(None)
        elif isinstance(g, Tensor):
            results.append(g)
        else:
            results.append(Tensor._wrap(xp.astype(g, t.dtype)))
    return tuple(results)


# A ``saved_tensors_hooks`` block entered while a backward runs (e.g. inside an unpack
# hook, which runs in the caller's context) must end with that backward, as in PyTorch:
# each entry point restores the caller's stack of hooks when the backward returns.
_saved_hooks = _context.saved_tensors_hooks


async def _execute(task: GraphTask) -> None:
    token = _saved_hooks.set(_saved_hooks.get())
    try:
        await task.engine.execute(task)
    finally:
        _saved_hooks.reset(token)


def _execute_sync(task: GraphTask) -> None:
    token = _saved_hooks.set(_saved_hooks.get())
    try:
        task.engine.execute_sync(task)
    finally:
        _saved_hooks.reset(token)


async def backward(tensors: Any, grad_tensors: Any = None, *, retain_graph: bool | None = None,
                   create_graph: bool = False, inputs: Any = None, priority: int = 0) -> None:
    """Accumulate the gradients of ``tensors`` into ``.grad`` of the leaves (and of
    tensors that ``retain_grad()``), committing only if the whole backward succeeds.

    ``priority``: on this loop, the ready nodes of higher-priority calls run first;
    equal priorities share the loop fairly; a lower-priority call is slowed, never
    starved (Note [Task order] in runtime/task_order.py). A nested backward runs at its
    parent's priority."""
    if type(priority) is not int:
        priority = check_priority(priority)
    held = admission(priority)  # (Note [Admission] in sched/admission.py)
    if held is UNHELD:  # it starts at once: nothing to enter or leave (the common case)
        task = _prepare_backward(tensors, grad_tensors, retain_graph, create_graph, inputs, priority)
        token = _saved_hooks.set(_saved_hooks.get())  # (``_execute`` inlined: one coroutine less)
        try:
            await task.engine.execute(task)
        finally:
            _saved_hooks.reset(token)
        return
    async with held:
        task = _prepare_backward(tensors, grad_tensors, retain_graph, create_graph, inputs, priority)
        token = _saved_hooks.set(_saved_hooks.get())  # (as above)
        try:
            await task.engine.execute(task)
        finally:
            _saved_hooks.reset(token)


async def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, *,
               retain_graph: bool | None = None, create_graph: bool = False,
               allow_unused: bool | None = None, materialize_grads: bool = False,
               priority: int = 0) -> tuple[Tensor | None, ...]:
    """The gradients of ``outputs`` with respect to ``inputs``; no ``.grad`` is touched.
    ``priority`` orders it among the loop's backward calls, as in ``backward``."""
    if type(priority) is not int:
        priority = check_priority(priority)
    args = (outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, materialize_grads,
            priority)
    held = admission(priority)  # (Note [Admission] in sched/admission.py)
    if held is UNHELD:  # it starts at once (as in ``backward``)
        task, ins, allow = await _run_grad(*args)
    else:
        async with held:
            task, ins, allow = await _run_grad(*args)
    return _grad_results(task, ins, allow, materialize_grads, create_graph)


async def _run_grad(*args: Any) -> tuple[GraphTask, tuple[Tensor, ...], bool]:
    """``grad``'s task prepared (``_prepare_grad(*args)``) and run."""
    task, ins, allow = _prepare_grad(*args)
    await _execute(task)
    return task, ins, allow


def _check_sync_allowed(name: str) -> None:
    if running_graph_task() is None and in_event_loop_thread():
        raise RuntimeError(
            f"{name}() was called from a thread that is running an event loop; it would "
            f"block the loop. Use `await asyncgrad.{name.replace('_sync', '')}(...)` instead "
            "(or Tensor.backward() from a thread without a running loop)."
        )


def backward_sync(tensors: Any, grad_tensors: Any = None, *, retain_graph: bool | None = None,
                  create_graph: bool = False, inputs: Any = None, priority: int = 0) -> None:
    """Blocking ``backward``. Inside a running backward (a hook, a Function's backward,
    a callback) it runs a nested (reentrant) backward on this thread, at its parent's
    priority. ``priority`` orders its kernels on the engine's worker threads among
    other calls' (Note [Task order] in runtime/task_order.py)."""
    _check_sync_allowed("backward_sync")
    if type(priority) is not int:
        priority = check_priority(priority)
    task = _prepare_backward(tensors, grad_tensors, retain_graph, create_graph, inputs, priority)
    _execute_sync(task)


def grad_sync(outputs: Any, inputs: Any, grad_outputs: Any = None, *,
              retain_graph: bool | None = None, create_graph: bool = False,
              allow_unused: bool | None = None, materialize_grads: bool = False,
              priority: int = 0) -> tuple[Tensor | None, ...]:
    """Blocking ``grad`` (reentrant inside a running backward; ``priority`` as in
    ``backward_sync``)."""
    _check_sync_allowed("grad_sync")
    if type(priority) is not int:
        priority = check_priority(priority)
    task, ins, allow = _prepare_grad(outputs, inputs, grad_outputs, retain_graph, create_graph,
                                     allow_unused, materialize_grads, priority)
    _execute_sync(task)
    return _grad_results(task, ins, allow, materialize_grads, create_graph)


def queue_callback(fn: Callable[[], Any]) -> None:
    """Run ``fn`` (sync or async) when the current GraphTask's nodes have all finished,
    before its ``await`` returns. Only valid while a backward is running."""
    task = running_graph_task()
    if task is None:
        raise RuntimeError("Final callbacks can only be installed during backward pass.")
    task.queue_callback(fn)


def queue_pre_commit(fn: Callable[[dict[Any, Any]], Any]) -> None:
    """Run ``fn(staged)`` (sync or async) after every node of the current backward has
    finished and before its commit (Note [Pre-commit] in task/commit.py). ``staged`` maps
    each tensor whose ``.grad`` will change to its staged gradient (a Tensor); ``fn`` may
    replace entries with Tensors of the same shape and dtype, and (``backward()`` only)
    add entries for leaves that require grad which this backward did not reach: they
    are committed in the same commit. Only valid while a backward runs.

    Errors: if ``fn`` raises, nothing is committed and the exception propagates from
    the backward call. Cancellation: an ``async`` ``fn`` may be cancelled with the
    backward; nothing is committed then either."""
    task = running_graph_task()
    if task is None:
        raise RuntimeError("Pre-commit functions can only be installed during backward pass.")
    task.pre_commits.append(fn)


__all__ = ["backward", "grad", "backward_sync", "grad_sync", "queue_callback", "queue_pre_commit"]

_context.engine_entry["backward_sync"] = backward_sync  # what Tensor.backward calls (_context.py)
