"""BLAS's threads: how many numpy's BLAS uses per call, adapted to the backward calls in
flight and to other processes' load, and the slots BLAS kernels on worker threads share.
Process-wide; knows no graph.

Note [BLAS threads]: BLAS runs threads of its own inside each call. Several BLAS kernels
at once multiply those threads and oversubscribe the cores, and with other work on the
cores (other kernels, other backward calls' forward passes on the loop) a multi-threaded
BLAS call waits for its helper threads, many times longer than a single-threaded one
takes (docs/benchmarks.md). So BLAS's threads adapt (``BLAS``):
numpy's BLAS is single-threaded while more than one backward call is in flight in the
process, and uses its own default threads while one backward runs alone (one large
product on all cores beats two single-threaded ones). A nested backward (a reentrant
checkpoint's, started by a node of a running backward) is not a second call: its
parent's node waits for it, so a training step with reentrant checkpoints alone keeps
BLAS's threads (counted as a second call, it made every such step single-threaded:
``python -m bench.blas_spin --checkpoint``). Going back to BLAS's own threads waits
until no second backward has been in flight for ``RELAX_SECONDS`` (Note [BLAS
hysteresis]). The switch is made only while no
engine BLAS kernel runs (OpenBLAS's pthreads build just stores the count; a call in
progress keeps the count it started with). On worker threads, BLAS kernels take
``threads-per-call`` of ``cores`` shared slots, over every loop and engine, and a BLAS
node's input gradients are split into parallel kernels only while BLAS is
single-threaded. Other processes' load counts too: BLAS gets at most the cores
they leave free (Note [Other processes' load] in runtime/cpu_load.py). ``Engine(blas_threads=n)``
fixes BLAS at ``n`` threads per call process-wide through threadpoolctl instead;
``BLAS.pinned(n)`` does so for a block (the benchmarks' one-thread rows).

Note [BLAS hysteresis]: flipping BLAS's threads per backward call made two tasks that
alternate (one's forward pass while the other's backward is in flight, then one alone)
call ``set_num_threads`` about twice per pass, and gave their forward passes' small
products BLAS's helper threads part of the time, the case where a busy core makes a
two-threaded call many times slower (``python -m bench.blas_flips 2`` measures both).
So BLAS goes single-threaded at once when a second backward starts, but gets its own
threads back only once no second backward has been in flight for ``RELAX_SECONDS``.
Seconds, not calls, because the cost being avoided lasts a time: after a product that
used them, OpenBLAS's helper threads spin for work for a while
(``OPENBLAS_THREAD_TIMEOUT``; the count BLAS is set to does not stop them, and only the
environment before numpy loads can shorten it), and when backward calls overlap again
within that time the spinning helper takes a core from them (``python -m
bench.blas_spin`` measures it; docs/benchmarks.md has the figures). ``RELAX_SECONDS``
is several such spins: a service with requests in flight now and then stays
single-threaded between them, and one caller running backward after backward alone (a
training loop), or one long backward alone, gets BLAS's threads half a second after the
last overlap, even in the middle of a backward (the decision is revisited as each call
starts and ends and after each BLAS kernel on a worker). Tests replace ``BLAS.clock``
to decide by the order of events alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...ops.kernels import intra_op
from .cpu_load import OtherLoad

RELAX_SECONDS = 0.5  # no second backward in flight for this long: BLAS gets its threads back (Note [BLAS hysteresis])
CORES = os.cpu_count() or 1


class BlasThreads:
    """Process-wide: how many threads numpy's BLAS uses per call, adapted to the number
    of backward calls in flight, and the slots BLAS kernels on worker threads share
    (Note [BLAS threads]). All state under ``_cond``."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        # ``with self._mutex`` is ``with self._cond`` without the Condition's Python-level
        # __enter__/__exit__: the per-call counters below take it twice per backward
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._free = cores  # BLAS threads not taken by a running engine BLAS kernel
        self._backwards = 0  # backward calls in flight, process-wide
        self._libs: list[Any] = []  # threadpoolctl controllers of numpy's BLAS
        self._default = cores  # BLAS's own threads per call
        self._fixed = False  # Engine(blas_threads=n) or inside pinned(): never adapt
        # the states pinned() blocks resume at their end (mutable: ``configure`` fills in
        # the default it finds when it runs inside a block)
        self._resumes: list[list[Any]] = []
        self._single = False
        self.clock = time.monotonic  # (tests replace it: Note [BLAS hysteresis])
        self._overlap_at = float("-inf")  # when a second backward was last in flight (self.clock)
        # the cores other processes leave free (Note [Other processes' load] in runtime/cpu_load.py)
        self.load = OtherLoad()
        self._cap = cores  # the cores BLAS may use while it adapts
        self._seen = cores  # the cores the last sample found free, BLAS fixed or not
        self._applied: int | None = None  # the count last given to BLAS, if any

    @property
    def free_cores(self) -> int:
        """The cores other processes leave free, as last sampled, with BLAS's threads
        fixed too (Note [Other processes' load] in runtime/cpu_load.py; all of them
        while that is off)."""
        return self._seen

    @property
    def spare_cores(self) -> int:
        """The cores other processes were last seen leaving wholly free: 0 when they
        take them all, and until sampled or while sampling is off (Note [Other
        processes' load] in runtime/cpu_load.py)."""
        return self.load.spare_cores()

    @property
    def backwards(self) -> int:
        """Backward calls in flight in the process (callers waiting in line included; a
        nested backward is not one: Note [BLAS threads])."""
        return self._backwards

    @property
    def per_call(self) -> int:
        return 1 if self._single else min(self._default, self._cap)

    @property
    def chosen(self) -> int | None:
        """The thread count the policy last gave numpy's BLAS (``per_call``), or None
        while it has not inspected BLAS yet (and so has not set it). A program that
        changes BLAS's threads behind the engine's back (a benchmark measuring other
        libraries in the same process) restores this before the engine runs again:
        the engine sets BLAS only when its decision changes."""
        with self._cond:
            return self.per_call if (self._libs or self._fixed) else None

    def configure(self) -> None:
        """On the set-up thread: find numpy's BLAS and its default thread count."""
        libs, default = _inspect_blas()
        with self._cond:
            self._install(libs, default)

    def _install(self, libs: list[Any], default: int) -> None:
        """Keep what the inspection found (the first time; under ``_cond``). While the
        count is fixed (``Engine(blas_threads=n)``, a ``pinned`` block) BLAS is set to
        it and the default found is what a pinned block resumes with: before, an
        inspection inside a block was dropped, so the block's count never reached BLAS
        and the process never adapted again."""
        if self._libs or not libs:
            return
        self._libs = libs
        for state in self._resumes:
            if not state[0]:  # an adaptive state, resumed when its block ends
                state[1] = default
        if self._fixed:
            for lib in libs:
                lib.set_num_threads(self._default)
            self._applied = self._default
            return
        self._default = default
        self._adapt()

    def fix(self, n: int) -> None:
        with self._cond:
            self._fixed, self._default, self._single = True, n, False

    @contextmanager
    def pinned(self, n: int) -> Iterator[None]:
        """numpy's BLAS at ``n`` threads per call inside the block, without adapting (as
        ``Engine(blas_threads=n)``, undone at the block's end, when the adaptive state
        resumes): for a program that measures at a set thread count, such as the
        benchmarks' one-thread rows, where a limit set from outside would be undone by
        the engine's next change of mind (Note [BLAS hysteresis]). Before the engine's
        first backward, the block inspects BLAS itself (a one-time cost on this thread)."""
        if not self._libs:  # not inspected yet: the block's count must reach BLAS now
            libs, default = _inspect_blas()
            with self._cond:
                self._install(libs, default)
        with self._cond:
            saved = [self._fixed, self._default, self._single]
            self._resumes.append(saved)
            self._fixed, self._default, self._single = True, n, False
            for lib in self._libs:
                lib.set_num_threads(n)
            self._applied = n
        try:
            yield
        finally:
            with self._cond:
                self._resumes = [s for s in self._resumes if s is not saved]
                self._fixed, self._default, self._single = bool(saved[0]), int(saved[1]), bool(saved[2])
                for lib in self._libs:
                    lib.set_num_threads(self.per_call)
                self._applied = self.per_call

    def intra_op_ok(self, one_pool: bool = False) -> bool:
        """Whether a compiled kernel may split itself over the cores now (Note [Intra-op
        threads] in ops/_intra.py): at most one backward call in flight, BLAS has threads
        of its own (Note [BLAS hysteresis]; not pinned at one) and no engine BLAS kernel
        is running. Read without the lock: a hint, as a kernel may start just after."""
        threads_ok = self.per_call == 1 if one_pool else self.per_call > 1  # (Note [One pool] there)
        return self._backwards <= 1 and threads_ok and self._free == self.cores

    def backward_started(self) -> None:
        with self._mutex:
            self._backwards += 1
            if self._backwards > 1:
                self._overlap_at = self.clock()
            if self._libs and not self._fixed:  # (else nothing to adapt)
                self._adapt()

    def _sampled(self) -> None:
        """After a new sample (on the thread that took it): the cores it leaves free,
        for BLAS's threads at once while they adapt."""
        with self._mutex:
            self._seen = self.load.free_cores()
            if self._libs and not self._fixed:
                self._cap = self._seen
                self._adapt()

    def backward_ended(self) -> None:
        with self._mutex:
            if self._backwards > 1:  # the overlap lasted until now
                self._overlap_at = self.clock()
            self._backwards -= 1
            if self._libs and not self._fixed:
                self._adapt()
            self._request_sample()

    def _request_sample(self) -> None:
        """Ask for a sample of other processes' load (at most every cpu_load.INTERVAL), as
        a call ends and after a BLAS kernel on a worker: it is taken on the sampler thread,
        which calls ``_sampled`` (Note [Sampling off the caller's path] in
        runtime/cpu_load.py). With BLAS fixed too, for the worker threads' niceness (Note
        [Niced kernels on the cores others leave] in sched/placement.py)."""
        self.load.request(self._sampled)

    def _adapt(self) -> None:
        if self._fixed or not self._libs or self._free != self.cores:
            return  # (a BLAS kernel running: the next start or end adapts)
        single = self._backwards > 1 or (self._single and self.clock() - self._overlap_at < RELAX_SECONDS)
        threads = 1 if single else min(self._default, self._cap)
        self._single = single
        if threads == (self._default if self._applied is None else self._applied):
            return  # (before any change BLAS runs the default the inspection found)
        for lib in self._libs:
            lib.set_num_threads(threads)
        self._applied = threads

    def run(self, fn: Any, *args: Any) -> Any:
        with self._cond:
            need = min(self.per_call, self.cores)
            while self._free < need:
                self._cond.wait()
            self._free -= need
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._free += need
                self._adapt()
                self._cond.notify_all()
                self._request_sample()  # (a long call adapts before its end)


def _inspect_blas() -> tuple[list[Any], int]:
    """numpy's BLAS libraries (threadpoolctl controllers) and their thread count: a
    one-time cost of a few to tens of ms, so the engine runs it on its set-up thread."""
    try:
        from threadpoolctl import ThreadpoolController  # (here: loading it is the one-time cost, off the loop)
    except ImportError:
        return [], CORES
    libs = [lib for lib in ThreadpoolController().select(user_api="blas").lib_controllers
            if "numpy" in lib.filepath or "scipy_openblas" in lib.filepath]
    return libs, max((lib.num_threads for lib in libs), default=1)


BLAS = BlasThreads(CORES)
intra_op.use_gate(BLAS)  # the intra-op switch asks BLAS whether the process is idle (ops never import autograd)


_malloc_tuned = False
TRIM_THRESHOLD = 256 * 1024 * 1024  # bytes of freed memory glibc keeps (Note [Page faults])


def keep_large_allocations() -> None:
    """Note [Page faults]: numpy allocates every result afresh. glibc serves large blocks
    with mmap and returns them to the OS on free, so each new large array is faulted in
    page by page again, and arrays made on worker threads and freed on the loop thread
    fault every time; that cost ate the gain of running branches in parallel. So the
    engine raises glibc's mmap and trim thresholds (mallopt, process-wide, once), and
    freed blocks are reused: the process keeps up to ``TRIM_THRESHOLD`` of freed memory
    per arena. The trim threshold is above what one large backward frees at its end,
    so glibc does not hand those pages back to the OS for the next forward to fault
    in again (docs/benchmarks.md, "Figures behind the Notes").
    ``Engine(tune_malloc=False)`` leaves malloc alone; a no-op off glibc."""
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    import ctypes  # (here: only when malloc is tuned, on the set-up thread)
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)  # glibc's maximum on 64-bit
        libc.mallopt(m_trim_threshold, TRIM_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        return
