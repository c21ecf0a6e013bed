"""Ops added for PyTorch parity (issue 13): repeat, prod, masked_fill, tril/triu, topk,
median/nanmedian, std, var_mean/std_mean, norm, comparison methods, relu(inplace=True)
and scaled_dot_product_attention.

Finite-difference checks are in test_ops_gradcheck.py; here: values, gradients and node
names against torch (skipped without it), conventions at zeros/ties/NaN, and errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as NF
from asyncgrad.autograd import gradgradcheck
from asyncgrad.autograd import gradcheck

INF = float("inf")


def leaf(values: Any) -> ag.Tensor:
    return ag.tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


def arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape)


def grads(fn: Callable[..., ag.Tensor], *xs: ag.Tensor) -> list[np.ndarray]:
    out = fn(*xs)
    gs = ag.grad_sync(out.sum() if out.ndim else out, list(xs))
    return [g.numpy() for g in gs]


# --- conventions checked by hand ----------------------------------------------------------------
def test_prod_gradient_with_zeros_as_pytorch() -> None:
    (g,) = grads(lambda t: t.prod(), leaf([2.0, 0.0, 3.0]))
    np.testing.assert_array_equal(g, [0.0, 6.0, 0.0])  # only the zero gets the others' product
    (g,) = grads(lambda t: t.prod(), leaf([2.0, 0.0, 3.0, 0.0]))
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.0, 0.0])
    (g,) = grads(lambda t: t.prod(1), leaf([[2.0, 0.0, 3.0], [1.0, 2.0, 4.0]]))
    np.testing.assert_array_equal(g, [[0.0, 6.0, 0.0], [8.0, 4.0, 2.0]])
    assert ag.tensor([2, 3, 4]).prod().item() == 24 and ag.tensor([2, 3]).prod().dtype == np.int64


def test_prod_higher_derivatives_at_zeros() -> None:
    def d(fn: Callable[[ag.Tensor], ag.Tensor]) -> Callable[[ag.Tensor], ag.Tensor]:
        def first(a: ag.Tensor) -> ag.Tensor:
            with ag.enable_grad():
                return ag.grad_sync(fn(a), a, create_graph=True)[0]
        return first

    a = leaf([1.5, 0.0, -0.7, 0.0, 2.0])
    assert gradcheck(d(lambda t: t.prod()), (a,)) and gradgradcheck(d(lambda t: t.prod()), (a,))
    b = leaf([[1.5, 0.0, -0.7], [0.3, 0.0, 0.1]])
    assert gradgradcheck(d(lambda t: (t.prod(1) * ag.tensor([1.0, 2.0], dtype=ag.float64)).sum()), (b,))


def test_median_is_the_lower_median_and_nan_rules() -> None:
    assert ag.tensor([4.0, 1.0, 3.0, 2.0]).median().item() == 2.0
    assert np.isnan(ag.tensor([1.0, np.nan, 3.0]).median().item())
    assert ag.tensor([1.0, np.nan, 3.0, 2.0]).nanmedian().item() == 2.0
    assert np.isnan(ag.tensor([np.nan, np.nan]).nanmedian().item())
    v, i = ag.tensor([[1.0, np.nan, 3.0], [5.0, 4.0, 6.0]]).median(1)
    assert np.isnan(v.numpy()[0]) and i.tolist()[0] == 1 and v.numpy()[1] == 5.0 and i.tolist()[1] == 0
    r = ag.tensor([[1.0, np.nan, 3.0], [np.nan, np.nan, 2.0]]).nanmedian(1, keepdim=True)
    assert r.values.tolist() == [[1.0], [2.0]] and r.indices.tolist() == [[0], [2]]
    assert type(r).__name__ == "nanmedian" and r._fields == ("values", "indices")
    # the gradient of a full median is split among the elements equal to it
    (g,) = grads(lambda t: t.median(), leaf([3.0, 1.0, 3.0, 5.0, 3.0]))
    np.testing.assert_allclose(g, [1 / 3, 0, 1 / 3, 0, 1 / 3])


def test_topk_order_indices_and_errors() -> None:
    x = ag.tensor([[1.0, 5.0, 3.0, np.nan], [0.0, -1.0, 2.0, 4.0]])
    r = x.topk(2)
    assert type(r).__name__ == "topk"
    assert r.indices.tolist() == [[3, 1], [3, 2]]  # NaN counts as the largest, as in PyTorch
    assert r.values.numpy()[1].tolist() == [4.0, 2.0]
    s = x.topk(3, largest=False)
    assert s.indices.tolist() == [[0, 2, 1], [1, 0, 2]]
    assert x.topk(0).values.shape == (2, 0)
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        x.topk(5)


def test_std_and_norm_have_zero_gradient_where_zero() -> None:
    (g,) = grads(lambda t: t.std(), leaf([2.0, 2.0, 2.0]))
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.0])
    (g,) = grads(lambda t: t.norm(), leaf([0.0, 0.0]))
    np.testing.assert_array_equal(g, [0.0, 0.0])
    (g,) = grads(lambda t: t.norm(dim=1), leaf([[0.0, 0.0], [3.0, 4.0]]))
    np.testing.assert_allclose(g, [[0.0, 0.0], [0.6, 0.8]])
    (g,) = grads(lambda t: t.norm(INF), leaf([-3.0, 1.0, 3.0]))
    np.testing.assert_allclose(g, [-0.5, 0.0, 0.5])  # split between the two extremes, with sign
    assert ag.tensor([0.0, 2.0, -1.0]).norm(0).item() == 2.0


def test_norm_errors() -> None:
    x = ag.tensor([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(NotImplementedError, match="nuclear norm"):
        x.norm("nuc")
    with pytest.raises(RuntimeError, match="linalg.matrix_norm: Order abc not supported."):
        x.norm("abc")
    with pytest.raises(RuntimeError, match="Expected a floating point or complex tensor as input. Got int64"):
        ag.tensor([1, 2]).norm()


def test_masked_fill_and_inplace_form() -> None:
    x = leaf([[1.0, 2.0], [3.0, 4.0]])
    mask = ag.tensor([[True, False], [False, True]])
    np.testing.assert_array_equal(x.masked_fill(mask, -1.0).numpy(), [[-1.0, 2.0], [3.0, -1.0]])
    np.testing.assert_array_equal(ag.masked_fill(x, np.array([True, False]), 0.0).numpy(), [[0.0, 2.0], [0.0, 4.0]])
    v = leaf(5.0)
    ga, gv = grads(lambda a, b: a.masked_fill(mask, b) * ag.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=ag.float64), x, v)
    np.testing.assert_array_equal(ga, [[0.0, 2.0], [3.0, 0.0]])
    assert gv.shape == () and gv == 5.0
    y = x * 1.0
    assert y.masked_fill_(mask, 0.0) is y and y._version == 1
    np.testing.assert_array_equal(y.numpy(), [[0.0, 2.0], [3.0, 0.0]])
    (g,) = ag.grad_sync((y * y).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [[0.0, 4.0], [6.0, 0.0]])
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        x.masked_fill_(mask, 0.0)
    with pytest.raises(RuntimeError, match="masked_fill_ only supports boolean masks, but got mask with dtype float"):
        x.masked_fill(np.array([1.0, 0.0]), 0.0)
    with pytest.raises(RuntimeError, match="masked_fill_ only supports a 0-dimensional value tensor, but got "
                       r"tensor with 1 dimension\(s\)\."):
        x.masked_fill(mask, ag.ones(2))
    assert x._version == 0 and x.numpy()[0, 0] == 1.0


def test_tril_triu_errors_and_inplace() -> None:
    with pytest.raises(RuntimeError, match="tril: input tensor must have at least 2 dimensions"):
        ag.ones(3).tril()
    with pytest.raises(RuntimeError, match="triu: input tensor must have at least 2 dimensions"):
        ag.triu(ag.ones(3))
    y = ag.ones(3, 3)
    y.tril_(-1)
    assert y.numpy().sum() == 3.0 and y._version == 1


def test_comparison_methods_and_functions() -> None:
    x = leaf([1.0, 2.0, 3.0])
    for name, expect in [("eq", [False, True, False]), ("ne", [True, False, True]), ("lt", [True, False, False]),
                         ("le", [True, True, False]), ("gt", [False, False, True]), ("ge", [False, True, True])]:
        for out in (getattr(x, name)(2.0), getattr(ag, name)(x, ag.tensor([2.0, 2.0, 2.0]))):
            assert out.dtype == np.bool_ and out.tolist() == expect
            assert not out.requires_grad and out.grad_fn is None


def test_relu_inplace_functional_and_module() -> None:
    x = leaf([-1.0, 2.0, -3.0])
    y = x * 2.0
    out = NF.relu(y, inplace=True)
    assert out is y and y._version == 1 and y.grad_fn.name() == "ReluBackward0"
    np.testing.assert_array_equal(y.numpy(), [0.0, 4.0, 0.0])
    (g,) = ag.grad_sync(y.sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [0.0, 2.0, 0.0])
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        NF.relu(x, inplace=True)
    z = x * 1.0
    assert NF.relu(z) is not z and z._version == 0
    m = ag.nn.ReLU(inplace=True)
    assert repr(m) == "ReLU(inplace=True)" and repr(ag.nn.ReLU()) == "ReLU()"
    w = x * 1.0
    assert m(w) is w and w.numpy().tolist() == [0.0, 2.0, 0.0]
    v = ag.tensor([-1.0, 1.0])
    ag.relu_(v)
    assert v.tolist() == [0.0, 1.0]


# --- scaled_dot_product_attention ------------------------------------------------------------------
def test_sdpa_fully_masked_rows_give_zeros_and_zero_gradients() -> None:
    q, k, v = leaf(arr(3, 2)), leaf(arr(4, 2, seed=1)), leaf(arr(4, 3, seed=2))
    mask = np.array([[True, False, True, True], [False] * 4, [True, True, False, False]])
    out = NF.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    np.testing.assert_array_equal(out.numpy()[1], 0.0)
    gq, gk, gv = ag.grad_sync(out.sum(), [q, k, v])
    np.testing.assert_array_equal(gq.numpy()[1], 0.0)
    assert np.isfinite(gk.numpy()).all() and np.isfinite(gv.numpy()).all()


def test_sdpa_dropout_uses_the_seeded_generator() -> None:
    q, k, v = ag.tensor(arr(2, 4, 3)), ag.tensor(arr(2, 5, 3, seed=1)), ag.tensor(arr(2, 5, 2, seed=2))
    ag.manual_seed(3)
    a = NF.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    ag.manual_seed(3)
    b = NF.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.allclose(a.numpy(), NF.scaled_dot_product_attention(q, k, v).numpy())
    np.testing.assert_array_equal(NF.scaled_dot_product_attention(q, k, v, dropout_p=1.0).numpy(), 0.0)


def test_sdpa_errors() -> None:
    q, k, v = ag.tensor(arr(3, 2)), ag.tensor(arr(4, 2)), ag.tensor(arr(4, 3))
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        NF.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 4), bool), is_causal=True)
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        NF.scaled_dot_product_attention(q, k.float(), v)
    with pytest.raises(RuntimeError, match="do not fit"):
        NF.scaled_dot_product_attention(q, ag.tensor(arr(4, 3)), v)
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        NF.scaled_dot_product_attention(q, k, v, dropout_p=1.5)


# --- PyTorch as an oracle ------------------------------------------------------------------------------
def lib(x: Any) -> Any:
    """The module of ``x``'s library (``torch.var_mean`` has no Tensor method)."""
    return ag if isinstance(x, ag.Tensor) else __import__("torch")


def nnf(x: Any) -> Any:
    """``nn.functional`` of ``x``'s library."""
    return NF if isinstance(x, ag.Tensor) else __import__("torch").nn.functional


NAN_ROWS = np.array([[0.3, np.nan, -0.5, 1.0], [0.1, 0.9, 0.4, -0.2]])
ORACLE: list[tuple[str, Callable[..., Any], list[Any]]] = [
    ("repeat", lambda x: x.repeat(2, 1, 3), [(2, 2)]),
    ("prod", lambda x: x.prod(), [(2, 3)]),
    ("prod_dim", lambda x: x.prod(0), [(2, 3)]),
    ("prod_zero", lambda x: x.prod(1, keepdim=True), [np.array([[1.5, 0.0, 2.0], [0.0, 0.0, 1.0]])]),
    ("masked_fill", lambda x: x.masked_fill(x > 0, 0.5), [(2, 3)]),
    ("tril", lambda x: x.tril(1), [(2, 3, 4)]),
    ("triu", lambda x: x.triu(-1), [(4, 3)]),
    ("topk", lambda x: x.topk(3, 0)[0], [(5, 2)]),
    ("topk_smallest", lambda x: x.topk(2, largest=False).values, [(3, 4)]),
    ("median", lambda x: x.median(), [(3, 4)]),
    ("median_even", lambda x: x.median(), [(2, 3)]),
    ("median_dim", lambda x: x.median(1).values, [(3, 4)]),
    ("median_dim_nan", lambda x: x.median(1).values, [NAN_ROWS]),
    ("nanmedian", lambda x: x.nanmedian(), [NAN_ROWS]),
    ("nanmedian_dim", lambda x: x.nanmedian(1, keepdim=True).values, [NAN_ROWS]),
    ("std", lambda x: x.std(0), [(3, 2)]),
    ("std_c0", lambda x: x.std(correction=0), [(3, 2)]),
    ("var_mean_var", lambda x: lib(x).var_mean(x, 1)[0], [(3, 2)]),
    ("var_mean_mean", lambda x: lib(x).var_mean(x, 1, keepdim=True)[1], [(3, 2)]),
    ("std_mean_std", lambda x: lib(x).std_mean(x)[0], [(3, 2)]),
    ("std_mean_mean", lambda x: lib(x).std_mean(x, (0, 1), correction=0)[1], [(3, 2)]),
    ("norm", lambda x: x.norm(), [(3, 2)]),
    ("norm_dim", lambda x: x.norm(dim=1, keepdim=True), [(3, 2)]),
    ("norm_1", lambda x: x.norm(1), [(3, 2)]),
    ("norm_3", lambda x: x.norm(3, 0), [(3, 2)]),
    ("norm_half", lambda x: x.norm(0.5), [(3, 2)]),
    ("norm_inf", lambda x: x.norm(INF, 1), [(3, 2)]),
    ("norm_neg_inf", lambda x: x.norm(-INF), [(3, 2)]),
    ("norm_fro_dims", lambda x: x.norm("fro", (0, 2)), [(2, 3, 2)]),
    ("relu_inplace", lambda x: nnf(x).relu(x * 1.0, inplace=True), [(2, 3)]),
    ("masked_fill_", lambda x: (x * 1.0).masked_fill_(x > 0.3, -2.0) * x, [(2, 3)]),
    ("tril_", lambda x: (x * 1.0).tril_(-1) * x, [(3, 3)]),
    ("sdpa", "sdpa", [(2, 3, 4), (2, 5, 4), (2, 5, 6)]),
    ("sdpa_causal", "sdpa_causal", [(2, 2, 4, 3), (2, 2, 4, 3), (2, 2, 4, 2)]),
    ("sdpa_bool_mask", "sdpa_bool", [(3, 2), (4, 2), (4, 3)]),
    ("sdpa_float_mask", "sdpa_float", [(3, 2), (4, 2), (4, 3), (3, 4)]),
    ("sdpa_gqa", "sdpa_gqa", [(1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 3)]),
]


def _fn(kind: Any, module: Any) -> Callable[..., Any]:
    if callable(kind):
        return kind
    sdpa = NF.scaled_dot_product_attention if module is ag else module.nn.functional.scaled_dot_product_attention
    mask = np.array([[True, False, True, True], [False] * 4, [True, True, False, False]])
    tmask = mask if module is ag else module.tensor(mask)
    return {
        "sdpa": lambda q, k, v: sdpa(q, k, v),
        "sdpa_causal": lambda q, k, v: sdpa(q, k, v, is_causal=True, scale=0.7),
        "sdpa_bool": lambda q, k, v: sdpa(q, k, v, attn_mask=tmask),
        "sdpa_float": lambda q, k, v, m: sdpa(q, k, v, attn_mask=m),
        "sdpa_gqa": lambda q, k, v: sdpa(q, k, v, enable_gqa=True),
    }[kind]


@pytest.mark.parametrize("name,fn,specs", ORACLE, ids=[o[0] for o in ORACLE])
def test_ops_match_torch(name: str, fn: Any, specs: list[Any]) -> None:
    torch = pytest.importorskip("torch")
    arrays = [s if isinstance(s, np.ndarray) else arr(*s, seed=i) for i, s in enumerate(specs)]
    xs = [ag.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, tout = _fn(fn, ag)(*xs), _fn(fn, torch)(*ts)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    if not name.startswith("sdpa"):  # torch's attention is one fused node
        assert out.grad_fn.name() == tout.grad_fn.name()
    w = np.random.default_rng(5).standard_normal(out.shape)
    gs = ag.grad_sync(out, xs, ag.tensor(w), create_graph=True)
    tgs = torch.autograd.grad(tout, ts, torch.tensor(w), create_graph=True)
    for g, t in zip(gs, tgs):
        np.testing.assert_allclose(g.numpy(), t.detach().numpy(), rtol=1e-9, atol=1e-12)
    if name.startswith(("median_dim_nan", "nanmedian")):
        return  # second derivatives of a NaN-valued function are NaN in both
    # second order: the gradient of sum(g * g * x)
    s = sum(((g * g * x).sum() for g, x in zip(gs, xs)), ag.tensor(0.0, dtype=ag.float64))
    ts_ = sum((g * g * t).sum() for g, t in zip(tgs, ts))
    hs = ag.grad_sync(s, xs, allow_unused=True, materialize_grads=True)
    ths = torch.autograd.grad(ts_, ts, allow_unused=True, materialize_grads=True)
    for h, t in zip(hs, ths):
        np.testing.assert_allclose(h.numpy(), t.numpy(), rtol=1e-8, atol=1e-10)


def test_topk_and_median_indices_match_torch() -> None:
    torch = pytest.importorskip("torch")
    a = arr(4, 5)
    for fn in (lambda x: x.topk(3, 1), lambda x: x.topk(2, 0, largest=False), lambda x: x.median(0),
               lambda x: x.median(1, keepdim=True), lambda x: x.nanmedian(1)):
        r, tr = fn(ag.tensor(a)), fn(torch.tensor(a))
        assert r.indices.tolist() == tr.indices.tolist()
        np.testing.assert_array_equal(r.values.numpy(), tr.values.numpy())
