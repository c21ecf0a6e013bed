"""A backward's lifecycle as public extension points: it *starts* (before its first node
runs) and, unless it commits, it is *aborted*. With ``queue_pre_commit`` and
``queue_callback`` (api.py) these let a library take part in one backward from its
beginning to its end, on every outcome. PyTorch has no equivalent of either hook.

Note [Backward start hooks]: ``register_backward_start_hook(node, fn)`` asks for
``fn()`` to be called, before the first node of a backward runs, by every backward that
will execute ``node``. A library marks a node of its own this way (DDP marks a node on
a branch only a backward through its forward reaches) and learns about the backward
early enough to register the rest of its part in it: ``queue_on_abort``,
``queue_pre_commit``, ``queue_callback``. The hooks are kept here, by ``id(node)`` with
a weak reference (a registration never keeps a graph alive), not on the node, so
nodes stay small. The GraphTask set-up already walks every node it will run; it looks
each newly found node up here only while some hook is registered (a truth test of an
empty dict otherwise), so its per-node cost stays one dict lookup at most. The hooks
are called by the driver after the set-up, so they may be ``async`` and may raise: the
backward then fails before any node ran (and is aborted). A backward cancelled during
its set-up finishes the walk (without yielding; only while some hook is registered)
and runs them, shielded, before its abort functions: every backward that started
calls the start hooks of the nodes it would run, then commits or is aborted.

Note [Abort functions]: ``queue_on_abort(fn)`` registers ``fn(error)`` with the running
backward, to be run exactly once if it ends without committing: a node raised, a
start hook or a pre-commit function raised, or it was cancelled (``error`` is that
exception, the backend's cancellation exception for a cancellation). Never on success:
once the commit starts, the abort functions are dropped. They run after every node
has finished (kernels on worker threads included), in registration order, awaited and
shielded from cancellation, still inside the backward (``current_graph_task_id()``
names it); under the blocking forms they run on the calling thread. If one raises an
``Exception``, the others still run and the *original* error propagates, with a note
naming what the abort function raised (as an exception raised while handling another
is reported beside it rather than replacing it); a ``BaseException`` such as
``KeyboardInterrupt`` is not caught.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any


from ..graph import Node
from ..graph.handles import HookDict, RemovableHandle
from ..runtime.threads import running_graph_task

if TYPE_CHECKING:
    from .graph_task import GraphTask

# id(node) -> (a weak reference to the node, its start hooks); read by GraphTask.setup_steps
START_HOOKS: dict[int, tuple[weakref.ref[Node], HookDict]] = {}


def register_backward_start_hook(node: Node, fn: Callable[[], Any]) -> RemovableHandle:
    """Call ``fn()`` (sync or async) when a backward that will execute ``node`` starts,
    before any of its nodes runs (Note [Backward start hooks]). It runs inside that
    backward, so it may ``queue_on_abort``, ``queue_pre_commit`` and ``queue_callback``.
    A backward that prunes ``node`` away (``grad()``, ``inputs=``) does not call it.
    Hooks of several nodes run highest ``sequence_nr`` first, a node's in registration
    order. The registration does not keep ``node`` alive; ``remove()`` the handle to
    unregister. Errors: ``TypeError`` if ``node`` is not a Node or ``fn`` not callable."""
    if not isinstance(node, Node):
        raise TypeError(f"register_backward_start_hook expects a graph Node (a tensor's grad_fn), "
                        f"got {type(node).__name__}")
    if not callable(fn):
        raise TypeError(f"register_backward_start_hook expects a callable, got {type(fn).__name__}")
    key = id(node)
    entry = START_HOOKS.get(key)
    if entry is None or entry[0]() is not node:
        def forget(ref: weakref.ref[Node]) -> None:
            if START_HOOKS.get(key, (None,))[0] is ref:
                del START_HOOKS[key]

        entry = START_HOOKS[key] = (weakref.ref(node, forget), HookDict())
    return entry[1].add(fn)


def queue_on_abort(fn: Callable[[BaseException], Any]) -> None:
    """Run ``fn(error)`` (sync or async) if the current backward ends without committing:
    a node, a start hook or a pre-commit function raised, or it was cancelled (Note
    [Abort functions]).
    Never on success. Awaited and shielded from cancellation; exactly once. If ``fn``
    raises, the backward's own error still propagates, with a note naming ``fn``'s.
    Only valid while a backward runs and before its commit started."""
    task = running_graph_task()
    if task is None:
        raise RuntimeError("Abort functions can only be installed during backward pass.")
    if task.aborts is None:
        raise RuntimeError(f"graph task {task.id} has already committed or been aborted; "
                           "abort functions must be installed before its commit")
    task.aborts.append(fn)


# --- called by the drivers (engine.py) ------------------------------------------------------
def start_hooks(task: GraphTask) -> list[Callable[[], Any]]:
    """The start hooks of the nodes ``task``'s set-up found (``task.starting``) that it
    will execute, in call order."""
    info = task.exec_info
    fns: list[Callable[[], Any]] = []
    for node in sorted(task.starting, key=lambda n: -n.sequence_nr):
        plan = None if info is None else info.get(node)
        if plan is not None and not plan.needed:
            continue  # reached only to capture a gradient: it does not run
        entry = START_HOOKS.get(id(node))
        if entry is not None and entry[0]() is node:
            fns.extend(entry[1].values())
    task.starting = []
    return fns


def finish_setup(steps: Iterator[None]) -> None:
    """After the set-up's walk, done or cancelled: a cancelled walk is finished here,
    without yielding, so that the abort runs every start hook (Note [Backward start
    hooks]); not when no start hook is registered at all (nothing to find)."""
    if START_HOOKS:
        for _ in steps:
            pass


def disarm(task: GraphTask) -> None:
    """The commit starts: from here on the backward is never aborted."""
    task.aborts = None


def note_abort_error(error: BaseException, fn: Callable[..., Any], raised: Exception) -> None:
    """Note on ``error`` (the backward's) that abort function ``fn`` raised ``raised``."""
    target = getattr(fn, "func", fn)  # (a functools.partial: name what it calls)
    name = getattr(target, "__qualname__", None) or type(target).__name__
    error.add_note(f"asyncgrad: while aborting this backward, {name} raised {type(raised).__name__}: {raised}")


__all__ = ["queue_on_abort", "register_backward_start_hook"]
