"""How much of this process's cores other processes keep busy (Note [Other processes'
load]), sampled at most every ``INTERVAL`` seconds from ``/proc/stat``, on a thread of its
own (Note [Sampling off the caller's path]).

Note [Other processes' load]: a BLAS call on two threads splits its product in two and
waits for both halves. When another process keeps one of the two cores busy, the half
on that core waits for its time slice, and the product takes many times longer than
on one thread (docs/benchmarks.md, "Figures behind the Notes"). So the engine counts,
between two samples at least ``INTERVAL`` apart (backward calls ask for them),
the CPU time the cores this process may run on (its affinity) spent
busy (user, system, interrupts, and time stolen by the hypervisor) less this process's
own CPU time, and gives BLAS only the cores that load leaves free
(``BlasThreads.cap``): one busy process on two cores sends BLAS to one thread, until two
samples in a row find the cores free again. Linux only (elsewhere nothing changes);
``ASYNCGRAD_ADAPT_TO_LOAD=0`` turns it off.

Note [Sampling off the caller's path]: a sample is about a dozen system calls (open,
read and close ``/proc/stat``, this process's CPU time) and a parse. Warm that is tens of
microseconds, but after a pass that evicts the caches (a ``gc.collect()``, another
library's work) it was a large part of a cold backward of a small graph, and each call
paid it once calls came more than ``INTERVAL`` apart (the ``ops`` benchmark collects
before each timed call). So a backward call only asks (``request``: a clock read, and
when a sample is due a job for the sampler thread), and goes on with the cores as last
seen; the sampler thread reads, and hands the sample to ``then`` (``BlasThreads``),
which revises BLAS's threads and the cores seen at once. The call asks as it ends, not
as it starts: the sampler needs the GIL, and woken at the start it took it at the
call's first loop turn (which releases it), so the call waited for the sample after
all. Asked at the end, it runs at the process's next release of the GIL (an idle loop's
wait, typically), and the next call starts with the cores it saw; a long call with
BLAS kernels on the workers also asks after each of them (the worker's thread, not the
loop's, pays the asking), so it adapts before its end. The sampler holds the GIL
briefly: ``/proc/stat`` stays open and is read again from its start (one ``pread``:
the kernel prints it afresh), and only the CPUs' lines, which come before the long
interrupt counts, are parsed. A forked child starts its own thread.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from ... import _bare_thread

INTERVAL = 0.1  # seconds between samples: /proc/stat counts in 10 ms ticks
ENV_VAR = "ASYNCGRAD_ADAPT_TO_LOAD"
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (not idle, iowait)
_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


_stat_fd: int | None = None  # /proc/stat, kept open (Note [Sampling off the caller's path])


def _read_stat(size: int) -> bytes:
    """The first ``size`` bytes of ``/proc/stat``, printed afresh: a ``pread`` from its
    start makes the kernel print it again."""
    global _stat_fd
    if _stat_fd is None:
        _stat_fd = os.open("/proc/stat", os.O_RDONLY | os.O_CLOEXEC)
    return os.pread(_stat_fd, size, 0)


def read_busy_seconds(cpus: set[int]) -> float | None:
    """Seconds the given CPUs have spent busy since boot (``/proc/stat``), or None."""
    size = 4096 + 128 * len(cpus)  # the CPUs' lines, which come first
    try:
        text = _read_stat(size)
        while b"\nintr" not in text and len(text) == size:  # (longer lines than thought)
            size *= 4
            text = _read_stat(size)
    except OSError:
        return None
    end = text.find(b"\nintr")  # the interrupt counts and the rest: not parsed
    busy = 0
    seen = 0
    for line in text[:end if end >= 0 else len(text)].split(b"\n"):
        if not line.startswith(b"cpu") or line[3:4] == b" ":  # (the total over all CPUs)
            continue
        name, _, rest = line.partition(b" ")
        if int(name[3:]) not in cpus:
            continue
        fields = rest.split()
        busy += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
        seen += 1
    return busy * _TICK if seen else None


class Sampler:
    """One daemon thread that runs the jobs given to it, in order (Note [Sampling off
    the caller's path]). Started by the first job, and again in a forked child (a fork
    keeps only the forking thread, and drops the jobs queued for the parent's)."""

    def __init__(self) -> None:
        self._started = False
        self._jobs: deque[Callable[[], None]] = deque()
        self._wake = threading.Lock()

    def __call__(self, job: Callable[[], None]) -> None:
        """Run ``job()`` on the sampler thread soon; returns at once."""
        if not self._started:
            self._start()
        self._jobs.append(job)
        try:
            self._wake.release()
        except RuntimeError:  # (already woken: it takes this job with the others)
            pass

    def forked(self) -> None:
        """In a forked child: the parent's thread and its jobs are gone."""
        self._started = False

    def _start(self) -> None:
        self._started = True
        self._jobs = deque()
        self._wake = threading.Lock()
        self._wake.acquire()
        # (bare: ``Thread.start()`` waits until the new thread runs; the caller must not. Not
        # started once the process is exiting: Note [A bare thread is never half-started at exit])
        if not _bare_thread.start(self._run, self._jobs, self._wake):
            self._started = False

    def _run(self, jobs: deque[Callable[[], None]], wake: threading.Lock) -> None:
        while True:
            wake.acquire()
            while jobs:
                job = jobs.popleft()
                try:
                    job()
                except Exception:  # (reported as a thread's error is; the thread goes on)
                    threading.excepthook(threading.ExceptHookArgs((*sys.exc_info(), None)))


SAMPLER = Sampler()
_forks = [0]  # forks this process descends by: a sample requested before one never ran in the child


def _after_fork_in_child() -> None:
    _forks[0] += 1
    SAMPLER.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class OtherLoad:
    """Samples of the cores other processes keep busy; ``free_cores()`` turns them into
    the cores BLAS may use. ``read``, ``own`` and ``clock`` are injectable for tests, and
    so is ``run``, which runs a requested sample (by default on the sampler thread)."""

    def __init__(self, read: Callable[[set[int]], float | None] = read_busy_seconds,
                 own: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic,
                 cpus: set[int] | None = None, enabled: bool | None = None,
                 run: Callable[[Callable[[], None]], None] = SAMPLER) -> None:
        self.read, self.own, self.clock, self.run = read, own, clock, run
        self.cpus = _affinity() if cpus is None else cpus
        if enabled is None:
            enabled = os.environ.get(ENV_VAR, "1").strip() != "0"
        self.enabled = enabled
        self._last: tuple[float, float, float] | None = None  # (clock, busy, own) at the last sample
        self._loads: list[float] = []  # the last two samples: cores' worth busy with others' work
        self._pending: int | None = None  # a requested sample not yet taken: the ``_forks`` then

    def request(self, then: Callable[[], None]) -> None:
        """Have a sample taken off this thread if ``INTERVAL`` has passed since the last
        (by ``run``), and ``then()`` called after it when it gave new loads; returns at
        once (Note [Sampling off the caller's path])."""
        if not self.enabled:
            return
        last = self._last
        if last is not None and self.clock() - last[0] < INTERVAL:
            return
        if self._pending == _forks[0]:
            return  # (one at a time; one pending when this process forked never runs in the child)
        self._pending = _forks[0]
        self.run(lambda: self._sample_then(then))

    def _sample_then(self, then: Callable[[], None]) -> None:
        try:
            sampled = self.sample()
        finally:
            self._pending = None
        if sampled:
            then()

    def sample(self) -> bool:
        """Take a sample if ``INTERVAL`` has passed since the last; whether one was taken
        (on this thread: ``request`` has it taken off the caller's)."""
        if not self.enabled:
            return False
        now = self.clock()
        last = self._last
        if last is not None and now - last[0] < INTERVAL:
            return False
        busy = self.read(self.cpus)
        if busy is None:
            self.enabled = False  # no /proc/stat: nothing to adapt to
            return False
        own = self.own()
        self._last = (now, busy, own)
        if last is None:
            return False
        wall = now - last[0]
        others = max(0.0, (busy - last[1]) - (own - last[2])) / wall
        self._loads = [*self._loads[-1:], others]  # (a new list: other threads read the last one)
        return True

    def spare_cores(self) -> int:
        """The cores the larger of the last two samples leaves wholly free of others'
        work (as ``free_cores``, but 0 when they take them all), and 0 while nothing is
        known: before the first sample and while sampling is off."""
        loads = self._loads
        if not self.enabled or not loads:
            return 0
        return max(0, len(self.cpus) - _taken(loads))

    def free_cores(self) -> int:
        """The cores left free by the larger of the last two samples (at least 1): a core
        counts as taken from about a third of a core's worth of others' work."""
        loads = self._loads
        if not loads:
            return len(self.cpus)
        return max(1, len(self.cpus) - _taken(loads))


def _taken(loads: list[float]) -> int:
    most = max(loads)
    return math.ceil(most - 0.3) if most > 0.3 else 0
