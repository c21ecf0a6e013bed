"""The reference executor: the one obviously correct way to run a backward.

Every ready node, in ready-queue order, goes through ``step.prepare``,
``run_kernel`` (or ``run_async_kernel``, awaited; wrapped by the profiler when one
records) and ``step.finish``, one at a time on the driving thread: no fused step, no
offload, no worker chains, no scheduler. (So under ``pytest --reference-engine`` the
tests that check overlapping or offloaded nodes themselves skip.) The
fast paths (the loop's scheduler, the core loop's fused step, sched/offload.py)
are checked against it in tests (tests/test_reference_executor.py, and the whole suite
with ``pytest --reference-engine``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..engine import Engine
from ..task.step import async_kernel_for, finish, kernel_for, prepare
from ..graph import Node
from ..task.graph_task import GraphTask
from ..runtime.threads import block_on


@contextmanager
def _naming(task: GraphTask, node: Node) -> Iterator[None]:
    """Record an error raised by ``node``'s steps on the task (first error wins)."""
    try:
        yield
    except Exception as e:
        task.fail(e, node)
        raise


def _steps(task: GraphTask) -> Iterator[tuple[Node, list[Any], bool]]:
    """Each node to run, prepared, in ready-queue order, and whether it is async."""
    while (entry := task.pop_ready()) is not None:
        _, _, node, buf = entry
        with _naming(task, node):
            inputs = prepare(task, node, buf)
        if inputs is not None:
            task.nodes_inline += 1
            yield node, inputs, node.maybe_async and node.is_async()


class ReferenceEngine(Engine):
    """An ``Engine`` whose drivers run every node through the reference sequence."""

    flat_schedule = False  # (its drivers pop the ready queue)

    async def _drain(self, task: GraphTask) -> None:
        for node, inputs, is_async in _steps(task):
            with _naming(task, node):
                if is_async:
                    outputs = await async_kernel_for(task)(node, inputs, task.math)
                else:
                    outputs = kernel_for(task, False)(node, inputs, task.math)
                finish(task, node, inputs, outputs)

    def _drain_sync(self, task: GraphTask) -> None:
        for node, inputs, is_async in _steps(task):
            with _naming(task, node):
                if is_async:
                    outputs = block_on(async_kernel_for(task), node, inputs, task.math)
                else:
                    outputs = kernel_for(task, False)(node, inputs, task.math)
                finish(task, node, inputs, outputs)
