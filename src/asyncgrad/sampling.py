"""Sampling ops: ``bernoulli``, ``multinomial`` and the in-place random fills
(``uniform_``, ``normal_``, ``bernoulli_``), all drawing from asyncgrad's generators.

Every draw takes the generator's lock (one generator may serve tasks on several threads)
and happens once, before anything is written, so a rejected call changes nothing. The
fills are in-place ops like any other (version bump, the leaf rule, recorded on non-leaves
with a zero gradient, as PyTorch's UniformBackward0/NormalBackward0/BernoulliBackward*).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .autograd.graph.record import record
from .ops import elementwise as E
from .ops._spec import OpSpec
from .random import Generator, default_generator
from .tensor import Tensor


def _draw(generator: Generator | None, fn: Any) -> np.ndarray:
    gen = generator or default_generator
    with gen._lock:
        return np.asarray(fn(gen.rng))


def _require_floating(op: str, t: Tensor) -> None:
    if t.dtype.kind != "f":
        raise NotImplementedError(f"{op}() samples floating point values only, but the tensor has dtype {t.dtype}")


def _filled(x: Tensor, spec: OpSpec, sample: np.ndarray, *others: Any) -> Tensor:
    """``sample`` as the new value of ``x`` (the out-of-place half of an in-place fill)."""
    return record(spec, (x, *others), np.broadcast_to(sample, x.shape).astype(x.dtype))


def uniform_(t: Tensor, low: float = 0.0, high: float = 1.0, *, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with samples from ``U[low, high)``; returns ``t``."""
    _require_floating("uniform_", t)
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low} > to={high}")
    sample = _draw(generator, lambda rng: rng.uniform(low, high, t.shape))
    return t._apply_inplace(_filled, E.uniform, sample)


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with samples from ``N(mean, std**2)``; returns ``t``."""
    _require_floating("normal_", t)
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    sample = _draw(generator, lambda rng: rng.normal(mean, std, t.shape))
    return t._apply_inplace(_filled, E.normal, sample)


def _check_probabilities(p: np.ndarray) -> None:
    bad = p[~((p >= 0) & (p <= 1))]  # NaN is bad too
    if bad.size:
        raise RuntimeError(f"bernoulli expects every probability to be in [0, 1], but got {bad.flat[0]}")


def bernoulli_(t: Tensor, p: Any = 0.5, *, generator: Generator | None = None) -> Tensor:
    """Fill ``t`` in place with 1 (probability ``p``, a number or a tensor broadcast to
    ``t``) or 0; returns ``t``."""
    if isinstance(p, Tensor):
        _check_probabilities(p.data)
        try:
            probs = np.broadcast_to(p.data, t.shape)
        except ValueError:
            raise RuntimeError(f"bernoulli_: p of shape {list(p.shape)} cannot be broadcast to the tensor's "
                               f"shape {list(t.shape)}") from None
        sample = _draw(generator, lambda rng: rng.random(t.shape) < probs)
        return t._apply_inplace(_filled, E.bernoulli_tensor, sample, p)
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    sample = _draw(generator, lambda rng: rng.random(t.shape) < p)
    return t._apply_inplace(_filled, E.bernoulli_scalar, sample)


def bernoulli(input: Tensor, p: float | None = None, *, generator: Generator | None = None) -> Tensor:
    """A new tensor of 0s and 1s like ``input``, each 1 with the probability held in
    ``input`` (or with ``p`` when given). Its gradient is zero (BernoulliBackward0)."""
    _require_floating("bernoulli", input)
    if p is not None:
        return bernoulli_(Tensor._wrap(np.empty_like(input.data)), p, generator=generator)
    _check_probabilities(input.data)
    sample = _draw(generator, lambda rng: rng.random(input.shape) < input.data)
    return record(E.bernoulli, (input,), sample.astype(input.dtype))


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,
                generator: Generator | None = None) -> Tensor:
    """Indices (int64) drawn from the categories of each row of ``input`` with
    probability proportional to its (non-negative) weights; without ``replacement`` each
    index appears at most once per row (zero-weight categories come last, as in PyTorch)."""
    w = input.data
    if w.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if w.dtype.kind != "f":
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {w.dtype}")
    n = w.shape[-1]
    k = int(num_samples)
    if k <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and k > n:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if not np.isfinite(w).all() or (w < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    rows = w.reshape(-1, n).astype(np.float64)
    if (rows.sum(axis=1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if replacement:
        u = _draw(generator, lambda rng: rng.random((rows.shape[0], k)))
        cum = np.cumsum(rows, axis=1)
        out = np.stack([np.searchsorted(c, ui * c[-1], side="right") for c, ui in zip(cum, u)])
        # u * total can round up to the total: keep to the last category that can be drawn
        last = n - 1 - np.argmax(rows[:, ::-1] > 0, axis=1)
        out = np.minimum(out, last[:, None])
    else:
        # weight / Exp(1) keys: the k largest are a draw without replacement (PyTorch's method)
        e = _draw(generator, lambda rng: rng.exponential(size=rows.shape))
        keys = rows / e
        out = np.argsort(-keys, axis=1, kind="stable")[:, :k]
    out = out.astype(np.int64)
    return Tensor._wrap(out.reshape(k) if w.ndim == 1 else out)
