"""Running a node elsewhere than inline: on worker threads (one kernel, a worker chain,
or one kernel per input gradient), or as its own task for an ``async def`` backward.
Which one is policy.py's decision; this module carries it out, on the loop, for one
GraphTask, and routes the results back through the same steps as an inline node."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .. import _context
from .execute import async_kernel_for, finish, kernel_for, own_fresh_outputs, resolved_kernel, run_kernel
from .graph import Node
from .graph_task import GraphTask
from .input_buffer import InputBuffer, ReadyInputs, combine, inputs_of, slots_of, value
from .recording import OpNode
from .threads import current_owner

if TYPE_CHECKING:
    from .engine import Engine


async def run_elsewhere(engine: Engine, task: GraphTask, tg: anyio.abc.TaskGroup, node: Node,
                        inputs: ReadyInputs) -> None:
    """The task that runs one prepared node elsewhere, then finishes it on the loop."""
    policy = engine.policy
    try:
        if node.maybe_async and node.is_async():
            _context.node_owner.set(current_owner())  # this task runs the node (explicit nesting)
            outputs = await async_kernel_for(task)(node, inputs_of(inputs), task.math)
        else:
            engine.count_in_flight(1)
            try:
                if type(node) is OpNode and node.spec.blas:
                    async with engine.blas_limiter():  # Note [BLAS threads] in policy.py
                        outputs = await _offload_kernel(engine, task, node, inputs, blas=True)
                elif policy.chains(task, node):
                    await _offload_chain(engine, task, node, inputs)
                    if task.error is not None:
                        tg.cancel_scope.cancel()
                    return
                else:
                    outputs = await _offload_kernel(engine, task, node, inputs)
            finally:
                engine.count_in_flight(-1)
        task.nodes_offloaded += 1
        if task.error is None:
            finish(task, node, inputs, outputs)
    except Exception as e:
        task.fail(e, node)
        tg.cancel_scope.cancel()
    except BaseException:  # cancelled: this node's gradients are dropped, so the
        task.stopping = True  # GraphTask can no longer complete
        raise
    finally:
        task.in_flight -= 1
        engine.node_done(task)


async def _offload_chain(engine: Engine, task: GraphTask, head: Node, inputs: ReadyInputs) -> None:
    """Run ``head`` and the nodes chained after it on one worker thread, then route
    their gradients on the loop (Note [Worker chains] in policy.py)."""
    chain, edges, partials = engine.policy.plan_chain(task, head)
    if not chain:
        outputs = await _offload_kernel(engine, task, head, inputs)
        task.nodes_offloaded += 1
        if task.error is None:
            finish(task, head, inputs, outputs)
        return
    task.thread_hops += 1
    nodes = [head, *chain]
    results, error = await engine.offload(_run_chain, task, nodes, edges, partials, inputs)
    task.nodes_offloaded += len(results)
    if error is not None:
        task.fail(error, nodes[len(results)])
        return
    if task.error is not None or len(results) < len(nodes):  # stopped: drop it all
        return
    external = [*slots_of(inputs), *partials]  # what the chain did not make itself
    for k, (node, outputs) in enumerate(zip(nodes, results)):
        own_fresh_outputs(task, node, external, outputs)  # Note [Owned gradients] in execute.py
        task.route(node, outputs, edges[k] if k < len(edges) else -1)


async def _offload_kernel(engine: Engine, task: GraphTask, node: Node, inputs: ReadyInputs,
                          blas: bool = False) -> list[Any]:
    task.thread_hops += 1
    if engine.policy.splits(task, node):
        if isinstance(inputs, InputBuffer):  # add up the deferred sums on a worker first
            task.thread_hops += 1
            grads: list[Any] = await engine.offload(inputs.resolve)
        else:
            grads = inputs
        return await _offload_per_input(engine, task, node, grads)
    kernel = kernel_for(task, True)
    offload: Callable[..., Any] = engine.offload_blas if blas else engine.offload
    outputs: list[Any]
    if isinstance(inputs, InputBuffer):  # add up the deferred sums on the worker too
        outputs = await offload(resolved_kernel, kernel, node, inputs, task.math)
    else:
        outputs = await offload(kernel, node, inputs, task.math)
    return outputs


async def _offload_per_input(engine: Engine, task: GraphTask, node: Node, inputs: list[Any]) -> list[Any]:
    if not isinstance(node, OpNode):
        raise TypeError("only built-in nodes are split")
    math = task.math
    outputs: list[Any] = [None] * len(node.next_edges)
    # unpack the saved values once (unpack hooks may be slow: on a worker thread)
    unpacked = await engine.offload(node.rule_args, math)
    offload = engine.offload_blas if node.spec.blas else engine.offload  # (each part holds BLAS slots)

    async def one(i: int) -> None:
        task.thread_hops += 1
        outputs[i] = await offload(node.apply_edge, i, inputs, math, unpacked)

    async with anyio.create_task_group() as parts:
        for i, (child, _) in enumerate(node.next_edges):
            if child is not None:
                parts.start_soon(one, i)
    return outputs


def _run_chain(task: GraphTask, nodes: list[Node], edges: list[int], partials: list[Any],
               inputs: ReadyInputs) -> tuple[list[list[Any]], BaseException | None]:
    """On a worker thread: run a chain of nodes, each fed the gradient its predecessor
    computed for it (added to what its buffer already held: ``partials``). Returns the
    outputs of the nodes that ran and the exception of the one that raised, if any (that
    one is ``nodes[len(outputs)]``); stops early once the GraphTask stops."""
    math = task.math
    results: list[list[Any]] = []
    for k, node in enumerate(nodes):
        if k and task.stopping:
            break
        try:
            if k:  # what the buffer held, plus the predecessor's gradient
                prev = results[-1]
                inputs = [value(combine(partials[k - 1], prev[edges[k - 1]]))]
                # dropped from the results (route skips that edge), so a long chain
                # holds one gradient at a time, not one per node
                prev[edges[k - 1]] = None
                del prev
            results.append(run_kernel(node, inputs_of(inputs), math))
        except Exception as e:
            return results, e
    return results, None
