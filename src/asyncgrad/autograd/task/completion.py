"""Completing a backward whose nodes all ran: the check that every node ran, the
commit, post-accumulate-grad hooks, freeing saved tensors, final callbacks.

The async driver (engine.py) does these steps with awaits where they may be long
(``run_pre_commits``, ``commit_shielded``, ``run_callbacks``); the loop's runner does
them inline for a small backward of a waiting caller (``complete_inline``, Note [The
runner completes small backward calls] in sched/loop.py); ``can_complete_inline`` says
which backward calls it may complete; the blocking driver (sched/blocking.py) calls the
same steps and blocks on what they return.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.lowlevel

from . import commit, lifecycle
from ..errors import EngineInternalError
from .graph_task import GraphTask
from ..runtime.threads import is_awaitable

if TYPE_CHECKING:
    from ..sched.wakeup import Wakeup

T = TypeVar("T")


def each_queued(fns: list[T], start: int = 0) -> Iterator[T]:
    """The queued functions of ``fns`` from ``start`` in order, including those appended
    while iterating: a final callback or a pre-commit function may queue more. (The one
    loop over queued functions: don't use a for-loop over the list itself.)"""
    i = start
    while i < len(fns):
        yield fns[i]
        i += 1


def check_complete(task: GraphTask) -> None:
    """After the drain: raise the task's error, or check that every node ran."""
    if task.error is not None:
        raise task.error
    if task.dependencies:
        raise EngineInternalError(f"graph task {task.id} ended with {len(task.dependencies)} "
                                  "nodes that never became ready")


def commit_on_loop(task: GraphTask) -> bool:
    """The one decision of how to commit (Note [Atomic commits] in commit.py): add the
    staged gradients up in place on the loop (a recorded backward, or fewer elements to
    add than the inline threshold), else sum them on a worker thread and publish them.
    Recorded on the task for the commit that follows without an await."""
    on_loop = task.commit_on_loop = task.create_graph or commit.staged_size(task) < task.policy.inline_threshold
    return on_loop


def can_complete_inline(task: GraphTask) -> bool:
    """Whether the runner may complete ``task`` within its slice: no pre-commit
    function (they may await), a commit on the loop, and saved tensors freed in one
    step."""
    return not task.pre_commits and len(task.executed) <= commit.RELEASE_STEP and commit_on_loop(task)


def commit_and_release(task: GraphTask) -> None:
    """Commit in place on this thread, run post-accumulate-grad hooks, free saved
    tensors (also when a hook raised: the commit happened). From here on the backward
    is never aborted (Note [Abort functions] in task/lifecycle.py)."""
    lifecycle.disarm(task)
    commit.commit_inline(task)
    try:
        commit.after_commit(task)
    finally:
        commit.release_all(task)


def complete_inline(task: GraphTask, waiting: Wakeup) -> None:
    """By the runner, in ``task``'s context: complete the backward for the driver
    waiting on ``waiting``, recording the outcome on it. Final callbacks run up to the
    first that returns an awaitable, which is left to the driver (``pending``)."""
    try:
        check_complete(task)
        commit_and_release(task)
        i = 0
        for callback in each_queued(task.callbacks):
            result = callback()
            i += 1
            if is_awaitable(result):
                waiting.pending = result
                break
        waiting.callbacks_from = i
    except Exception as e:  # raised by the driver, as if it had completed the backward
        waiting.error = e
    waiting.done = True


def commit_at_once(task: GraphTask) -> bool:
    """The commit without a coroutine when it has nothing to await: on the loop, and
    saved tensors released in one step. False (nothing done) otherwise."""
    if not (commit_on_loop(task) and len(task.executed) <= commit.RELEASE_STEP):
        return False
    commit_and_release(task)
    return True


async def commit_shielded(task: GraphTask) -> None:
    """Commit on success (Note [Atomic commits] in commit.py) as ``commit_on_loop``
    decided just before. Shielded from cancellation once started: it happens entirely
    or not at all. From here on the backward is never aborted (Note [Abort functions] in
    lifecycle.py)."""
    lifecycle.disarm(task)
    if task.commit_on_loop:
        commit.commit_inline(task)
    else:
        with anyio.CancelScope(shield=True):
            prepared = await task.engine.offload(commit.sum_fresh, task, priority=task.priority)
        commit.publish(task, prepared)
    try:
        commit.after_commit(task)
    finally:
        if len(task.executed) <= commit.RELEASE_STEP:  # one step: nothing to wait for
            commit.release_all(task)
        else:
            with anyio.CancelScope(shield=True):  # bookkeeping after the commit: finish it
                await run_steps(commit.release_steps(task), task.policy.yield_interval)


async def run_pre_commits(task: GraphTask) -> None:
    """Note [Pre-commit] in commit.py: after every node finished, before the commit.
    Not shielded: a cancellation or an error here commits nothing."""
    view = commit.pre_commit_view(task)
    for fn in each_queued(task.pre_commits):
        result = fn(view)
        if is_awaitable(result):
            await result
    commit.end_pre_commit(task)


async def run_callbacks(task: GraphTask, start: int = 0) -> None:
    """The final callbacks from ``start`` on, awaiting those that return awaitables."""
    for callback in each_queued(task.callbacks, start):
        result = callback()
        if is_awaitable(result):
            await result


async def after_runner_completed(task: GraphTask, completed: Wakeup) -> None:
    """The runner committed: raise what its completion raised, or run the final
    callbacks it left to this driver (from an async one on)."""
    if completed.error is not None:
        raise completed.error
    if completed.pending is not None:
        await completed.pending
        await run_callbacks(task, completed.callbacks_from)


def steps_within_slice(steps: Iterator[None], interval: float) -> bool:
    """Run ``steps`` for up to ``interval`` without a coroutine; True when they are
    exhausted, False when the rest needs ``run_steps``."""
    clock = time.perf_counter
    deadline = clock() + interval
    for _ in steps:
        if clock() >= deadline:
            return False
    return True


async def run_steps(steps: Iterator[None], interval: float) -> None:
    """Exhaust a step generator, yielding to the loop every ``interval``."""
    deadline = time.perf_counter() + interval
    for _ in steps:
        if time.perf_counter() >= deadline:
            await anyio.lowlevel.checkpoint()
            deadline = time.perf_counter() + interval
