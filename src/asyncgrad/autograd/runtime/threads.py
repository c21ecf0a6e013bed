"""Threads for the engine: running a call on an executor from async code, blocking on a
coroutine from sync code, handing a drain to a fresh thread, and which thread or task
is running now (the identity a nested backward is matched against).

Nothing here knows about nodes or GraphTasks.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import anyio

from ... import _context
from .timer_wake import after_wake
from .workers import submit

# Note [No one-time stall] (sched/placement.py): anyio imports its asyncio back end on first use,
# ~25 ms of imports that would land on the loop inside the first ``await backward``.
# Imported here instead, with asyncgrad (trio users have imported trio's already).
try:
    importlib.import_module("anyio._backends._asyncio")
except ImportError:  # (a future anyio may move it: then it is loaded on first use)
    pass

if TYPE_CHECKING:
    from ..task.graph_task import GraphTask


def current_owner() -> object:
    """The asyncio or trio task running now, or, off any event loop, this thread's id.

    Note [Explicit nesting]: a backward is nested only when it starts inside the task or
    thread that runs a node of another backward (``_context.node_owner``). A task created
    from a hook inherits the context variables of the running backward, but not this
    identity, so its backward calls are independent top-level ones.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        task = None
    if task is not None:
        return task
    trio = sys.modules.get("trio")  # an optional back end: only a thread running it imported it
    if trio is not None:
        try:
            return trio.lowlevel.current_task()
        except RuntimeError:
            pass
    return threading.get_ident()


def running_graph_task() -> GraphTask | None:
    """The GraphTask whose node (hook, callback) this task or thread is running, or
    None: also in a task that merely inherited the context of one (Note [Explicit
    nesting]). A backward started now is nested in it."""
    task = _context.current_graph_task.get()
    if task is None or _context.node_owner.get() != current_owner():
        return None
    return task


def as_owner(fn: Callable[..., Any], *args: Any) -> Any:
    """On a worker thread: ``fn(*args)`` with this thread marked as the node's owner."""
    _context.node_owner.set(threading.get_ident())
    return fn(*args)


def threadsafe_caller() -> tuple[Callable[..., object], asyncio.AbstractEventLoop | None]:
    """On the loop's thread: a function any thread may call as ``call_soon(fn, *args)``
    to run ``fn(*args)`` on this loop soon (asyncio's ``call_soon_threadsafe``, trio's
    ``run_sync_soon``), and the asyncio loop (None on trio)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        try:
            import trio  # (here: trio is optional; not on asyncio)
        except ImportError:
            raise RuntimeError("asyncgrad runs on asyncio or trio: no asyncio event loop is running "
                               "and trio is not installed") from None

        run_sync_soon: Callable[..., object] = trio.lowlevel.current_trio_token().run_sync_soon
        return run_sync_soon, None
    return loop.call_soon_threadsafe, loop


def redeliver_cancellation(cancelled: BaseException) -> None:
    """An asyncio task cancelled after its backward committed (Note [The runner
    completes small backward calls] in sched/loop.py) returns normally and is cancelled
    again at its next await, the cancel count unchanged (``asyncio.timeout`` and task
    groups match cancels to uncancels), with the same message (anyio's cancel scopes
    recognise their own cancellations by it). Trio's cancel scope stays cancelled and
    raises at the caller's next checkpoint by itself."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # trio: its cancel scope stays cancelled, nothing to do
        return
    if task is not None:
        if hasattr(task, "uncancel"):  # (Python 3.11+: cancels are counted)
            task.uncancel()
        task.cancel(cancelled.args[0] if cancelled.args else None)


async def run_in_executor(executor: Executor, fn: Callable[..., Any], args: tuple[Any, ...],
                          priority: int = 0, on_cancel: Callable[[], object] | None = None) -> Any:
    """Run ``fn`` on ``executor`` in a copy of this context (the worker thread is the
    owner of what runs there), queued by ``priority`` on the engine's own threads.
    Cancellation: a call that has not started is withdrawn;
    one that has is waited for (a thread cannot be interrupted), then the cancellation
    goes on. ``on_cancel`` is called on the loop as the cancellation arrives, before
    that wait: a call that has started can read what it set and stop early.

    The result comes back in a one-item list that is emptied here: the executor's
    future, and the worker thread's frame until it next runs, keep only the empty list.
    A worker thread (possibly niced, Note [Worker threads yield the CPU to the loop])
    may keep them a while after the loop went on, and would keep a large gradient alive with
    them after the commit took it over (Note [Owned gradients] in task/step.py).

    Note [A bare future for the hop back]: on asyncio the awaiting task waits on a
    plain ``asyncio.Future`` that the worker's done-callback resolves through
    ``call_soon_threadsafe``, not on an anyio Event (an asyncio Event wrapped in
    anyio's, whose ``wait`` makes a future of its own and whose ``set`` walks its
    waiters). The hop is on the critical path of every offloaded node, and the loop
    must reach its ``select`` before the worker gets the GIL, so each step the loop
    runs between the submit and its next sleep delays the kernel's start. Trio keeps
    the anyio Event."""
    ctx = contextvars.copy_context()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio
        return await _run_in_executor_anyio(executor, fn, args, ctx, priority, on_cancel)
    arrival = _Arrival(loop)
    future = submit(executor, priority, ctx.run, boxed_call, fn, *args)
    future.add_done_callback(arrival.from_worker)
    try:
        await arrival.waiter
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        if not future.cancel() and not future.done():
            # started: wait for its end (the loop thread ran every earlier arrival,
            # so a kernel that ended before this point shows as done above)
            arrival.waiter = loop.create_future()
            with anyio.CancelScope(shield=True):
                await arrival.waiter
        raise
    return future.result().pop()


class _Arrival:
    """The loop-side end of one call on a worker: ``waiter`` is resolved on the loop
    once the call's future is done (the waiter may be replaced after a cancellation)."""

    __slots__ = ("loop", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiter: asyncio.Future[None] = loop.create_future()

    def from_worker(self, _: object) -> None:
        self.loop.call_soon_threadsafe(self.arrive)

    def arrive(self) -> None:
        if not self.waiter.done():  # (cancelled meanwhile: nothing waits on it)
            self.waiter.set_result(None)
        after_wake(self.loop)  # (Note [A woken loop's next timer] in runtime/timer_wake.py)


async def _run_in_executor_anyio(executor: Executor, fn: Callable[..., Any], args: tuple[Any, ...],
                                 ctx: contextvars.Context, priority: int,
                                 on_cancel: Callable[[], object] | None) -> Any:
    done = anyio.Event()
    call_soon, _ = threadsafe_caller()
    future = submit(executor, priority, ctx.run, boxed_call, fn, *args)
    future.add_done_callback(lambda _: call_soon(done.set))
    try:
        await done.wait()
    except anyio.get_cancelled_exc_class():
        if on_cancel is not None:
            on_cancel()
        if not future.cancel():
            with anyio.CancelScope(shield=True):
                await done.wait()
        raise
    return future.result().pop()


def boxed_call(fn: Callable[..., Any], *args: Any) -> list[Any]:
    """On a worker: ``[fn(*args)]``, run as the node's owner. The loop empties the box
    when it takes the result (see ``run_in_executor``)."""
    return [as_owner(fn, *args)]


def in_event_loop_thread() -> bool:
    """Whether this *thread* is running an event loop. Not sniffio's context variable:
    contexts are copied into worker threads, threads are not."""
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_trio_token()
        return True
    except RuntimeError:
        return False


def block_on(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    """Run the coroutine ``fn(*args)`` to completion from synchronous code, with this
    context's variables. On a thread that runs an event loop (which we must not block
    re-entrantly) it runs on a fresh thread with its own loop."""
    ctx = contextvars.copy_context()
    run = fn
    if _context.node_owner.get() == current_owner():
        # The caller runs a node or callback of a backward (Note [Explicit nesting]): the
        # coroutine does so on its behalf, in the new loop's task, which owns it now.
        async def as_node_owner(*args: Any) -> Any:
            # reset after: the task's context naming the task itself is a reference cycle
            token = _context.node_owner.set(current_owner())
            try:
                return await fn(*args)
            finally:
                _context.node_owner.reset(token)

        run = as_node_owner
    if not in_event_loop_thread():
        return ctx.run(asyncio.run, run(*args))
    return run_on_fresh_thread(lambda: asyncio.run(run(*args)), ctx=ctx)


def run_on_fresh_thread(fn: Callable[..., Any], *args: Any, ctx: contextvars.Context | None = None) -> Any:
    """``fn(*args)`` on a new thread, waited for; its exception is re-raised here."""
    ctx = ctx or contextvars.copy_context()
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(ctx.run(fn, *args))
        except BaseException as e:  # re-raised on the calling thread
            error.append(e)

    thread = threading.Thread(target=target, name="asyncgrad-reentrant")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0] if result else None


def is_awaitable(result: Any) -> bool:
    return asyncio.iscoroutine(result) or hasattr(result, "__await__")


def await_blocking(result: Any) -> None:
    """From a sync driver: run an awaitable that a callback returned to completion."""
    if is_awaitable(result):
        async def wait() -> None:
            await result

        block_on(wait)
