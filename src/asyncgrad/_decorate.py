"""Using a context manager as a decorator, on plain, generator and ``async def``
functions alike (grad mode, anomaly mode)."""

from __future__ import annotations

import functools
import inspect
import warnings
from contextlib import AbstractContextManager
from typing import Any, TypeVar
from collections.abc import Callable

F = TypeVar("F", bound=Callable[..., Any])

_CLASS_WARNING = (
    "Decorating classes is deprecated and will be disabled in future versions. You should only decorate "
    "functions or methods. To preserve the current behavior of class decoration, you can directly "
    "decorate the `__init__` method and nothing else."
)


def decorate(fn: F, make_context: Callable[[], AbstractContextManager[Any]]) -> F:
    """Wrap ``fn`` so every call (every resumption, for a generator) runs inside a fresh
    ``make_context()``. A fresh context each time keeps concurrent calls independent.
    A class is constructed inside it, with PyTorch's FutureWarning."""
    if inspect.isclass(fn):
        warnings.warn(_CLASS_WARNING, FutureWarning, stacklevel=3)
        cls = fn

        def construct(*args: Any, **kwargs: Any) -> Any:
            with make_context():
                return cls(*args, **kwargs)
        return construct  # type: ignore[return-value]
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with make_context():
                return await fn(*args, **kwargs)
        return async_wrapper  # type: ignore[return-value]
    if inspect.isgeneratorfunction(fn):
        return _wrap_generator(fn, make_context)  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with make_context():
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def _wrap_generator(fn: Callable[..., Any], make_context: Callable[[], AbstractContextManager[Any]]
                    ) -> Callable[..., Any]:
    """A generator function whose body runs inside ``make_context()`` each time it is
    resumed, whether by ``send``, ``throw`` or ``close``: an exception thrown into the
    wrapper is thrown into the generator, and closing the wrapper closes the generator
    there and then, so its ``except``/``finally`` blocks run under the decorator's mode
    (as PyTorch's ``_wrap_generator`` does)."""
    @functools.wraps(fn)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
        gen = fn(*args, **kwargs)
        try:
            with make_context():
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with make_context():
                        gen.close()
                    raise
                except BaseException as e:
                    with make_context():
                        response = gen.throw(e)
                else:
                    with make_context():
                        response = gen.send(request)
        except StopIteration as stop:
            return stop.value
    return gen_wrapper
