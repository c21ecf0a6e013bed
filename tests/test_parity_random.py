"""Factories and random ops added for PyTorch parity (issue 13): randn_like, rand_like,
Tensor.new_tensor/new_zeros/new_ones/new_empty/new_full, uniform_, normal_,
bernoulli/bernoulli_ and multinomial.

Samples are checked for their support and (on many draws, seeded, so deterministic)
their statistics; reproducibility under ``manual_seed`` and explicit generators; in-place
semantics (version, leaf rule, graph); and errors that change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag


def test_randn_like_and_rand_like() -> None:
    t = ag.zeros(200, 50, dtype=ag.float64)
    ag.manual_seed(0)
    a = ag.randn_like(t)
    ag.manual_seed(0)
    assert np.array_equal(a.numpy(), ag.randn_like(t).numpy())
    assert a.shape == t.shape and a.dtype == np.float64 and not a.requires_grad
    assert abs(a.numpy().mean()) < 0.03 and abs(a.numpy().std() - 1) < 0.03
    u = ag.rand_like(t, dtype=ag.float32, requires_grad=True)
    assert u.dtype == np.float32 and u.requires_grad and u.is_leaf
    assert u.numpy().min() >= 0 and u.numpy().max() < 1 and abs(u.numpy().mean() - 0.5) < 0.02
    g = ag.Generator(5)
    b = ag.randn_like(t, generator=g)
    assert np.array_equal(b.numpy(), ag.randn_like(t, generator=ag.Generator(5)).numpy())
    with pytest.raises(NotImplementedError,
                       match=r"randn_like\(\) samples floating point values only, got dtype int64"):
        ag.randn_like(ag.tensor([1, 2]))
    with pytest.raises(NotImplementedError, match="rand_like"):
        ag.rand_like(ag.zeros(2), dtype=ag.int64)


def test_new_factories_take_the_tensors_dtype() -> None:
    x = ag.ones(2, dtype=ag.float64, requires_grad=True)
    data = np.array([1, 2, 3])
    n = x.new_tensor(data)
    assert n.dtype == np.float64 and n.tolist() == [1.0, 2.0, 3.0] and not n.requires_grad
    data[0] = 9  # a copy
    assert n.tolist()[0] == 1.0
    assert x.new_tensor([1, 2], dtype=ag.int64, requires_grad=False).dtype == np.int64
    assert x.new_tensor([1.0], requires_grad=True).requires_grad
    src = ag.tensor([4.0, 5.0])
    c = x.new_tensor(src)
    assert not np.shares_memory(c.numpy(), src.numpy()) and c.dtype == np.float64
    z = x.new_zeros(2, 3)
    assert z.shape == (2, 3) and z.dtype == np.float64 and (z.numpy() == 0).all() and z.is_leaf
    assert x.new_zeros((3,)).shape == (3,)
    o = x.new_ones(4, dtype=ag.float32)
    assert o.dtype == np.float32 and (o.numpy() == 1).all()
    assert x.new_empty(2, 2).shape == (2, 2) and x.new_empty((5,)).dtype == np.float64
    f = x.new_full((2,), 7)
    assert f.dtype == np.float64 and f.tolist() == [7.0, 7.0]


FILLS: list[tuple[str, Callable[[ag.Tensor], Any], str]] = [
    ("uniform_", lambda t: t.uniform_(-2.0, 3.0), "UniformBackward0"),
    ("normal_", lambda t: t.normal_(1.0, 0.5), "NormalBackward0"),
    ("bernoulli_", lambda t: t.bernoulli_(0.25), "BernoulliBackward2"),
]


@pytest.mark.parametrize("name,fill,node", FILLS, ids=[f[0] for f in FILLS])
def test_inplace_fills_follow_the_inplace_rules(name: str, fill: Callable[[ag.Tensor], Any], node: str) -> None:
    leaf = ag.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        fill(leaf)
    assert leaf._version == 0 and (leaf.numpy() == 0).all()
    with ag.no_grad():  # how nn.init fills parameters
        assert fill(leaf) is leaf
    assert leaf._version == 1
    # on a non-leaf: recorded, with a zero gradient for what was overwritten
    x = ag.ones(4, dtype=ag.float64, requires_grad=True)
    y = x * 2.0
    fill(y)
    assert y.grad_fn is not None and y.grad_fn.name() == node and y._version == 1
    (g,) = ag.grad_sync((y * x).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), y.numpy())  # only the direct use of x
    # through a view: the base gets the sample in that slice only
    base = ag.zeros(2, 3)
    fill(base[1])
    assert (base.numpy()[0] == 0).all() and base._version == 1


def test_fill_statistics_and_seeding() -> None:
    t = ag.zeros(100_000, dtype=ag.float64)
    ag.manual_seed(1)
    t.uniform_(-2.0, 3.0)
    first = t.numpy().copy()
    assert first.min() >= -2.0 and first.max() < 3.0 and abs(first.mean() - 0.5) < 0.02
    ag.manual_seed(1)
    np.testing.assert_array_equal(t.uniform_(-2.0, 3.0).numpy(), first)
    t.normal_(1.0, 0.5, generator=ag.Generator(2))
    assert abs(t.numpy().mean() - 1.0) < 0.01 and abs(t.numpy().std() - 0.5) < 0.01
    t.bernoulli_(0.25)
    assert set(np.unique(t.numpy())) <= {0.0, 1.0} and abs(t.numpy().mean() - 0.25) < 0.01
    i = ag.zeros(1000, dtype=ag.int64)
    i.bernoulli_(0.5)  # any dtype takes 0/1
    assert set(np.unique(i.numpy())) == {0, 1}
    p = ag.tensor([0.0, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(ag.zeros(3, 4).bernoulli_(p).numpy(), np.tile([0.0, 1.0, 0.0, 1.0], (3, 1)))


def test_fill_errors_change_nothing() -> None:
    t = ag.ones(3)
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range, but found from=2 > to=1"):
        t.uniform_(2, 1)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0, but found std -1"):
        t.normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\], but got p=1.5"):
        t.bernoulli_(1.5)
    with pytest.raises(RuntimeError, match=r"bernoulli expects every probability to be in \[0, 1\]"):
        t.bernoulli_(ag.tensor([0.5, 2.0, 0.0]))
    with pytest.raises(NotImplementedError, match=r"uniform_\(\) samples floating point values only"):
        ag.tensor([1, 2]).uniform_()
    assert t._version == 0 and (t.numpy() == 1).all()


def test_bernoulli_out_of_place() -> None:
    p = ag.tensor(np.linspace(0, 1, 5), requires_grad=True)
    s = ag.bernoulli(p)
    assert s.dtype == p.dtype and s.numpy()[0] == 0 and s.numpy()[-1] == 1
    assert s.grad_fn is not None and s.grad_fn.name() == "BernoulliBackward0"
    (g,) = ag.grad_sync(s.sum(), [p])
    np.testing.assert_array_equal(g.numpy(), 0.0)
    q = ag.full((20_000,), 0.5).bernoulli(0.1)  # p overrides the values of the input
    assert abs(q.numpy().mean() - 0.1) < 0.01
    with pytest.raises(RuntimeError, match=r"bernoulli expects every probability to be in \[0, 1\]"):
        ag.bernoulli(ag.tensor([np.nan]))


def test_multinomial_with_and_without_replacement() -> None:
    ag.manual_seed(0)
    w = ag.tensor([1.0, 0.0, 3.0, 4.0])
    s = ag.multinomial(w, 20_000, replacement=True)
    assert s.dtype == np.int64 and s.shape == (20_000,)
    freq = np.bincount(s.numpy(), minlength=4) / 20_000
    np.testing.assert_allclose(freq, [0.125, 0.0, 0.375, 0.5], atol=0.015)  # zero weight never drawn
    rows = ag.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 5.0, 1.0]])
    for _ in range(20):
        u = rows.multinomial(4)
        assert u.shape == (2, 4)
        assert all(sorted(r) == [0, 1, 2, 3] for r in u.tolist())
        assert sorted(u.tolist()[1][:2]) == [2, 3]  # positive weights before zero weights
    first = [rows.multinomial(2).tolist()[0][0] for _ in range(4000)]
    np.testing.assert_allclose(np.bincount(first, minlength=4) / 4000, [0.1, 0.2, 0.3, 0.4], atol=0.03)
    ag.manual_seed(4)
    a = w.multinomial(3)
    ag.manual_seed(4)
    assert a.tolist() == w.multinomial(3).tolist()


@pytest.mark.parametrize("make,n,kw,message", [
    (lambda: ag.tensor([0.5, 0.5]), 3, {},
     r"cannot sample n_sample > prob_dist.size\(-1\) samples without replacement"),
    (lambda: ag.tensor([0.0, 0.0]), 1, {}, r"invalid multinomial distribution \(sum of probabilities <= 0\)"),
    (lambda: ag.tensor([-1.0, 1.0]), 1, {}, "probability tensor contains either `inf`, `nan` or element < 0"),
    (lambda: ag.tensor([np.inf, 1.0]), 1, {"replacement": True}, "contains either `inf`, `nan`"),
    (lambda: ag.ones(2, 2, 2), 1, {}, "prob_dist must be 1 or 2 dim"),
    (lambda: ag.tensor([1, 2]), 1, {}, "multinomial only supports floating-point dtypes for input, got: int64"),
    (lambda: ag.tensor([1.0, 2.0]), 0, {}, "cannot sample n_sample <= 0 samples"),
])
def test_multinomial_errors(make: Callable[[], ag.Tensor], n: int, kw: dict[str, Any], message: str) -> None:
    state = ag.get_rng_state()
    with pytest.raises(RuntimeError, match=message):
        ag.multinomial(make(), n, **kw)
    assert ag.get_rng_state() == state  # nothing drawn
