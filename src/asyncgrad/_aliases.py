"""numpy's keyword names accepted beside PyTorch's: ``axis`` for ``dim``, ``keepdims`` for
``keepdim`` (PyTorch itself accepts ``axis``), so ``x.sum(axis=0)`` works as in numpy.

Only the keywords are renamed; positional calls do not pay for the check beyond one
``if kwargs``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

_F = TypeVar("_F", bound=Callable[..., Any])

# numpy's name -> PyTorch's name
NUMPY_ALIASES = {"axis": "dim", "keepdims": "keepdim"}


def numpy_aliases(fn: _F) -> _F:
    """Let ``fn`` (which takes ``dim``/``keepdim``) also be called with ``axis``/``keepdims``.

    Raises ``TypeError`` naming both spellings when a call gives a keyword and its alias.
    """
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            for alias, canonical in NUMPY_ALIASES.items():
                if alias in kwargs:
                    if canonical in kwargs:
                        raise TypeError(f"{name}() got both '{canonical}' and its numpy alias '{alias}'; "
                                        f"pass only one")
                    kwargs[canonical] = kwargs.pop(alias)
        return fn(*args, **kwargs)

    return cast(_F, wrapper)
