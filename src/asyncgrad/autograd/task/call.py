"""The one sequence of a backward call, from its set-up to its final callbacks.

Note [One driver skeleton]: what a backward call does is written once, here, as a
generator: ``call_steps`` runs each step as a plain call and *yields* where a step may
have to wait, saying what for (a request); its driver carries the request out and
resumes it. Three drivers drive the one sequence:

* the async driver (``Engine.execute``) awaits: the loop's turn at ``TURN``, an awaitable
  a hook or callback returned, the drain at ``DRAIN`` (the loop's scheduler runs the
  nodes), ``Offload`` on a worker thread, shielded;
* the blocking driver (``Engine.execute_sync``, sched/blocking.py's ``drive_blocking``)
  blocks: every node inline at ``DRAIN``, an awaitable run to its end, ``Offload`` right
  there, turns skipped;
* the loop's runner (sched/loop.py) resumes a waiting driver's sequence from ``DRAIN``
  when every node of that call ran, and completes the call within its slice (Note [The
  runner completes small backward calls]): only a call whose rest needs no wait
  (``completes_at_once``), up to the first awaitable of a final callback, which it
  leaves for the driver (``GraphTask.request``).

An error or a cancellation is thrown into the sequence where it waits (its ``finally``
steps run), and then the driver runs ``abort_steps`` the same way, shielded.

Note [The fixed cost of a call]: a small call's own steps besides its nodes are plain
calls that do not suspend: the set-up's walk runs within the slice and yields a
``TURN`` only when the slice ran out, a commit on the loop is a call, final callbacks
run only when queued; a small call then suspends once, at ``DRAIN``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from typing import TypeVar

from . import commit, lifecycle
from ..errors import EngineInternalError
from .commit import commit_on_loop
from .graph_task import GraphTask
from .lifecycle import START_HOOKS
from ..runtime.threads import is_awaitable

T = TypeVar("T")


class Request:
    """A named request of the sequence to its driver (``DRAIN``, ``TURN``, ...)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


DRAIN = Request("DRAIN")  # run every node (the drivers' own way), then resume
TURN = Request("TURN")  # the slice ran out: the loop's turn, then resume
SHIELDED_TURN = Request("SHIELDED_TURN")  # the same, not cancellable (after the commit)
DONE = Request("DONE")  # the sequence ended (``advance``'s result, never yielded)


class Offload:
    """A request to run ``fn(*args)`` on a worker thread, shielded, and resume with its
    result (the commit's sums, Note [Atomic commits] in task/commit.py)."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn = fn
        self.args = args


class Raised:
    """What the runner's advance of a sequence raised, for its driver to raise."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


Steps = Generator[Any, Any, None]


def call_steps(task: GraphTask) -> Steps:
    """THE sequence of one backward call (Note [One driver skeleton])."""
    interval = task.policy.yield_interval
    setup = task.setup_steps()
    try:
        yield from in_slices(setup, interval, TURN)
    finally:
        if START_HOOKS:
            lifecycle.finish_setup(setup)  # (cancelled: the walk finished for the abort)
    if task.starting:
        for fn in lifecycle.start_hooks(task):
            if is_awaitable(result := fn()):
                yield result
    yield DRAIN
    check_complete(task)
    if task.pre_commits:  # Note [Pre-commit] in task/commit.py: not shielded
        view = commit.pre_commit_view(task)
        for pre_commit in each_queued(task.pre_commits):
            if is_awaitable(result := pre_commit(view)):
                yield result
        commit.end_pre_commit(task)
    # the commit (Note [Atomic commits]): from here on the backward is never aborted
    lifecycle.disarm(task)
    if commit_on_loop(task):
        commit.commit_inline(task)
    else:
        commit.publish(task, (yield Offload(commit.sum_fresh, task)))
    try:
        commit.after_commit(task)
    finally:
        if commit.releases_in_one_step(task):
            commit.release_all(task)
        else:
            yield from in_slices(commit.release_steps(task), interval, SHIELDED_TURN)
    for callback in each_queued(task.callbacks):
        if is_awaitable(result := callback()):
            yield result


def check_complete(task: GraphTask) -> None:
    """After the drain: raise the task's error, or check that every node ran."""
    if task.error is not None:
        raise task.error
    if task.dependencies:
        raise EngineInternalError(f"graph task {task.id} ended with {len(task.dependencies)} "
                                  "nodes that never became ready")


def each_queued(fns: list[T], start: int = 0) -> Iterator[T]:
    """The queued functions of ``fns`` from ``start`` in order, including those appended
    while iterating: a final callback or a pre-commit function may queue more. (The one
    loop over queued functions: don't use a for-loop over the list itself.)"""
    i = start
    while i < len(fns):
        yield fns[i]
        i += 1


def completes_at_once(task: GraphTask) -> bool:
    """Whether the rest of ``task``'s sequence after ``DRAIN`` runs without a wait but
    for an async final callback: no pre-commit function, a commit on the loop, saved
    tensors freed in one step (the runner's test, Note [The runner completes small
    backward calls])."""
    return not task.pre_commits and commit.releases_in_one_step(task) and commit_on_loop(task)


def abort_steps(task: GraphTask, error: BaseException) -> Iterator[Any]:
    """The abort (Note [Abort functions] in task/lifecycle.py), driven like the call's
    sequence (shielded by the async driver): start hooks that did not run yet (a call
    cancelled in its set-up), then the abort functions, once. What one raises is noted
    on ``error``."""
    if not task.starting and not task.aborts:
        task.aborts = None
        return
    for start in lifecycle.start_hooks(task):
        yield from _noting(error, start)
    fns = task.aborts
    task.aborts = None
    for fn in fns or ():
        yield from _noting(error, fn, error)


def _noting(error: BaseException, fn: Callable[..., Any], *args: Any) -> Iterator[Any]:
    try:
        if is_awaitable(result := fn(*args)):
            yield result
    except Exception as e:
        lifecycle.note_abort_error(error, fn, e)


def advance(steps: Iterator[Any], value: Any = None, error: BaseException | None = None) -> Any:
    """Resume ``steps`` with ``value`` (or throw ``error`` into it); its next request,
    or ``DONE``."""
    try:
        if error is not None:
            return steps.throw(error)  # type: ignore[attr-defined]
        return steps.send(value)  # type: ignore[attr-defined]
    except StopIteration:
        return DONE


def in_slices(steps: Iterator[None], interval: float, turn: Request) -> Iterator[Request]:
    """Exhaust a step generator, yielding ``turn`` each time ``interval`` passed."""
    clock = time.perf_counter
    deadline = clock() + interval
    for _ in steps:
        if clock() >= deadline:
            yield turn
            deadline = clock() + interval
