"""Custom autograd Functions: ``Function`` and ``Function.apply``.

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
not require grad). Everything else follows PyTorch's ``torch.autograd.Function``:
its error messages, ``ctx`` methods, and the treatment of dirty, non-differentiable
and returned-input outputs (function_outputs.py).

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

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from .. import _context
from ..tensor import Tensor
from .function_node import FunctionCtx, FunctionNode
from .function_outputs import wrap_outputs
from .graph import NO_EDGE, Edge
from .once_differentiable import DelayedError, once_differentiable

# (the ctx, the node and once_differentiable live in modules of their own; this is
# their public path, as in PyTorch)
__all__ = ["DelayedError", "Function", "FunctionCtx", "FunctionNode", "InplaceFunction", "once_differentiable"]

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
        return wrap_outputs(cls, ctx, args, requires, tuple(edges), output, executable)


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


class InplaceFunction(Function):
    """PyTorch's ``InplaceFunction``: a Function whose instances carry an ``inplace`` flag
    (read by subclasses' legacy code); used through ``apply`` like any Function."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace
