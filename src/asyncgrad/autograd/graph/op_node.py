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


# Note [An OpNode's one edge in its slot]: a deep graph's memory is mostly per node, and
# most built-in nodes have one edge that needs a gradient, from their first input, output
# 0 of its producer (``sin(x)``; ``x * c`` and ``x + d`` with constants ``c`` and ``d``).
# As tuples, ``((producer, 0),)`` or ``((producer, 0), (None, 0))``, those edges cost two
# tuples per node, almost as much as the node itself. So such an OpNode's slot ``_edges``
# holds the producer alone (a Node, never a tuple); every other node's holds its tuple
# of edges, and the slot's type tells the forms apart. The number of forward inputs,
# which the tuple's length gave, is that of ``input_shapes`` (one per input), so
# ``next_edges`` (and ``next_functions``) builds the tuple from the bare node whenever
# asked: every reader off the hot paths takes it (hooks, pruning, placement, tools). The
# hot readers read the slot and take the one child as the edge ``(child, 0)`` of input
# 0, the others leading nowhere: the flat schedule's walk and loop and its fused runs,
# the dynamic walk and router, the plain step, ``apply`` and ``validate_outputs``.
# ``record`` (and ``OpNode.__init__``, through ``compact_edges``) makes the bare form;
# nothing changes a node's edges once it is built.


def compact_edges(edges: tuple[Any, ...]) -> Any:
    """An OpNode's ``_edges`` for ``edges`` (Note [An OpNode's one edge in its slot])."""
    if edges and edges[0][0] is not None and edges[0][1] == 0 and all(e[0] is None for e in edges[1:]):
        return edges[0][0]
    return edges


class OpNode(Node):
    """The node of a built-in primitive: its spec, saved values and backward params.

    ``saved`` is laid out as the rules' arguments ``(ans, x, y, ...)`` and holds the raw
    values (arrays, constant operands, None where no needed rule reads the value), so a
    plain backward passes it to the rules as it is; ``()`` means nothing was saved,
    ``None`` that the saved values were released. ``checks`` is the SavedTensors behind
    those arrays, for the version check and to rebuild Tensors under create_graph; its
    slot ``_checks`` holds one of them bare (Note [Shared one-entry checks] in saved.py).
    ``saved`` and a SavedTensor may be shared with other nodes: they are never changed,
    only rebound. The edges' slot ``_edges`` may hold one node bare (Note [An OpNode's one
    edge in its slot]). ``factor`` is set when the node can be in a fused run of the flat
    schedule (Note [Fused runs] in autograd/sched/runs.py): the factor of its one input
    that needs a gradient.
    """

    __slots__ = ("spec", "saved", "_checks", "params", "input_shapes", "input_dtypes", "work", "factor")

    def __init__(self, spec: OpSpec, edges: tuple[Any, ...], params: dict[str, Any] | None,
                 aux: Any, meta: tuple[tuple[Any, ...], tuple[Any, ...]], work: int) -> None:
        Node.__init__(self, compact_edges(edges))
        self.spec = spec
        self.saved: tuple[Any, ...] | None = ()
        self._checks: Any = ()
        # a forward's auxiliary constant (max's tie weights...) travels as the rule's
        # ``aux`` keyword, so it needs no slot of its own
        self.params = params if aux is None else {**(params or {}), "aux": aux}
        self.input_shapes, self.input_dtypes = meta
        self.work = work
        self.factor: GradFactor | None = None

    def name(self) -> str:
        return self.spec.node_name

    @property
    def next_edges(self) -> tuple[Any, ...]:
        """One edge ``(node, input_nr)`` per forward input, built from the slot's bare node
        when it holds one (Note [An OpNode's one edge in its slot])."""
        edges = self._edges
        if type(edges) is tuple:
            return edges
        return ((edges, 0),) + (NO_EDGE,) * (len(self.input_shapes) - 1)

    @property
    def checks(self) -> tuple[Any, ...]:
        """The node's saved tensors (SavedTensors or HookedSavedTensors), for the version
        check: ``_checks`` as a tuple (Note [Shared one-entry checks] in saved.py)."""
        checks = self._checks
        return checks if type(checks) is tuple else (checks,)

    def rule_args(self, m: Any) -> tuple[Any, dict[str, Any] | None]:
        """The rules' arguments ``(ans, x, y, ...)`` and keyword params, unpacked (with
        the in-place modification check)."""
        saved = self.saved
        if saved is None:
            raise RuntimeError(FREED_MESSAGE)
        checks = self._checks
        if m.tensor_mode or type(checks) is HookedSavedTensor \
                or (type(checks) is tuple and checks and type(checks[0]) is HookedSavedTensor):
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
        checks = self._checks
        if type(checks) is tuple:
            for e in checks:
                if e.version.value != e.saved_version:
                    e.unpack_array(self)  # raises the in-place modification error
        elif checks.version.value != checks.saved_version:
            checks.unpack_array(self)
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
        edges = self._edges
        if type(edges) is tuple:
            return self._apply_over(edges, grads, m)
        # one edge, input 0's (Note [An OpNode's one edge in its slot]): its rule alone
        g = grads[0]
        n = len(self.input_shapes)
        if g is None:
            return [None] * n
        args, params = self.rule_args(m)
        rule: Any = self.spec.vjps[0]  # (an edge that needs a gradient has a rule)
        if self.spec.variadic:
            gi = rule(m, g, *args, index=0, **(params or {}))
        else:
            gi = rule(m, g, *args, **params) if params else rule(m, g, *args)
        return [gi] if n == 1 else [gi] + [None] * (n - 1)

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
            self._checks = ()


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
