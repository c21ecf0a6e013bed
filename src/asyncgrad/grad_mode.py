"""Grad mode: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``inference_mode``.

The flag is a ContextVar (``_context.grad_enabled``), not thread-local: two asyncio tasks
interleaving on one loop never see each other's mode, and kernels offloaded to threads
see the mode of the task that offloaded them. Each class works as a context manager and
as a decorator, on plain functions, generators and ``async def`` functions alike.
"""

from __future__ import annotations

from contextvars import Token
from typing import Any, TypeVar
from collections.abc import Callable

from . import _context
from ._decorate import decorate

F = TypeVar("F", bound=Callable[..., Any])


class _GradModeBase:
    """Sets grad mode to ``self.mode`` for the duration of a block or call."""

    mode: bool = True

    def __init__(self) -> None:
        self._tokens: list[Token[bool]] = []

    def __enter__(self) -> None:
        self._tokens.append(_context.grad_enabled.set(self.mode))

    def __exit__(self, *exc: object) -> None:
        _context.grad_enabled.reset(self._tokens.pop())

    def _clone(self) -> _GradModeBase:
        return type(self)()

    def __call__(self, fn: F) -> F:
        return decorate(fn, self._clone)


class _NoParamDecorator(_GradModeBase):
    """Also usable as a bare decorator, ``@no_grad`` (as PyTorch allows)."""

    def __new__(cls, orig_func: Callable[..., Any] | None = None) -> Any:
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class no_grad(_NoParamDecorator):
    """Disable recording of operations (context manager or decorator)."""

    mode = False


class enable_grad(_NoParamDecorator):
    """Enable recording of operations (context manager or decorator)."""

    mode = True


class set_grad_enabled(_GradModeBase):
    """Set grad mode: as a plain call it switches the current context's mode at once; as a
    context manager or decorator it restores the previous mode afterwards."""

    def __init__(self, mode: bool) -> None:
        super().__init__()
        self.mode = bool(mode)
        self._prev = _context.grad_enabled.get()
        _context.grad_enabled.set(self.mode)

    def __enter__(self) -> None:
        # the mode was already set in __init__; remember how to undo it
        self._tokens.append(_context.grad_enabled.set(self.mode))

    def __exit__(self, *exc: object) -> None:
        _context.grad_enabled.reset(self._tokens.pop())
        _context.grad_enabled.set(self._prev)

    def __call__(self, fn: F) -> F:
        _context.grad_enabled.set(self._prev)  # decorating must not change the mode now
        return super().__call__(fn)

    def _clone(self) -> _GradModeBase:
        prev = _context.grad_enabled.get()
        clone = set_grad_enabled(self.mode)
        clone._prev = prev
        return clone


class inference_mode(_GradModeBase):
    """Behaves as ``no_grad`` (``inference_mode(False)`` as ``enable_grad``)."""

    def __new__(cls, mode: Any = True) -> Any:
        if isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)  # bare decorator: ``@inference_mode``

    def __init__(self, mode: bool = True) -> None:
        super().__init__()
        self.mode = not mode
        self._flag = mode
        self._inference_tokens: list[Token[bool]] = []

    def __enter__(self) -> None:
        super().__enter__()
        self._inference_tokens.append(_context.inference_enabled.set(self._flag))

    def __exit__(self, *exc: object) -> None:
        _context.inference_enabled.reset(self._inference_tokens.pop())
        super().__exit__(*exc)

    def _clone(self) -> _GradModeBase:
        return inference_mode(self._flag)


def is_grad_enabled() -> bool:
    """Whether operations are being recorded in the current context."""
    return _context.grad_enabled.get()


def is_inference_mode_enabled() -> bool:
    """True inside ``inference_mode()`` (in this context: task or thread)."""
    return _context.inference_enabled.get()
