"""Checking the gradients a node returns (PyTorch's ``validate_outputs``): their count,
then each one's shape (a broadcast-larger gradient is summed down to its input's shape)
and dtype (cast). Runs inside the kernel, so on a worker thread for offloaded nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...backend import xp
from ...ops._broadcast import is_expandable_to
from .registry import tensor_type

if TYPE_CHECKING:
    from . import Node


def validate_outputs(node: Node, outputs: list[Any]) -> list[Any]:
    """PyTorch's validate_outputs: count, then shape (summing a broadcast-larger gradient
    down) and dtype (cast) of every gradient against the input it is for."""
    edges = node._edges
    shapes = node.input_shapes
    dtypes = node.input_dtypes
    if type(edges) is not tuple:
        # an OpNode's one edge, input 0's (Note [An OpNode's one edge in its slot] in
        # op_node.py): only its gradient is checked
        if len(outputs) != len(shapes):
            _count_error(node, len(shapes), len(outputs))
        g = outputs[0]
        if g is not None and (type(g) is not xp.array_type or g.shape != shapes[0] or g.dtype != dtypes[0]):
            outputs[0] = fix_gradient(node, 0, g)
        return outputs
    if len(outputs) != len(edges):
        _count_error(node, len(edges), len(outputs))
    for i, g in enumerate(outputs):
        if g is None:
            continue
        shape = shapes[i]
        if shape is None or edges[i][0] is None:
            continue
        if type(g) is xp.array_type and g.shape == shape and g.dtype == dtypes[i]:
            continue  # the common case: nothing to fix
        outputs[i] = fix_gradient(node, i, g)
    return outputs


def _count_error(node: Node, expected: int, got: int) -> None:
    raise RuntimeError(
        f"Function {node.name()} returned an invalid number of gradients - expected "
        f"{expected}, but got {got}"
    )


def validate_one(node: Node, i: int, g: Any) -> Any:
    """``validate_outputs`` for the gradient of input ``i`` alone."""
    shape = node.input_shapes[i]
    if g is None or shape is None or node.next_edges[i][0] is None:
        return g
    if type(g) is xp.array_type and g.shape == shape and g.dtype == node.input_dtypes[i]:
        return g
    return fix_gradient(node, i, g)


def fix_gradient(node: Node, i: int, g: Any) -> Any:
    """Sum a broadcast-larger gradient down to input ``i``'s shape and cast it to its
    dtype (raises when the shapes are not compatible)."""
    shape = node.input_shapes[i]
    dt = node.input_dtypes[i]
    assert shape is not None
    gshape = g.shape
    if type(g) is xp.array_type and len(gshape) == len(shape) + 1 and gshape[1:] == shape:
        # the common broadcast: one leading axis (a bias over a batch); what ``sum_to``
        # does for it, without its general axis bookkeeping
        g = xp.sum_leading(g)
    elif gshape != shape:
        if not is_expandable_to(shape, gshape):
            raise RuntimeError(
                f"Function {node.name()} returned an invalid gradient at index {i} - got "
                f"{list(gshape)} but expected shape compatible with {list(shape)}"
            )
        g = _sum_to(g, shape)
    if type(g) is xp.array_type:
        return g if g.dtype == dt else xp.astype(g, dt)
    if isinstance(g, tensor_type()):
        return g if g.dtype == dt else g.to(dt)
    return xp.asarray(g, dtype=dt)  # a numpy scalar from a 0-d computation


def _sum_to(g: Any, shape: tuple[int, ...]) -> Any:
    if isinstance(g, tensor_type()):
        return g.sum_to_size(shape)  # (differentiable: a create_graph gradient)
    return xp.math.sum_to(xp.asarray(g), shape)
