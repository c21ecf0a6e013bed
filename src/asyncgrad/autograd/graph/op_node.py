"""The nodes of built-in ops: :class:`OpNode` (one primitive's derivative rules, applied
to what its forward saved) and :class:`MultiViewNode` (several views of one input
returned together). ``record.py`` builds them; the engine runs them.

``record`` makes OpNodes without calling ``__init__`` (Note [The recording fast path] in
record.py): a slot added to OpNode must be set there too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ops._spec import GradFactor, OpSpec
from . import FREED_MESSAGE, NO_EDGE, HookedSavedTensor, Node
from .validate import validate_one


class OpNode(Node):
    """The node of a built-in primitive: its spec, saved values and backward params.

    ``saved`` is laid out as the rules' arguments ``(ans, x, y, ...)`` and holds the raw
    values (arrays, constant operands, None where no needed rule reads the value), so a
    plain backward passes it to the rules as it is. ``checks`` holds the SavedTensors
    behind those arrays (with their position), for the version check and to rebuild
    Tensors under create_graph. ``()`` means nothing was saved; ``None`` that the saved
    values were released. Both tuples may be shared with other nodes (Note [Shared
    one-entry checks] in saved.py): they are never changed, only rebound. ``factor`` is set
    when the node can be in a fused run of the flat schedule (Note [Fused runs] in
    autograd/sched/runs.py): the factor of its one input that needs a gradient.
    """

    __slots__ = ("spec", "saved", "checks", "params", "input_shapes", "input_dtypes", "work", "factor")

    def __init__(self, spec: OpSpec, edges: tuple[Any, ...], params: dict[str, Any] | None,
                 aux: Any, meta: tuple[tuple[Any, ...], tuple[Any, ...]], work: int) -> None:
        Node.__init__(self, edges)
        self.spec = spec
        self.saved: tuple[Any, ...] | None = ()
        self.checks: tuple[Any, ...] = ()
        # a forward's auxiliary constant (max's tie weights...) travels as the rule's
        # ``aux`` keyword, so it needs no slot of its own
        self.params = params if aux is None else {**(params or {}), "aux": aux}
        self.input_shapes, self.input_dtypes = meta
        self.work = work
        self.factor: GradFactor | None = None

    def name(self) -> str:
        return self.spec.node_name

    def rule_args(self, m: Any) -> tuple[Any, dict[str, Any] | None]:
        """The rules' arguments ``(ans, x, y, ...)`` and keyword params, unpacked (with
        the in-place modification check)."""
        saved = self.saved
        if saved is None:
            raise RuntimeError(FREED_MESSAGE)
        checks = self.checks
        if m.tensor_mode or (checks and type(checks[0]) is HookedSavedTensor):
            args: Any = list(saved) if saved else list(self.spec.no_args)
            for pos, e in self.saved_entries():
                args[pos] = e.unpack_tensor(self) if m.tensor_mode else e.unpack_array(self)
        else:
            args = self.plain_args()
        params = self.params
        if m.tensor_mode and self.spec.has_aux and params is not None:
            params = {**params, "aux": m.constant(params["aux"])}
        return args, params

    def plain_args(self) -> tuple[Any, ...]:
        """The saved arrays as the rules' arguments, once checked unmodified since saved
        (PyTorch's version-counter check; raises its error). Saved values not released,
        no saved-tensor hooks."""
        for e in self.checks:
            if e.version.value != e.saved_version:
                e.unpack_array(self)  # raises the in-place modification error
        return self.saved or self.spec.no_args

    def saved_entries(self) -> list[tuple[int, Any]]:
        """``(position among the rule arguments, SavedTensor)`` for every saved tensor.
        A SavedTensor may be shared by several nodes, so its position is found by the
        identity of its array (a hooked one, never shared, carries its position)."""
        saved = self.saved or ()
        out: list[tuple[int, Any]] = []
        for e in self.checks:
            if type(e) is HookedSavedTensor:
                out.append((e.pos, e))
            else:
                out.extend((k, e) for k, v in enumerate(saved) if v is e.data)
        return out

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        return self._apply_over(self.next_edges, grads, m)

    def apply_needed(self, grads: list[Any], m: Any, needed: frozenset[int]) -> list[Any]:
        """``apply`` computing only the gradients of the edges numbered in ``needed`` (a
        pruned backward's: ``grad()``, ``inputs=``), None for the others, as PyTorch's
        ``task_should_compute_output``: a saliency map's ``grad(loss, x)`` computes no
        weight gradient."""
        edges = self.next_edges
        if all(e[0] is None or i in needed for i, e in enumerate(edges)):
            return self._apply_over(edges, grads, m)
        return self._apply_over(tuple(e if i in needed else NO_EDGE for i, e in enumerate(edges)), grads, m)

    def _apply_over(self, edges: tuple[Any, ...], grads: list[Any], m: Any) -> list[Any]:
        """The gradients for ``edges`` (the node's, or some of them cut: ``apply_needed``):
        None where an edge leads nowhere."""
        g = grads[0]
        if g is None:  # a built-in node passes None on (PyTorch: undefined grads)
            return [None] * len(edges)
        args, params = self.rule_args(m)
        spec = self.spec
        vjps: tuple[Any, ...] = spec.vjps  # (an edge that needs a gradient has a rule)
        if spec.variadic:
            rule = vjps[0]
            return [None if node is None else rule(m, g, *args, index=i, **(params or {}))
                    for i, (node, _) in enumerate(edges)]
        if len(edges) == 1:  # unary: most nodes
            return [vjps[0](m, g, *args, **params) if params else vjps[0](m, g, *args)]
        mask = spec.joint_for(edges, m.tensor_mode)
        if mask is not None and spec.joint is not None:  # one call (Note [Joint rules])
            return list(spec.joint(g, *args, mask=mask, **(params or {})))
        if params:
            return [None if node is None else vjps[i](m, g, *args, **params)
                    for i, (node, _) in enumerate(edges)]
        return [None if node is None else vjps[i](m, g, *args)
                for i, (node, _) in enumerate(edges)]

    def apply_edge(self, i: int, grads: list[Any], m: Any,
                   unpacked: tuple[Any, dict[str, Any] | None]) -> Any:
        """The gradient for input ``i`` alone, validated, from arguments ``rule_args``
        unpacked once for the node: lets the engine compute the gradients of a large
        multi-input node (a linear layer's dx and dW) in parallel."""
        g = grads[0]
        if g is None:
            return None
        args, params = unpacked
        vjps: tuple[Any, ...] = self.spec.vjps
        if self.spec.variadic:
            out = vjps[0](m, g, *args, index=i, **(params or {}))
        else:
            out = vjps[i](m, g, *args, **(params or {}))
        return validate_one(self, i, out)

    def release_variables(self) -> None:
        # Nodes that saved nothing stay usable: the "second time" error is lazy (PyTorch 5.3).
        if self.saved or self.spec.saves_params:
            self.saved = None
            self.checks = ()


class MultiViewNode(Node):
    """The one node behind several views of one input returned together (``unbind``,
    ``split``, ``chunk``): one gradient slot per view, combined by ``rule(m, grads,
    **params)`` into the input's gradient in one pass (PyTorch's UnbindBackward0...)."""

    __slots__ = ("node_name", "rule", "params", "num_outputs", "input_shapes", "input_dtypes", "work")

    def __init__(self, node_name: str, rule: Any, edge: Any, params: dict[str, Any], num_outputs: int,
                 shape: tuple[int, ...], dtype: np.dtype) -> None:
        Node.__init__(self, (edge,))
        self.node_name = node_name
        self.rule = rule
        self.params = params
        self.num_outputs = num_outputs
        self.input_shapes = (shape,)
        self.input_dtypes = (dtype,)
        self.work = int(np.prod(shape, dtype=np.int64))

    def name(self) -> str:
        return self.node_name

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        if all(g is None for g in grads):
            return [None]
        return [self.rule(m, list(grads), **self.params)]
