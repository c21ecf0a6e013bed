"""Copy-like primitives behind in-place methods and casts: ``to(dtype)``, ``fill_``,
``zero_`` and ``copy_``. Their gradients pass ``g`` through or drop it."""

from __future__ import annotations

import numpy as np

from ._spec import defop


def _copy_forward(x: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``src`` broadcast to ``x``'s shape and dtype."""
    return np.broadcast_to(src, x.shape).astype(x.dtype)


to_copy = defop("ToCopyBackward0", lambda x: x, lambda m, g, ans, x: g)
fill = defop("FillBackward2", np.full_like, lambda m, g, ans, x: g * 0.0)
zero = defop("ZeroBackward0", np.zeros_like, fill.vjps[0])
copy = defop("CopyBackwards", _copy_forward, lambda m, g, ans, x, s: g * 0.0, lambda m, g, ans, x, s: g)
