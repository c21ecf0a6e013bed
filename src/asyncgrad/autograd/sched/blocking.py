"""The synchronous driver (``backward_sync``, reentrant backward calls from a node's
own thread, checkpoint recomputation), and what both drivers do on entering a backward.

Every node runs inline on the calling thread; an ``async def`` backward is run to its
end here (threads.block_on). It never waits for a worker slot, so an exhausted pool
cannot deadlock a nested backward (Note [Reentrant backwards] in engine.py).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from ... import _context
from ..task.call import DONE, DRAIN, SHIELDED_TURN, TURN, Offload, advance
from .inline import run_inline
from ..task.step import async_kernel_for, finish
from ..task.graph_task import GraphTask
from ..runtime.threads import await_blocking, block_on, current_owner

_INF = float("inf")


def drive_blocking(steps: Iterator[Any], drain: Callable[[], None] | None) -> None:
    """The blocking driver of a call's sequence (Note [One driver skeleton] in
    task/call.py): ``drain`` at ``DRAIN``, an awaitable run to its end here, an
    ``Offload`` right here, no turns. What a step raises is thrown into the sequence."""
    request = advance(steps)
    while request is not DONE:
        try:
            if request is DRAIN:
                assert drain is not None
                drain()
                value = None
            elif type(request) is Offload:
                value = request.fn(*request.args)
            else:
                value = None
                if request is not TURN and request is not SHIELDED_TURN:
                    await_blocking(request)  # (an awaitable's result: unused by the sequence)
        except BaseException as e:  # (thrown into an ended sequence, it is raised as it is)
            request = advance(steps, error=e)
        else:
            request = advance(steps, value)


def drain_sync(task: GraphTask) -> None:
    """Every node inline on this thread (an ``async def`` backward run to its end here;
    the driver made the task's threshold infinite)."""
    while run_inline(task, _INF) or task.to_start:
        while task.to_start:
            node, inputs, _ = task.to_start.popleft()
            try:
                outputs = block_on(async_kernel_for(task), node, inputs, task.math)
                task.nodes_inline += 1
                finish(task, node, inputs, outputs)
            except BaseException as e:
                task.fail(e, node)
                raise


# Note [A finished GraphTask is freed at once]: ``task.context`` holds the context
# variable that names ``task`` as the running backward, so the task and its context form
# a reference cycle. Left in place, every finished GraphTask, and through its root the
# whole graph it walked, lived until the cyclic garbage collector found it: memory held
# for no use, collections that freed thousands of objects at once (millisecond pauses
# of the loop), and arrays returned to the allocator late, in whatever order the
# collector freed them. So leaving a backward drops ``task.context``: the task goes
# with its driver's last reference, and the graph with its own last holder.
def enter_task(task: GraphTask) -> tuple[Any, Any, Any, GraphTask]:
    """Make ``task`` the context's running backward, owned by this task or thread (its
    callbacks run here), and capture the context its nodes run in."""
    tokens = (_context.current_graph_task.set(task), _context.grad_enabled.set(task.create_graph),
              _context.node_owner.set(current_owner()), task)
    task.context = contextvars.copy_context()
    return tokens


def exit_task(tokens: tuple[Any, Any, Any, GraphTask]) -> None:
    """Undo ``enter_task``, and break the task's reference cycle (Note [A finished
    GraphTask is freed at once])."""
    _context.node_owner.reset(tokens[2])
    _context.grad_enabled.reset(tokens[1])
    _context.current_graph_task.reset(tokens[0])
    tokens[3].context = None
