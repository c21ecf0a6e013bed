"""What a custom Function records: ``FunctionNode`` (the ``<Name>Backward`` node) and
``FunctionCtx`` (the ``ctx`` its ``forward`` and ``backward`` share). Note [Function
gradients] in function/__init__.py says what the node does with the gradients it is handed.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _context
from ...backend import xp
from ...tensor import Tensor
from ..graph import Edge, Node
from ..graph.saved import FREED_MESSAGE

if TYPE_CHECKING:
    from . import Function

__all__ = ["FunctionCtx", "FunctionNode"]

_grad_enabled = _context.grad_enabled


class FunctionCtx:
    """The ``ctx`` passed to ``forward``/``setup_context`` and ``backward``.

    Besides the methods below, any attribute may be stored on it (``ctx.k = 3``).
    """

    def __init__(self) -> None:
        self.needs_input_grad: tuple[bool, ...] = ()
        self.materialize_grads = True
        self._to_save: tuple[Tensor | None, ...] = ()
        self._dirty: tuple[Tensor, ...] = ()
        self._non_differentiable: tuple[Tensor, ...] = ()
        # after apply: one saved entry (graph.save_for_backward's result) or None per value,
        # and the Tensor object itself for a saved input or intermediate (not an output:
        # that would be a cycle through the node), which ``saved_tensors`` hands back
        self._saved: list[Any] | None = None
        self._originals: list[Tensor | None] = []
        self._freed = False
        self._node_ref: weakref.ref[Node] | None = None

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        """Save tensors (inputs, outputs or intermediates) or None for ``backward``."""
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(
                    f"save_for_backward can only save variables, but argument {i} is of type "
                    f"{type(t).__name__}"
                )
        self._to_save = tensors

    @property
    def saved_tensors(self) -> tuple[Tensor | None, ...]:
        """The saved tensors; raises if one was modified in place since, or if the graph
        was freed by a backward without ``retain_graph``."""
        if self._freed:
            raise RuntimeError(FREED_MESSAGE)
        if self._saved is None:  # no node was built (or still inside forward)
            return tuple(self._to_save)
        node = self._node_ref() if self._node_ref is not None else None
        out: list[Tensor | None] = []
        for s, original in zip(self._saved, self._originals):
            if s is None:
                out.append(None)
            elif original is not None:  # the same object, as PyTorch returns it
                s.unpack_array(node)  # (the in-place modification check)
                out.append(original)
            else:
                out.append(s.unpack_tensor(node))
        return tuple(out)

    def mark_dirty(self, *tensors: Tensor) -> None:
        """Declare inputs that ``forward`` modified in place (they must be returned)."""
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors: Tensor) -> None:
        """Declare outputs that are not differentiable (``requires_grad=False``); their
        gradient still reaches ``backward``, as zeros."""
        self._non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """With False, ``backward`` receives None instead of zeros for unused outputs."""
        self.materialize_grads = bool(value)

    def _release(self) -> None:
        self._saved = None
        self._originals = []
        self._to_save = ()
        self._freed = True


class FunctionNode(Node):
    """The node of a custom Function; each Function gets a subclass ``<Name>Backward``."""

    __slots__ = ("ctx", "num_outputs", "input_shapes", "input_dtypes", "work", "output_meta",
                 "tensor_inputs", "non_diff")

    _function: type[Function]

    def __init__(self, edges: tuple[Edge, ...], ctx: FunctionCtx) -> None:
        Node.__init__(self, edges)
        self.ctx = ctx
        self.num_outputs = 1
        self.input_shapes: tuple[tuple[int, ...] | None, ...] = ()
        self.input_dtypes: tuple[np.dtype | None, ...] = ()
        self.work = 0
        self.output_meta: list[tuple[tuple[int, ...], np.dtype] | None] = []
        self.tensor_inputs: tuple[bool, ...] = ()
        self.non_diff: frozenset[int] = frozenset()

    # --- the engine's side ------------------------------------------------------------
    def is_async(self) -> bool:
        return self._function._async_backward

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        args = self._grad_outputs(grads)
        token = _grad_enabled.set(bool(m.tensor_mode))
        try:
            result = self._function._user_backward()(self.ctx, *args)
        finally:
            _grad_enabled.reset(token)
        return self._input_grads(result, m)

    async def apply_async(self, grads: list[Any], m: Any) -> list[Any]:
        args = self._grad_outputs(grads)
        token = _grad_enabled.set(bool(m.tensor_mode))
        try:
            result = await self._function._user_backward()(self.ctx, *args)
        finally:
            _grad_enabled.reset(token)
        return self._input_grads(result, m)

    def release_variables(self) -> None:
        self.ctx._release()

    # --- see Note [Function gradients] -----------------------------------------------
    def _grad_outputs(self, grads: list[Any]) -> list[Tensor | None]:
        ctx = self.ctx
        # PyTorch's private flag (set by torch.compile-style code): False hands None, not
        # zeros, for the gradients of outputs marked non-differentiable
        materialize_non_diff = getattr(ctx, "_materialize_non_diff_grads", True)
        out: list[Tensor | None] = []
        for i, meta in enumerate(self.output_meta):
            g = grads[i] if i < len(grads) else None
            if g is None:
                if meta is not None and ctx.materialize_grads and (
                        materialize_non_diff or i not in self.non_diff):
                    out.append(Tensor._wrap(xp.zeros(meta[0], meta[1])))
                else:
                    out.append(None)
            else:
                out.append(g if isinstance(g, Tensor) else Tensor._wrap(g))
        return out

    def _input_grads(self, result: Any, m: Any) -> list[Any]:
        name = self.name()
        if not isinstance(result, tuple):
            result = (result,)
        n = len(self.next_edges)
        if len(result) > n and all(g is None for g in result[n:]):
            result = result[:n]  # trailing Nones are allowed (PyTorch)
        if len(result) != n:
            raise RuntimeError(
                f"function {name} returned an incorrect number of gradients (expected {n}, "
                f"got {len(result)})"
            )
        out: list[Any] = []
        for i, (g, (edge_node, _)) in enumerate(zip(result, self.next_edges)):
            if g is None:
                out.append(None)
                continue
            if not self.tensor_inputs[i]:
                raise RuntimeError(
                    f"function {name} returned a gradient different than None at position "
                    f"{i + 1}, but the corresponding forward input was not a Variable"
                )
            if not isinstance(g, Tensor):
                raise TypeError(f"expected Variable or None (got {type(g).__name__})")
            if edge_node is None:  # the input does not require grad: dropped
                out.append(None)
            else:
                out.append(g if m.tensor_mode else g.data)
        return out
