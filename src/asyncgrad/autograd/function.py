"""Custom autograd Functions: ``Function``, its ``ctx`` and ``once_differentiable``.

    class Exp(ag.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp(); ctx.save_for_backward(y); return y
        @staticmethod
        def backward(ctx, g):              # may also be ``async def``
            (y,) = ctx.saved_tensors
            return g * y

``Exp.apply(x)`` runs ``forward`` under ``no_grad`` and, when grad mode is on and some
tensor argument requires grad, builds one node, ``ExpBackward``, with one edge per
forward argument (an invalid edge ``(None, 0)`` for non-tensors and for tensors that do
not require grad). Everything else follows PyTorch's ``torch.autograd.Function``
(``pytorch_engine_semantics.md`` §11).

Note [Function gradients]: the engine hands the node one gradient per forward output
(numpy arrays in a plain backward, Tensors under ``create_graph``). The node turns them
into Tensors for the user's ``backward`` (a missing one becomes zeros unless
``ctx.set_materialize_grads(False)``), runs it with grad mode = ``create_graph``, checks
the count and the types of what it returns (PyTorch's messages), drops gradients of
arguments that need none, and returns arrays again (Tensors under ``create_graph``).
Shapes and dtypes are then checked by the engine's ``validate_outputs``, which names
the node and the argument index.

Note [Async Functions]: an ``async def backward`` makes ``is_async()`` true; the engine
awaits ``apply_async`` on the backward's event loop while it keeps running other ready
nodes, and cancelling the backward cancels that await. A large synchronous Function
(``work`` counts the elements of its inputs, outputs and saved tensors) runs on a worker
thread like any large built-in node.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from typing import Any, TypeVar
from collections.abc import Callable

import numpy as np

from .. import _context
from ..tensor import Tensor
from .graph import FREED_MESSAGE, NO_EDGE, Edge, Node, SavedTensor
from .graph import save_for_backward as _save

__all__ = ["Function", "FunctionCtx", "FunctionNode", "once_differentiable"]

F = TypeVar("F", bound=Callable[..., Any])

_grad_enabled = _context.grad_enabled

_NOT_IMPLEMENTED_BACKWARD = (
    "You must implement either the backward or vjp method for your custom autograd.Function "
    "to use it with backward mode AD."
)
_LEGACY_CALL = (
    "Legacy autograd function with non-static forward method is deprecated. Please use "
    "new-style autograd function with static forward method. (Example: "
    "asyncgrad.autograd.Function's docstring)"
)
_DIRTY_NOT_RETURNED = (
    "Some elements marked as dirty during the forward method were not returned as output. "
    "The inputs that are modified inplace must all be outputs of the Function."
)
_DIRTY_NOT_INPUT = (
    "ctx.mark_dirty() received a tensor that was not an input. Only input Tensors that have "
    "been mutated should be passed to ctx.mark_dirty()."
)
ONCE_DIFFERENTIABLE_ERROR = (
    "trying to differentiate twice a function that was marked with @once_differentiable"
)


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
        out: list[Tensor | None] = []
        for i, meta in enumerate(self.output_meta):
            g = grads[i] if i < len(grads) else None
            if g is None:
                if meta is not None and ctx.materialize_grads:
                    out.append(Tensor._wrap(np.zeros(meta[0], dtype=meta[1])))
                else:
                    out.append(None)
            else:
                out.append(g if isinstance(g, Tensor) else Tensor._wrap(np.asarray(g)))
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


class Function:
    """Base class of custom autograd operations; see the module docstring.

    Subclasses define static ``forward(ctx, *args, **kwargs)`` (or ``forward(*args)``
    plus ``setup_context(ctx, inputs, output)``) and ``backward(ctx, *grad_outputs)``
    (a plain or an ``async def`` function), and are used through ``apply``.
    """

    _backward_cls: type[FunctionNode]
    _async_backward: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._backward_cls = type(f"{cls.__name__}Backward", (FunctionNode,),
                                 {"__slots__": (), "_function": cls})
        try:
            cls._async_backward = inspect.iscoroutinefunction(cls._user_backward())
        except RuntimeError:  # both backward and vjp: reported when backward runs
            cls._async_backward = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            f"{type(self)} should not be instantiated. Methods on autograd functions are all "
            "static, so you should invoke them on the class itself.",
            DeprecationWarning, stacklevel=2,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(_LEGACY_CALL)

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> Any:
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise NotImplementedError(_NOT_IMPLEMENTED_BACKWARD)

    @staticmethod
    def vjp(ctx: Any, *grad_outputs: Any) -> Any:
        raise NotImplementedError(_NOT_IMPLEMENTED_BACKWARD)

    @classmethod
    def _user_backward(cls) -> Callable[..., Any]:
        backward = _underlying(cls.__dict__.get("backward"), cls, "backward")
        vjp = _underlying(cls.__dict__.get("vjp"), cls, "vjp")
        base_backward, base_vjp = Function.backward, Function.vjp
        if backward is not base_backward and vjp is not base_vjp:
            raise RuntimeError("Implementing both 'backward' and 'vjp' for a custom Function is not allowed.")
        return cls.vjp if vjp is not base_vjp else cls.backward

    @classmethod
    def _uses_setup_context(cls) -> bool:
        return _underlying(None, cls, "setup_context") is not Function.setup_context

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run ``forward`` and, if anything requires grad, record a ``<Name>Backward`` node."""
        if cls is Function:
            raise RuntimeError("Function.apply must be called on a subclass of Function")
        setup_style = cls._uses_setup_context()
        if kwargs or setup_style:
            args, kwargs = _bind(cls, setup_style, args, kwargs)
        requires = tuple(isinstance(a, Tensor) and a._requires_grad for a in args)
        executable = _grad_enabled.get() and any(requires)
        ctx = FunctionCtx()
        ctx.needs_input_grad = requires if executable else (False,) * len(args)
        edges: list[Edge] = []
        if executable:
            edges = [a._gradient_edge() if r else NO_EDGE for a, r in zip(args, requires)]
        token = _grad_enabled.set(False)
        try:
            if setup_style:
                output = cls.forward(*args, **kwargs)
                cls.setup_context(ctx, args, output)
            else:
                output = cls.forward(ctx, *args, **kwargs)
        finally:
            _grad_enabled.reset(token)
        return _wrap_outputs(cls, ctx, args, requires, tuple(edges), output, executable)


def _underlying(value: Any, cls: type, name: str) -> Any:
    """The plain function behind a static/class method, for override checks."""
    if value is None:
        for klass in cls.__mro__:
            if name in klass.__dict__:
                value = klass.__dict__[name]
                break
    return getattr(value, "__func__", value)


_signatures: dict[Any, inspect.Signature] = {}


def _bind(cls: type[Function], setup_style: bool, args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional form of ``args``/``kwargs`` so keyword tensors get edges too (PyTorch's
    ``bind_default_args``). Keyword-only and ``**kwargs`` parameters stay keywords."""
    forward = cls.forward
    sig = _signatures.get(forward)
    if sig is None:
        sig = _signatures[forward] = inspect.signature(forward)
    if setup_style:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.args), dict(bound.kwargs)
    bound = sig.bind(None, *args, **kwargs)
    return tuple(bound.args[1:]), dict(bound.kwargs)


def _wrap_outputs(cls: type[Function], ctx: FunctionCtx, args: tuple[Any, ...],
                  requires: tuple[bool, ...], edges: tuple[Edge, ...], output: Any,
                  executable: bool) -> Any:
    is_tuple = isinstance(output, tuple)
    outputs = output if is_tuple else (output,)
    dirty_ids = {id(t) for t in ctx._dirty}
    returned_ids = {id(o) for o in outputs}
    if not dirty_ids <= returned_ids:
        raise RuntimeError(_DIRTY_NOT_RETURNED)
    input_ids = {id(a) for a in args if isinstance(a, Tensor)}
    for t in ctx._dirty:
        if id(t) not in input_ids:
            if t._base is not None:  # a view of an intermediate: PyTorch raises
                raise RuntimeError(_DIRTY_NOT_INPUT)
            warnings.warn(_DIRTY_NOT_INPUT, UserWarning, stacklevel=3)
    for t in ctx._dirty:
        t._version_counter.value += 1  # PyTorch's _mark_dirty bumps the version
    # ctx must not keep the tensors it was told about: a dirty tensor's grad_fn becomes
    # the node, which holds ctx (a reference cycle that only gc.collect() would free)
    ctx._dirty = ()
    non_differentiable, ctx._non_differentiable = ctx._non_differentiable, ()
    if not executable:
        for t in non_differentiable:
            if isinstance(t, Tensor) and t.grad_fn is None and id(t) not in input_ids:
                t._requires_grad = False
        return output

    node = cls._backward_cls(edges, ctx)
    non_diff_ids = {id(t) for t in non_differentiable}
    dirty_views: list[Tensor] = []
    new_outputs: list[Any] = []
    meta: list[tuple[tuple[int, ...], np.dtype] | None] = []
    non_diff: set[int] = set()
    done: dict[int, Tensor] = {}
    output_nr: dict[int, int] = {}  # id of an output (before and after wrapping) -> slot
    for i, o in enumerate(outputs):
        if not isinstance(o, Tensor):
            new_outputs.append(o)
            meta.append(None)
            continue
        meta.append((o.data.shape, o.data.dtype))
        if id(o) in done:  # the same tensor returned twice: the same object twice
            new_outputs.append(done[id(o)])
            continue
        if id(o) in non_diff_ids:
            non_diff.add(i)
            new = o if (o.grad_fn is None and not o._requires_grad) else _alias(o, None, 0)
        elif id(o) in dirty_ids:
            _rebase_dirty(o, node, i)
            if o._base is not None:
                dirty_views.append(o)
            new = o
        elif id(o) in input_ids or o.grad_fn is not None or o._requires_grad:
            new = _alias(o, node, i)  # an input returned as-is: a new view with our grad_fn
        else:
            o.grad_fn = node
            o.output_nr = i
            o._requires_grad = True
            new = o
        done[id(o)] = new
        output_nr[id(o)] = output_nr[id(new)] = i
        new_outputs.append(new)

    node.num_outputs = len(outputs)
    node.output_meta = meta
    node.non_diff = frozenset(non_diff)
    node.tensor_inputs = tuple(isinstance(a, Tensor) for a in args)
    node.input_shapes = tuple(a.data.shape if r else None for a, r in zip(args, requires))
    node.input_dtypes = tuple(a.data.dtype if r else None for a, r in zip(args, requires))
    saved: list[Any] = []
    originals: list[Tensor | None] = []
    work = sum(a.data.size for a in args if isinstance(a, Tensor))
    work += sum(int(np.prod(m[0])) for m in meta if m is not None)
    for value in ctx._to_save:
        if value is None:
            saved.append(None)
            originals.append(None)
            continue
        nr = output_nr.get(id(value))
        if nr is not None and new_outputs[nr].grad_fn is node:
            saved.append(_save(new_outputs[nr], True))  # no output -> node -> output cycle
            originals.append(None)
        else:
            entry = _save(value)
            saved.append(entry)
            originals.append(value if type(entry) is SavedTensor else None)
        work += value.data.size
    ctx._saved = saved
    ctx._originals = originals
    ctx._to_save = ()
    ctx._node_ref = weakref.ref(node)
    node.work = work
    if _context.anomaly_mode.get() is not None:
        from .anomaly_mode import record_forward_trace

        record_forward_trace(node)
    for view in dirty_views:  # (after saving: a saved dirty view is saved as an output)
        _record_on_base(view)
    return tuple(new_outputs) if is_tuple else new_outputs[0]


def _alias(t: Tensor, node: Node | None, output_nr: int) -> Tensor:
    """A new tensor sharing ``t``'s memory and version counter (a view of it)."""
    out = Tensor._nonleaf(t.data, node, output_nr, t._version_counter)
    out._base = t._base if t._base is not None else t
    return out


def _rebase_dirty(t: Tensor, node: Node, output_nr: int) -> None:
    """An input modified in place by forward: the same object, now an output of ``node``."""
    if t.grad_fn is None and t._requires_grad:
        raise RuntimeError("a leaf Variable that requires grad has been used in an in-place operation.")
    base = t._base
    if base is not None and base.grad_fn is None and (base._requires_grad or t._requires_grad):
        raise RuntimeError(
            "a view of a leaf Variable that requires grad is being used in an in-place operation."
        )
    old_node, old_nr = t.grad_fn, t.output_nr
    t.grad_fn = node
    t.output_nr = output_nr
    t._requires_grad = True
    if t._retains_grad and old_node is not None and old_node._hooks is not None:
        old_node._hooks.retains_grad.pop(old_nr, None)  # retain_grad follows the tensor
        t._retains_grad = False
        t.retain_grad()


def _record_on_base(view: Tensor) -> None:
    """A view that ``forward`` modified in place (marked dirty; its grad_fn is now the
    Function's node): record the change on its base too, as PyTorch does. The base
    becomes ``CopySlices(old base, the node's output)`` and the view a fresh view of the
    new base, so gradients reaching the base (or other views of it) flow through the
    Function's backward."""
    from .. import functional as F
    from ..grad_mode import enable_grad
    from ..tensor import _recordable_view_index

    base = view._base
    assert base is not None
    where = _recordable_view_index(view, base)
    out = Tensor._nonleaf(view.data, view.grad_fn, view.output_nr, None)
    with enable_grad():
        new_base = F.index_put(base._snapshot(), where, out, copy_slices=True)
        base._rebase(new_base.grad_fn)
        view._rebase(F.getitem(base, where).grad_fn)
    base._register_view(view)
    base._regenerate_views(skip=view)


# --------------------------------------------------------------------------------------
# once_differentiable
# --------------------------------------------------------------------------------------

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
        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(ctx: Any, *args: Any) -> Any:
        token = _grad_enabled.set(False)
        try:
            outputs = fn(ctx, *args)
        finally:
            _grad_enabled.reset(token)
        return _delay_error(ctx, args, outputs)
    return wrapper  # type: ignore[return-value]


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
