"""The rest of PyTorch's torch.* operations model code uses (asyncgrad.torch_ops, issue 32):
derivatives by gradcheck/gradgradcheck in float64, and, where torch is installed, values and
gradients equal to PyTorch's for the same calls."""

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck, gradgradcheck

rng = np.random.default_rng(0)
POS = np.abs(rng.standard_normal((2, 3))) + 0.5  # inside every function's domain
UNIT = rng.uniform(-0.8, 0.8, (2, 3))
ANY = np.array([[0.3, -1.2, 0.7], [-0.4, 1.1, -0.9]])
SECOND = rng.standard_normal((2, 3)) + 3.0

# name, the call (the same source for asyncgrad and torch), input data
DIFFERENTIABLE = [
    ("rsqrt", lambda m, x: m.rsqrt(x), POS), ("log1p", lambda m, x: x.log1p(), POS),
    ("expm1", lambda m, x: m.expm1(x), ANY), ("log2", lambda m, x: m.log2(x), POS),
    ("log10", lambda m, x: x.log10(), POS), ("exp2", lambda m, x: m.exp2(x), ANY),
    ("sinh", lambda m, x: x.sinh(), ANY), ("cosh", lambda m, x: m.cosh(x), ANY),
    ("asin", lambda m, x: m.asin(x), UNIT), ("acos", lambda m, x: x.acos(), UNIT),
    ("atan", lambda m, x: m.atan(x), ANY), ("atan2", lambda m, x: m.atan2(x, x * 2 + 3), ANY),
    ("reciprocal", lambda m, x: x.reciprocal(), POS), ("erfc", lambda m, x: m.erfc(x), ANY),
    ("square", lambda m, x: x.square(), ANY), ("remainder", lambda m, x: m.remainder(x, 0.37), POS),
    ("fmod", lambda m, x: m.fmod(x, 0.37), ANY), ("lerp", lambda m, x: m.lerp(x, x * x, 0.3), ANY),
    ("addcmul", lambda m, x: m.addcmul(x, x, x, value=0.5), ANY),
    ("addcdiv", lambda m, x: x.addcdiv(x, x + 3, value=2), ANY), ("hypot", lambda m, x: m.hypot(x, x + 1), ANY),
    ("logaddexp", lambda m, x: m.logaddexp(x, x * 3), ANY), ("xlogy", lambda m, x: m.xlogy(x, x * x + 1), ANY),
    ("logsumexp", lambda m, x: m.logsumexp(x, 1), ANY),
    ("logsumexp_k", lambda m, x: x.logsumexp((0, 1), True), ANY),
    ("cumsum", lambda m, x: x.cumsum(1), ANY), ("cumsum0", lambda m, x: m.cumsum(x, dim=0), ANY),
    ("diff", lambda m, x: m.diff(x, dim=1), ANY), ("trace", lambda m, x: m.trace(x), ANY),
    ("flip", lambda m, x: m.flip(x, (0, 1)), ANY), ("fliplr", lambda m, x: x.fliplr(), ANY),
    ("roll", lambda m, x: m.roll(x, 1, 1), ANY), ("roll_flat", lambda m, x: x.roll(2), ANY),
    ("movedim", lambda m, x: m.movedim(x.reshape(1, 2, 3), 0, 2), ANY),
    ("unflatten", lambda m, x: x.unflatten(1, (3, 1)), ANY), ("tile", lambda m, x: x.tile((2,)), ANY),
    ("repeat_interleave", lambda m, x: x.repeat_interleave(2, dim=1), ANY),
    ("take_along_dim", lambda m, x: m.take_along_dim(x, m.tensor([[0], [2]]), 1), ANY),
    ("masked_select", lambda m, x: m.masked_select(x, m.tensor(ANY > 0)), ANY),
    ("outer", lambda m, x: m.outer(x[0], x[1]), ANY),
    ("dot", lambda m, x: m.dot(x[0], x[1]), ANY), ("bmm", lambda m, x: m.bmm(x[None], x.t()[None]), ANY),
    ("mv", lambda m, x: m.mv(x, x[0]), ANY), ("addmm", lambda m, x: m.addmm(x[:, :2], x, x.t(), beta=0.5), ANY),
    ("baddbmm", lambda m, x: m.baddbmm(x[None, :, :2], x[None], x.t()[None], alpha=2), ANY),
    ("diag", lambda m, x: m.diag(x[0], 1), ANY), ("diag2", lambda m, x: x.diag(), ANY),
    ("diag_embed", lambda m, x: m.diag_embed(x), ANY), ("cdist", lambda m, x: m.cdist(x, x + 1), ANY),
    ("sort", lambda m, x: m.sort(x, 1, descending=True).values, ANY),
    ("nan_to_num", lambda m, x: m.nan_to_num(x), ANY),
    ("clamp_min", lambda m, x: x.clamp_min(0.1), ANY), ("hstack", lambda m, x: m.hstack([x, x * 2]), ANY),
    ("vstack", lambda m, x: m.vstack([x[0], x]), ANY), ("column_stack", lambda m, x: m.column_stack([x[0], x[1]]), ANY),
    ("broadcast_tensors", lambda m, x: m.broadcast_tensors(x, x[0])[1], ANY),
    ("meshgrid", lambda m, x: m.meshgrid(x[0], x[1, :2], indexing="ij")[0], ANY),
    ("meshgrid_xy", lambda m, x: m.meshgrid(x[0], x[1, :2], indexing="xy")[1], ANY),
    ("tan", lambda m, x: m.tan(x), ANY), ("nansum", lambda m, x: m.nansum(x, 1), ANY),
    ("index_add", lambda m, x: x.index_add(1, m.tensor([0, 2, 0]), x[:, :3] * 2, alpha=0.5), ANY),
    ("index_fill", lambda m, x: x.index_fill(0, m.tensor([1]), 0.5), ANY), ("nanmean", lambda m, x: x.nanmean(), ANY),
    ("tensor_split", lambda m, x: m.tensor_split(x, [1], 1)[1], ANY), ("ravel", lambda m, x: x.ravel(), ANY),
    ("sum_to_size", lambda m, x: x.sum_to_size(1, 3), ANY),
    ("t", lambda m, x: m.t(x), ANY), ("frac", lambda m, x: m.frac(x), ANY + 0.05),
]
QUERIES = [
    ("floor", lambda m, x: m.floor(x)), ("ceil", lambda m, x: x.ceil()), ("round", lambda m, x: m.round(x * 3)),
    ("round_dec", lambda m, x: x.round(decimals=1)),
    ("trunc", lambda m, x: m.trunc(x)), ("sign", lambda m, x: x.sign()),
    ("argsort", lambda m, x: m.argsort(x, 1, descending=True)), ("argmax", lambda m, x: m.argmax(x, 1)),
    ("argmin", lambda m, x: m.argmin(x)), ("all", lambda m, x: m.all(x > -5, 1)), ("any", lambda m, x: (x > 0).any()),
    ("count_nonzero", lambda m, x: m.count_nonzero(x > 0, 0)), ("nonzero", lambda m, x: m.nonzero(x > 0)),
    ("isclose", lambda m, x: m.isclose(x, x + 1e-9)), ("logical_xor", lambda m, x: m.logical_xor(x > 0, x > 1)),
    ("isnan", lambda m, x: m.isnan(x)), ("floor_divide", lambda m, x: m.floor_divide(x, 0.25)),
    ("bucketize", lambda m, x: m.bucketize(x, m.tensor([-1.0, 0.0, 1.0]))),
    ("searchsorted", lambda m, x: m.searchsorted(m.tensor([-1.0, 0.0, 1.0]), x)),
    ("unique", lambda m, x: m.unique(m.tensor([3, 1, 3, 2]), return_counts=True)[1]),
    ("triu_indices", lambda m, x: m.triu_indices(3, 4, 1)), ("tril_indices", lambda m, x: m.tril_indices(3, 3)),
    ("histc", lambda m, x: m.histc(x, bins=4, min=-2, max=2)),
]


@pytest.mark.parametrize("name, fn, data", DIFFERENTIABLE, ids=[c[0] for c in DIFFERENTIABLE])
def test_derivatives(name, fn, data):
    x = ag.tensor(data, requires_grad=True)
    assert gradcheck(lambda t: fn(ag, t), (x,))
    assert gradgradcheck(lambda t: fn(ag, t), (x,))


def test_equal_to_pytorch():
    torch = pytest.importorskip("torch")
    for name, fn, data in DIFFERENTIABLE:
        x = ag.tensor(data, requires_grad=True)
        tx = torch.tensor(data, requires_grad=True)
        y, ty = fn(ag, x), fn(torch, tx)
        assert y.shape == tuple(ty.shape), name
        assert np.allclose(y.numpy(), ty.detach().numpy()), name
        g = rng.standard_normal(y.shape)
        (gx,) = ag.grad_sync(y, x, ag.tensor(g))
        (tgx,) = torch.autograd.grad(ty, tx, torch.tensor(g))
        assert np.allclose(gx.numpy(), tgx.numpy()), name
    for name, fn in QUERIES:
        y, ty = fn(ag, ag.tensor(ANY)), fn(torch, torch.tensor(ANY))
        assert np.array_equal(np.asarray(y.numpy()), ty.numpy()), name
        assert y.dtype == np.dtype(str(ty.dtype).replace("torch.", "")), name


def test_queries_without_torch():
    x = ag.tensor([[1.0, -2.0, 3.0], [0.0, 5.0, -6.0]])
    assert ag.floor(ag.tensor([1.5, -1.5])).tolist() == [1.0, -2.0]
    assert x.argsort(1).tolist() == [[1, 0, 2], [2, 0, 1]]
    assert ag.argsort(ag.tensor([1.0, 2.0, 1.0]), descending=True).tolist() == [1, 0, 2]  # stable
    assert ag.nonzero(x > 2).tolist() == [[0, 2], [1, 1]]
    assert x.all(1).tolist() == [True, False] and ag.any(x > 4).item() is True
    assert x.count_nonzero().item() == 5
    values, counts = ag.unique(ag.tensor([3, 1, 3]), return_counts=True)
    assert values.tolist() == [1, 3] and counts.tolist() == [1, 2]
    assert ag.isclose(x, x).all() and ag.allclose(x, x + 1e-12) and ag.equal(x, x.clone())
    assert x.nelement() == 6 and x.ndimension() == 2 and x.element_size() == 8 and x.stride() == (3, 1)
    assert x.pin_memory() is x and x.is_pinned() is False
    with pytest.raises(RuntimeError):
        x.cuda()
    assert ag.floor(x.requires_grad_()).requires_grad  # piecewise constant: a zero gradient
    ag.floor(x).sum().backward()
    assert x.grad.tolist() == [[0.0] * 3] * 2


def test_inplace_variants_and_factories():
    x = ag.tensor([0.25, 4.0])
    assert x.clone().sqrt_().tolist() == [0.5, 2.0] and x.clone().rsqrt_().tolist() == [2.0, 0.5]
    assert x.clone().clamp_max_(1.0).tolist() == [0.25, 1.0]
    assert x.clone().lerp_(ag.ones(2), 0.5).tolist() == [0.625, 2.5]
    y = ag.tensor([1.0, 2.0], requires_grad=True)
    z = y * 1
    z.sigmoid_()
    z.sum().backward()
    s = 1 / (1 + np.exp(-np.array([1.0, 2.0])))
    assert np.allclose(y.grad.numpy(), s * (1 - s))
    assert ag.empty_like(x).shape == (2,) and ag.as_tensor(x) is x and ag.as_tensor([1, 2]).dtype == np.int64
    assert ag.logspace(0, 2, 3).tolist() == [1.0, 10.0, 100.0]
    assert ag.normal(ag.zeros(3), 1.0).shape == (3,) and ag.normal(0.0, 1.0, (2, 2)).shape == (2, 2)
    r = ag.randint_like(ag.zeros(4, dtype=ag.long), 3)
    assert r.dtype == np.int64 and r.shape == (4,) and (r < 3).all()
    with pytest.warns(UserWarning, match="indexing"):
        ag.meshgrid(ag.ones(2), ag.ones(3))
