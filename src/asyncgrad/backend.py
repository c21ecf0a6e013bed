"""The array library the engine reaches gradients through: one namespace, ``xp``, holding
the operations the engine itself performs on gradients (``ArrayBackend`` lists them), and
the math namespace ``xp.math`` that derivative rules get as ``m`` in a plain backward.

Note [One array backend]: the engine core (autograd's task/, sched/ and runtime/) routes,
sums, stages and commits gradients without knowing which library made them. It asks
``xp`` whether a value is one of the backend's arrays (``type(g) is xp.array_type``, an
exact type test as cheap as numpy's own), adds through it, and asks it whether an array
is the engine's to write into (``xp.owns_memory``; Note [Owned gradients] in
autograd/task/step.py). The graph layer checks and fixes gradients through it too
(autograd/graph/validate.py, accumulate.py) and the public calls make root gradients with
it (autograd/api.py). ``xp`` is one object whose attributes are the active backend's
operations, so every module that imported it sees ``use_backend`` switch it. numpy's
operations are numpy's own functions where one does the job (``np.asarray``,
``np.result_type``, ``np.add.reduce`` over axis 0...), so the numpy path pays no call of
ours for them; the others (``owns_memory``, ``add_into``...) are one-line functions
called per gradient sent to a leaf or per sum, not per node. Switch between backward
calls, not while one runs.

numpy is the one shipped backend. Another library plugs in with an object that has the
names of ``ArrayBackend`` (``asyncgrad.backend_array_api.ArrayApiBackend`` adapts any
array-API namespace). A Tensor holds an array of the active backend (``Tensor(array)``
wraps one without a copy), and the engine runs any graph over such arrays unchanged.
What a backend does not change: built-in ops (``ops/``, Tensor's methods, ``ag.*``)
compute their forward with numpy, and many of their derivative rules have numpy-only
paths. So with another backend a model's forward is written with custom ``Function``s
that compute with that library; a built-in op's node recorded over the backend's arrays
(``graph.record.record``) runs its rules with the backend's math namespace, which works
for rules written only with ``m``'s names and array operators (2-D ``matmul``, ``add``,
``mul``, ``relu``, ``sum``: tests/test_array_backend.py runs such an MLP).
"""

from __future__ import annotations

from collections.abc import Callable
import operator
import sys
from functools import partial
from types import TracebackType
from typing import Any, Protocol, cast

import numpy as np

from .ops._array_math import ARRAY_MATH

Array = Any  # an array of the backend (for annotations)


class ArrayBackend(Protocol):
    """What the engine does with gradients, and nothing else: every operation the engine
    core and the graph layer perform on an array goes through one of these."""

    name: str
    array_type: type  # ``type(g) is array_type``: one of this backend's arrays (exactly)
    math: Any  # the rules' ``m`` in a plain backward (ops/_array_math.py's names)

    def asarray(self, obj: Any, dtype: Any = None) -> Array:
        """``obj`` as one of this backend's arrays (no copy when it is one)."""

    def astype(self, a: Any, dtype: Any) -> Array:
        """A new array: ``a``'s values in ``dtype`` (never ``a`` itself)."""

    def ones(self, shape: tuple[int, ...], dtype: Any) -> Array:
        """A new array of ones."""

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Array:
        """A new array of zeros."""

    def result_type(self, *arrays: Any) -> Any:
        """The dtype that adding ``arrays`` gives."""

    def is_floating(self, dtype: Any) -> bool:
        """Whether ``dtype`` is a real floating type (only those get gradients)."""

    def add_into(self, a: Array, b: Any) -> Any:
        """``a += b`` in place, ``b`` cast to ``a``'s dtype; ``a`` is the engine's own."""

    def sum_as(self, a: Array, b: Any) -> Array:
        """``a + b`` as a new array of ``a``'s dtype (a commit's fresh sum)."""

    def sum_leading(self, a: Array) -> Array:
        """``a`` summed over its first axis (a gradient one broadcast axis too large)."""

    def owns_memory(self, a: Array) -> bool:
        """``a`` is no view of another array and may be written: new memory a kernel
        made, which the engine may keep and later add into (Note [Owned gradients])."""

    def writeable(self, a: Array) -> bool:
        """``a`` may be written in place (a ``.grad`` the commit adds into)."""


OPERATIONS = ("name", "array_type", "math", "asarray", "astype", "ones", "zeros", "result_type",
              "is_floating", "add_into", "sum_as", "sum_leading", "owns_memory", "writeable")


def _is_floating(dtype: Any) -> bool:
    return dtype.kind == "f"  # type: ignore[no-any-return]


def _sum_as(a: np.ndarray, b: Any) -> np.ndarray:
    # (asarray: np.add of 0-d arrays returns a numpy scalar, not an array)
    return np.asarray(np.add(a, b, dtype=a.dtype, casting="unsafe"))


# Note [A whole view of new memory]: a rule that builds its result in another shape and
# returns ``out.reshape(shape)`` hands the engine a view whose base is an array nothing
# else holds; judged "a view", every such leaf gradient (batch norm's, max-pool's, a
# linear bias's, a layer norm's...) was copied at the commit, a whole pass over memory
# per leaf. So a view counts as owned when it is C-contiguous and covers all of its base,
# and the base is new memory (no base of its own) that only this view refers to: nobody
# could see a write through it. "Only this view" is read from the base's reference
# count, which is calibrated at import (how an interpreter counts references on the
# stack changes between versions, and 3.14 borrows some); where the count cannot tell
# a second holder apart, views are never owned, and copied as before.
def _base_refs(a: np.ndarray) -> int:
    base = a.base  # (as in _owns_memory: the view's reference, this name, the argument)
    return sys.getrefcount(base)


def _calibrate() -> int:
    alone = _base_refs(np.empty(4).reshape(2, 2))
    held = np.empty(4)
    if _base_refs(held.reshape(2, 2)) != alone + 1:
        return -1  # (the count does not see a second holder: never own a view)
    return alone


_BASE_ALONE = _calibrate()


def _owns_memory(a: np.ndarray) -> bool:
    if not a.flags.writeable:
        return False
    base = a.base
    if base is None:
        return True
    return (type(base) is np.ndarray and base.base is None and a.flags.c_contiguous
            and a.nbytes == base.nbytes and sys.getrefcount(base) == _BASE_ALONE)


class NumpyBackend:
    """numpy as the engine sees it: numpy's own functions where one does the job."""

    name = "numpy"
    array_type: type = np.ndarray
    math = ARRAY_MATH
    asarray = staticmethod(np.asarray)
    astype = staticmethod(np.array)  # np.array(a, dtype): a new array (numpy scalars too)
    ones = staticmethod(np.ones)
    zeros = staticmethod(np.zeros)
    result_type = staticmethod(np.result_type)
    is_floating = staticmethod(_is_floating)
    # ``a += b``: numpy's in-place add (same-kind casting; gradients reach a ``.grad``
    # in its dtype, graph/validate.py), a C call with no Python frame, as is the test
    add_into = staticmethod(operator.iadd)
    sum_as = staticmethod(_sum_as)
    sum_leading = staticmethod(partial(np.add.reduce, axis=0))
    owns_memory = staticmethod(_owns_memory)
    writeable = staticmethod(operator.attrgetter("flags.writeable"))


# (a cast: numpy's overloaded signatures are wider than the protocol's, not narrower)
NUMPY = cast(ArrayBackend, NumpyBackend())


class ActiveBackend:
    """``xp``: the active backend's operations as this one object's attributes (Note [One
    array backend]); ``backend`` is the backend object itself."""

    backend: ArrayBackend
    name: str
    array_type: Any  # (Any: a type test on it narrows nothing)
    math: Any
    asarray: Callable[..., Any]
    astype: Callable[[Any, Any], Any]
    ones: Callable[[tuple[int, ...], Any], Any]
    zeros: Callable[[tuple[int, ...], Any], Any]
    result_type: Callable[..., Any]
    is_floating: Callable[[Any], bool]
    add_into: Callable[[Any, Any], Any]
    sum_as: Callable[[Any, Any], Any]
    sum_leading: Callable[[Any], Any]
    owns_memory: Callable[[Any], bool]
    writeable: Callable[[Any], bool]

    def __init__(self, backend: ArrayBackend) -> None:
        self.install(backend)

    def install(self, backend: ArrayBackend) -> None:
        """Make ``backend`` the active one (checked first: a refusal changes nothing)."""
        missing = [n for n in OPERATIONS if not hasattr(backend, n)]
        if missing:
            raise TypeError(f"{type(backend).__name__} is not an array backend: it has no "
                            f"{', '.join(missing)} (asyncgrad.backend.ArrayBackend lists them)")
        for n in OPERATIONS:
            setattr(self, n, getattr(backend, n))
        self.backend = backend

    def __repr__(self) -> str:
        return f"<asyncgrad array backend {self.name!r}>"


xp = ActiveBackend(NUMPY)


class use_backend:
    """Make ``backend`` the array backend the engine uses, from now on; as a context
    manager, until the block ends (then the previous one is back)::

        with use_backend(ArrayApiBackend(array_api_strict)):
            await ag.backward(loss)

    Switch between backward calls, not while one runs (Note [One array backend])."""

    def __init__(self, backend: ArrayBackend) -> None:
        self.previous = xp.backend
        xp.install(backend)

    def __enter__(self) -> ArrayBackend:
        return xp.backend

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        xp.install(self.previous)


def active_backend() -> ArrayBackend:
    """The array backend the engine uses now (numpy unless ``use_backend`` changed it)."""
    return xp.backend
