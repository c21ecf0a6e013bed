"""Snapshots of the engine's and a GraphTask's counters (for debugging, tests and the
profiler), and the calls that read the running GraphTask's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runtime.threads import running_graph_task

if TYPE_CHECKING:
    from .graph_task import GraphTask


@dataclass(frozen=True)
class EngineStatistics:
    """A snapshot of an engine's counters."""

    graph_tasks_started: int
    graph_tasks_succeeded: int
    graph_tasks_failed: int
    graph_tasks_cancelled: int
    graph_tasks_running: int
    nodes_inline: int
    nodes_offloaded: int
    kernels_in_flight: int
    max_workers: int
    inline_threshold: int
    thread_hops: int = 0  # kernels sent to worker threads (a worker chain is one)


@dataclass(frozen=True)
class GraphTaskStatistics:
    """A snapshot of one running GraphTask."""

    id: int
    depth: int
    nodes_inline: int
    nodes_offloaded: int
    in_flight: int
    ready: int
    pending: int
    thread_hops: int = 0
    priority: int = 0  # the order of its turns (Note [Task order] in runtime/task_order.py)


def graph_task_statistics(task: GraphTask) -> GraphTaskStatistics:
    ready, pending = len(task.ready), len(task.dependencies)
    if task.schedule is not None:  # (Note [The flat schedule]: its next node is ready)
        left = task.schedule.left()
        ready, pending = min(left, 1), max(left - 1, 0)
    return GraphTaskStatistics(task.id, task.depth, task.nodes_inline, task.nodes_offloaded,
                               task.in_flight, ready, pending, task.thread_hops, task.priority)


def current_graph_task_statistics() -> GraphTaskStatistics | None:
    """Statistics of the GraphTask running in this context (from a hook, a Function's
    backward or a callback), or None outside backward."""
    task = running_graph_task()
    return None if task is None else graph_task_statistics(task)


def current_graph_task_id() -> int | None:
    """The id of the GraphTask running in this context, or None outside backward."""
    task = running_graph_task()
    return None if task is None else task.id
