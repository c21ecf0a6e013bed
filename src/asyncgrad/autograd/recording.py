"""Recording: turning a call of a primitive (an :class:`OpSpec`) into a Tensor and a node.

This is the forward hot path: run the numpy kernel, and only when grad mode is on and
some input requires grad, build one :class:`OpNode` that saves what the rule needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _context
from ..ops._spec import OpSpec
from .graph import NO_EDGE, FREED_MESSAGE, Node, SavedTensor

_grad_enabled = _context.grad_enabled
_anomaly = _context.anomaly_mode


class OpNode(Node):
    """The node of a built-in primitive: its spec, saved values and backward params."""

    __slots__ = ("spec", "saved", "params", "aux", "input_shapes", "input_dtypes", "work")

    def __init__(self, spec: OpSpec, edges: tuple[Any, ...], saved: tuple[Any, ...] | None,
                 params: dict[str, Any] | None, aux: Any, shapes: tuple[Any, ...],
                 dtypes: tuple[Any, ...], work: int) -> None:
        Node.__init__(self, edges)
        self.spec = spec
        self.saved = saved
        self.params = params
        self.aux = aux
        self.input_shapes = shapes
        self.input_dtypes = dtypes
        self.work = work

    def name(self) -> str:
        return self.spec.node_name

    def _unpack(self, tensor_mode: bool) -> list[Any]:
        saved = self.saved
        assert saved is not None
        spec = self.spec
        values: list[Any] = [None] * spec.arity
        if tensor_mode:
            for pos, s in zip(spec.save_inputs, saved):
                values[pos] = s.unpack_tensor()
            ans = saved[-1].unpack_tensor(self, 0) if spec.save_ans else None
        else:
            for pos, s in zip(spec.save_inputs, saved):
                values[pos] = s.unpack_array()
            ans = saved[-1].unpack_array() if spec.save_ans else None
        return [ans, *values]

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        g = grads[0]
        if g is None:  # a built-in node passes None on (PyTorch: undefined grads)
            return [None] * len(self.next_edges)
        saved = self.saved
        if saved is None:
            raise RuntimeError(FREED_MESSAGE)
        args = self._unpack(m.tensor_mode) if saved else [None] * (self.spec.arity + 1)
        params = self.params
        if params is not None and self.aux is not None:
            params = {**params, "aux": m.constant(self.aux)}
        elif self.aux is not None:
            params = {"aux": m.constant(self.aux)}
        out: list[Any] = []
        variadic = self.spec.variadic
        for i, (edge_node, _) in enumerate(self.next_edges):
            if edge_node is None:
                out.append(None)
                continue
            if variadic:
                rule = self.spec.vjps[0]
                assert rule is not None
                out.append(rule(m, g, *args, index=i, **(params or {})))
            else:
                rule = self.spec.vjps[i]
                assert rule is not None, f"{self.spec.node_name} has no rule for input {i}"
                out.append(rule(m, g, *args, **params) if params else rule(m, g, *args))
        return out

    def release_variables(self) -> None:
        # Nodes that saved nothing stay usable: the "second time" error is lazy (PyTorch 5.3).
        if self.saved:
            self.saved = None
            self.aux = None


def record(spec: OpSpec, inputs: tuple[Any, ...], out: np.ndarray, aux: Any = None,
           params: dict[str, Any] | None = None) -> Any:
    """Wrap ``out`` (already computed from ``inputs``) as a Tensor, recording a node when
    grad mode is on and some input requires grad. Non-Tensor inputs are constants."""
    from ..tensor import Tensor

    requires = False
    if _grad_enabled.get():
        for t in inputs:
            if type(t) is Tensor and t._requires_grad:
                requires = True
                break
    if not requires:
        return Tensor._wrap(out)
    edges: list[Any] = []
    shapes: list[Any] = []
    dtypes: list[Any] = []
    for t in inputs:
        if type(t) is Tensor and t._requires_grad:
            edges.append(t._gradient_edge())
            d = t.data
            shapes.append(d.shape)
            dtypes.append(d.dtype)
        else:
            edges.append(NO_EDGE)
            shapes.append(None)
            dtypes.append(None)
    node = OpNode(spec, tuple(edges), (), params, aux, tuple(shapes), tuple(dtypes), out.size)
    result = Tensor._nonleaf(out, node, 0, None)
    if spec.save_inputs or spec.save_ans:
        saved = [SavedTensor(inputs[i]) for i in spec.save_inputs]
        if spec.save_ans:
            saved.append(SavedTensor(result, is_output_of=node))
        node.saved = tuple(saved)
        node.work = out.size * (len(saved) + 1)
    if _anomaly.get() is not None:
        from .anomaly_mode import record_forward_trace

        record_forward_trace(node)
    return result
