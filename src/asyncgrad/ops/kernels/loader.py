"""Which kernels the ops run: the numpy ones, always available, or compiled ones (numba,
the optional ``fast`` extra), loaded on a background thread.

Note [Compiled kernels load off the loop]: importing numba and loading the kernels from
numba's cache takes 0.6-0.9 s, compiling them after an install about 10 s: far too long
to stall an event loop for (issue 11). So nothing loads at import: the first op that
could use a compiled kernel starts a daemon thread that imports ``ops/kernels/numba_kernels.py``,
and every op runs its numpy kernel until that import has finished, then the compiled
one. The loader is ~1 s of Python on a second thread: it shares the GIL and a core with
the loop, so it runs with the collector off, a short switch interval (Note [The loader
yields the loop its turns]) and at the lowest CPU priority (Note [The loader runs at low
CPU priority]); the loop still sees gaps of a few ms while it runs, so services load the
kernels before serving (``wait()`` at start-up, docs/guides/kernels.md). :func:`wait` blocks
until the outcome is known (benchmarks and tests call it so that the path they measure
is known); :func:`set_mode` chooses the path at run time and the ``ASYNCGRAD_KERNELS``
environment variable at start-up:

* ``auto`` (the default): compiled kernels when numba imports, numpy's until then;
* ``numpy``: never load numba;
* ``compiled``: as ``auto``, but a failed load is an error, raised by :func:`wait`.

The two paths compute the same functions but not in the same order of operations, so
float32 results may differ in their last bits (a few ulps: the compiled ``exp`` is a
polynomial, sums are vectorised); float64 results agree to rounding.

numba's cache lives next to the package when that directory is writable, else in the
user's cache directory (or ``NUMBA_CACHE_DIR``); when no cache directory is usable the
kernels are compiled without a cache, every time the process loads them.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from ... import _bare_thread

MODES = ("auto", "numpy", "compiled")
ENV_VAR = "ASYNCGRAD_KERNELS"

_lock = threading.Lock()
_done = threading.Event()  # the loader has finished, with or without kernels
_started = False  # the loader thread was started (once)
_loaded: ModuleType | None = None  # the compiled kernels, once imported
_error: BaseException | None = None  # why they could not be imported
_mode: str | None = None  # None: read ENV_VAR at first use
_active: ModuleType | None = None  # what compiled() returns: _loaded unless mode is numpy
_use_cache = True  # read by numba_kernels at import
LOADER_SWITCH_INTERVAL = 0.0005  # seconds: the GIL switch interval while the loader runs
LOADER_NAME = "asyncgrad-kernels-loader"  # the loader thread's name (threading, profilers)
LOADER_NICE = 19  # the loader thread's nice value (Linux; Note [The loader runs at low CPU priority])


def _check(mode: str, source: str) -> str:
    if mode not in MODES:
        raise ValueError(f"{source} must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def mode() -> str:
    """The kernel mode: ``auto``, ``numpy`` or ``compiled`` (``ASYNCGRAD_KERNELS``, or the
    last :func:`set_mode`)."""
    global _mode
    if _mode is None:
        _mode = _check(os.environ.get(ENV_VAR, "auto").strip().lower() or "auto", ENV_VAR)
    return _mode


def set_mode(new_mode: str) -> None:
    """Use the numpy kernels (``"numpy"``) or the compiled ones when loaded (``"auto"``,
    ``"compiled"``) from now on; a compiled mode starts loading them. Ops already running
    finish on the path they started on."""
    global _mode, _active
    _check(new_mode, "set_mode's mode")
    with _lock:
        _mode = new_mode
        _active = None if new_mode == "numpy" else _loaded
    if new_mode != "numpy":
        start()


def compiled() -> ModuleType | None:
    """The compiled kernels if they are loaded and in use, else None (the numpy path).
    Cheap; the first call starts the loader (Note [Compiled kernels load off the loop])."""
    if _active is None and not _started:
        start()
    return _active


def start() -> None:
    """Start loading the compiled kernels on a background thread (once; not in mode numpy).

    Note [Starting the loader does not wait]: ``threading.Thread.start()`` returns only
    once the new thread has run its first Python code, so its caller, the event loop at
    its first op, waits until the OS schedules that thread and the thread gets the GIL:
    on a busy machine a stall of tens to hundreds of ms at the first backward (issue 33;
    ``python -m bench.first_backward --profile``). ``_thread.start_new_thread`` returns
    once the thread exists; the loader names itself when it runs. Like a daemon thread,
    it does not keep the process alive; once the process is exiting it is not started
    and the numpy kernels stay (Note [A bare thread is never half-started at exit] in
    _bare_thread.py)."""
    global _started
    if mode() == "numpy":
        return
    with _lock:
        if _started:
            return
        _started = True
    if not _bare_thread.start(_run_loader):
        _done.set()


def _run_loader() -> None:
    threading.current_thread().name = LOADER_NAME
    _load()


def ready() -> bool:
    """True once compiled kernels are loaded and in use."""
    return _active is not None


def wait(timeout: float | None = None) -> bool:
    """Block until the loader has finished (or ``timeout`` seconds); return :func:`ready`.
    Starts the loader if needed. In mode ``compiled`` a failed load raises RuntimeError.
    For benchmarks, tests and start-up code, not for coroutines on a running loop."""
    if mode() == "numpy":
        return False
    start()
    _done.wait(timeout)
    if _error is not None and mode() == "compiled":
        raise RuntimeError(f"{ENV_VAR}=compiled, but the compiled kernels failed to load: {_why()}") from _error
    return ready()


def status() -> str:
    """One line for logs and benchmark reports: the mode and which kernels run."""
    if _active is not None:
        state = "compiled kernels in use"
    elif _error is not None:
        state = f"numpy kernels (compiled ones failed to load: {_why()})"
    elif mode() != "numpy" and not _started:
        state = "numpy kernels (compiled ones not requested yet)"
    elif mode() != "numpy" and not _done.is_set():
        state = "numpy kernels (compiled ones loading)"
    else:
        state = "numpy kernels"
    return f"{ENV_VAR}={mode()}: {state}"


def _why() -> str:
    """Why the compiled kernels did not load, with the fix when numba is missing."""
    if isinstance(_error, ModuleNotFoundError) and (_error.name or "").split(".")[0] in ("numba", "llvmlite"):
        return f'{_error.name} is not installed; install the "fast" extra: pip install "asyncgrad[fast]"'
    return repr(_error)


@contextmanager
def _sharing_the_gil_finely() -> Iterator[None]:
    """Note [The loader yields the loop its turns]: importing numba is ~100,000 new Python
    objects and 0.7 s of Python code on the loader thread. Two things in it held the GIL
    against the event loop: the cyclic garbage collector, which that many new objects
    drove to two full collections of ~45 ms each (a collection runs in whichever thread
    allocates, and holds the GIL throughout), and Python's 5 ms switch interval, the
    longest the loop waits for the GIL behind a running thread. So while the loader runs
    the collector is off and the switch interval is 0.5 ms; at the end the objects the
    load made are moved into the oldest generation without a scan (``gc.freeze`` then
    ``gc.unfreeze``), so the young generations do not start with 100,000 objects to
    traverse; they are scanned at the next full collection, whenever the process's own
    allocations call for one, like any long-lived object. Cycles that became garbage
    meanwhile are collected then too: nothing is frozen for good. Both settings are
    process-wide and restored after the load, unless something else changed them
    meanwhile. Measured with a 1 ms asyncio ticker during a load from numba's cache:
    before, p99 lag 7-9 ms and worst 40-60 ms; after, docs/guides/kernels.md."""
    interval = sys.getswitchinterval()
    fine = min(interval, LOADER_SWITCH_INTERVAL)
    sys.setswitchinterval(fine)
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if collecting:
            gc.enable()
        if sys.getswitchinterval() == fine:  # (else someone changed it meanwhile: theirs stands)
            sys.setswitchinterval(interval)


def _tasks() -> set[int]:
    """The kernel thread ids of this process (Linux's ``/proc/self/task``)."""
    return {int(t) for t in os.listdir("/proc/self/task")}


@contextmanager
def _at_low_cpu_priority() -> Iterator[None]:
    """Note [The loader runs at low CPU priority]: the loader is CPU-bound Python for about
    a second; the loop sleeps between its events and must get a core back at once when it
    wakes. On a busy 2-core machine (another process on one core, the loader on the other)
    it did not: the scheduler let the woken loop wait for a timer tick behind the loader
    (lateness in steps of 4 ms, one wait for each time the loop's thread slept, for the
    GIL too), ten and more per forward pass, and a 1 ms asyncio ticker was 36-50 ms late
    at worst. A pure-Python busy thread in place of the loader did the same, so the cause
    is not a C call of numba's that holds the GIL, and neither a shorter switch interval
    (20 us) nor a loader that slept while ops ran helped. At nice 19 the loader yields its
    core whenever the loop (or anything else) wakes, and a GIL it holds is handed over as
    soon as the loop, now sleeping on it, leaves the core free. Linux only (per-thread
    nice); elsewhere the loader runs at the process's priority. Threads that the load
    starts (scipy's BLAS, pulled in by numba) inherit nice 19: they are given the
    loader's old value back afterwards where the process may raise a priority (root, or
    ``RLIMIT_NICE``), else they keep 19. Measured: docs/guides/kernels.md."""
    tid = threading.get_native_id()
    try:
        if not sys.platform.startswith("linux"):
            raise OSError("per-thread nice is Linux's")
        before = os.getpriority(os.PRIO_PROCESS, tid)
        tasks = _tasks()
        os.setpriority(os.PRIO_PROCESS, tid, max(before, LOADER_NICE))
    except OSError:
        yield  # as before: the process's priority
        return
    try:
        yield
    finally:
        for task in _tasks() - tasks:  # threads started during the load (all from the loader:
            try:  # the others are not at LOADER_NICE)
                if os.getpriority(os.PRIO_PROCESS, task) == max(before, LOADER_NICE) != before:
                    os.setpriority(os.PRIO_PROCESS, task, before)
            except OSError:  # gone meanwhile, or no permission to raise a priority
                pass


def _preload_llvm() -> None:
    """Note [LLVM's library loads without the GIL]: importing numba loads llvmlite's
    LLVM, a shared library of ~170 MB, with ``ctypes.CDLL``, whose ``dlopen`` holds the
    GIL from start to end: the event loop waits for all of it, reading the file from
    disk included (docs/guides/kernels.md). A ``dlopen`` called through ctypes
    as a foreign function releases the GIL meanwhile, so the loader opens the library
    that way first; llvmlite's own ``dlopen`` then finds it loaded and returns at once.
    It is opened as llvmlite opens it (``RTLD_LOCAL``: its symbols stay its own), and only
    on POSIX systems; elsewhere, or when anything is missing, the import does it as before."""
    if os.name != "posix":
        return
    import ctypes
    import importlib.util

    try:
        spec = importlib.util.find_spec("llvmlite")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    paths = [path for folder in spec.submodule_search_locations
             for path in sorted(Path(folder, "binding").glob("libllvmlite*"))]
    if not paths:
        return
    try:
        dlopen = ctypes.CDLL(None).dlopen
    except (OSError, AttributeError):
        return
    dlopen.argtypes = (ctypes.c_char_p, ctypes.c_int)
    dlopen.restype = ctypes.c_void_p
    dlopen(os.fsencode(paths[0]), os.RTLD_NOW | os.RTLD_LOCAL)


def _load() -> None:
    try:
        with _at_low_cpu_priority(), _sharing_the_gil_finely():
            _preload_llvm()
            _import_kernels()
    finally:  # after both are restored: wait() returns to a process as it was
        _done.set()


def _import_kernels() -> None:
    global _loaded, _active, _error, _use_cache
    name = __name__.rsplit(".", 1)[0] + ".numba_kernels"
    try:
        try:
            module = importlib.import_module(name)
        except RuntimeError as exc:  # numba: "cannot cache function ...": no usable cache dir
            if "cache" not in str(exc):
                raise
            sys.modules.pop(name, None)
            _use_cache = False
            module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the numpy path, recorded
        _error = exc
    else:
        with _lock:
            _loaded = module
            if mode() != "numpy":
                _active = module
