"""Compiled kernels (numba): one pass per op where numpy needs several. Imported only by
``ops/kernels/loader.py``'s loader thread; never import it elsewhere (importing numba and loading
these kernels takes a few hundred ms).

Every kernel is compiled for float32 and float64 (explicit signatures: compiled, or loaded
from numba's cache, at import), takes C-contiguous arrays and writes into ``out`` arrays
the caller allocates. float32 stays float32: constants go through :func:`_c` and
accumulators start from a typed zero, as numba would promote ``x * 0.5`` to float64.

Note [Compiled exp]: LLVM without Intel's SVML cannot vectorise a call to ``expf``; a
softmax calling ``math.exp`` per element took 13.6 ms against PyTorch's 2.9. ``_exp``
is therefore written out so that LLVM vectorises it (24 instructions per 8 floats):
``x`` clamped to [-104, 88.75], ``k = round(x / ln2)`` read from the bits of
``x / ln2 + 1.5 * 2**23``, ``r = x - k ln2`` with ``ln2`` split in two constants,
``exp(r) = 1 + r + r^2 q(r)`` with ``q`` of degree 4 fitted near-minimax on
``|r| <= ln2/2`` (relative error 4e-9), and ``2**k`` as two normal factors built from
exponent bits, so subnormal results are rounded once. It is within 1.0 float32 ulp of
float64 ``np.exp`` over every 61st float32 in [-110, 88.8], subnormal results included
(Cephes' ``expf``, used before, reached 5.1 ulps and flushed to 0 below -87.34): 0 below
-103.97 and for ``-inf``, inf above 88.72283 and for ``+inf``, NaN propagated
(tests/test_compiled_exp.py). float64 calls libm's ``exp`` (exact; gradcheck).

Note [Fast-math flags]: the kernels allow reassociation (vectorised sums), contraction
(fused multiply-add) and reciprocals, but not ``nnan``/``ninf``/``nsz``: masked
attention feeds -inf to softmax and GELU(-0) is -0, as in PyTorch.
"""

from __future__ import annotations

import math
import os

import numpy as np
from llvmlite import ir  # (numba's own dependency; the row sums' vector intrinsic writes IR)
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import intra_op, loader

_FLAGS = {"reassoc", "contract", "arcp"}  # Note [Fast-math flags]
# numba's cache, unless turned off or the loader found no usable cache directory (it then
# imports this module again with loader._use_cache False)
_CACHE = loader._use_cache and os.environ.get("ASYNCGRAD_KERNELS_CACHE", "1") != "0"


def _jit(*sigs):  # type: ignore[no-untyped-def]
    return njit(list(sigs), nogil=True, fastmath=_FLAGS, cache=_CACHE, error_model="numpy")


def _jit_exact(*sigs):  # type: ignore[no-untyped-def]
    """As ``_jit`` without fast-math flags: numpy's operations, in order, rounded alike."""
    return njit(list(sigs), nogil=True, cache=_CACHE, error_model="numpy")


F32, F64 = types.float32, types.float64
A32, A64 = types.float32[::1], types.float64[::1]
M32, M64 = types.float32[:, ::1], types.float64[:, ::1]


# --- scalar helpers, resolved per float type at compile time ---------------------------------
def _c(x, v):  # type: ignore[no-untyped-def]
    """``v`` as a constant of ``x``'s float type."""


@overload(_c, inline="always")
def _c_impl(x, v):  # type: ignore[no-untyped-def]
    cast = np.float32 if x == F32 else np.float64
    return lambda x, v: cast(v)


@intrinsic
def _int_bits_as_f32(typingctx, bits):  # type: ignore[no-untyped-def]
    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], context.get_value_type(F32))
    return F32(types.int32), codegen


@intrinsic
def _f32_bits_as_int(typingctx, x):  # type: ignore[no-untyped-def]
    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], context.get_value_type(types.int32))
    return types.int32(F32), codegen


def _exp(x):  # type: ignore[no-untyped-def]
    """exp(x) in x's type (Note [Compiled exp])."""


@overload(_exp, inline="always", jit_options={"fastmath": _FLAGS})
def _exp_impl(x):  # type: ignore[no-untyped-def]
    if x != F32:
        return lambda x: math.exp(x)
    f = np.float32

    def exp_f32(x):  # type: ignore[no-untyped-def]
        # clamped to [-104, 88.75]: every result below rounds to 0, above overflows to inf
        # (so -inf gives 0 and +inf gives inf); NaN fails both tests and stays NaN
        c = x
        if c < f(-104.0):
            c = f(-104.0)
        if c > f(88.75):
            c = f(88.75)
        # k = round(c / ln2) read from the bits of c / ln2 + 1.5 * 2**23 (no float-to-int
        # conversion, undefined for NaN; no float subtraction for reassociation to cancel)
        # (int32 arithmetic written as such: numba widens int32 - int32 to int64)
        k = np.int32(_f32_bits_as_int(c * f(1.44269504088896341) + f(12582912.0)) - np.int32(0x4B400000))
        n = np.float32(k)
        r = c - n * f(0.693359375)  # ln2 = 0.693359375 - 2.12194440e-4 (+ 1e-12)
        r = r + n * f(2.12194440e-4)
        q = f(1.381461275741458e-3)
        q = q * r + f(8.368710055947304e-3)
        q = q * r + f(4.166838899254799e-2)
        q = q * r + f(1.666652113199234e-1)
        q = q * r + f(4.999999403953552e-1)
        p = q * (r * r) + r + f(1.0)
        k1 = k >> np.int32(1)  # 2**k as two normal factors, k in [-150, 128]
        y = p * _int_bits_as_f32((k1 + np.int32(127)) << np.int32(23))
        return y * _int_bits_as_f32((k - k1 + np.int32(127)) << np.int32(23))
    return exp_f32


def _erf(x):  # type: ignore[no-untyped-def]
    """erf(x) in x's type: float32 as ``blockwise.erf_f32_block`` (Eigen's rational)."""


@overload(_erf, inline="always", jit_options={"fastmath": _FLAGS})
def _erf_impl(x):  # type: ignore[no-untyped-def]
    if x != F32:
        return lambda x: math.erf(x)
    f = np.float32

    def erf_f32(x):  # type: ignore[no-untyped-def]
        c = x
        if c > f(4.0):  # clip that keeps NaN (see blockwise.erf_f32_block)
            c = f(4.0)
        if c < f(-4.0):
            c = f(-4.0)
        x2 = c * c
        p = x2 * f(-2.72614225801306e-10) + f(2.77068142495902e-08)
        p = p * x2 + f(-2.10102402082508e-06)
        p = p * x2 + f(-5.69250639462346e-05)
        p = p * x2 + f(-7.34990630326855e-04)
        p = p * x2 + f(-2.95459980854025e-03)
        p = p * x2 + f(-1.60960333262415e-02)
        q = x2 * f(-1.45660718464996e-05) + f(-2.13374055278905e-04)
        q = q * x2 + f(-1.68282697438203e-03)
        q = q * x2 + f(-7.37332916720468e-03)
        q = q * x2 + f(-1.42647390514189e-02)
        return c * p / q
    return erf_f32


# --- elementwise -----------------------------------------------------------------------------
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K = math.sqrt(2.0 / math.pi)
_TANH_C = 0.044715


@_jit((A32, A32, A32), (A64, A64, A64))
def gelu(x, out, cdf):  # type: ignore[no-untyped-def]
    """``cdf = Phi(x)``, ``out = x * Phi(x)``."""
    for i in range(x.size):
        v = x[i]
        p = _c(v, 0.5) * (_c(v, 1.0) + _erf(v * _c(v, _INV_SQRT_2)))
        cdf[i] = p
        out[i] = v * p


@_jit((A32, A32, A32, A32), (A64, A64, A64, A64))
def gelu_backward(g, x, cdf, out):  # type: ignore[no-untyped-def]
    """``g * (Phi(x) + x * phi(x))``."""
    for i in range(x.size):
        v = x[i]
        pdf = _exp(_c(v, -0.5) * v * v) * _c(v, _INV_SQRT_2PI)
        out[i] = g[i] * (cdf[i] + v * pdf)


@_jit((A32, A32), (A64, A64))
def gelu_tanh(x, out):  # type: ignore[no-untyped-def]
    """``x * sigmoid(2u)`` = ``0.5 x (1 + tanh(u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``."""
    for i in range(x.size):
        v = x[i]
        u2 = _c(v, 2.0 * _K) * (v + _c(v, _TANH_C) * v * v * v)
        out[i] = v / (_c(v, 1.0) + _exp(-u2))


@_jit((A32, A32, A32), (A64, A64, A64))
def gelu_tanh_backward(g, x, out):  # type: ignore[no-untyped-def]
    """``g * (s + 2 x s (1 - s) sqrt(2/pi) (1 + 3c x^2))``, ``s = sigmoid(2u)``: with
    ``t = tanh(u) = 2s - 1``, ``0.5 (1 + t) = s`` and ``1 - t^2 = 4 s (1 - s)``."""
    for i in range(x.size):
        v = x[i]
        v2 = v * v
        u2 = _c(v, 2.0 * _K) * (v + _c(v, _TANH_C) * v2 * v)
        s = _c(v, 1.0) / (_c(v, 1.0) + _exp(-u2))
        d = _c(v, 2.0 * _K) * v * s * (_c(v, 1.0) - s) * (_c(v, 1.0) + _c(v, 3.0 * _TANH_C) * v2)
        out[i] = g[i] * (s + d)  # NaN where x^3 overflows, as PyTorch's kernel


@_jit((A32, A32), (A64, A64))
def sigmoid(x, out):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = _c(x[i], 1.0) / (_c(x[i], 1.0) + _exp(-x[i]))


@_jit((A32, A32, A32), (A64, A64, A64))
def sigmoid_backward(g, ans, out):  # type: ignore[no-untyped-def]
    for i in range(ans.size):
        out[i] = g[i] * ans[i] * (_c(ans[i], 1.0) - ans[i])


@_jit((A32, A32, A32), (A64, A64, A64))
def tanh_backward(g, ans, out):  # type: ignore[no-untyped-def]
    for i in range(ans.size):
        out[i] = g[i] * (_c(ans[i], 1.0) - ans[i] * ans[i])


# --- rows: softmax, log_softmax, layer_norm ----------------------------------------------------
def _row_max(row):  # type: ignore[no-untyped-def]
    """The largest element of a non-empty row (Note [Row maximum by integer keys])."""


# Note [Row maximum by integer keys]: a running maximum of floats is a chain of dependent
# compare-selects that LLVM does not vectorise without ``nnan`` (Note [Fast-math flags]).
# For float32, each element's bits ``b`` become the integer key ``b ^ ((b >> 31) &
# 0x7fffffff)``, which orders as the floats do (-0.0 just below +0.0), and a maximum of
# integers LLVM vectorises; the key of the maximum is turned back into its float (the map
# is its own inverse). 1024 rows of 65: 7 us against 16 for eight scalar running maxima.
# The softmaxes' results keep their bits: a row's max is the same float (+0.0 where -0.0
# and +0.0 tie, and subtracting either zero gives the same exponent), and a NaN in a row
# makes its whole output NaN either way. float64 keeps the eight scalar maxima.
@overload(_row_max, inline="always", jit_options={"fastmath": _FLAGS})
def _row_max_impl(row):  # type: ignore[no-untyped-def]
    if row.dtype == F32:
        i32 = np.int32

        def keys_max(row):  # type: ignore[no-untyped-def]
            b = _f32_bits_as_int(row[0])
            m = i32(b ^ i32(i32(b >> i32(31)) & i32(0x7FFFFFFF)))
            for j in range(1, row.size):
                b = _f32_bits_as_int(row[j])
                m = max(m, i32(b ^ i32(i32(b >> i32(31)) & i32(0x7FFFFFFF))))
            return _int_bits_as_f32(i32(m ^ i32(i32(m >> i32(31)) & i32(0x7FFFFFFF))))
        return keys_max

    def eight_maxima(row):  # type: ignore[no-untyped-def]
        # eight independent running maxima (one is a dependent chain, 4 cycles per element)
        n = row.size
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]
        j = 0
        while j + 8 <= n:
            m0 = max(m0, row[j])
            m1 = max(m1, row[j + 1])
            m2 = max(m2, row[j + 2])
            m3 = max(m3, row[j + 3])
            m4 = max(m4, row[j + 4])
            m5 = max(m5, row[j + 5])
            m6 = max(m6, row[j + 6])
            m7 = max(m7, row[j + 7])
            j += 8
        for k in range(j, n):
            m0 = max(m0, row[k])
        return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    return eight_maxima


@_jit((M32, M32), (M64, M64))
def softmax(x, out):  # type: ignore[no-untyped-def]
    n = x.shape[1]
    for i in range(x.shape[0]):
        row, o = x[i], out[i]
        m = _row_max(row)
        total = _c(m, 0.0)
        for j in range(n):
            e = _exp(row[j] - m)
            o[j] = e
            total += e
        inv = _c(m, 1.0) / total
        for j in range(n):
            o[j] *= inv


@_jit((M32, M32, M32), (M64, M64, M64))
def softmax_backward(g, ans, out):  # type: ignore[no-untyped-def]
    """``ans * (g - sum(g * ans))`` per row."""
    n = ans.shape[1]
    for i in range(ans.shape[0]):
        gi, ai, o = g[i], ans[i], out[i]
        dot = _c(ai[0], 0.0)
        for j in range(n):
            dot += gi[j] * ai[j]
        for j in range(n):
            o[j] = ai[j] * (gi[j] - dot)


@_jit((M32, M32), (M64, M64))
def log_softmax(x, out):  # type: ignore[no-untyped-def]
    n = x.shape[1]
    for i in range(x.shape[0]):
        row, o = x[i], out[i]
        m = _row_max(row)
        total = _c(m, 0.0)
        for j in range(n):
            total += _exp(row[j] - m)
        # (x - max) - log(sum), as PyTorch: x - (max + log(sum)) rounds the log away
        # beside a large max (a row of -1e30 gave 0 instead of -log(n))
        lse = math.log(total)
        for j in range(n):
            o[j] = (row[j] - m) - lse


@_jit((M32, M32, M32), (M64, M64, M64))
def log_softmax_backward(g, ans, out):  # type: ignore[no-untyped-def]
    """``g - exp(ans) * sum(g)`` per row."""
    n = ans.shape[1]
    for i in range(ans.shape[0]):
        gi, ai, o = g[i], ans[i], out[i]
        total = _c(ai[0], 0.0)
        for j in range(n):
            total += gi[j]
        for j in range(n):
            o[j] = gi[j] - _exp(ai[j]) * total


# Note [Layer norm's forward loops]: the forward ran at ~0.55 ns per element on rows of 128
# float32 (77 us for 1024 rows, L2-resident), against ~0.35 for PyTorch's whole call: its
# last loop read and rewrote x-hat, wrote the output, and branched on the affine parts, and
# LLVM compiled it to slow code (one more store stream cost it 30 us). Now x-hat is written
# once, by a loop of its own, and the output by a second loop over x-hat, with the affine
# cases as separate loops: 45 us (as fast as a kernel that writes no x-hat at all), 617
# against 716 us on 4096 rows of 256. The same bits on rows of a multiple of 8 elements;
# on others LLVM now orders the sums otherwise (a few ulps; tests/test_row_kernels_forward.py).
@_jit((M32, A32, A32, F64, M32, M32, M32), (M64, A64, A64, F64, M64, M64, M64))
def layer_norm(x, w, b, eps, out, xhat, rstd):  # type: ignore[no-untyped-def]
    """Rows normalised: ``xhat = (x - mean) * rstd`` and ``out = xhat * w + b`` (``w``/``b``
    empty: no affine part); ``rstd`` is ``(N, 1)``. Float accumulators of x's type."""
    n = x.shape[1]
    affine, bias = w.size > 0, b.size > 0
    for i in range(x.shape[0]):
        row, h, o = x[i], xhat[i], out[i]
        total = _c(row[0], 0.0)
        for j in range(n):
            total += row[j]
        mean = total / _c(total, n)
        sq = _c(row[0], 0.0)
        for j in range(n):
            d = row[j] - mean
            sq += d * d
        r = _c(sq, 1.0) / math.sqrt(sq / _c(sq, n) + _c(sq, eps))
        rstd[i, 0] = r
        for j in range(n):
            h[j] = (row[j] - mean) * r
        if affine and bias:
            for j in range(n):
                o[j] = h[j] * w[j] + b[j]
        elif affine:
            for j in range(n):
                o[j] = h[j] * w[j]
        elif bias:
            for j in range(n):
                o[j] = h[j] + b[j]
        else:
            for j in range(n):
                o[j] = h[j]


@_jit((M32, M32, M32, A32, M32), (M64, M64, M64, A64, M64))
def layer_norm_backward(g, xhat, rstd, w, out):  # type: ignore[no-untyped-def]
    """``rstd * (gw - mean(gw) - xhat * mean(gw * xhat))`` per row, ``gw = g * w``
    (``w`` empty: ``gw = g``)."""
    n = g.shape[1]
    affine = w.size > 0
    for i in range(g.shape[0]):
        gi, h, o = g[i], xhat[i], out[i]
        s1 = _c(h[0], 0.0)
        s2 = _c(h[0], 0.0)
        for j in range(n):
            gw = gi[j] * w[j] if affine else gi[j]
            o[j] = gw
            s1 += gw
            s2 += gw * h[j]
        m1 = s1 / _c(s1, n)
        m2 = s2 / _c(s2, n)
        r = rstd[i, 0]
        for j in range(n):
            o[j] = r * (o[j] - m1 - h[j] * m2)


# Note [Column sums by row blocks]: dw and db sum thousands of rows (B*T). A float32
# running sum over all of them grows its rounding error with the row count; so each block
# of ``_BLOCK`` rows is summed in x's type (vectorised along the row, as fast as float32
# goes), and the blocks' sums are added into float64 totals (once per block: cheap). A
# test holds the float32 result to the float64 sum over 20,000 rows.
_BLOCK = 128


_JOINT = ((M32, M32, M32, A32, types.boolean, M32, A32, A32),
          (M64, M64, M64, A64, types.boolean, M64, A64, A64))


@_jit(*_JOINT)
def layer_norm_backward_joint(g, xhat, rstd, w, need_dx, dx, dw, db):  # type: ignore[no-untyped-def]
    """layer_norm's ``dw = sum_i g * xhat``, ``db = sum_i g`` and, when ``need_dx``, dx
    (else ``dx`` is not written) in one pass over ``g`` and ``xhat``: PyTorch's
    ``native_layer_norm_backward`` with its output mask. Column sums by row blocks (Note
    [Column sums by row blocks]); dw and db cost little beside dx as they share its loads,
    so both are always computed."""
    rows, n = g.shape
    block_w = np.zeros(n, dtype=g.dtype)
    block_b = np.zeros(n, dtype=g.dtype)
    total_w = np.zeros(n, dtype=np.float64)
    total_b = np.zeros(n, dtype=np.float64)
    # (its parallel form runs this kernel on each block of rows: Note [Parallel kernels
    # give the serial bits])
    for i in range(rows):
        gi, h = g[i], xhat[i]
        if need_dx:
            o = dx[i]
            s1 = _c(h[0], 0.0)
            s2 = _c(h[0], 0.0)
            for j in range(n):
                gj, hj = gi[j], h[j]
                block_w[j] += gj * hj
                block_b[j] += gj
                gw = gj * w[j]
                o[j] = gw
                s1 += gw
                s2 += gw * hj
            m1 = s1 / _c(s1, n)
            m2 = s2 / _c(s2, n)
            r = rstd[i, 0]
            for j in range(n):
                o[j] = r * (o[j] - m1 - h[j] * m2)
        else:
            for j in range(n):
                block_w[j] += gi[j] * h[j]
                block_b[j] += gi[j]
        if (i + 1) % _BLOCK == 0 or i + 1 == rows:
            for j in range(n):
                total_w[j] += block_w[j]
                total_b[j] += block_b[j]
                block_w[j] = 0
                block_b[j] = 0
    for j in range(dw.size):
        dw[j] = total_w[j]
    for j in range(db.size):
        db[j] = total_b[j]


# --- nll_loss's forward ----------------------------------------------------------------------
# Note [NLL in one pass]: the numpy forward of nll_loss (cross_entropy's second node) makes
# about ten small arrays per call (the valid mask, np.where's safe targets, np.arange, the
# fancy-indexed picks, the coefficients, the bounds check's three masks): ~26 us on 1024
# rows of 65 classes against ~3 us for the work itself, and a third of cross_entropy's
# forward. ``nll_pick`` checks the bounds, picks ``-logp[i, target[i]]`` and writes the
# safe targets and the coefficients in one pass; the loss itself stays numpy's sum of the
# picks (pairwise, the numpy path's bits). Ignored rows pick +0.0 without reading logp,
# as PyTorch (the numpy path's ``-logp * valid`` gave NaN for an ignored row's -inf).
_I64 = types.int64[::1]
_PICK = types.UniTuple(types.int64, 2)


@_jit_exact(_PICK(M32, _I64, types.int64, types.boolean, A32, _I64, A32),
            _PICK(M64, _I64, types.int64, types.boolean, A64, _I64, A64))
def nll_pick(logp, target, ignore_index, mean, picked, safe, coef):  # type: ignore[no-untyped-def]
    """``picked[i] = -logp[i, target[i]]`` (+0.0 where ``target[i] == ignore_index``),
    ``safe`` the targets with ignored ones as 0, ``coef`` the gradient's coefficient per
    row (-1, or -1 / count when ``mean``; -0.0 where ignored). Returns ``(count of rows not
    ignored, first row whose target is out of range or -1)``; on an out-of-range target
    it stops there, the outputs partly written. ``logp`` must not be empty."""
    rows, c = logp.shape
    count = 0
    zero = _c(logp[0, 0], 0.0)  # (logp has at least one element: the caller's check)
    for i in range(rows):
        t = target[i]
        if t == ignore_index:
            safe[i] = 0
            picked[i] = zero
        elif t < 0 or t >= c:
            return count, i
        else:
            safe[i] = t
            picked[i] = -logp[i, t]
            count += 1
    scale = -_c(zero, 1.0)
    if mean and count:
        scale = scale / _c(zero, count)
    for i in range(rows):  # (-0.0 where ignored: the numpy path's ``-valid / count``)
        coef[i] = -zero if target[i] == ignore_index else scale
    return count, -1


@_jit((M32, M32, A32), (M64, M64, A64))
def column_dots(a, b, out):  # type: ignore[no-untyped-def]
    """``out[j] = sum_i a[i, j] * b[i, j]``: layer_norm's weight gradient in one pass."""
    out[:] = 0
    for i in range(a.shape[0]):
        ai, bi = a[i], b[i]
        for j in range(a.shape[1]):
            out[j] += ai[j] * bi[j]


# --- row sums in numpy's order ------------------------------------------------------------------
# Note [Row sums in numpy's order]: ``np.add.reduce`` over the last axis of a C-contiguous
# float array sums each row by numpy's pairwise summation (``pairwise_sum`` in numpy's
# ``loops_utils.h.src``): a row of at most 128 elements is summed in eight lanes (lane k
# adds elements k, k + 8, ...), the lanes are added as ((0+1)+(2+3))+((4+5)+(6+7)) and the
# last ``n % 8`` elements one by one; fewer than 8 elements from -0.0, one by one; a longer
# row is split at ``n2 = n // 2 - (n // 2) % 8`` and its halves summed so, then added; and
# the reduction adds that to its initial 0.0. numpy's build does not vectorise those lanes
# well, and numba's does not at all without reassociation, which would change the order.
# So ``_lanes`` writes the lanes as one LLVM vector of eight (a vector add is eight IEEE
# adds, lane by lane: the same bits), for four rows at a time (four independent chains, so
# the adds' latency does not bound the loop): ``row_sums`` gives numpy's bits, NaN, inf
# and -0.0 included (tests/test_row_sums.py). One thread, warm cache, median of 30: 1024
# rows of 512 float32 in 0.11 ms (numpy 0.23, PyTorch 0.10, one vector chain per row
# 0.08-0.11 warm but 1.3 ms against PyTorch's 0.8 on 4096 rows of 1024), 4096 x 1024 in
# 0.85 ms (numpy 1.57, PyTorch 0.82); float64 at or below numpy and PyTorch.
_ROWS = 4  # rows summed together by row_sums


def _lanes_intrinsic(count: int):  # type: ignore[no-untyped-def]
    """An intrinsic ``(x, r, lo, n) -> tuple of count sums``: for rows ``r .. r + count - 1``
    of the 2-D C-contiguous ``x``, numpy's eight-lane sum of ``x[row, lo:lo + m]``,
    ``m = n - n % 8 >= 8``, lanes combined as numpy combines them (the tail is the caller's)."""

    @intrinsic
    def lanes(typingctx, x, r, lo, n):  # type: ignore[no-untyped-def]
        dt = x.dtype
        sig = types.UniTuple(dt, count)(x, types.intp, types.intp, types.intp)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            r, lo, n = args[1], args[2], args[3]
            vec = ir.VectorType(context.get_value_type(dt), 8).as_pointer()
            align = dt.bitwidth // 8
            ncols = builder.extract_value(ary.shape, 1)
            bases, accs = [], []
            for k in range(count):
                row = builder.add(r, ir.Constant(r.type, k))
                base = builder.gep(ary.data, [builder.add(builder.mul(row, ncols), lo)])
                bases.append(base)
                first = builder.load(builder.bitcast(base, vec), align=align)
                accs.append(cgutils.alloca_once_value(builder, first))
            eight = ir.Constant(n.type, 8)
            m = builder.sub(n, builder.srem(n, eight))
            with cgutils.for_range_slice(builder, eight, m, eight) as (i, _):
                for base, acc in zip(bases, accs):
                    v = builder.load(builder.bitcast(builder.gep(base, [i]), vec), align=align)
                    builder.store(builder.fadd(builder.load(acc), v), acc)
            sums = []
            for acc in accs:
                v = builder.load(acc)
                e = [builder.extract_element(v, ir.Constant(ir.IntType(32), j)) for j in range(8)]
                sums.append(builder.fadd(builder.fadd(builder.fadd(e[0], e[1]), builder.fadd(e[2], e[3])),
                                         builder.fadd(builder.fadd(e[4], e[5]), builder.fadd(e[6], e[7]))))
            return context.make_tuple(builder, sig.return_type, sums)
        return sig, codegen
    return lanes


_lanes4 = _lanes_intrinsic(_ROWS)
_lanes1 = _lanes_intrinsic(1)
_I = types.intp


@_jit_exact(types.UniTuple(F32, _ROWS)(M32, _I, _I, _I), types.UniTuple(F64, _ROWS)(M64, _I, _I, _I))
def _pairwise4(x, r, lo, n):  # type: ignore[no-untyped-def]
    """numpy's pairwise sums of ``x[r + k, lo:lo + n]`` for k < 4 (Note [Row sums in numpy's order])."""
    if n < 8:
        s0 = s1 = s2 = s3 = _c(x[r, 0], -0.0)
        for j in range(lo, lo + n):
            s0 += x[r, j]
            s1 += x[r + 1, j]
            s2 += x[r + 2, j]
            s3 += x[r + 3, j]
        return s0, s1, s2, s3
    if n <= 128:
        s0, s1, s2, s3 = _lanes4(x, r, lo, n)
        for j in range(lo + n - n % 8, lo + n):
            s0 += x[r, j]
            s1 += x[r + 1, j]
            s2 += x[r + 2, j]
            s3 += x[r + 3, j]
        return s0, s1, s2, s3
    n2 = n // 2
    n2 -= n2 % 8
    a = _pairwise4(x, r, lo, n2)
    b = _pairwise4(x, r, lo + n2, n - n2)
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]


@_jit_exact((M32, A32), (M64, A64))
def row_sums(x, out):  # type: ignore[no-untyped-def]
    """``out[i] = np.add.reduce(x[i])`` for each row of the 2-D ``x`` (at least one column),
    bit for bit (Note [Row sums in numpy's order])."""
    rows, n = x.shape
    if x.size == 0:
        out[:] = 0
        return
    zero = _c(x[0, 0], 0.0)
    full = rows - rows % _ROWS
    for i in range(0, full, _ROWS):
        s = _pairwise4(x, i, 0, n)
        out[i] = zero + s[0]
        out[i + 1] = zero + s[1]
        out[i + 2] = zero + s[2]
        out[i + 3] = zero + s[3]
    if full < rows:  # the last rows, fewer than four: summed as four, padded with zero rows
        tail = np.zeros((_ROWS, n), dtype=x.dtype)
        tail[:rows - full] = x[full:]
        s = _pairwise4(tail, 0, 0, n)
        for k in range(rows - full):
            out[full + k] = zero + s[k]


@_jit_exact(F32(M32, _I, _I, _I), F64(M64, _I, _I, _I))
def _pairwise1(x, r, lo, n):  # type: ignore[no-untyped-def]
    """numpy's pairwise sum of ``x[r, lo:lo + n]`` (Note [Row sums in numpy's order])."""
    if n < 8:
        s = _c(x[r, 0], -0.0)
        for j in range(lo, lo + n):
            s += x[r, j]
        return s
    if n <= 128:
        s = _lanes1(x, r, lo, n)[0]
        for j in range(lo + n - n % 8, lo + n):
            s += x[r, j]
        return s
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise1(x, r, lo, n2) + _pairwise1(x, r, lo + n2, n - n2)


@_jit_exact((M32, A32), (M64, A64))
def row_sums_streamed(x, out):  # type: ignore[no-untyped-def]
    """``row_sums`` one row at a time, the same bits (Note [Row sums from memory])."""
    if x.size == 0:
        out[:] = 0
        return
    zero = _c(x[0, 0], 0.0)
    for i in range(x.shape[0]):
        out[i] = zero + _pairwise1(x, i, 0, x.shape[1])


# Note [Row sums from memory]: four rows summed together keep four chains of vector adds
# in flight, which is what a warm row needs (one chain per row waits on each add's
# latency); but an array that comes from memory is then read as four interleaved streams
# a row apart, and the loads wait on memory instead: from DRAM, four rows at a time ran
# slower than numpy's reduction, one row at a time (a single sequential stream) faster.
# So ``reductions._row_sums`` takes ``row_sums_streamed`` for an array larger than a
# core's cache could hold (``reductions.ROW_SUMS_STREAM_BYTES``), ``row_sums`` below it.


def _row_sums_match_numpy() -> bool:
    """Whether ``row_sums`` gives this numpy's bits, checked once at load on rows of every
    split length of Note [Row sums in numpy's order] (about 0.1 ms): the order is numpy's
    implementation, not its contract, so a numpy that sums otherwise keeps its own
    reduction (``reductions._row_sums`` reads ``ROW_SUMS_MATCH_NUMPY``)."""
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for n in (1, 7, 8, 9, 15, 16, 17, 127, 128, 129, 136, 255, 256, 257, 300, 1031):
            x = rng.standard_normal((5, n)).astype(dtype)
            out = np.empty(5, dtype)
            want = np.add.reduce(x, axis=-1).tobytes()
            row_sums(x, out)
            if out.tobytes() != want:
                return False
            row_sums_streamed(x, out)
            if out.tobytes() != want:
                return False
    return True


ROW_SUMS_MATCH_NUMPY = _row_sums_match_numpy()


# --- embedding backward ----------------------------------------------------------------------
@_jit((M32, types.int64[::1], M32), (M64, types.int64[::1], M64))
def add_rows(out, rows, g):  # type: ignore[no-untyped-def]
    """``out[rows[i]] += g[i]`` in order of i (deterministic); rows already in range."""
    for i in range(rows.size):
        o, gi = out[rows[i]], g[i]
        for j in range(g.shape[1]):
            o[j] += gi[j]


# --- masks -------------------------------------------------------------------------------------
@_jit((A32, A32), (A64, A64))
def relu(x, out):  # type: ignore[no-untyped-def]
    """``out = maximum(x, 0)`` bit for bit as numpy's: ``x`` where ``x > 0`` or ``x`` is
    NaN (its bits pass), else +0 (also for -0). One select per element, where numpy's
    NaN-propagating ``maximum`` does more per element."""
    for i in range(x.size):
        v = x[i]
        out[i] = v if v > _c(v, 0.0) or v != v else _c(v, 0.0)


@_jit((A32, A32, A32), (A64, A64, A64))
def threshold_backward(g, ans, out):  # type: ignore[no-untyped-def]
    """``out = g`` where ``ans > 0``, else +0 (relu's derivative): a select, so ``g``'s
    bits pass unchanged (inf, NaN, -0) and a NaN ``ans`` gives +0, as the numpy rule."""
    for i in range(ans.size):
        out[i] = g[i] if ans[i] > _c(ans[i], 0.0) else _c(g[i], 0.0)


# Note [Masks broadcast over rows]: an attention mask is (T, T) and the scores it masks
# (B, H, T, T); numpy's ``where`` walks the broadcast mask at every element (0.35 ms for
# the transformer's 262,144 floats, where one pass over them takes 0.05). These kernels
# take the scores as rows of the mask's size and read the mask once per row.
@_jit((M32, types.boolean[::1], types.boolean, F32, M32), (M64, types.boolean[::1], types.boolean, F64, M64))
def select_rows(x, mask, keep, fill, out):  # type: ignore[no-untyped-def]
    """``out[i, j] = x[i, j]`` where ``mask[j] == keep``, else ``fill``: a select, so the
    kept elements' bits pass unchanged (inf, NaN, -0), as ``np.where``."""
    n = mask.size
    for i in range(x.shape[0]):
        xi, o = x[i], out[i]
        for j in range(n):
            o[j] = xi[j] if mask[j] == keep else fill


# --- attention (Note [Fused attention] in ops/attention.py) -----------------------------------
# The scores of a (..., L, S) attention come as rows (..., L) x S: row ``r`` is query
# ``r % L``. A bool mask (True: may attend) has ``Q`` rows, read at ``r % Q`` (Q = L: one
# (L, S) mask for every head; Q = all rows: a mask per row). Masked and unmasked forms are
# separate kernels: numba's SSA pass warns about two inlined copies of ``_exp`` in one.
#
# Note [Causal rows at full width]: a causal row ``i`` needs only its first ``i + 1`` keys,
# but LLVM vectorises a loop 8 wide and 4 times interleaved, so a row shorter than ~32
# keys runs the scalar remainder: over GPT-small's rows of 64, the causal softmax that
# touched only the first ``i + 1`` keys (half the exps) took longer than the full-row
# softmax. The causal kernels therefore run their exp and backward passes over the row
# rounded up to ``_CAUSAL_WIDTH`` keys (the whole row up to that length) and select 0 at
# the masked keys, reading the causal mask as a bool row (a select on the key index
# compiled to slower code). The masked keys' scores are read, never used: a NaN or inf
# there cannot reach the result. The row maximum (``_scaled_row_max``, one LLVM vector of
# eight lanes) still stops at key ``i``. Measured, one thread, 4096 rows, medians (2
# shared cores, noisy): forward 0.40 -> 0.33 ms at 64 keys, then 0.47 -> 0.38 (minima
# 0.33 -> 0.29) with the vector maximum, 0.55 -> 0.47 at 128 keys; backward 0.15 -> 0.09
# at 64 keys, 0.52 -> 0.23 at 128.
_MASK = types.boolean[:, ::1]
_CAUSAL_WIDTH = 128


@intrinsic
def _scaled_max8(typingctx, row, m, scale):  # type: ignore[no-untyped-def]
    """The largest of ``row[j] * scale`` for ``j < m`` (``m`` a multiple of 8, at least 8)
    as one LLVM vector of eight running maxima (``a > b ? a : b`` lane by lane, then
    across the lanes): ``_row_max``'s eight scalar chains are not vectorised, and were a
    quarter of the causal softmax at 64 keys. The products are the scalar ones (no
    contraction), so the maximum is the same element's; a NaN may or may not win, as in
    ``_row_max`` (a NaN row becomes NaN through its exp and sum)."""
    dt = row.dtype
    sig = dt(row, types.intp, dt)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        m, scale = args[1], args[2]
        fty = context.get_value_type(dt)
        vty = ir.VectorType(fty, 8)
        vptr = vty.as_pointer()
        align = dt.bitwidth // 8
        splat = ir.Constant(vty, ir.Undefined)
        for k in range(8):
            splat = builder.insert_element(splat, scale, ir.Constant(ir.IntType(32), k))

        def load(i):  # type: ignore[no-untyped-def]
            v = builder.load(builder.bitcast(builder.gep(ary.data, [i]), vptr), align=align)
            return builder.fmul(v, splat)

        acc = cgutils.alloca_once_value(builder, load(ir.Constant(m.type, 0)))
        eight = ir.Constant(m.type, 8)
        with cgutils.for_range_slice(builder, eight, m, eight) as (i, _):
            a, v = builder.load(acc), load(i)
            builder.store(builder.select(builder.fcmp_ordered(">", a, v), a, v), acc)
        lanes = builder.load(acc)
        e = [builder.extract_element(lanes, ir.Constant(ir.IntType(32), k)) for k in range(8)]
        while len(e) > 1:
            e = [builder.select(builder.fcmp_ordered(">", a, b), a, b) for a, b in zip(e[::2], e[1::2])]
        return e[0]
    return sig, codegen


@njit(inline="always", fastmath=_FLAGS)
def _scaled_row_max(row, lim, scale):  # type: ignore[no-untyped-def]
    """The largest of ``row[j] * scale`` for ``j < lim`` (``lim >= 1``)."""
    m8 = lim - lim % 8
    if m8 == 0:
        m = row[0] * scale
    else:
        m = _scaled_max8(row, m8, scale)
    for k in range(m8, lim):
        v = row[k] * scale
        m = m if m > v else v
    return m


@njit(inline="always", fastmath=_FLAGS)
def _row_shift(row, lim, scale):  # type: ignore[no-untyped-def]
    """The softmax shift of ``row[j] * scale`` for ``j < lim``: their maximum, or a NaN
    among them when the maximum came out -inf (max() may pass over one); -inf means
    nothing to attend to."""
    m = _scaled_row_max(row, lim, scale)
    if m == _c(m, -np.inf):
        for j in range(lim):
            v = row[j] * scale
            if v != v:
                m = v
    return m


@_jit((M32, F32), (M64, F64))
def attention_softmax(s, scale):  # type: ignore[no-untyped-def]
    """In place: each row of scores becomes ``softmax(scale * row)``. A row of only -inf
    scores becomes zeros (PyTorch's safe softmax); a NaN score makes its row NaN, as
    numpy's softmax. The scale is applied within the max and exp passes."""
    n = s.shape[1]
    for r in range(s.shape[0]):
        row = s[r]
        m = _row_shift(row, n, scale)
        if m == _c(m, -np.inf):
            row[:] = _c(m, 0.0)
            continue
        total = _c(m, 0.0)
        for j in range(n):
            e = _exp(row[j] * scale - m)
            row[j] = e
            total += e
        inv = _c(m, 1.0) / total
        for j in range(n):
            row[j] *= inv


@_jit((M32, F32, _MASK), (M64, F64, _MASK))
def attention_softmax_causal(s, scale, tri):  # type: ignore[no-untyped-def]
    """``attention_softmax`` over keys ``j <= r % L`` of each row, 0 at the others, also
    in a row of NaN; ``tri`` is the (L, S) causal mask (Note [Causal rows at full width])."""
    n = s.shape[1]
    length = tri.shape[0]
    for r in range(s.shape[0]):
        row = s[r]
        a = tri[r % length]
        lim = min(r % length + 1, n)
        width = min((lim + _CAUSAL_WIDTH - 1) // _CAUSAL_WIDTH * _CAUSAL_WIDTH, n)
        m = _row_shift(row, lim, scale)
        if m == _c(m, -np.inf):
            row[:] = _c(m, 0.0)
            continue
        total = _c(m, 0.0)
        for j in range(width):
            e = _exp(row[j] * scale - m)
            e = e if a[j] else _c(m, 0.0)
            row[j] = e
            total += e
        inv = _c(m, 1.0) / total
        if total == total:
            for j in range(width):
                row[j] *= inv
        else:  # a NaN row: the masked keys stay 0
            for j in range(width):
                row[j] = row[j] * inv if a[j] else _c(m, 0.0)
        for j in range(width, n):
            row[j] = _c(m, 0.0)


@_jit((M32, F32, _MASK), (M64, F64, _MASK))
def attention_softmax_masked(s, scale, allowed):  # type: ignore[no-untyped-def]
    """``attention_softmax`` over the keys a bool mask allows; 0 at the others, also in a
    row of NaN; zeros for a row with no allowed key."""
    n = s.shape[1]
    for r in range(s.shape[0]):
        row = s[r]
        a = allowed[r % allowed.shape[0]]
        m = _c(scale, -np.inf)
        for j in range(n):
            if a[j]:
                v = row[j] * scale
                row[j] = v
                m = max(m, v)
        if m == _c(m, -np.inf):  # as above
            for j in range(n):
                if a[j] and row[j] != row[j]:
                    m = row[j]
            if m == _c(m, -np.inf):
                row[:] = _c(m, 0.0)
                continue
        total = _c(m, 0.0)
        for j in range(n):  # (a select, not exp(-inf): an underflow to 0 costs a microcode assist)
            e = _exp(row[j] - m)
            e = e if a[j] else _c(m, 0.0)
            row[j] = e
            total += e
        inv = _c(m, 1.0) / total
        for j in range(n):
            if a[j]:  # (a NaN total leaves the masked keys at 0)
                row[j] *= inv


@_jit((M32, M32, F32), (M64, M64, F64))
def attention_softmax_backward(dp, p, scale):  # type: ignore[no-untyped-def]
    """In place: the gradient of the weights ``dp`` becomes the scores' gradient
    ``p * (dp - sum(dp * p)) * scale`` per row (softmax's backward, then the scale's)."""
    n = dp.shape[1]
    for r in range(dp.shape[0]):
        d, pr = dp[r], p[r]
        dot = _c(scale, 0.0)
        for j in range(n):
            dot += d[j] * pr[j]
        for j in range(n):
            d[j] = pr[j] * (d[j] - dot) * scale


@_jit((M32, M32, F32, _MASK), (M64, M64, F64, _MASK))
def attention_softmax_backward_causal(dp, p, scale, tri):  # type: ignore[no-untyped-def]
    """``attention_softmax_backward`` over keys ``j <= r % L``, 0 at the others, whatever
    ``dp`` holds there (Note [Causal rows at full width])."""
    n = dp.shape[1]
    length = tri.shape[0]
    for r in range(dp.shape[0]):
        d, pr = dp[r], p[r]
        a = tri[r % length]
        lim = min(r % length + 1, n)
        width = min((lim + _CAUSAL_WIDTH - 1) // _CAUSAL_WIDTH * _CAUSAL_WIDTH, n)
        dot = _c(scale, 0.0)
        for j in range(width):
            dot += d[j] * pr[j] if a[j] else _c(scale, 0.0)
        for j in range(width):
            d[j] = pr[j] * (d[j] - dot) * scale if a[j] else _c(scale, 0.0)
        for j in range(width, n):
            d[j] = _c(scale, 0.0)


@_jit((M32, M32, F32, _MASK), (M64, M64, F64, _MASK))
def attention_softmax_backward_masked(dp, p, scale, allowed):  # type: ignore[no-untyped-def]
    """``attention_softmax_backward`` over the keys a bool mask allows, 0 at the others."""
    n = dp.shape[1]
    for r in range(dp.shape[0]):
        d, pr = dp[r], p[r]
        a = allowed[r % allowed.shape[0]]
        dot = _c(scale, 0.0)
        for j in range(n):
            if a[j]:
                dot += d[j] * pr[j]
        for j in range(n):
            d[j] = pr[j] * (d[j] - dot) * scale if a[j] else _c(scale, 0.0)


# --- optimizers ----------------------------------------------------------------------------------
# Note [Adam in one pass]: Adam's update in numpy is ~12 passes over each parameter and
# its state, with temporaries, and ~60 us of Python per parameter: 4 ms per step for the
# transformer's 52 parameters (0.8 M floats). This kernel is the same expressions, in the
# same order, in the parameter's float type, and compiled *without* fast-math flags (no
# contraction into fused multiply-adds), so its results are bit for bit those of the numpy
# rule in ``optim/adam.py`` (tests hold them to equality, NaN and inf included).
_B = types.boolean
_S32 = (A32, A32, A32, A32, _B, F32, _B, _B, F32, _B, F32, F32, F32, F32, F32, F32, F32)
_S64 = (A64, A64, A64, A64, _B, F64, _B, _B, F64, _B, F64, F64, F64, F64, F64, F64, F64)


@_jit_exact(_S32, _S64)
def adam_step(x, g, m, v, decoupled, decay, maximize, use_l2, l2,  # type: ignore[no-untyped-def]
              lerp_small, w1, one_minus_w1, beta2, c2, neg_step_size, bc2_sqrt, eps):
    """One Adam/AdamW step of ``x`` with gradient ``g``, updating ``m`` and ``v`` in place
    (Note [Adam in one pass]): ``x *= decay`` (AdamW, ``decoupled``) or ``g += l2 * x``
    (Adam's L2, ``use_l2``), ``m = lerp(m, g, w1)`` (PyTorch's two formulas),
    ``v = v * beta2 + c2 * g * g``, ``x += neg_step_size * m / (sqrt(v) / bc2_sqrt + eps)``."""
    for i in range(x.size):
        xi = x[i]
        gi = g[i]
        if maximize:
            gi = -gi
        if decoupled:
            xi = xi * decay
        elif use_l2:
            gi = gi + l2 * xi
        mi = m[i]
        if lerp_small:
            mi = mi + w1 * (gi - mi)
        else:
            mi = gi - (gi - mi) * one_minus_w1
        m[i] = mi
        vi = v[i] * beta2
        vi = vi + c2 * gi * gi
        v[i] = vi
        x[i] = xi + neg_step_size * mi / (math.sqrt(vi) / bc2_sqrt + eps)


# --- the same with a constant gradient --------------------------------------------------------
# A gradient that is one value broadcast (zero strides: a sum's gradient, passed on by
# adds and views) would be copied out in full for the kernels above (``compiled_path._c``): these
# read the value once instead. Same expressions, so the same bits.
@_jit((F32, A32, A32), (F64, A64, A64))
def tanh_backward_scalar(g, ans, out):  # type: ignore[no-untyped-def]
    for i in range(ans.size):
        out[i] = g * (_c(ans[i], 1.0) - ans[i] * ans[i])


@_jit((F32, A32, A32), (F64, A64, A64))
def sigmoid_backward_scalar(g, ans, out):  # type: ignore[no-untyped-def]
    for i in range(ans.size):
        out[i] = g * ans[i] * (_c(ans[i], 1.0) - ans[i])


@_jit((F32, A32, A32), (F64, A64, A64))
def threshold_backward_scalar(g, ans, out):  # type: ignore[no-untyped-def]
    for i in range(ans.size):
        out[i] = g if ans[i] > _c(ans[i], 0.0) else _c(g, 0.0)


# --- parallel forms (Note [Intra-op threads] in intra_op.py) -------------------------------------
# --- the image layers: max pooling, batch norm, convolution's im2col and col2im --------------
# Note [Max pooling per output]: the numpy kernel copies the ``kh * kw`` taps of every
# window out (a tap matrix as large as the input times the taps), takes the maximum, then
# finds the winning tap in one more pass per tap. Here each output meets its window's taps
# that lie inside the input once, in window order, keeping the best value and where it was
# by selects, not branches (which random data mispredicts half the time; the loop order is
# Note [Max pooling row by row]); a tap in the padding never wins. The winner is
# PyTorch's: the first tap holding the maximum, or the last NaN (a NaN always takes the
# place; nothing beats a NaN). The backward adds each output's gradient at that element,
# in output order, in the gradient's type (PyTorch's order), into a plane it zeroes just
# before: one pass over the input's gradient, where zeroing the whole array first wrote
# all of it and the additions then read it back from beyond the core's cache.
#
# Note [Batch norm per channel]: batch norm's channels are independent, and one channel's
# elements (N rows of H * W) fit in L2 for the image sizes it sees; so each kernel finishes
# a channel before the next, its passes over the channel reading from L2. The forward makes
# three (the sum; x - mean, written once, and its squares; the output), the backward two
# (``sum g`` and ``sum g * (x - mean)``; dx as ``a g - b (x - mean) - c`` with the three
# coefficients per channel). Sums are accumulated in float64 and rounded once.
_N = types.int64  # (sizes and window parameters)
P32, P64 = types.float32[:, :, ::1], types.float64[:, :, ::1]  # (N, C, R)
_INDEX = types.int64[::1]
_SIZES = (_N,) * 5  # planes, H, W, oh, ow
_WIN = (_N,) * 8  # kh, kw, sh, sw, dh, dw, pad top, pad left


# --- max pooling (Note [Max pooling per output]) -----------------------------------------------
_U = np.uint64  # (an unsigned index: numba checks a signed one for wrapping at every access)


# Note [Max pooling row by row]: a window at a time (the kernel before this one) took ~5 ns
# per tap. numba lowers ``a if t else b`` to a branch, and in
# a loop that updates values in memory LLVM kept it one (a conditional store: seen in the
# IR), which random data mispredicts. So the kernel works an output row at a time: for each tap ``(a, b)`` in window
# order it runs over the row's outputs whose tap lies inside the input (a range of ``j``
# per ``b``, computed once: the borders need no test per tap), updating the row's best
# values and indices by :func:`_pick` (an LLVM ``select``: never a branch). Per output
# the taps are still met in window order, so the winner is the same (Note [Max pooling
# per output]); a tap in the padding is skipped, as before. The index is int32 (half the
# bytes of int64 to write, and to read back in the backward): planes of 2**31 elements
# and more keep the numpy kernel (figures: docs/benchmarks.md, "Figures behind the Notes").
_INDEX32 = types.int32[::1]


@intrinsic
def _pick(typingctx, take, a, b):  # type: ignore[no-untyped-def]
    """``a if take else b`` as one LLVM ``select`` (Note [Max pooling row by row])."""
    if a != b:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.select(args[0], args[1], args[2])
    return a(types.boolean, a, b), codegen


@_jit((A32, A32, _INDEX32, *_SIZES, *_WIN), (A64, A64, _INDEX32, *_SIZES, *_WIN))
def max_pool(x, out, index, planes, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (planes, oh, ow), flat: each window's maximum of ``x`` (planes, H, W) read
    with the given kernel, stride, dilation and leading padding; ``index``: the flat
    index into its plane of the element that won (Note [Max pooling row by row])."""
    lo = np.empty(kw, dtype=np.int64)  # tap b lies inside the input for outputs lo[b] <= j < hi[b]
    hi = np.empty(kw, dtype=np.int64)
    for b in range(kw):
        off = b * dw - pl
        first = 0 if off >= 0 else (sw - 1 - off) // sw
        last = (w - 1 - off) // sw + 1 if off <= w - 1 else 0
        lo[b] = min(first, ow)
        hi[b] = max(min(last, ow), lo[b])
    col = np.empty(ow, dtype=np.int64)  # each output's first column inside the input
    for j in range(ow):
        c0 = j * sw - pl
        col[j] = c0 if c0 >= 0 else c0 % dw
    none = _c(x[0], -np.inf)
    for p in range(planes):
        base = p * h * w
        for i in range(oh):
            o = (p * oh + i) * ow
            r0 = i * sh - pt
            row = (r0 if r0 >= 0 else r0 % dh) * w  # its first row inside
            for j in range(ow):
                out[_U(o + j)] = none
                index[_U(o + j)] = np.int32(row + col[j])
            for a in range(kh):
                r = r0 + a * dh
                if r < 0 or r >= h:
                    continue
                for b in range(kw):
                    e0 = r * w + b * dw - pl
                    for j in range(lo[b], hi[b]):
                        e = e0 + j * sw
                        v = x[_U(base + e)]
                        best = out[_U(o + j)]
                        take = (v > best) | (v != v)
                        out[_U(o + j)] = _pick(take, v, best)
                        index[_U(o + j)] = _pick(take, np.int32(e), index[_U(o + j)])


@_jit((A32, _INDEX, A32, _N, _N), (A64, _INDEX, A64, _N, _N),
      (A32, _INDEX32, A32, _N, _N), (A64, _INDEX32, A64, _N, _N))
def max_pool_backward(g, index, out, positions, plane):  # type: ignore[no-untyped-def]
    """``out`` (planes, H * W), flat: each plane zeroed, then += each output's gradient
    ``g`` (planes, positions) at the element ``index`` names in its plane (Note [Max
    pooling per output]: a plane is zeroed just before its additions, in cache)."""
    for p in range(g.size // positions):
        base = p * plane
        for e in range(base, base + plane):
            out[_U(e)] = 0
        for k in range(p * positions, (p + 1) * positions):
            out[_U(base + index[k])] += g[k]


# --- batch norm (Note [Batch norm per channel]) -------------------------------------------------
@_jit((P32, A32, A32, types.float64, P32, P32, A32, A32, A32),
      (P64, A64, A64, types.float64, P64, P64, A64, A64, A64))
def batch_norm(x, w, b, eps, out, xc, mean, var, rstd):  # type: ignore[no-untyped-def]
    """Training batch norm of ``x`` (N, C, R) per channel: ``mean``, biased ``var``,
    ``rstd = 1 / sqrt(var + eps)``, the centred input ``xc`` and ``out = xc * rstd * w + b``
    (``w``, ``b`` empty: no affine part)."""
    n, c, r = x.shape
    count = n * r
    for ch in range(c):
        total = 0.0
        for i in range(n):
            row = x[i, ch]
            for k in range(r):
                total += row[k]
        mean[ch] = total / count
        m = mean[ch]  # (in x's type, as the numpy kernel centres by it)
        sq = 0.0
        for i in range(n):
            row, d = x[i, ch], xc[i, ch]
            for k in range(r):
                v = row[k] - m
                d[k] = v
                sq += v * v
        v64 = sq / count
        var[ch] = v64
        rstd[ch] = 1.0 / math.sqrt(v64 + eps)
        scale = rstd[ch] * w[ch] if w.size else rstd[ch]
        shift = b[ch] if b.size else _c(scale, 0.0)
        for i in range(n):
            d, o = xc[i, ch], out[i, ch]
            for k in range(r):
                o[k] = d[k] * scale + shift


@_jit((P32, P32, A32, A32, types.boolean, P32, A32, A32),
      (P64, P64, A64, A64, types.boolean, P64, A64, A64))
def batch_norm_backward(g, xc, rstd, w, need_dx, dx, gx, gsum):  # type: ignore[no-untyped-def]
    """Batch norm's backward per channel from ``g`` and the centred input ``xc`` (N, C, R):
    ``gsum = sum g`` (db), ``gx = sum g * xhat`` (dw) and, when ``need_dx``,
    ``dx = w * rstd * (g - gsum / count - xhat * gx / count)`` (``w`` empty: 1)."""
    n, c, r = g.shape
    count = n * r
    for ch in range(c):
        s1 = 0.0
        s2 = 0.0
        for i in range(n):
            gi, d = g[i, ch], xc[i, ch]
            for k in range(r):
                s1 += gi[k]
                s2 += gi[k] * d[k]
        rs = np.float64(rstd[ch])
        gsum[ch] = s1
        gx[ch] = s2 * rs
        if not need_dx:
            continue
        scale = rs * (np.float64(w[ch]) if w.size else 1.0)
        a = _c(rstd[ch], scale)
        bb = _c(rstd[ch], scale * s2 * rs * rs / count)
        cc = _c(rstd[ch], scale * s1 / count)
        for i in range(n):
            gi, d, o = g[i, ch], xc[i, ch], dx[i, ch]
            for k in range(r):
                o[k] = a * gi[k] - bb * d[k] - cc


# --- convolution's im2col and col2im (Note [Windows row by row]) ---------------------------------
# Note [Windows row by row]: numpy copies the windows of a strided view one innermost row
# at a time, through its iterator: on small images (a 4 x 4 plane: rows of 4) or strided
# windows that is a call per few elements, and the copy took twice the product's time.
# These kernels walk the same rows in compiled loops, reading the unpadded input (the
# padding is the zeros they write, or the elements they skip), in the order of the
# channels-first windows (C, kh, kw, N, oh, ow). col2im adds each window element back in
# tap order, as the numpy kernel's one slice addition per tap, so the sums are the same.
@_jit((A32, A32, *_SIZES, _N, *_WIN), (A64, A64, *_SIZES, _N, *_WIN))
def unfold(x, out, n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (C, kh, kw, N, oh, ow), flat: the windows of ``x`` (N, C, H, W), flat."""
    o = 0
    for ch in range(c):
        for a in range(kh):
            for b in range(kw):
                off = b * dw - pl
                lo = min(ow, 0 if off >= 0 else (sw - 1 - off) // sw)  # the first j with j * sw + off >= 0
                hi = max(lo, min(ow, (w - 1 - off) // sw + 1) if w - 1 - off >= 0 else 0)
                for img in range(n):
                    for i in range(oh):
                        r = i * sh + a * dh - pt
                        if r < 0 or r >= h:
                            for j in range(ow):
                                out[_U(o + j)] = 0
                        else:
                            src = ((img * c + ch) * h + r) * w + off
                            for j in range(lo):
                                out[_U(o + j)] = 0
                            for j in range(lo, hi):
                                out[_U(o + j)] = x[_U(src + j * sw)]
                            for j in range(hi, ow):
                                out[_U(o + j)] = 0
                        o += ow


@_jit((A32, A32, *_SIZES, _N, *_WIN), (A64, A64, *_SIZES, _N, *_WIN))
def fold(cols, out, n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (N, C, H, W), flat, zeros on entry, += the windows ``cols`` (C, kh, kw, N,
    oh, ow), flat: the adjoint of ``unfold``."""
    o = 0
    for ch in range(c):
        for a in range(kh):
            for b in range(kw):
                off = b * dw - pl
                lo = min(ow, 0 if off >= 0 else (sw - 1 - off) // sw)
                hi = max(lo, min(ow, (w - 1 - off) // sw + 1) if w - 1 - off >= 0 else 0)
                for img in range(n):
                    for i in range(oh):
                        r = i * sh + a * dh - pt
                        if 0 <= r < h:
                            dst = ((img * c + ch) * h + r) * w + off
                            for j in range(lo, hi):
                                out[_U(dst + j * sw)] += cols[_U(o + j)]
                        o += ow


# --- convolution's window gradients on pixel rows (ops/_pixel_rows.py) ---------------------------
# The numpy fold adds each tap's window gradients with one strided slice addition over
# (images, oh, ow, C), whose innermost runs are one pixel's ``C`` channels: numpy's
# iterator takes a call per run (16 floats on a 16-channel layer). This loop adds the same
# runs, image by image and in each image tap by tap: every element receives its terms in
# the numpy kernel's order (an element is in one image), so both give the same bits, and
# one image's gradient and windows stay in cache while its taps are added.
@_jit((A32, A32, _N, _N, _N, _N, _N, _N, *_WIN), (A64, A64, _N, _N, _N, _N, _N, _N, *_WIN))
def rows_fold(cols, xp, n, c, hp, wp, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``xp`` (N, Hp, Wp, C), flat, += the window gradients ``cols`` (N, oh, ow, kh, kw, C),
    flat, tap by tap (``pt``, ``pl`` unused: ``xp`` is padded)."""
    for img in range(n):
        for a in range(kh):
            for b in range(kw):
                for i in range(oh):
                    for j in range(ow):
                        src = ((((img * oh + i) * ow + j) * kh + a) * kw + b) * c
                        dst = ((img * hp + i * sh + a * dh) * wp + j * sw + b * dw) * c
                        for ch in range(c):
                            xp[_U(dst + ch)] += cols[_U(src + ch)]


# --- convolution's layout changes on pixel rows (Note [Channels last by a compiled copy]) -------
# Note [Channels last by a compiled copy]: pixel rows copy the input (N, C, H, W) into a
# padded (N, Hp, Wp, C) and, for the input's gradient, the padded gradient back. numpy
# makes that transposing copy with ``C`` elements per inner loop, the reads one plane
# apart: 2 ns an element, a third of a 16-channel strided layer's forward. These loops
# take one image row at a time: the row's ``C`` runs fill the same few cache lines of the
# output (``Wp * C`` elements), which stay in L1 until the row is done. (Channel by
# channel over a whole image instead, each pass wrote one element into every line of the
# image's output, more lines than L1 holds, so every line came back from L2 once per
# channel: twice the time.) In the row, each block of 8 channels of 8 pixels is read as
# eight vectors, transposed in registers by shuffles and written as eight vectors of one
# pixel's 8 channels (``_transpose8``: LLVM does not vectorise the element-by-element
# loop, whose stores are ``C`` apart); the channels and pixels past the last full block
# are copied one by one. The reverse copy reads one pixel apart and writes rows in order,
# by the same blocks. A copy: the same bits as numpy's.
@intrinsic
def _transpose8(typingctx, src, s, sstride, dst, d, dstride):  # type: ignore[no-untyped-def]
    """``dst[d + k * dstride + i] = src[s + i * sstride + k]`` for ``i, k < 8``: an 8 x 8 block
    transposed in registers, eight vector loads, three rounds of two-vector shuffles
    (round ``b`` swaps the off-diagonal ``b x b`` blocks of each pair of rows ``b`` apart),
    eight vector stores (Note [Channels last by a compiled copy])."""
    sig = types.none(src, types.intp, types.intp, dst, types.intp, types.intp)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        source = context.make_array(sig.args[0])(context, builder, args[0])
        target = context.make_array(sig.args[3])(context, builder, args[3])
        s, ss, d, ds = args[1], args[2], args[4], args[5]
        dt = sig.args[0].dtype
        vptr = ir.VectorType(context.get_value_type(dt), 8).as_pointer()
        align = dt.bitwidth // 8
        rows = []
        for k in range(8):
            at = builder.add(s, builder.mul(ss, ir.Constant(ss.type, k)))
            rows.append(builder.load(builder.bitcast(builder.gep(source.data, [at]), vptr), align=align))
        lanes = ir.VectorType(ir.IntType(32), 8)
        for b in (1, 2, 4):
            low = ir.Constant(lanes, [c if not c & b else 8 + c - b for c in range(8)])
            high = ir.Constant(lanes, [c + b if not c & b else 8 + c for c in range(8)])
            new = list(rows)
            for r in range(8):
                if not r & b:
                    new[r] = builder.shuffle_vector(rows[r], rows[r + b], low)
                    new[r + b] = builder.shuffle_vector(rows[r], rows[r + b], high)
            rows = new
        for k in range(8):
            at = builder.add(d, builder.mul(ds, ir.Constant(ds.type, k)))
            builder.store(rows[k], builder.bitcast(builder.gep(target.data, [at]), vptr), align=align)
        return context.get_dummy_value()
    return sig, codegen


@njit(inline="always")
def _row_channels_last(x, out, img, c, h, w, dst0, wp):  # type: ignore[no-untyped-def]
    """Image ``img`` of ``x`` (N, C, H, W), flat, into ``out``, flat, channels last: its
    element ``(ch, r, col)`` at ``dst0 + (r * wp + col) * c + ch``; by blocks of 8 channels
    of 8 pixels, the rest one by one."""
    c8, w8, hw = c - c % 8, w - w % 8, h * w
    for r in range(h):
        for ch in range(c):
            src = ((img * c + ch) * h + r) * w
            dst = dst0 + r * wp * c + ch
            if ch < c8:
                if ch % 8 == 0:
                    for col in range(0, w8, 8):
                        _transpose8(x, src + col, hw, out, dst + col * c, c)
                lo = w8
            else:
                lo = 0
            for col in range(lo, w):
                out[_U(dst + col * c)] = x[_U(src + col)]


@njit(inline="always")
def _row_channels_first(xp, out, img, c, h, w, src0, wp):  # type: ignore[no-untyped-def]
    """The inverse of ``_row_channels_last``: image ``img`` of ``out`` (N, C, H, W), flat,
    from ``xp``, flat, its element ``(ch, r, col)`` at ``src0 + (r * wp + col) * c + ch``."""
    c8, w8, hw = c - c % 8, w - w % 8, h * w
    for r in range(h):
        for ch in range(c):
            src = src0 + r * wp * c + ch
            dst = ((img * c + ch) * h + r) * w
            if ch < c8:
                if ch % 8 == 0:
                    for col in range(0, w8, 8):
                        _transpose8(xp, src + col * c, c, out, dst + col, hw)
                lo = w8
            else:
                lo = 0
            for col in range(lo, w):
                out[_U(dst + col)] = xp[_U(src + col * c)]


@_jit((A32, A32, _N, _N, _N, _N, _N, _N, _N, _N), (A64, A64, _N, _N, _N, _N, _N, _N, _N, _N))
def channels_last(x, out, n, c, h, w, hp, wp, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (N, Hp, Wp, C), flat, zeros in the padding on entry: ``x`` (N, C, H, W),
    flat, written at rows ``pt`` and columns ``pl`` on."""
    for img in range(n):
        _row_channels_last(x, out, img, c, h, w, ((img * hp + pt) * wp + pl) * c, wp)


@_jit((A32, A32, _N, _N, _N, _N, _N, _N, _N, _N), (A64, A64, _N, _N, _N, _N, _N, _N, _N, _N))
def channels_first(xp, out, n, c, h, w, hp, wp, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (N, C, H, W), flat: the rows ``pt`` to ``pt + H`` and columns ``pl`` to ``pl + W``
    of ``xp`` (N, Hp, Wp, C), flat (the inverse of ``channels_last``)."""
    for img in range(n):
        _row_channels_first(xp, out, img, c, h, w, ((img * hp + pt) * wp + pl) * c, wp)


# Note [Pixel rows straight from the input]: the windows on pixel rows were two copies, the
# input into a padded channels-last buffer the size of the batch (fresh memory, written
# out to L3 and read back), then each part's windows out of it. This kernel makes both
# copies image by image through one padded channels-last image ``tmp`` (zeros in its
# padding, which no image writes): each image is copied into it as above, while it is in
# L1 and L2 its windows are copied out in runs of ``kw * C`` (``C`` when dilated), and
# the batch-sized buffer is never made. The fold on pixel rows (the input's gradient)
# runs the same way backwards: each image's window gradients are added onto ``tmp``
# (zeroed first) tap by tap in the order of ``rows_fold``, then copied out cropped to
# channels first. Copies and the same additions in the same order: numpy's bits.
@_jit((A32, A32, A32, *(_N,) * 17), (A64, A64, A64, *(_N,) * 17))
def rows_unfold(x, out, tmp, n0, m, c, h, w, hp, wp, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """``out`` (m, oh, ow, kh, kw, C), flat: the windows on pixel rows of images ``n0`` to
    ``n0 + m`` of ``x`` (N, C, H, W), flat, through ``tmp`` (Hp, Wp, C), flat, zeros on entry."""
    run = kw * c if dw == 1 else c
    runs = kh if dw == 1 else kh * kw
    o = 0
    for img in range(n0, n0 + m):
        _row_channels_last(x, tmp, img, c, h, w, (pt * wp + pl) * c, wp)
        for i in range(oh):
            for j in range(ow):
                for t in range(runs):
                    a, b = (t, 0) if dw == 1 else (t // kw, t % kw)
                    s = ((i * sh + a * dh) * wp + j * sw + b * dw) * c
                    for k in range(run):
                        out[_U(o + k)] = tmp[_U(s + k)]
                    o += run


@_jit((A32, A32, A32, *(_N,) * 17), (A64, A64, A64, *(_N,) * 17))
def rows_fold_first(cols, out, tmp, n0, m, c, h, w, hp, wp, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """Images ``n0`` to ``n0 + m`` of ``out`` (N, C, H, W), flat: the window gradients
    ``cols`` (m, oh, ow, kh, kw, C), flat, of those images folded back through ``tmp``
    (Hp, Wp, C), flat: the adjoint of ``rows_unfold``."""
    for img in range(m):
        for e in range(hp * wp * c):
            tmp[_U(e)] = 0
        for a in range(kh):
            for b in range(kw):
                for i in range(oh):
                    for j in range(ow):
                        src = ((((img * oh + i) * ow + j) * kh + a) * kw + b) * c
                        dst = ((i * sh + a * dh) * wp + j * sw + b * dw) * c
                        for ch in range(c):
                            tmp[_U(dst + ch)] += cols[_U(src + ch)]
        _row_channels_first(tmp, out, n0 + img, c, h, w, (pt * wp + pl) * c, wp)


# Note [Parallel kernels give the serial bits]: each parallel form cuts its arrays into one
# contiguous part per thread (elements, or whole rows) and runs the serial kernel on each
# part, so every element, and every row's reductions (softmax's max and sum, layer_norm's
# mean and variance), is computed by the same code in the same order as on one thread.
# layer_norm's joint backward sums dw and db over rows by blocks of ``_BLOCK`` rows (Note
# [Column sums by row blocks]); its parallel form runs the serial kernel on each block (a
# block's sums, in x's type, go through its float64 total and back exactly) and adds them
# into the float64 totals in block order, as the serial kernel does. Every parallel form
# calls its serial kernel, never a copy of the serial loops: the joint backward's form once
# ran an inlined copy of the rows, which gave the serial bits when numba had just compiled
# it and other bits (its vectorised sums and fused multiply-adds ordered otherwise) when
# numba loaded it from its cache, so the result depended on whether the process compiled
# the kernels or found them cached (issue 33). Tests hold the two forms to equal bits, NaN
# and inf included, and a parallel form loaded from the cache to the bits of the same form
# just compiled (tests/test_kernel_cache.py).
def _tbb_layer() -> bool:
    """Whether numba's parallel loops will run on the TBB layer, loading TBB if the
    ``tbb`` wheel installed it in the environment's ``lib`` (pip puts it there, where the
    dynamic loader does not look; loaded by path, numba's own lookup by name finds it)."""
    import ctypes
    import importlib
    import sys

    try:
        from numba.core import config
        from numba.np.ufunc import parallel as numba_parallel

        if getattr(numba_parallel, "_is_initialized", False):  # someone launched a parallel loop already
            return bool(numba_parallel._threading_layer == "tbb")
        chosen = str(getattr(config, "THREADING_LAYER", "default")).lower()
        if chosen not in ("default", "tbb", "safe", "threadsafe", "forksafe"):
            return False  # a layer chosen by the user: leave it alone, run serially
        name = "libtbb.12.dylib" if sys.platform == "darwin" else "libtbb.so.12"
        for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
            path = os.path.join(prefix, "lib", name)
            if os.path.exists(path):
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                break
        numba_parallel._check_tbb_version_compatible()
        importlib.import_module("numba.np.ufunc.tbbpool")  # the layer's extension loads
    except Exception:  # noqa: BLE001 - no usable TBB: serial kernels
        return False
    return True


PARALLEL = intra_op.load_forms and _tbb_layer()


# parts per parallel call: numba hands each thread a contiguous run of them (16 spreads
# evenly over up to 16 threads). A constant, not ``get_num_threads()``: a kernel that calls
# that cannot be cached (numba: "dynamic globals"), and compiling them all takes a minute.
_PARTS = 16


def _pjit(*sigs):  # type: ignore[no-untyped-def]
    return njit(list(sigs), nogil=True, parallel=True, fastmath=_FLAGS, cache=_CACHE, error_model="numpy")


def _pjit_exact(*sigs):  # type: ignore[no-untyped-def]
    """As ``_pjit`` without fast-math flags (``adam_step``'s parallel form: Note [Adam in one pass])."""
    return njit(list(sigs), nogil=True, parallel=True, cache=_CACHE, error_model="numpy")


def _dispatch(serial, parallel, minimum):  # type: ignore[no-untyped-def]
    """The public kernel: ``parallel`` when its first array has at least ``intra_op.<minimum>``
    elements and the switch allows it (Note [Intra-op threads]), else ``serial``."""
    def call(*args):  # type: ignore[no-untyped-def]
        if args[0].size >= getattr(intra_op, minimum) and intra_op.allowed():
            return parallel(*args)
        return serial(*args)
    call.serial = serial  # type: ignore[attr-defined]
    call.parallel = parallel  # type: ignore[attr-defined]
    call.__name__ = call.__qualname__ = serial.__name__
    call.__doc__ = serial.__doc__
    return call


_PARALLEL_FORMS = {  # public kernel: its parallel form, and the intra_op threshold it goes parallel from
    "gelu": ("_gelu_p", "MIN_HEAVY"),
    "gelu_backward": ("_gelu_backward_p", "MIN_HEAVY"),
    "gelu_tanh": ("_gelu_tanh_p", "MIN_HEAVY"),
    "gelu_tanh_backward": ("_gelu_tanh_backward_p", "MIN_HEAVY"),
    "sigmoid": ("_sigmoid_p", "MIN_HEAVY"),
    "sigmoid_backward": ("_sigmoid_backward_p", "MIN_LIGHT"),
    "tanh_backward": ("_tanh_backward_p", "MIN_LIGHT"),
    "threshold_backward": ("_threshold_backward_p", "MIN_LIGHT"),
    "softmax": ("_softmax_p", "MIN_HEAVY"),
    "softmax_backward": ("_softmax_backward_p", "MIN_LIGHT"),
    "log_softmax": ("_log_softmax_p", "MIN_HEAVY"),
    "log_softmax_backward": ("_log_softmax_backward_p", "MIN_LIGHT"),
    "layer_norm": ("_layer_norm_p", "MIN_HEAVY"),
    "layer_norm_backward": ("_layer_norm_backward_p", "MIN_LIGHT"),
    "layer_norm_backward_joint": ("_layer_norm_backward_joint_p", "MIN_LIGHT"),
    "select_rows": ("_select_rows_p", "MIN_LIGHT"),
    "adam_step": ("_adam_step_p", "MIN_HEAVY"),
}


def _install(on: bool) -> None:
    """Make each public kernel with a parallel form its dispatcher (``on``) or its serial
    kernel, so that with the switch off (the default) a call costs what it did before the
    parallel forms (a dispatcher costs ~0.3 us a call). ``intra_op.set_enabled`` calls it."""
    table = _DISPATCHING if on else _SERIAL
    globals().update(table)


if PARALLEL:
    _E2 = ((A32, A32), (A64, A64))
    _E3 = ((A32, A32, A32), (A64, A64, A64))
    _E4 = ((A32, A32, A32, A32), (A64, A64, A64, A64))
    _R2 = ((M32, M32), (M64, M64))
    _R3 = ((M32, M32, M32), (M64, M64, M64))

    @_pjit(*_E3)
    def _gelu_p(x, out, cdf):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            gelu(x[lo:hi], out[lo:hi], cdf[lo:hi])

    @_pjit(*_E4)
    def _gelu_backward_p(g, x, cdf, out):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            gelu_backward(g[lo:hi], x[lo:hi], cdf[lo:hi], out[lo:hi])

    @_pjit(*_E2)
    def _gelu_tanh_p(x, out):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            gelu_tanh(x[lo:hi], out[lo:hi])

    @_pjit(*_E3)
    def _gelu_tanh_backward_p(g, x, out):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            gelu_tanh_backward(g[lo:hi], x[lo:hi], out[lo:hi])

    @_pjit(*_E2)
    def _sigmoid_p(x, out):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            sigmoid(x[lo:hi], out[lo:hi])

    @_pjit(*_E3)
    def _sigmoid_backward_p(g, ans, out):  # type: ignore[no-untyped-def]
        n, k = ans.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            sigmoid_backward(g[lo:hi], ans[lo:hi], out[lo:hi])

    @_pjit(*_E3)
    def _tanh_backward_p(g, ans, out):  # type: ignore[no-untyped-def]
        n, k = ans.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            tanh_backward(g[lo:hi], ans[lo:hi], out[lo:hi])

    @_pjit(*_E3)
    def _threshold_backward_p(g, ans, out):  # type: ignore[no-untyped-def]
        n, k = ans.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            threshold_backward(g[lo:hi], ans[lo:hi], out[lo:hi])

    @_pjit(*_R2)
    def _softmax_p(x, out):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            softmax(x[lo:hi], out[lo:hi])

    @_pjit(*_R3)
    def _softmax_backward_p(g, ans, out):  # type: ignore[no-untyped-def]
        n, k = ans.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            softmax_backward(g[lo:hi], ans[lo:hi], out[lo:hi])

    @_pjit(*_R2)
    def _log_softmax_p(x, out):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            log_softmax(x[lo:hi], out[lo:hi])

    @_pjit(*_R3)
    def _log_softmax_backward_p(g, ans, out):  # type: ignore[no-untyped-def]
        n, k = ans.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            log_softmax_backward(g[lo:hi], ans[lo:hi], out[lo:hi])

    @_pjit((M32, A32, A32, F64, M32, M32, M32), (M64, A64, A64, F64, M64, M64, M64))
    def _layer_norm_p(x, w, b, eps, out, xhat, rstd):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            layer_norm(x[lo:hi], w, b, eps, out[lo:hi], xhat[lo:hi], rstd[lo:hi])

    @_pjit((M32, M32, M32, A32, M32), (M64, M64, M64, A64, M64))
    def _layer_norm_backward_p(g, xhat, rstd, w, out):  # type: ignore[no-untyped-def]
        n, k = g.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            layer_norm_backward(g[lo:hi], xhat[lo:hi], rstd[lo:hi], w, out[lo:hi])

    @_pjit(*_JOINT)
    def _layer_norm_backward_joint_p(g, xhat, rstd, w, need_dx, dx, dw, db):  # type: ignore[no-untyped-def]
        rows, n = g.shape
        blocks = (rows + _BLOCK - 1) // _BLOCK
        part_w = np.zeros((blocks, n), dtype=g.dtype)
        part_b = np.zeros((blocks, n), dtype=g.dtype)
        for blk in prange(blocks):  # each block's column sums, exact in its float64 total, back in g's type
            lo, hi = blk * _BLOCK, min((blk + 1) * _BLOCK, rows)
            layer_norm_backward_joint(g[lo:hi], xhat[lo:hi], rstd[lo:hi], w, need_dx, dx[lo:hi], part_w[blk],
                                      part_b[blk])
        total_w = np.zeros(n, dtype=np.float64)
        total_b = np.zeros(n, dtype=np.float64)
        for blk in range(blocks):  # in block order, as the serial kernel
            pw, pb = part_w[blk], part_b[blk]
            for j in range(n):
                total_w[j] += pw[j]
                total_b[j] += pb[j]
        for j in range(dw.size):
            dw[j] = total_w[j]
        for j in range(db.size):
            db[j] = total_b[j]

    @_pjit((M32, types.boolean[::1], types.boolean, F32, M32), (M64, types.boolean[::1], types.boolean, F64, M64))
    def _select_rows_p(x, mask, keep, fill, out):  # type: ignore[no-untyped-def]
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            select_rows(x[lo:hi], mask, keep, fill, out[lo:hi])

    @_pjit_exact(_S32, _S64)
    def _adam_step_p(x, g, m, v, decoupled, decay, maximize, use_l2, l2,  # type: ignore[no-untyped-def]
                     lerp_small, w1, one_minus_w1, beta2, c2, neg_step_size, bc2_sqrt, eps):
        n, k = x.shape[0], _PARTS
        for c in prange(k):
            lo, hi = c * n // k, (c + 1) * n // k
            adam_step(x[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], decoupled, decay, maximize, use_l2, l2,
                      lerp_small, w1, one_minus_w1, beta2, c2, neg_step_size, bc2_sqrt, eps)

    _SERIAL = {name: globals()[name] for name in _PARALLEL_FORMS}
    _DISPATCHING = {name: _dispatch(_SERIAL[name], globals()[par], minimum)
                    for name, (par, minimum) in _PARALLEL_FORMS.items()}
    intra_op.available = True
    intra_op.on_switch = _install
    _install(intra_op.enabled())


# --- products over the same pool (Note [One pool] in intra_op.py) --------------------------------
def _numpy_gemm() -> tuple[object, object] | None:
    """numpy's own BLAS ``cblas_sgemm`` and ``cblas_dgemm`` as ctypes functions, or None
    (a BLAS whose symbols are not found: products stay numpy's). The symbols of numpy's
    wheels (``scipy_cblas_?gemm64_``, 64-bit integers) first, then a plain CBLAS."""
    import ctypes

    try:
        from threadpoolctl import ThreadpoolController

        paths = [lib.filepath for lib in ThreadpoolController().select(user_api="blas").lib_controllers
                 if "numpy" in lib.filepath]
        if not paths:
            return None
        lib = ctypes.CDLL(paths[0])
    except Exception:  # noqa: BLE001 - no threadpoolctl or no loadable BLAS: numpy's products
        return None
    for prefix, suffix, index in (("scipy_cblas_", "64_", ctypes.c_int64), ("cblas_", "64_", ctypes.c_int64),
                                  ("cblas_", "", ctypes.c_int)):
        fns = []
        for letter, real in (("s", ctypes.c_float), ("d", ctypes.c_double)):
            fn = getattr(lib, f"{prefix}{letter}gemm{suffix}", None)
            if fn is None:
                break
            fn.restype = None
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, index, index, index, real,
                           ctypes.c_void_p, index, ctypes.c_void_p, index, real, ctypes.c_void_p, index]
            fns.append(fn)
        if len(fns) == 2:
            return fns[0], fns[1]
    return None


_PRODUCT_PARTS = 2  # row blocks per product: one per core here; more blocks thin each GEMM
_ROW, _NOTRANS, _TRANS = 101, 111, 112  # CBLAS's enums
_PRODUCT_ROWS: dict[np.dtype, object] = {}  # dtype -> compiled split product, once built


def _product_rows(gemm):  # type: ignore[no-untyped-def]
    def product(a, b, out):  # type: ignore[no-untyped-def]
        # out (n, m) = a (n, k) @ b (k, m), the rows of ``out`` cut into blocks, one
        # single-threaded GEMM per block; a and b each have one unit stride
        n, k = a.shape
        m = b.shape[1]
        size = a.itemsize
        ta, lda = (_NOTRANS, a.strides[0] // size) if a.strides[1] == size else (_TRANS, a.strides[1] // size)
        tb, ldb = (_NOTRANS, b.strides[0] // size) if b.strides[1] == size else (_TRANS, b.strides[1] // size)
        parts = _PRODUCT_PARTS
        for c in prange(parts):
            lo, hi = c * n // parts, (c + 1) * n // parts
            gemm(_ROW, ta, tb, hi - lo, m, k, 1.0, a[lo:].ctypes.data, lda, b.ctypes.data, ldb, 0.0,
                 out[lo:].ctypes.data, m)
    return product


def _split_product(a, b, out):  # type: ignore[no-untyped-def]
    """``a @ b`` of 2-D float arrays split over the pool into ``out`` (or a new array),
    or None when Note [One pool] does not apply (then ``linalg._mm`` runs numpy's)."""
    if not intra_op.one_pool:
        return None
    kernel = _PRODUCT_ROWS.get(a.dtype)
    if kernel is None or b.dtype != a.dtype or a.ndim != 2 or b.ndim != 2:
        return None
    n, k = a.shape
    m = b.shape[1]
    if n < _PRODUCT_PARTS or n * k * m < intra_op.MIN_PRODUCT or b.shape[0] != k:
        return None
    size = a.itemsize
    for x in (a, b):  # one unit stride (a BLAS layout), the other a positive multiple
        s0, s1 = x.strides
        if not ((s1 == size and s0 >= x.shape[1] * size) or (s0 == size and s1 >= x.shape[0] * size)):
            return None
    if out is None:
        out = np.empty((n, m), a.dtype)
    elif out.dtype != a.dtype or out.shape != (n, m) or not out.flags.c_contiguous:
        return None
    if not intra_op.allowed():
        return None
    kernel(a, b, out)  # type: ignore[operator]
    return out


def _build_product() -> bool:
    """Compile the split product the first time one pool is turned on (Note [One pool]);
    whether numpy's BLAS gemm was found. Not cached, as the BLAS functions' addresses are
    compiled in (~1 s): built lazily, so a process that never turns one pool on never
    pays it, with TBB installed or not."""
    if intra_op.product is not None:
        return True
    gemm = _numpy_gemm()
    if gemm is None:
        return False
    sgemm, dgemm = gemm
    _PRODUCT_ROWS[np.dtype(np.float64)] = njit([(types.float64[:, :], types.float64[:, :], M64)],
                                               nogil=True, parallel=True)(_product_rows(dgemm))
    _PRODUCT_ROWS[np.dtype(np.float32)] = njit([(types.float32[:, :], types.float32[:, :], M32)],
                                               nogil=True, parallel=True)(_product_rows(sgemm))
    intra_op.product = _split_product
    return True


if PARALLEL:
    intra_op.build_product = _build_product
    if intra_op.one_pool:  # (ASYNCGRAD_INTRA_OP=pool: built now, on the loader thread)
        _build_product()
