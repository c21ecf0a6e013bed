"""How much of this process's cores other processes keep busy (Note [Other processes'
load]), sampled at most every ``INTERVAL`` seconds from ``/proc/stat``.

Note [Other processes' load]: a BLAS call on two threads splits its product in two and
waits for both halves. When another process keeps one of the two cores busy, the half
on that core waits for its time slice, and the product takes many times longer than
on one thread (docs/benchmarks.md, "Figures behind the Notes"). So the engine counts,
between two backward calls at least
``INTERVAL`` apart, the CPU time the cores this process may run on (its affinity) spent
busy (user, system, interrupts, and time stolen by the hypervisor) less this process's
own CPU time, and gives BLAS only the cores that load leaves free
(``BlasThreads.cap``): one busy process on two cores sends BLAS to one thread, until two
samples in a row find the cores free again. Linux only (elsewhere nothing changes);
``ASYNCGRAD_ADAPT_TO_LOAD=0`` turns it off.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

INTERVAL = 0.1  # seconds between samples: /proc/stat counts in 10 ms ticks
ENV_VAR = "ASYNCGRAD_ADAPT_TO_LOAD"
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (not idle, iowait)
_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def read_busy_seconds(cpus: set[int]) -> float | None:
    """Seconds the given CPUs have spent busy since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    busy = 0
    seen = 0
    for line in text.split(b"\n"):
        if not line.startswith(b"cpu") or line[3:4] == b" ":
            continue
        name, _, rest = line.partition(b" ")
        if int(name[3:]) not in cpus:
            continue
        fields = rest.split()
        busy += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
        seen += 1
    return busy * _TICK if seen else None


class OtherLoad:
    """Samples of the cores other processes keep busy; ``free_cores()`` turns them into
    the cores BLAS may use. ``read``, ``own`` and ``clock`` are injectable for tests."""

    def __init__(self, read: Callable[[set[int]], float | None] = read_busy_seconds,
                 own: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic,
                 cpus: set[int] | None = None, enabled: bool | None = None) -> None:
        self.read, self.own, self.clock = read, own, clock
        self.cpus = _affinity() if cpus is None else cpus
        if enabled is None:
            enabled = os.environ.get(ENV_VAR, "1").strip() != "0"
        self.enabled = enabled
        self._last: tuple[float, float, float] | None = None  # (clock, busy, own) at the last sample
        self._loads: list[float] = []  # the last two samples: cores' worth busy with others' work

    def sample(self) -> bool:
        """Take a sample if ``INTERVAL`` has passed since the last; whether one was taken."""
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
        self._loads = [*self._loads[-1:], others]
        return True

    def spare_cores(self) -> int:
        """The cores the larger of the last two samples leaves wholly free of others'
        work (as ``free_cores``, but 0 when they take them all), and 0 while nothing is
        known: before the first sample and while sampling is off."""
        if not self.enabled or not self._loads:
            return 0
        return max(0, len(self.cpus) - self._taken())

    def free_cores(self) -> int:
        """The cores left free by the larger of the last two samples (at least 1): a core
        counts as taken from about a third of a core's worth of others' work."""
        if not self._loads:
            return len(self.cpus)
        return max(1, len(self.cpus) - self._taken())

    def _taken(self) -> int:
        most = max(self._loads)
        return math.ceil(most - 0.3) if most > 0.3 else 0
