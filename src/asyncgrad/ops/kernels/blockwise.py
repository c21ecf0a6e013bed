"""Fused elementwise kernels in numpy, evaluated block by block (plain backward and forward
only; under ``create_graph`` the rules use their composite form, see ``ops/nn.py``). They
are the path used when the compiled kernels (``ops/kernels/numba_kernels.py``) are not loaded.

Why blocks: a numpy expression of k ufuncs over n elements streams k temporaries of n
elements through main memory, and with glibc's default thresholds every fresh temporary
above 128 KB is mmap'd and page-faulted in again. Evaluating it on blocks of :data:`BLOCK`
elements keeps the temporaries in L2 cache and lets malloc reuse them. The 24-ufunc float32
``erf`` (``special.erf_f32_block``), on 1024x512 floats, one thread (medians, this machine):

    blocks of 16,384: 4.0 ms   65,536: 2.3 ms   131,072: 1.8 ms   whole array: 9.5 ms
    the same after the engine raised malloc's thresholds (no page faults):
    blocks of 16,384: 2.7 ms   65,536: 2.0 ms   131,072: 2.0 ms   whole array: 1.95 ms

so 65,536 elements (256 KB of float32): near the best either way. Each kernel takes and
returns blocks of the same shape; the result is a fresh array of the kernel's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

BLOCK = 65536  # elements: 256 KB of float32 (see above)

Kernel = Callable[..., np.ndarray]


def blockwise(kernel: Kernel, *arrays: np.ndarray) -> np.ndarray:
    """``kernel(*arrays)`` evaluated on aligned blocks of same-shaped arrays, into one
    fresh array of the first array's shape. Arrays of different shapes (broadcasting)
    or small ones are passed to ``kernel`` whole."""
    first = arrays[0]
    n = first.size
    if n <= 2 * BLOCK or any(a.shape != first.shape for a in arrays[1:]):
        # kernels use out= and in-place ops, which need arrays, not the numpy scalars
        # that ufuncs return for 0-d input
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        return kernel(*(a if a.ndim else a.reshape(1) for a in arrays)).reshape(shape)
    flat = [a.reshape(-1) for a in arrays]  # a copy only for non-contiguous input
    head = kernel(*(f[:BLOCK] for f in flat))
    out = np.empty(n, dtype=head.dtype)
    out[:BLOCK] = head
    for s in range(BLOCK, n, BLOCK):
        out[s:s + BLOCK] = kernel(*(f[s:s + BLOCK] for f in flat))
    return out.reshape(first.shape)


# --- GELU ------------------------------------------------------------------------------------
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_C = 0.044715


def gelu_exact_backward_block(g: np.ndarray, x: np.ndarray, cdf: np.ndarray) -> np.ndarray:
    """``g * (Phi(x) + x * phi(x))`` from the forward's ``Phi(x)``; phi is the normal pdf."""
    f = x.dtype.type
    t = x * x
    t *= f(-0.5)
    np.exp(t, out=t)
    t *= f(_INV_SQRT_2PI)
    t *= x
    t += cdf
    t *= g
    return t


def gelu_tanh_block(x: np.ndarray) -> np.ndarray:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
    f = x.dtype.type
    t = x * x
    t *= f(_TANH_C)
    t += 1
    t *= x
    t *= f(_SQRT_2_OVER_PI)
    np.tanh(t, out=t)
    t += 1
    t *= x
    t *= f(0.5)
    return t


def gelu_tanh_backward_block(g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``g * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))`` with
    ``t = tanh(sqrt(2/pi) (x + 0.044715 x^3))``."""
    f = x.dtype.type
    x2 = x * x
    t = x2 * f(_TANH_C)
    t += 1
    t *= x
    t *= f(_SQRT_2_OVER_PI)
    np.tanh(t, out=t)
    d = x2  # d_inner = sqrt(2/pi) * (1 + 3c x^2), scaled by 0.5 x (1 - t^2)
    d *= f(3 * _TANH_C)
    d += 1
    d *= f(0.5 * _SQRT_2_OVER_PI)
    d *= x
    s = t * t
    np.subtract(1, s, out=s)
    d *= s
    t += 1
    t *= f(0.5)
    t += d
    t *= g
    return t
