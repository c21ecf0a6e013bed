"""The array library the engine core (autograd's task/, sched/ and runtime/) reaches arrays
through: one namespace, ``xp``, with the few operations the engine itself performs on
gradients (derivative rules use the math namespace ``m``, ops/_array_math.py).

Note [One array backend]: the engine routes, sums and stages gradients without
knowing which library made them; it asks this namespace whether a value is one of its
arrays (``type(g) is xp.array_type``: an exact type test, as cheap as numpy's own) and
adds through it (``xp.add``, numpy's ufunc itself, so the hot path pays no extra call).
numpy is the one shipped backend; another library plugs in here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class NumpyBackend:
    """numpy as the engine sees it."""

    name = "numpy"
    array_type: type = np.ndarray  # ``type(g) is array_type``: one of this backend's arrays
    add = staticmethod(np.add)  # add(a, b, out=None, dtype=None, casting=...)
    asarray = staticmethod(np.asarray)
    result_type = staticmethod(np.result_type)


xp: Any = NumpyBackend()
Array = Any  # an array of the backend (for annotations)
