"""Where a tiny node's backward time goes (issue 33's per-node target): the ``chain``
workload's graph (2,000 elementwise ops on 16 floats, ``bench/workloads/chain.py``) taken
apart, every part measured in one process with the rounds interleaved, medians in µs per
node:

* ``engine``: ``await ag.backward(loss)`` (the flat schedule: Note [The flat schedule]);
* ``walk``: the flat schedule's walk alone (``walk_flat``: finding the graph, counting
  its edges, the sort by sequence number);
* ``rules``: every node's derivative rules called in the backward's order on its saved
  values and the gradient that reaches it, and nothing else;
* ``least loop``: the least a Python engine running these rules does: the walk, then a
  loop over the sorted nodes with the saved tensors' version check, the rules and a
  dict of gradients (no ownership records, no shape/dtype check of what a rule returns,
  no slices for the loop, no release of saved tensors);
* ``numpy``: the hand-written forward's saved values and reversed loop of the same rules
  (the workload's floor);
* ``HIPS autograd``, when installed: the best Python peer of the workload.

``engine - least loop`` is what the engine's guarantees cost per node (API.md's: the
in-place check's error, gradients cast and summed to their input's shape, ``.grad``
arrays owned or copied, the loop's turns, saved tensors freed at the commit).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.node_budget [--rounds 21] [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import numpy as np

import asyncgrad as ag
from asyncgrad.autograd.graph import ACCUMULATE_GRAD_SEQUENCE_NR
from asyncgrad.autograd.graph.op_node import OpNode
from asyncgrad.autograd.task.schedule import walk_flat
from asyncgrad.backend import xp

from .workloads.chain import _inputs, ag_forward, numpy_backward, numpy_forward

_sequence_nr = attrgetter("sequence_nr")


class _Walker:
    """What ``walk_flat`` reads of a GraphTask."""

    inline_threshold = mid_work = float("inf")

    def __init__(self) -> None:
        self.dependencies: dict[Any, int] = {}
        self.starting: list[Any] = []


def walk(loss: ag.Tensor) -> Any:
    steps = walk_flat(_Walker(), loss.grad_fn, [None], [loss.grad_fn], 1 << 30)  # type: ignore[arg-type]
    try:
        next(steps)
    except StopIteration as done:
        return done.value
    raise AssertionError("the walk yielded")


def _edges(node: Any) -> Any:
    """A node's edges as the engine's hot paths read them: its slot, the one child of an
    OpNode's one edge as the edge of input 0 (Note [An OpNode's one edge in its slot])."""
    edges = node._edges
    return edges if type(edges) is tuple else ((edges, 0),)


def _sorted_nodes(loss: ag.Tensor) -> list[Any]:
    """The graph's nodes but the leaves, highest sequence number first."""
    seen = {loss.grad_fn}
    stack = [loss.grad_fn]
    while stack:
        for child, _ in _edges(stack.pop()):
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)
    return sorted((n for n in seen if n.sequence_nr != ACCUMULATE_GRAD_SEQUENCE_NR), key=_sequence_nr,
                  reverse=True)


def least_loop(loss: ag.Tensor) -> dict[Any, Any]:
    """The walk, then each node's version check and rules, gradients in a dict."""
    m = xp.math
    order = _sorted_nodes(loss)
    grads: dict[Any, Any] = {order[0]: np.ones((), np.float32)}
    for node in order:
        g = grads.pop(node)
        checks = node._checks  # (one bare: Note [Shared one-entry checks])
        for e in checks if type(checks) is tuple else (checks,):
            if e.version.value != e.saved_version:
                raise RuntimeError("modified in place")
        args = node.saved or node.spec.no_args
        params = node.params
        vjps = node.spec.vjps
        for i, (child, _) in enumerate(_edges(node)):
            if child is None:
                continue
            gi = vjps[i](m, g, *args, **params) if params else vjps[i](m, g, *args)
            old = grads.get(child)
            grads[child] = gi if old is None else old + gi
    return grads


def rule_calls(loss: ag.Tensor) -> list[tuple[Any, Any, tuple[Any, ...], dict[str, Any] | None]]:
    """Every rule call of the backward, with its arguments (from a run of ``least_loop``'s)."""
    m = xp.math
    order = _sorted_nodes(loss)
    grads: dict[Any, Any] = {order[0]: np.ones((), np.float32)}
    calls = []
    for node in order:
        g = grads.pop(node)
        args = node.saved or node.spec.no_args
        for i, (child, _) in enumerate(_edges(node)):
            if child is not None:
                calls.append((node.spec.vjps[i], g, args, node.params))
                grads[child] = calls[-1][0](m, g, *args, **(node.params or {}))
    return calls


def call_rules(calls: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any] | None]]) -> None:
    m = xp.math
    for rule, g, args, params in calls:
        rule(m, g, *args, **params) if params else rule(m, g, *args)


def _timed(fn: Callable[..., Any], *args: Any) -> float:
    gc.disable()
    try:
        t = time.perf_counter()
        fn(*args)
        return time.perf_counter() - t
    finally:
        gc.enable()


async def measure(rounds: int, n: int) -> dict[str, float]:
    x0, c0 = _inputs(16)
    try:
        from .workloads.chain import autograd_forward
        import autograd  # noqa: F401
    except ImportError:
        autograd_forward = None  # type: ignore[assignment]
    times: dict[str, list[float]] = {k: [] for k in ("engine", "walk", "rules", "least loop", "numpy")}
    if autograd_forward is not None:
        times["HIPS autograd"] = []
    for _ in range(rounds):
        for part in times:
            if part == "numpy":
                _, saved = numpy_forward(x0, c0, n)
                times[part].append(_timed(numpy_backward, saved, c0, n, 16))
            elif part == "HIPS autograd":
                vjp, ans = autograd_forward(x0, c0, n)
                times[part].append(_timed(vjp, np.ones_like(ans)))
            elif part == "engine":
                loss = ag_forward(x0, c0, n)
                gc.disable()
                t = time.perf_counter()
                await ag.backward(loss)
                times[part].append(time.perf_counter() - t)
                gc.enable()
            else:
                loss = ag_forward(x0, c0, n)
                if part == "rules":
                    times[part].append(_timed(call_rules, rule_calls(loss)))
                else:
                    times[part].append(_timed(walk if part == "walk" else least_loop, loss))
    return {k: statistics.median(v) / n * 1e6 for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--n", type=int, default=2000)
    args = p.parse_args(argv)
    assert all(type(node) is OpNode for node in _sorted_nodes(ag_forward(*_inputs(16), 8)))
    us = asyncio.run(measure(args.rounds, args.n))
    print(f"# {args.n} ops, {args.rounds} interleaved rounds, medians, µs per node")
    print("| part | µs/node |\n|---|---|")
    for k, v in us.items():
        print(f"| {k} | {v:.2f} |")
    print(f"| engine - least loop (the guarantees) | {us['engine'] - us['least loop']:.2f} |")
    print(f"| least loop - walk - rules (the loop itself) | {us['least loop'] - us['walk'] - us['rules']:.2f} |")
    if "HIPS autograd" in us:
        print(f"\nengine / HIPS autograd: {us['engine'] / us['HIPS autograd']:.2f} (issue 33's target: 0.5); "
              f"least loop / HIPS autograd: {us['least loop'] / us['HIPS autograd']:.2f}")


if __name__ == "__main__":
    main()
