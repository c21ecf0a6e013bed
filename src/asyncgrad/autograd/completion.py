"""Completing a backward whose nodes all ran: the check that every node ran, the
commit, post-accumulate-grad hooks, freeing saved tensors, final callbacks.

The async driver (engine.py) does these steps with awaits where they may be long; the
loop's runner does them inline for a small backward of a waiting caller (Note [The
runner completes small backward calls] in scheduler.py); ``can_complete_inline`` says
which backward calls it may complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import commit, lifecycle
from .errors import EngineInternalError
from .graph_task import GraphTask
from .threads import is_awaitable

if TYPE_CHECKING:
    from .wakeup import Wakeup


def check_complete(task: GraphTask) -> None:
    """After the drain: raise the task's error, or check that every node ran."""
    if task.error is not None:
        raise task.error
    if task.dependencies:
        raise EngineInternalError(f"graph task {task.id} ended with {len(task.dependencies)} "
                                  "nodes that never became ready")


def commits_in_one_step(task: GraphTask, threshold: float) -> bool:
    """Whether ``task`` commits with nothing to await: a commit small enough to add up
    on the loop, and saved tensors freed in one step."""
    return len(task.executed) <= commit.RELEASE_STEP and (
        task.create_graph or commit.staged_size(task) < threshold)


def can_complete_inline(task: GraphTask, threshold: float) -> bool:
    """Whether the runner may complete ``task`` within its slice: no pre-commit
    function (they may await), and a commit in one step."""
    return not task.pre_commits and commits_in_one_step(task, threshold)


def commit_and_release(task: GraphTask) -> None:
    """Commit in place on this thread, run post-accumulate-grad hooks, free saved
    tensors (also when a hook raised: the commit happened). From here on the backward
    is never aborted (Note [Abort functions] in lifecycle.py)."""
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
        callbacks = task.callbacks
        i = 0
        while i < len(callbacks):  # a callback may queue more
            result = callbacks[i]()
            i += 1
            if is_awaitable(result):
                waiting.pending = result
                break
        waiting.callbacks_from = i
    except Exception as e:  # raised by the driver, as if it had completed the backward
        waiting.error = e
    waiting.done = True
