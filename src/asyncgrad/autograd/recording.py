"""Recording: turning a call of a primitive (an :class:`OpSpec`) into a Tensor and a node.

This is the forward hot path: run the numpy kernel, and only when grad mode is on and
some input requires grad, build one :class:`OpNode` that saves what the rule needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _context
from ..ops._spec import OpSpec
from ..tensor import Tensor, _init
from .validation import validate_one
from .graph import FREED_MESSAGE, NO_EDGE, AccumulateGrad, HookedSavedTensor, Node, SavedTensor, save_for_backward

_grad_enabled = _context.grad_enabled
# A BLAS multiply-add costs about this fraction of an elementwise pass over one element
# (Note [Inline or offload] in policy.py): a matrix product's backward counts as
# (output elements x inner dimension) / this many elements of work.
MULTIPLY_ADDS_PER_ELEMENT = 4
_wrap = Tensor._wrap
_nonleaf = Tensor._nonleaf
_for_leaf = AccumulateGrad.for_leaf
_new_tensor = object.__new__
_anomaly = _context.anomaly_mode


class OpNode(Node):
    """The node of a built-in primitive: its spec, saved values and backward params.

    ``saved`` is laid out as the rules' arguments ``(ans, x, y, ...)`` and holds the raw
    values (arrays, constant operands, None where no needed rule reads the value), so a
    plain backward passes it to the rules as it is. ``checks`` holds the SavedTensors
    behind those arrays (with their position), for the version check and to rebuild
    Tensors under create_graph. ``()`` means nothing was saved; ``None`` that the saved
    values were released.
    """

    __slots__ = ("spec", "saved", "checks", "params", "input_shapes", "input_dtypes", "work")

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
        g = grads[0]
        edges = self.next_edges
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
        if self.saved:
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


def record_views(node_name: str, rule: Any, x: Any, outs: list[np.ndarray], params: dict[str, Any]) -> list[Any]:
    """Wrap the arrays ``outs`` (views of ``x``) as Tensors that share one
    :class:`MultiViewNode` when grad mode is on and ``x`` requires grad."""
    if not _grad_enabled.get() or not x._requires_grad:
        return [_wrap(o) for o in outs]
    node = MultiViewNode(node_name, rule, x._gradient_edge(), params, len(outs), x.data.shape, x.data.dtype)
    if _anomaly.get() is not None:
        from .anomaly_mode import record_forward_trace

        record_forward_trace(node)
    return [_nonleaf(o, node, i, None) for i, o in enumerate(outs)]


# Input shapes/dtypes tuples are interned: nodes with the same input signature share one
# pair of tuples instead of allocating their own (graph memory per node matters for deep
# graphs). The cache is bounded so that ever-changing shapes cannot grow it without limit.
_META_CACHE: dict[tuple[Any, ...], tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
_META_CACHE_MAX = 4096


def _meta(key: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    meta = _META_CACHE.get(key)
    if meta is None:
        meta = (key[0::2], key[1::2])
        if len(_META_CACHE) < _META_CACHE_MAX:
            _META_CACHE[key] = meta
    return meta


def record(spec: OpSpec, inputs: tuple[Any, ...], out: np.ndarray, aux: Any = None,
           params: dict[str, Any] | None = None) -> Any:
    """Wrap ``out`` (already computed from ``inputs``) as a Tensor, recording a node when
    grad mode is on and some input requires grad. Non-Tensor inputs are constants.

    The forward's hot path (every op of every forward): it reads slots directly and
    inlines ``Tensor._gradient_edge`` and ``Tensor._nonleaf``."""
    if type(out) is not np.ndarray:
        out = np.asarray(out)
    if not _grad_enabled.get():
        return _wrap(out)
    edges: list[Any] = []
    key: list[Any] = []
    requires = False
    for t in inputs:
        if type(t) is Tensor and t._requires_grad:
            requires = True
            fn = t.grad_fn
            edges.append((fn, t.output_nr) if fn is not None else (_for_leaf(t), 0))
            d = t._data
            key.append(d.shape)
            key.append(d.dtype)
        else:
            edges.append(NO_EDGE)
            key.append(None)
            key.append(None)
    if not requires:
        return _wrap(out)
    node = OpNode(spec, tuple(edges), params, aux, _meta(tuple(key)), 0)
    result = _new_tensor(Tensor)
    _init(result, out, node, 0, None)
    result._requires_grad = True
    # elements the kernel reads: the incoming gradient and every saved array, scaled by
    # the op's cost factor; a matrix product's by its multiply-adds (Note [Inline or
    # offload] in policy.py)
    work = out.size
    if spec.save_inputs or spec.save_ans:
        # laid out as the rules' arguments: (ans, input 0, input 1, ...)
        saved: list[Any] = list(spec.no_args)
        checks: list[Any] = []
        for pos, users in zip(spec.save_inputs, spec.save_when):
            if users is not None:
                for u in users:
                    if edges[u] is not NO_EDGE:
                        break
                else:
                    continue  # no rule that would read it will run
            v = inputs[pos]
            if type(v) is Tensor:
                entry = save_for_backward(v)
                if type(entry) is HookedSavedTensor:
                    entry.pos = pos + 1
                if entry not in checks:
                    checks.append(entry)
                    if type(entry) is SavedTensor:
                        work += entry.data.size
                saved[pos + 1] = entry.data
            else:
                saved[pos + 1] = v
        if spec.save_ans:
            entry = save_for_backward(result, is_output=True)
            if type(entry) is HookedSavedTensor:
                entry.pos = 0
            else:
                work += out.size  # (its array is ``out``)
            checks.append(entry)
            saved[0] = entry.data
        node.saved = tuple(saved)
        node.checks = tuple(checks)
    if spec.blas:
        first = inputs[0]._data if type(inputs[0]) is Tensor else np.asarray(inputs[0])
        work += out.size * (first.shape[-1] if first.ndim else 1) // MULTIPLY_ADDS_PER_ELEMENT
    node.work = work if spec.cost == 1.0 else int(work * spec.cost)
    if _anomaly.get() is not None:
        from .anomaly_mode import record_forward_trace

        record_forward_trace(node)
    return result

