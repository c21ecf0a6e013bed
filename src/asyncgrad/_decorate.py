"""Using a context manager as a decorator, on plain, generator and ``async def``
functions alike (grad mode, anomaly mode)."""

from __future__ import annotations

import functools
import inspect
from contextlib import AbstractContextManager
from typing import Any, TypeVar
from collections.abc import Callable

F = TypeVar("F", bound=Callable[..., Any])


def decorate(fn: F, make_context: Callable[[], AbstractContextManager[Any]]) -> F:
    """Wrap ``fn`` so every call (every resumption, for a generator) runs inside a fresh
    ``make_context()``. A fresh context each time keeps concurrent calls independent."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with make_context():
                return await fn(*args, **kwargs)
        return async_wrapper  # type: ignore[return-value]
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            gen = fn(*args, **kwargs)
            value = None
            while True:
                with make_context():
                    try:
                        item = gen.send(value)
                    except StopIteration as stop:
                        return stop.value
                value = yield item
        return gen_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with make_context():
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]
