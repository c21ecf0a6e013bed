"""Shared helpers: timing with warm-up and medians, the event-loop ticker, peer detection,
result records and the table printer.

Every workload returns a :class:`Result`: one row per implementation (asyncgrad, the
peers, the numpy floor) with named metrics, plus ratios and the issue-7 targets computed
from rows measured in the same run.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

ASYNCGRAD = "asyncgrad"
TORCH = "torch"
AUTOGRAD = "autograd"
NUMPY = "numpy"

ALL_IMPLS = (ASYNCGRAD, TORCH, AUTOGRAD, NUMPY)


def available(name: str) -> bool:
    """True when the peer ``name`` can be imported (without importing it)."""
    if name in (ASYNCGRAD, NUMPY):
        return True
    return importlib.util.find_spec(name) is not None


def select_impls(requested: list[str] | None) -> list[str]:
    """The implementations to measure: those requested (default: all) that are importable."""
    wanted = list(ALL_IMPLS) if not requested else requested
    return [n for n in wanted if available(n)]


# --- timing ----------------------------------------------------------------------------
@contextmanager
def no_gc() -> Iterator[None]:
    """Collect, then keep the cyclic GC off for the timed region (as ``timeit`` does)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def session_row(impl: str, sessions: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A table row for ``impl`` from its ticked sessions: medians of passes/s and lag."""
    return {"impl": impl, **extra,
            "passes_per_s": median([s["passes_per_s"] for s in sessions]),
            "p99_lag_ms": median([s["p99_lag_ms"] for s in sessions]),
            "max_lag_ms": median([s["max_lag_ms"] for s in sessions]),
            "sessions": sessions}


def percentile(xs: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest-rank, of ``xs``."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def measure(setup: Callable[[], Any], timed: Callable[[Any], Any], rounds: int,
            warmup: int = 1) -> list[float]:
    """Seconds of ``timed(setup())`` for each of ``rounds`` rounds after ``warmup`` rounds.
    ``setup`` (e.g. building the forward graph) is not timed."""
    times = []
    for i in range(warmup + rounds):
        state = setup()
        with no_gc():
            t0 = time.perf_counter()
            timed(state)
            dt = time.perf_counter() - t0
        del state
        if i >= warmup:
            times.append(dt)
    return times


def measure_async(setup: Callable[[], Any], timed: Callable[[Any], Awaitable[Any]], rounds: int,
                  warmup: int = 1) -> list[float]:
    """:func:`measure` for a coroutine function, all rounds on one asyncio event loop."""

    async def main() -> list[float]:
        times = []
        for i in range(warmup + rounds):
            state = setup()
            with no_gc():
                t0 = time.perf_counter()
                await timed(state)
                dt = time.perf_counter() - t0
            del state
            if i >= warmup:
                times.append(dt)
        return times

    return asyncio.run(main())


def _engine_blas() -> Any:
    """asyncgrad's process-wide BLAS policy (``policy.BLAS``), or None without asyncgrad."""
    try:
        from asyncgrad.autograd.runtime.blas import BLAS as engine_blas
    except ImportError:
        return None
    return engine_blas


class BlasThreads:
    """Keeps each implementation's BLAS thread count its own in one shared process.

    asyncgrad's engine adapts numpy's BLAS threads (process-wide, through threadpoolctl;
    Note [BLAS threads] in runtime/blas.py), and sets them only when its decision changes. So
    before each measurement the runner sets numpy's BLAS to the process's original count
    for the peers and the numpy floor, and back to the count asyncgrad's engine last chose
    for asyncgrad (``policy.BLAS.chosen``; the original count before its first backward).
    Inside ``limited(n)`` (the "one thread each" measurements) every implementation gets
    ``n``, and asyncgrad's engine is pinned to ``n`` (``policy.BLAS.pinned``): left to
    adapt, it gave BLAS its own threads back in the middle of the ops table after the
    concurrency workloads had made it single-threaded.

    (Reading the count back from BLAS after asyncgrad's rounds, as this class once did,
    recorded whatever limit was in force then: after the ops workload's one-thread
    section, the transformer's default-threads rows ran asyncgrad on one BLAS thread
    while its engine believed BLAS had two.)"""

    def __init__(self) -> None:
        self._ctl: Any = None
        self.default: int | None = None
        self.engine: int | None = None
        self.limit: int | None = None

    def _controller(self) -> Any:
        if self._ctl is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                self._ctl = False
            else:
                self._ctl = ThreadpoolController()
        return self._ctl or None

    def get(self) -> int | None:
        ctl = self._controller()
        if ctl is None:
            return None
        infos = ctl.select(user_api="blas").info()
        return int(infos[0]["num_threads"]) if infos else None

    def snapshot(self) -> None:
        """Record the original count (call before any asyncgrad backward runs)."""
        if self.default is None:
            self.default = self.get()

    def set(self, n: int | None) -> None:
        ctl = self._controller()
        if ctl is not None and n is not None and self.get() != n:
            ctl.select(user_api="blas").limit(limits=n)

    @staticmethod
    def engine_choice() -> int | None:
        """The count asyncgrad's engine last gave BLAS, or None before it inspected BLAS."""
        engine_blas = _engine_blas()
        return None if engine_blas is None else engine_blas.chosen

    @contextmanager
    def limited(self, n: int) -> Iterator[None]:
        """Every implementation on ``n`` BLAS threads inside the block. asyncgrad's
        engine inspects BLAS first, so it takes the original count as BLAS's own even
        when its first backward runs inside the block."""
        self.snapshot()
        pin: Any = nullcontext()
        engine_blas = _engine_blas()
        if engine_blas is not None:
            engine_blas.configure()
            pin = engine_blas.pinned(n)  # (else its next change of mind resets BLAS to its own threads)
        before, self.limit = self.limit, n
        try:
            with pin:
                self.set(n)
                yield
        finally:
            self.limit = before
            self.set(self.default if before is None else before)

    def enter(self, impl: str) -> None:
        self.snapshot()
        if self.limit is not None:
            self.set(self.limit)
        elif impl.startswith(ASYNCGRAD):
            chosen = self.engine_choice()
            self.set(self.default if chosen is None else chosen)
        else:
            self.set(self.default)

    def leave(self, impl: str) -> None:
        if impl.startswith(ASYNCGRAD) and self.limit is None:
            self.engine = self.engine_choice()

    def describe(self) -> str:
        return f"BLAS threads: peers and floor {self.default}, asyncgrad {self.engine} (its engine's choice)"


BLAS = BlasThreads()


@dataclass
class Case:
    """One thing to time: ``timed(setup())``; ``timed`` may be a coroutine function."""

    name: str
    setup: Callable[[], Any]
    timed: Callable[[Any], Any]


SETTLE = 0.2  # seconds between two measurements (see measure_cases)


def measure_cases(cases: list[Case], rounds: int, warmup: int = 1,
                  faults: dict[str, list[int]] | None = None, settle: float = SETTLE) -> dict[str, list[float]]:
    """Seconds per round of every case, the cases *interleaved* round by round (the order
    rotating each round) on one asyncio loop, so that a change in the machine's load
    during the run hits every implementation alike and ratios stay meaningful.

    ``settle`` seconds pass (untimed) before each measurement: OpenBLAS's and OpenMP's worker
    threads keep spinning for a while after a call, and a library measured right after
    another one's BLAS call would share the two cores with those spinning threads (PyTorch
    measured right after a numpy matmul ran 4x slower here)."""

    async def main() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {c.name: [] for c in cases}
        for i in range(warmup + rounds):
            k = i % len(cases) if cases else 0
            for case in cases[k:] + cases[:k]:
                BLAS.enter(case.name)
                if settle:
                    await asyncio.sleep(settle)
                state = case.setup()
                with no_gc():
                    f0 = minor_faults()
                    t0 = time.perf_counter()
                    out = case.timed(state)
                    if asyncio.iscoroutine(out):
                        await out
                    dt = time.perf_counter() - t0
                    df = minor_faults() - f0
                del state, out
                BLAS.leave(case.name)
                if i >= warmup:
                    times[case.name].append(dt)
                    if faults is not None:
                        faults.setdefault(case.name, []).append(df)
        return times

    return asyncio.run(main())


# --- the event-loop ticker ---------------------------------------------------------------
class Ticker:
    """A task that sleeps ``interval`` seconds in a loop and records how late each wake-up
    was (the loop's lag). ``start()`` inside a running loop, ``await stop()`` to finish."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._recording = False

    async def _run(self) -> None:
        interval = self.interval
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(interval)
            lag = time.perf_counter() - t0 - interval
            if self._recording:
                self.lags.append(max(0.0, lag))

    def start(self) -> None:
        self._recording = True
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._recording = False
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._task = None

    def summary_ms(self) -> dict[str, float]:
        return {"p50_lag_ms": percentile(self.lags, 50) * 1e3,
                "p99_lag_ms": percentile(self.lags, 99) * 1e3,
                "max_lag_ms": (max(self.lags) if self.lags else math.nan) * 1e3,
                "ticks": float(len(self.lags))}


async def ticked(work: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    """Await ``work()`` with the GC off under a 1 ms ticker: the ticker's lag summary
    plus ``elapsed_ms``."""
    ticker = Ticker(0.001)
    with no_gc():
        ticker.start()
        await asyncio.sleep(0.005)
        ticker.lags.clear()
        t0 = time.perf_counter()
        await work()
        elapsed = time.perf_counter() - t0
        await ticker.stop()
    out = ticker.summary_ms()
    out["elapsed_ms"] = elapsed * 1e3
    return out


# --- memory --------------------------------------------------------------------------------
def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def trim_heap() -> None:
    """Give malloc's free memory back to the OS (glibc's ``malloc_trim``; elsewhere
    nothing), so that what a measurement allocates next shows in RSS: freed memory left by
    a warm-up and the kernels' loader (tens of MB) is reused otherwise (deep's graph once
    grew RSS by 16 B/node where tracemalloc counted 462)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def tune_malloc(threshold: int = 1 << 30) -> bool:
    """Ask glibc's malloc to keep freed memory (``mallopt`` M_MMAP_THRESHOLD and
    M_TRIM_THRESHOLD raised to ``threshold``), so large arrays reuse already-faulted pages
    instead of being mmap'd / trimmed and faulted in again on every allocation. On this
    project's VMs a page fault costs ~8 µs, so a fresh 4 MB array costs ~8 ms of faults.
    Same effect as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment.
    Returns False where there is no glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, threshold)) and bool(libc.mallopt(m_trim_threshold, threshold))
    except (OSError, AttributeError):
        return False


def minor_faults() -> int:
    """Minor page faults of this process so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# --- results ---------------------------------------------------------------------------------
@dataclass
class Column:
    key: str
    label: str
    fmt: str = "{:.3g}"


@dataclass
class Target:
    """One target (issues 7 and 33): ``value`` must be ``<= limit`` (or ``>=`` when ``at_least``)."""

    name: str
    value: float
    limit: float
    unit: str = ""
    at_least: bool = False

    @property
    def met(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "limit": self.limit, "unit": self.unit,
                "at_least": self.at_least, "met": self.met}


@dataclass(frozen=True)
class About:
    """What a workload tells the reader of the benchmarks page; each workload module
    declares one as ``ABOUT`` next to its code, and ``bench/report.py`` renders it.

    ``plots`` lists ``(metric key, axis label, log scale)`` for the figure (default: the
    first column); ``run`` overrides the command (default ``python -m bench --only NAME``).
    """

    title: str
    measures: str
    reading: str = ""
    plots: tuple[tuple[str, str, bool], ...] = ()
    run: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "measures": self.measures, "reading": self.reading,
                "plots": [list(p) for p in self.plots], "run": self.run}


def about_of(module: Any, name: str) -> dict[str, Any]:
    """A workload module's ``ABOUT`` as a dict; a module without one is described from its
    docstring (first line the title, the rest what it measures)."""
    about = getattr(module, "ABOUT", None)
    if isinstance(about, About):
        return about.as_dict()
    doc = (getattr(module, "__doc__", None) or name).strip()
    first, _, rest = doc.partition("\n")
    title = first.split(":", 1)[1].strip() if first.startswith(f"{name}:") else first
    return About(title=title.rstrip("."), measures=" ".join(rest.split())).as_dict()


@dataclass
class Result:
    name: str
    description: str
    params: dict[str, Any]
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)  # {"impl": ..., metric: value}
    ratios: dict[str, float] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    about: dict[str, Any] = field(default_factory=dict)  # the workload's About (set by the runner)

    def row(self, impl: str) -> dict[str, Any] | None:
        for r in self.rows:
            if r["impl"] == impl:
                return r
        return None

    def value(self, impl: str, key: str) -> float:
        r = self.row(impl)
        v = None if r is None else r.get(key)
        return math.nan if v is None else float(v)

    def add_ratio(self, label: str, num: float, den: float) -> float:
        r = num / den if den and not math.isnan(num) and not math.isnan(den) else math.nan
        if not math.isnan(r):
            self.ratios[label] = r
        return r

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "params": self.params,
                "columns": [c.__dict__ for c in self.columns], "rows": self.rows,
                "ratios": self.ratios, "targets": [t.as_dict() for t in self.targets],
                "notes": self.notes, "seconds": self.seconds, "about": self.about}


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, str):
        return value
    return fmt.format(value)


def format_table(result: Result) -> str:
    """The result as a GitHub-flavoured markdown table, then ratios and targets."""
    head = ["impl"] + [c.label for c in result.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result.rows:
        cells = [r["impl"]] + [_cell(r.get(c.key), c.fmt) for c in result.columns]
        lines.append("| " + " | ".join(cells) + " |")
    out = [f"### {result.name}: {result.description}", "", *lines]
    if result.ratios:
        out += ["", "ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in result.ratios.items())]
    for t in result.targets:
        mark = {True: "MET", False: "NOT MET", None: "n/a"}[t.met]
        op = ">=" if t.at_least else "<="
        fmt = "{:,.0f}" if t.value is not None and abs(t.value) >= 100 else "{:.3g}"
        out.append(f"target {t.name}: {_cell(t.value, fmt)} {t.unit} ({op} {t.limit:g}) {mark}")
    for n in result.notes:
        out.append(f"note: {n}")
    return "\n".join(out)


def fmt_ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"
