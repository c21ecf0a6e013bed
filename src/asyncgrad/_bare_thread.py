"""Bare background threads: started without waiting for them to run, and never left
half-started when the process exits.

Note [A bare thread is never half-started at exit]: the engine's background threads (the
kernel loader, the one-time set-up, the CPU-load sampler, the starter of a new worker)
are started with ``_thread.start_new_thread``, which returns before the new thread runs:
their callers, the event loop among them, must not wait for the OS to schedule it (Note
[Starting the loader does not wait] in ops/kernels/loader.py). But CPython makes the new
thread's state in the starting thread and binds it only when the new thread first runs.
If the process begins to exit in between, finalization deletes that state with the other
threads' and the thread, once scheduled, dies on it (SIGSEGV in
``_PyThreadState_SetCurrent`` under the finalizing main thread): a process that exits
right after its first backward, whose end starts the CPU-load sampler's thread, crashed
after its work was done. So every bare thread starts through :func:`start`, which
records it until it has run its first line, and at exit (``atexit``, before
finalization) the process waits for the recorded ones: that is a wait for the OS to
schedule them, never for a thread's work. From then on :func:`start` starts nothing and
returns False; each caller says what its thread would have done instead.
"""

from __future__ import annotations

import _thread
import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

EXIT_WAIT = 2.0  # seconds, at most, that exit waits for started threads to begin running

_lock = threading.Lock()
_unstarted: set[Any] = set()  # a lock per thread started but not yet running, held until it runs
_exiting = False


def start(target: Callable[..., object], *args: Any) -> bool:
    """Run ``target(*args)`` on a new daemon thread, without waiting for it to run.
    False (and no thread) once the process is exiting (Note [A bare thread is never
    half-started at exit])."""
    begun = _thread.allocate_lock()
    begun.acquire()
    with _lock:
        if _exiting or sys.is_finalizing():
            return False
        _unstarted.add(begun)
    try:
        _thread.start_new_thread(_run, (begun, target, args))
    except BaseException:
        with _lock:
            _unstarted.discard(begun)
        raise
    return True


def _run(begun: Any, target: Callable[..., object], args: tuple[Any, ...]) -> None:
    with _lock:
        _unstarted.discard(begun)
    begun.release()
    target(*args)


def _wait_at_exit() -> None:
    """At exit: start no more bare threads, and wait for those started to begin running."""
    global _exiting
    with _lock:
        _exiting = True
        pending = list(_unstarted)
    for begun in pending:
        if begun.acquire(timeout=EXIT_WAIT):
            begun.release()


def _after_fork_in_child() -> None:
    # (a fork keeps only the forking thread: threads the parent had not yet run are not here)
    global _lock
    _lock = threading.Lock()
    _unstarted.clear()


atexit.register(_wait_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
