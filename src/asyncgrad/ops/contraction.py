"""Einstein summation: ``einsum``'s forward and its derivative rule.

The equation arrives normalised (``parse_einsum``): one string of explicit letters per
operand (an ellipsis spelled out, right-aligned), the output's letters, and each letter's
size. The gradient of operand ``i`` is itself one einsum, of the output's gradient with
the other operands, giving operand ``i``'s letters; a letter repeated in operand ``i``
(a diagonal, ``"ii->i"``) is written through identity matrices, and a letter only operand
``i`` has (summed away by the forward) through a vector of ones. Operands of size 1 where
others are larger (broadcasting) get the broadcast gradient, which the engine sums down.
Every step is an einsum, so the rule is differentiable again under ``create_graph``.
"""

from __future__ import annotations

import functools
import string
from typing import Any

import numpy as np

from ._spec import OpSpec

_LETTERS = string.ascii_letters


def parse_einsum(equation: str, shapes: list[tuple[int, ...]]) -> tuple[tuple[str, ...], str, dict[str, int]]:
    """``(operand letters, output letters, size of each letter)`` with the ellipsis
    spelled out; raises ``RuntimeError`` (PyTorch's type) for a malformed equation."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise RuntimeError(f"einsum(): {len(terms)} operands in the equation, but {len(shapes)} were given")
    for ch in eq.replace("...", "").replace(",", "").replace("->", ""):
        if ch not in _LETTERS:
            raise RuntimeError(f"einsum(): invalid subscript given at index {eq.index(ch)} in the equation "
                               f"string, subscripts must be in [a-zA-Z]")
    used = set(eq) & set(_LETTERS)
    free = [c for c in _LETTERS if c not in used]
    ell = 0
    for term, shape in zip(terms, shapes):
        named = len(term.replace("...", ""))
        if "..." in term:
            ell = max(ell, len(shape) - named)
        elif named != len(shape):
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({named}) does not match "
                               f"the number of dimensions ({len(shape)}) for operand "
                               f"{terms.index(term)} and no ellipsis was given")
    pool = "".join(free[:ell])
    subs: list[str] = []
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        if "..." in term:
            e = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", pool[ell - e:] if e else "")
        for ch, n in zip(term, shape):
            if sizes.get(ch, 1) not in (1, n) and n != 1:
                raise RuntimeError(f"einsum(): operands do not broadcast with remapped shapes (original->"
                                   f"remapped): subscript '{ch}' has size {sizes[ch]} and {n}")
            sizes[ch] = max(sizes.get(ch, 1), n)
        subs.append(term)
    if arrow:
        out = rhs.replace("...", pool)
        for ch in out:
            if ch not in sizes:
                raise RuntimeError(f"einsum(): output subscript {ch} does not appear in the equation for any "
                                   f"input operand")
    else:
        counts = "".join(subs)
        out = pool + "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and c not in pool))
    return tuple(subs), out, sizes


def einsum_forward(*arrays: np.ndarray, subs: tuple[str, ...], out: str, sizes: dict[str, int]) -> np.ndarray:
    return np.asarray(np.einsum(",".join(subs) + "->" + out, *arrays, optimize=len(arrays) > 1))


def _einsum_rule(m, g, ans, *xs, index, subs, out, sizes):  # type: ignore[no-untyped-def]
    target = subs[index]
    own = xs[index].shape
    operands: list[Any] = [g]
    terms = [out]
    for j, (x, term) in enumerate(zip(xs, subs)):
        if j != index:
            operands.append(x)
            terms.append(term)
    # what the inputs of this einsum already provide, letter by letter
    avail: dict[str, int] = {}
    for term, x in zip(terms, operands):
        for ch, n in zip(term, x.shape):
            avail[ch] = max(avail.get(ch, 0), n)
    free = iter(c for c in _LETTERS if c not in sizes)
    result = ""
    for k, ch in enumerate(target):
        if ch in result:  # a repeated letter: its own letter, tied by an identity
            fresh = next(free)
            operands.append(m.constant(np.eye(own[k], dtype=g.dtype)))
            terms.append(ch + fresh)
            result += fresh
            continue
        if avail.get(ch, 0) < own[k]:  # summed by the forward over this operand alone
            operands.append(m.constant(np.ones(own[k], dtype=g.dtype)))
            terms.append(ch)
            avail[ch] = own[k]
        result += ch
    return m.einsum(",".join(terms) + "->" + result, *operands)


@functools.cache
def einsum_spec(n: int) -> OpSpec:
    """The einsum primitive of ``n`` operands, all saved (each one's rule reads the others)."""
    rules = tuple(functools.partial(_einsum_rule, index=i) for i in range(n))
    return OpSpec("EinsumBackward0", einsum_forward, rules, save_inputs=tuple(range(n)))
