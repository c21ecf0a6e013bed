"""Elementwise primitives: forward kernel and derivative rules, one row each.

Rules read ``rule(m, g, ans, x, y, ...)``: ``g`` is the output's gradient, ``ans`` the
output (when saved), ``x``/``y``/``z`` the saved inputs. A rule may return the broadcast
shape; the engine sums it down to the input's shape (``_broadcast.sum_to``).
Ties and kinks follow PyTorch: relu'(0) = 0, |x|'(0) = 0, clamp passes the gradient
where ``min <= x <= max``, maximum/minimum split it in half at ties.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .kernels import compiled_path as fast
from ._quiet import quiet
from ._spec import FACTOR_MAX_ELEMENTS, IDENTITY, GradFactor, defop
from .kernels.special import erf as _erf

_2_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


@quiet  # 0 ** negative is masked out
def _pow_base_rule(m, g, ans, x, y):  # type: ignore[no-untyped-def]
    # d/dx x**y = y * x**(y-1); zero when y == 0 (PyTorch's pow_backward)
    return m.where(y == 0, 0.0, g * y * x ** (y - 1))


@quiet  # log(0) is masked out
def _pow_exponent_rule(m, g, ans, x, y):  # type: ignore[no-untyped-def]
    # d/dy x**y = x**y * log(x); zero where x == 0 and y >= 0 (PyTorch's pow_backward_exponent)
    return m.where((x == 0) & (y >= 0), 0.0, g * ans * m.log(x))


def _sigmoid(x):  # type: ignore[no-untyped-def]
    out = fast.sigmoid(x)
    if out is not None:
        return out
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives exactly 0
        if x.dtype.kind != "f" or x.ndim == 0:
            return 1.0 / (1.0 + np.exp(-x))
        t = np.negative(x)  # one buffer for the four steps
        np.exp(t, out=t)
        t += 1
        np.reciprocal(t, out=t)
        return t


def _sigmoid_rule(m, g, ans, x):  # type: ignore[no-untyped-def]
    if m.tensor_mode or ans.ndim == 0:
        return g * ans * (1.0 - ans)
    d = fast.sigmoid_backward(g, ans)
    if d is not None:
        return d
    d = 1 - ans
    d *= ans
    d *= g
    return d


def _relu(x: np.ndarray) -> np.ndarray:
    # one compiled pass, when loaded (numpy's maximum is NaN-aware and slower)
    out = fast.relu(x) if type(x) is np.ndarray else None
    return np.maximum(x, 0) if out is None else out


def _tanh_rule(m, g, ans, x):  # type: ignore[no-untyped-def]
    d = None if m.tensor_mode else fast.tanh_backward(g, ans)
    return g * (1.0 - ans * ans) if d is None else d


def _clamp(x, *, lo, hi):  # type: ignore[no-untyped-def]
    return np.clip(x, lo, hi)


def _clamp_rule(m, g, ans, x, *, lo, hi):  # type: ignore[no-untyped-def]
    inside = True
    if lo is not None:
        inside = x >= lo
    if hi is not None:
        inside = (x <= hi) if inside is True else (inside & (x <= hi))
    return m.where(inside, g, 0.0)


# Note [Gradient factors] in _spec.py: the rules below that are ``g * factor`` (the factor
# forms hold where no compiled kernel runs, which the runs' size bound keeps)
assert FACTOR_MAX_ELEMENTS < fast.ELEMENTWISE_MIN
_TIMES_Y = GradFactor(2)  # mul's input 0: g * y
_TIMES_X = GradFactor(1)  # mul's input 1: g * x
_TIMES_ANS = GradFactor(0, own=True)  # exp's: g * ans
_COS_X = GradFactor(1, lambda m, x: m.cos(x), own=True)  # sin's: g * cos(x)
_TANH_SLOPE = GradFactor(0, lambda m, ans: 1.0 - ans * ans, own=True)  # tanh's: g * (1 - ans^2)

# name --------------- node name -------- forward ---------- saves -- derivative per input
add = defop("AddBackward0", np.add,
            lambda m, g, ans, x, y: g,
            lambda m, g, ans, x, y: g, cost=0.0, factors=(IDENTITY, IDENTITY))
sub = defop("SubBackward0", np.subtract,
            lambda m, g, ans, x, y: g,
            lambda m, g, ans, x, y: -g, factors=(IDENTITY, None))
rsub = defop("RsubBackward1", np.subtract,  # ``scalar - tensor``, named as PyTorch's rsub
             None,
             lambda m, g, ans, x, y: -g)
mul = defop("MulBackward0", np.multiply,
            lambda m, g, ans, x, y: g * y,
            lambda m, g, ans, x, y: g * x, save="x@1 y@0", symmetric=True,
            takes_views=True,  # (Note [Mean's gradient as a view] in autograd/task/step.py)
            factors=(_TIMES_Y, _TIMES_X))
# Kernels that can divide by zero, overflow or leave their domain are ``quiet``: PyTorch
# returns inf/nan there without a warning, numpy warns (see _quiet.py).
div = defop("DivBackward0", quiet(np.true_divide, 2),
            quiet(lambda m, g, ans, x, y: g / y),
            quiet(lambda m, g, ans, x, y: -g * x / (y * y)), save="x@1 y")
pow_scalar = defop("PowBackward0", quiet(np.power, 2),
                   _pow_base_rule, None, save="x y")
pow_tensor = defop("PowBackward1", quiet(np.power, 2),
                   _pow_base_rule, _pow_exponent_rule, save="x y ans")
rpow = defop("PowBackward2", quiet(np.power, 2),
             None, _pow_exponent_rule, save="x y ans")
maximum = defop("MaximumBackward0", np.maximum,
                lambda m, g, ans, x, y: m.where(x > y, g, m.where(x == y, g * 0.5, 0.0)),
                lambda m, g, ans, x, y: m.where(y > x, g, m.where(x == y, g * 0.5, 0.0)),
                save="x y")
minimum = defop("MinimumBackward0", np.minimum,
                lambda m, g, ans, x, y: m.where(x < y, g, m.where(x == y, g * 0.5, 0.0)),
                lambda m, g, ans, x, y: m.where(y < x, g, m.where(x == y, g * 0.5, 0.0)),
                save="x y")
def _where(c, a, b):  # type: ignore[no-untyped-def]
    """``np.where(c, a, b)``; compiled when one side is a scalar and the mask broadcasts
    over the other's leading dims (an attention mask: Note [Masks broadcast over rows])."""
    if b.ndim == 0 and a.ndim >= c.ndim:
        out = fast.select(c, a, b, True)
    elif a.ndim == 0 and b.ndim >= c.ndim:
        out = fast.select(c, b, a, False)
    else:
        out = None
    return np.where(c, a, b) if out is None else out


def _select_grad(m, c, g, keep):  # type: ignore[no-untyped-def]
    """``g`` where ``c == keep``, else 0: the gradient through a where / masked_fill."""
    if not m.tensor_mode:
        d = fast.select(c, g, 0.0, keep)
        if d is not None:
            return d
    return m.where(c, g, 0.0) if keep else m.where(c, 0.0, g)


where = defop("WhereBackward0", _where,
              None,
              lambda m, g, ans, c, a, b: _select_grad(m, c, g, True),
              lambda m, g, ans, c, a, b: _select_grad(m, c, g, False), save="x")

neg = defop("NegBackward0", np.negative, lambda m, g, ans, x: -g)
abs_ = defop("AbsBackward0", np.abs, lambda m, g, ans, x: g * m.sign(x), save="x")
exp = defop("ExpBackward0", quiet(np.exp, 1), lambda m, g, ans, x: g * ans, save="ans",
            factors=(_TIMES_ANS,))
log = defop("LogBackward0", quiet(np.log, 1), quiet(lambda m, g, ans, x: g / x), save="x")
sqrt = defop("SqrtBackward0", quiet(np.sqrt, 1), quiet(lambda m, g, ans, x: g / (2.0 * ans)), save="ans")
sin = defop("SinBackward0", np.sin, lambda m, g, ans, x: g * m.cos(x), save="x", factors=(_COS_X,))
cos = defop("CosBackward0", np.cos, lambda m, g, ans, x: -g * m.sin(x), save="x")
tanh = defop("TanhBackward0", np.tanh, _tanh_rule, save="ans", factors=(_TANH_SLOPE,))
sigmoid = defop("SigmoidBackward0", _sigmoid, _sigmoid_rule, save="ans")
relu = defop("ReluBackward0", _relu, lambda m, g, ans, x: m.threshold_backward(g, ans), save="ans")
erf = defop("ErfBackward0", _erf,
            lambda m, g, ans, x: g * _2_OVER_SQRT_PI * m.exp(-(x * x)), save="x")
clamp = defop("ClampBackward1", _clamp, _clamp_rule, save="x")
clone = defop("CloneBackward0", np.copy, lambda m, g, ans, x: g, cost=0.0, factors=(IDENTITY,))

# Ops that only appear inside derivative rules under create_graph (PyTorch's names). Their
# derivative with respect to the mask-defining input is zero, but depending on it keeps
# ``requires_grad`` as PyTorch has it: the gradient of ``x.abs()`` or ``x.relu()`` taken
# with create_graph=True can be differentiated again (to zeros) rather than raising.
sgn = defop("SgnBackward0", np.sign, lambda m, g, ans, x: m.zeros_like(g))
threshold_backward = defop("ThresholdBackwardBackward0", lambda g, ans: np.where(ans > 0, g, 0),
                           lambda m, gg, _, g, ans: m.threshold_backward(gg, ans),
                           lambda m, gg, _, g, ans: m.zeros_like(gg), save="y")


# --- added for PyTorch parity ----------------------------------------------------------------
def _tri_mask(shape: tuple[int, ...], k: int, lower: bool) -> np.ndarray:
    """The kept positions of ``tril(k)`` (``lower``) or ``triu(k)`` for the last two dims."""
    rows, cols = shape[-2], shape[-1]
    return np.tri(rows, cols, k, dtype=bool) if lower else ~np.tri(rows, cols, k - 1, dtype=bool)


masked_fill = defop("MaskedFillBackward0", lambda x, v, *, mask: _where(mask, v, x),
                    lambda m, g, ans, x, v, *, mask: _select_grad(m, mask, g, False),
                    lambda m, g, ans, x, v, *, mask: m.where(mask, g, 0.0))  # summed to the 0-d value
tril = defop("TrilBackward0", lambda x, *, k: np.tril(x, k),
             lambda m, g, ans, x, *, k: m.where(_tri_mask(g.shape, k, True), g, 0.0))
triu = defop("TriuBackward0", lambda x, *, k: np.triu(x, k),
             lambda m, g, ans, x, *, k: m.where(_tri_mask(g.shape, k, False), g, 0.0))
# In-place random fills and bernoulli: their output does not depend on the input's values,
# so the input gets a zero gradient (PyTorch records them all the same). The sample is drawn
# by the caller (asyncgrad.sampling), so there is no forward kernel here.
uniform = defop("UniformBackward0", None, lambda m, g, ans, x: m.zeros_like(g))  # type: ignore[arg-type]
normal = replace(uniform, node_name="NormalBackward0")
bernoulli = replace(uniform, node_name="BernoulliBackward0")
bernoulli_scalar = replace(uniform, node_name="BernoulliBackward2")  # bernoulli_(float p)
bernoulli_tensor = defop("BernoulliBackward1", None,  # type: ignore[arg-type]
                         lambda m, g, ans, x, p: m.zeros_like(g),
                         lambda m, g, ans, x, p: m.zeros_like(g))  # summed down to p's shape


# --- more of PyTorch's elementwise functions (issue 32) ------------------------------------
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


def _zero_rule(m, g, ans, x):  # type: ignore[no-untyped-def]
    return m.zeros_like(g)  # piecewise constant: a zero gradient (PyTorch's for floor etc.)


rsqrt = defop("RsqrtBackward0", quiet(lambda x: 1.0 / np.sqrt(x), 1),
              lambda m, g, ans, x: -0.5 * g * ans * ans * ans, save="ans")
log1p = defop("Log1PBackward0", quiet(np.log1p, 1), quiet(lambda m, g, ans, x: g / (x + 1.0)), save="x")
expm1 = defop("Expm1Backward0", quiet(np.expm1, 1), lambda m, g, ans, x: g * (ans + 1.0), save="ans")
log2 = defop("Log2Backward0", quiet(np.log2, 1), quiet(lambda m, g, ans, x: g / (x * _LN2)), save="x")
log10 = defop("Log10Backward0", quiet(np.log10, 1), quiet(lambda m, g, ans, x: g / (x * _LN10)), save="x")
exp2 = defop("Exp2Backward0", quiet(np.exp2, 1), lambda m, g, ans, x: g * ans * _LN2, save="ans")
sinh = defop("SinhBackward0", quiet(np.sinh, 1),
             lambda m, g, ans, x: g * (m.exp(x) + m.exp(-x)) * 0.5, save="x")
cosh = defop("CoshBackward0", quiet(np.cosh, 1),
             lambda m, g, ans, x: g * (m.exp(x) - m.exp(-x)) * 0.5, save="x")
asin = defop("AsinBackward0", quiet(np.arcsin, 1),
             quiet(lambda m, g, ans, x: g / m.sqrt(1.0 - x * x)), save="x")
acos = defop("AcosBackward0", quiet(np.arccos, 1),
             quiet(lambda m, g, ans, x: -g / m.sqrt(1.0 - x * x)), save="x")
atan = defop("AtanBackward0", np.arctan, lambda m, g, ans, x: g / (1.0 + x * x), save="x")
atan2 = defop("Atan2Backward0", quiet(np.arctan2, 2),
              quiet(lambda m, g, ans, y, x: g * x / (x * x + y * y)),
              quiet(lambda m, g, ans, y, x: -g * y / (x * x + y * y)), save="x y")
reciprocal = defop("ReciprocalBackward0", quiet(np.reciprocal, 1), lambda m, g, ans, x: -g * ans * ans,
                   save="ans")
erfc = defop("ErfcBackward0", lambda x: 1.0 - _erf(x),
             lambda m, g, ans, x: -g * _2_OVER_SQRT_PI * m.exp(-(x * x)), save="x")
floor = defop("FloorBackward0", np.floor, _zero_rule)
ceil = defop("CeilBackward0", np.ceil, _zero_rule)
round_ = defop("RoundBackward0", np.round, _zero_rule)
trunc = defop("TruncBackward0", np.trunc, _zero_rule)
sign = replace(sgn, node_name="SignBackward0")
frac = defop("FracBackward0", lambda x: x - np.trunc(x), lambda m, g, ans, x: g)
