"""``once_differentiable``: a custom Function's backward that is not itself
differentiable runs under ``no_grad``; under ``create_graph`` its results stand behind
a ``DelayedError`` node, which raises only if something differentiates through them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ... import _context
from ...tensor import Tensor
from ..graph import Edge, Node

__all__ = ["DelayedError", "ONCE_DIFFERENTIABLE_ERROR", "once_differentiable"]

F = TypeVar("F", bound=Callable[..., Any])

_grad_enabled = _context.grad_enabled

ONCE_DIFFERENTIABLE_ERROR = (
    "trying to differentiate twice a function that was marked with @once_differentiable"
)


class DelayedError(Node):
    """Stands behind the results of a ``@once_differentiable`` backward computed under
    ``create_graph``: running it (differentiating them) raises."""

    __slots__ = ("message", "num_outputs", "input_shapes", "input_dtypes")

    def __init__(self, message: str, edges: tuple[Edge, ...], num_outputs: int) -> None:
        Node.__init__(self, edges)
        self.message = message
        self.num_outputs = num_outputs
        self.input_shapes = (None,) * len(edges)
        self.input_dtypes = (None,) * len(edges)

    def name(self) -> str:
        return "Error"

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        raise RuntimeError(self.message)


def once_differentiable(fn: F) -> F:
    """Decorate a Function's ``backward`` that is not itself differentiable: it runs
    under ``no_grad``, and under ``create_graph`` its results raise when differentiated."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(ctx: Any, *args: Any) -> Any:
            token = _grad_enabled.set(False)
            try:
                outputs = await fn(ctx, *args)
            finally:
                _grad_enabled.reset(token)
            return _delay_error(ctx, args, outputs)
        return cast(F, async_wrapper)

    @functools.wraps(fn)
    def wrapper(ctx: Any, *args: Any) -> Any:
        token = _grad_enabled.set(False)
        try:
            outputs = fn(ctx, *args)
        finally:
            _grad_enabled.reset(token)
        return _delay_error(ctx, args, outputs)
    return cast(F, wrapper)


def _delay_error(ctx: Any, grad_outputs: tuple[Any, ...], outputs: Any) -> Any:
    if not _grad_enabled.get():
        return outputs
    edges = [g._gradient_edge() for g in grad_outputs if isinstance(g, Tensor) and g._requires_grad]
    if not edges:  # nothing to differentiate through: plain results
        return outputs
    node = getattr(ctx, "_node_ref", None)
    node = node() if node is not None else None
    if node is not None:
        edges.extend(e for e in node.next_edges if e[0] is not None)
    is_tuple = isinstance(outputs, tuple)
    outs = outputs if is_tuple else (outputs,)
    err = DelayedError(ONCE_DIFFERENTIABLE_ERROR, tuple(edges), len(outs))
    wrapped = tuple(Tensor._nonleaf(o.data, err, i, None) if isinstance(o, Tensor) else o
                    for i, o in enumerate(outs))
    return wrapped if is_tuple else wrapped[0]
