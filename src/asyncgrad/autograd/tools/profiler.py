"""The backward profiler: per-node timings, a PyTorch-like summary table, Chrome traces.

    with ag.autograd.profiler.profile() as prof:
        await ag.backward(loss)
    print(prof.key_averages().table(sort_by="total_time", row_limit=10))
    prof.export_chrome_trace("trace.json")     # open in ui.perfetto.dev or chrome://tracing

Every backward call (GraphTask) *started* inside the block is recorded, including those
started by tasks spawned inside it (``asyncio.gather``, task groups: they copy the
context) and nested (reentrant) ones. The recorder is a ContextVar
(``_context.profiler``), so a backward running concurrently in an unrelated task is not
recorded. ``profile`` works with ``with`` and with ``async with``.

Note [Profiler seam]: a GraphTask reads ``_context.profiler`` once when it is created.
When it is set, the engine runs each node through ``profile.wrap_kernel(run_kernel,
task, offloaded)``, inline on the loop thread or on a worker thread; otherwise it calls
``run_kernel`` directly, so profiling costs nothing when off. The wrapper only appends
to a list (atomic under the GIL), so it is safe on any thread.

What is measured is a node's kernel (its ``apply`` plus gradient validation, and the
NaN check in anomaly mode): not the hooks around it, and not the engine's bookkeeping.
Nodes whose backward is ``async def`` and AccumulateGrad (staged by the engine, no
kernel) are not recorded.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ... import _context

__all__ = ["NodeEvent", "FunctionEventAvg", "EventTable", "profile"]

Kernel = Callable[[Any, list[Any], Any], list[Any]]
AsyncKernel = Callable[[Any, list[Any], Any], Awaitable[list[Any]]]


@dataclass(frozen=True)
class NodeEvent:
    """One run of one node's kernel."""

    name: str
    sequence_nr: int
    graph_task: int
    depth: int
    thread_id: int  # ``threading.get_native_id()``: the OS thread id
    thread_name: str
    offloaded: bool  # ran on a worker thread (else inline on the driving thread)
    start_ns: int  # ``time.perf_counter_ns()``
    duration_ns: int
    input_shapes: tuple[tuple[int, ...] | None, ...]  # of the gradients the node received
    failed: bool = False  # the kernel raised
    is_async: bool = False  # an ``async def backward``: duration is wall time, awaits included

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


class profile:
    """Record every node run by the backward calls started inside the block.

    ``events`` is the list of :class:`NodeEvent` (in order of completion);
    ``key_averages()`` summarises them by node name; ``export_chrome_trace(path)``
    writes them as a Trace Event Format file, one track per thread.
    ``enabled=False`` records nothing (the engine then runs no wrapper at all).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.events: list[NodeEvent] = []
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self._tokens: list[Any] = []

    # --- entering and leaving --------------------------------------------------------
    def __enter__(self) -> profile:
        if self.enabled:
            self._tokens.append(_context.profiler.set(self))
        if self.start_ns is None:
            self.start_ns = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tokens:
            _context.profiler.reset(self._tokens.pop())
        self.end_ns = time.perf_counter_ns()

    async def __aenter__(self) -> profile:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)

    # --- the engine seam (Note [Profiler seam]) ---------------------------------------
    def wrap_kernel(self, kernel: Kernel, task: Any, offloaded: bool) -> Kernel:
        """``kernel`` timed: each call appends one :class:`NodeEvent` to ``events``."""
        append = self.events.append
        task_id: int = task.id
        depth: int = task.depth
        clock = time.perf_counter_ns

        def timed(node: Any, inputs: list[Any], math: Any) -> list[Any]:
            failed = True
            start = clock()
            try:
                outputs = kernel(node, inputs, math)
                failed = False
                return outputs
            finally:
                duration = clock() - start
                thread = threading.current_thread()
                append(NodeEvent(
                    node.name(), node.sequence_nr, task_id, depth, threading.get_native_id(),
                    thread.name, offloaded, start, duration,
                    tuple(_shape(g) for g in inputs), failed,
                ))

        return timed

    def wrap_async_kernel(self, kernel: AsyncKernel, task: Any) -> AsyncKernel:
        """The same for a node whose backward is ``async def``: ``kernel(node, inputs,
        math)`` is awaited on the event loop; the event's duration is wall time, awaits
        included, and its ``is_async`` is True."""
        append = self.events.append
        task_id: int = task.id
        depth: int = task.depth
        clock = time.perf_counter_ns

        async def timed(node: Any, inputs: list[Any], math: Any) -> list[Any]:
            failed = True
            start = clock()
            try:
                outputs = await kernel(node, inputs, math)
                failed = False
                return outputs
            finally:
                duration = clock() - start
                append(NodeEvent(
                    node.name(), node.sequence_nr, task_id, depth, threading.get_native_id(),
                    threading.current_thread().name, False, start, duration,
                    tuple(_shape(g) for g in inputs), failed, True,
                ))

        return timed

    # --- views ------------------------------------------------------------------------
    def key_averages(self, group_by_input_shape: bool = False) -> EventTable:
        """Events grouped by node name (and input shapes, if asked), as a table."""
        groups: dict[tuple[str, Any], list[NodeEvent]] = {}
        self_times = _self_times(self.events)
        selfs: dict[tuple[str, Any], int] = {}
        for e, self_ns in zip(self.events, self_times):
            key = (e.name, e.input_shapes if group_by_input_shape else None)
            groups.setdefault(key, []).append(e)
            selfs[key] = selfs.get(key, 0) + self_ns
        rows = []
        for key, events in groups.items():
            durations = [e.duration_ns for e in events]
            rows.append(FunctionEventAvg(
                name=key[0],
                input_shapes=key[1],
                calls=len(events),
                total_ns=sum(durations),
                self_ns=selfs[key],
                min_ns=min(durations),
                max_ns=max(durations),
                offloaded=sum(e.offloaded for e in events),
                threads=len({e.thread_id for e in events}),
            ))
        return EventTable(rows)

    def table(self, sort_by: str = "total_time", row_limit: int = -1) -> str:
        """``key_averages().table(...)``."""
        return self.key_averages().table(sort_by=sort_by, row_limit=row_limit)

    def __str__(self) -> str:
        return self.table()

    def export_chrome_trace(self, path: str | os.PathLike[str], *, graph_task_tracks: bool = True) -> None:
        """Write the events as Chrome Trace Event Format JSON (``chrome://tracing``,
        https://ui.perfetto.dev): one "X" (complete) event per node run, on a track per
        thread (process "asyncgrad threads"). With ``graph_task_tracks`` the same events
        are also laid out on one track per GraphTask (process "asyncgrad graph tasks"), so
        concurrent backward calls sharing the event-loop thread appear side by side."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(graph_task_tracks=graph_task_tracks), f)

    def chrome_trace(self, *, graph_task_tracks: bool = True) -> dict[str, Any]:
        """The trace that ``export_chrome_trace`` writes, as a dict."""
        events = sorted(self.events, key=lambda e: e.start_ns)
        t0 = self.start_ns if self.start_ns is not None else (events[0].start_ns if events else 0)
        pid = os.getpid()
        out: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
             "args": {"name": "asyncgrad threads"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": 0}},
        ]
        threads: dict[int, tuple[str, bool]] = {}
        for e in events:
            name, any_inline = threads.get(e.thread_id, (e.thread_name, False))
            threads[e.thread_id] = (name, any_inline or not e.offloaded)
        # driving (event-loop) threads first, then worker threads, each by first use
        order = sorted(threads, key=lambda tid: not threads[tid][1])
        for index, tid in enumerate(order):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": f"{threads[tid][0]} ({tid})"}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": index}})
        for e in events:
            out.append(_complete_event(e, pid, e.thread_id, t0))
        if graph_task_tracks and events:
            gpid = pid + 1
            out.append({"ph": "M", "name": "process_name", "pid": gpid, "tid": 0,
                        "args": {"name": "asyncgrad graph tasks"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": gpid, "tid": 0,
                        "args": {"sort_index": 1}})
            tasks: dict[int, int] = {}
            for e in events:
                tasks.setdefault(e.graph_task, e.depth)
            for gid, depth in tasks.items():
                out.append({"ph": "M", "name": "thread_name", "pid": gpid, "tid": gid,
                            "args": {"name": f"GraphTask {gid} (depth {depth})"}})
            for e in events:
                out.append(_complete_event(e, gpid, e.graph_task, t0))
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"generator": "asyncgrad.autograd.tools.profiler"}}


def _complete_event(e: NodeEvent, pid: int, tid: int, t0: int) -> dict[str, Any]:
    return {
        "ph": "X", "cat": "offloaded" if e.offloaded else "inline", "name": e.name,
        "pid": pid, "tid": tid, "ts": (e.start_ns - t0) / 1000, "dur": e.duration_ns / 1000,
        "args": {
            "sequence_nr": e.sequence_nr, "graph_task": e.graph_task, "depth": e.depth,
            "offloaded": e.offloaded, "thread": e.thread_name,
            "shapes": [None if s is None else list(s) for s in e.input_shapes],
            **({"failed": True} if e.failed else {}),
            **({"async": True} if e.is_async else {}),
        },
    }


def _shape(g: Any) -> tuple[int, ...] | None:
    shape = getattr(g, "shape", None)
    return None if shape is None else tuple(shape)


def _self_times(events: Sequence[NodeEvent]) -> list[int]:
    """Each event's duration less that of the events nested in it on the same thread
    (a reentrant backward run inside a node's kernel)."""
    selfs = [e.duration_ns for e in events]
    by_thread: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        by_thread.setdefault(e.thread_id, []).append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (events[i].start_ns, -events[i].duration_ns))
        stack: list[int] = []
        for i in indices:
            e = events[i]
            while stack and events[stack[-1]].end_ns <= e.start_ns:
                stack.pop()
            if stack:
                selfs[stack[-1]] -= e.duration_ns
            stack.append(i)
    return selfs


@dataclass(frozen=True)
class FunctionEventAvg:
    """The summary of every run of one node name (one row of ``key_averages()``)."""

    name: str
    input_shapes: tuple[tuple[int, ...] | None, ...] | None
    calls: int
    total_ns: int
    self_ns: int
    min_ns: int
    max_ns: int
    offloaded: int  # how many of the calls ran on a worker thread
    threads: int

    @property
    def count(self) -> int:
        return self.calls

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.calls


_SORT_KEYS: dict[str, Callable[[FunctionEventAvg], Any]] = {
    "total_time": lambda r: r.total_ns,
    "self_time": lambda r: r.self_ns,
    "mean_time": lambda r: r.mean_ns,
    "max_time": lambda r: r.max_ns,
    "calls": lambda r: r.calls,
    "count": lambda r: r.calls,
    "name": lambda r: r.name,
    # PyTorch's names for the same columns
    "cpu_time_total": lambda r: r.total_ns,
    "self_cpu_time_total": lambda r: r.self_ns,
    "cpu_time": lambda r: r.mean_ns,
}


class EventTable(Sequence[FunctionEventAvg]):
    """The rows of ``key_averages()``; ``table()`` formats them as PyTorch does."""

    def __init__(self, rows: list[FunctionEventAvg]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: Any) -> Any:
        return self._rows[i]

    def __iter__(self) -> Iterator[FunctionEventAvg]:
        return iter(self._rows)

    def table(self, sort_by: str = "total_time", row_limit: int = -1) -> str:
        """A text table, sorted descending by ``sort_by`` (``"total_time"``,
        ``"self_time"``, ``"mean_time"``, ``"max_time"``, ``"calls"``, ``"name"``, or
        PyTorch's ``"cpu_time_total"`` ...), cut to ``row_limit`` rows (-1: all)."""
        try:
            key = _SORT_KEYS[sort_by]
        except KeyError:
            raise ValueError(f"sort_by must be one of {sorted(_SORT_KEYS)}, got {sort_by!r}") from None
        rows = sorted(self._rows, key=key, reverse=sort_by != "name")
        if row_limit >= 0:
            rows = rows[:row_limit]
        grand_total = sum(r.total_ns for r in self._rows) or 1
        grand_self = sum(r.self_ns for r in self._rows) or 1
        shapes = any(r.input_shapes is not None for r in rows)
        header = ["Name", "Self %", "Self", "Total %", "Total", "Mean", "Max", "Calls", "Offloaded"]
        body = [[r.name, f"{100 * r.self_ns / grand_self:.2f}%", _fmt_time(r.self_ns),
                 f"{100 * r.total_ns / grand_total:.2f}%", _fmt_time(r.total_ns),
                 _fmt_time(r.mean_ns), _fmt_time(r.max_ns), str(r.calls), str(r.offloaded)]
                for r in rows]
        if shapes:
            header.append("Input Shapes")
            for line, r in zip(body, rows):
                line.append(str([None if s is None else list(s) for s in r.input_shapes or ()]))
        widths = [max(len(h), *(len(line[c]) for line in body)) if body else len(h)
                  for c, h in enumerate(header)]
        rule = "  ".join("-" * w for w in widths)

        def fmt(cells: list[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
            return "  ".join([first, *rest]).rstrip()

        lines = [rule, fmt(header), rule, *(fmt(line) for line in body), rule,
                 f"Self time total: {_fmt_time(sum(r.self_ns for r in self._rows))}"]
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<EventTable of {len(self)} rows>"


def _fmt_time(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    return f"{ns / 1e3:.3f}us"
