"""Note [Mean's gradient as a view] (autograd/task/step.py): the fused inline step hands
mean's gradient as a read-only broadcast view to a built-in, hook-free ``takes_views``
child (``mul``); every other route gets a fresh writeable array, as before."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.ops import reductions

SHAPE = (300, 400)  # 120_000 elements: above SMALL_EXPANDED_GRAD, where the view applies


@pytest.fixture(autouse=True)
def _an_engine():
    """These tests check the Engine's fused route: on an Engine, also under
    ``--reference-engine`` (the reference executor has no fused route)."""
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine())
    yield
    ag.autograd.set_engine(prev)


@pytest.fixture
def views():
    """The strides of each array mean's view rule returned (values kept)."""
    seen: list[tuple[int, ...]] = []
    for spec in (reductions.mean, reductions.mean_all):
        real = spec.view_vjp

        def spy(*args, _real=real, **kwargs):
            out = _real(*args, **kwargs)
            seen.append(out.strides)
            return out
        object.__setattr__(spec, "view_vjp", spy)
    yield seen
    for spec, real in ((reductions.mean, reductions._mean_view_rule),
                       (reductions.mean_all, reductions._mean_view_rule)):
        object.__setattr__(spec, "view_vjp", real)


def _data(shape=SHAPE, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _fresh(a) -> bool:
    a = a.numpy() if isinstance(a, ag.Tensor) else np.asarray(a)
    return bool(a.flags.writeable and a.flags.owndata and 0 not in a.strides)


async def _square_mean_grads(dim, shape=SHAPE):
    a0, w0 = _data(shape, seed=1), _data((shape[1], shape[1]), seed=2) / 20
    a = ag.from_numpy(a0.copy()).requires_grad_()
    w = ag.from_numpy(w0.copy()).requires_grad_()
    h = a @ w
    loss = (h * h).mean() if dim is None else (h * h).mean(dim=dim).sum()
    await ag.backward(loss)
    return a.grad.numpy(), w.grad.numpy()


@pytest.mark.parametrize("shape", [SHAPE, (256, 1024)], ids=["300x400", "mlp-loss"])
@pytest.mark.parametrize("dim", [None, 1, 0], ids=["all", "dim1", "dim0"])
async def test_the_fused_route_takes_the_view_with_the_old_bits(views, dim, shape):
    new = await _square_mean_grads(dim, shape)
    assert views and all(0 in s for s in views)  # the view (strides 0) was routed
    for spec in (reductions.mean, reductions.mean_all):
        object.__setattr__(spec, "view_vjp", None)
    old = await _square_mean_grads(dim, shape)
    for n, o in zip(new, old):
        np.testing.assert_array_equal(n, o)
        assert _fresh(n)


@pytest.mark.parametrize("dim", [None, (1,)])
async def test_float64_values_through_the_view(views, dim):
    """gradcheck's own backward prunes by inputs= (no view there), so a plain backward
    through the view is checked against the closed form of d/db mean((b c)^2), and
    gradcheck against finite differences for the same function."""
    rng = np.random.default_rng(3)
    # broadcast to 260 x 260 = 67_600 elements (above SMALL_EXPANDED_GRAD) by the product
    b0, c0 = rng.standard_normal((260, 1)), rng.standard_normal((1, 260))
    b = ag.tensor(b0, requires_grad=True)
    c = ag.tensor(c0, requires_grad=True)

    def fn(b, c):
        h = b * c
        return (h * h).mean() if dim is None else (h * h).mean(dim=dim).sum()

    await ag.backward(fn(b, c))
    assert views and all(0 in s for s in views)
    n = 260 * 260 if dim is None else 260
    np.testing.assert_allclose(b.grad.numpy(), 2 * b0 * (c0 * c0).sum(1, keepdims=True) / n, rtol=1e-12)
    np.testing.assert_allclose(c.grad.numpy(), 2 * c0 * (b0 * b0).sum(0, keepdims=True) / n, rtol=1e-12)
    assert ag.autograd.gradcheck(fn, (b, c), atol=1e-6)


async def test_a_leaf_gets_a_fresh_grad(views):
    x = ag.from_numpy(_data()).requires_grad_()
    await ag.backward(x.mean())
    assert views == [] and _fresh(x.grad)
    x.grad.numpy()[0, 0] = 5.0  # writeable
    np.testing.assert_array_equal(x.grad.numpy()[1], np.float32(1) / np.float32(x.numel()))


async def test_a_tensor_hook_on_the_product_gets_a_fresh_array(views):
    x = ag.from_numpy(_data()).requires_grad_()
    h = x * 2.0
    y = h * h
    got = []
    y.register_hook(lambda g: got.append(_fresh(g)))
    await ag.backward(y.mean())
    assert got == [True] and views == []


async def test_node_pre_and_post_hooks_get_fresh_arrays(views):
    x = ag.from_numpy(_data()).requires_grad_()
    h = x * 2.0
    y = h * h
    got = []
    y.grad_fn.register_prehook(lambda gin: got.append(("pre", _fresh(gin[0]))))
    m = y.mean()
    m.grad_fn.register_hook(lambda gin, gout: got.append(("post", _fresh(gin[0]))))
    await ag.backward(m)
    assert sorted(got) == [("post", True), ("pre", True)] and views == []


async def test_retain_grad_gets_a_fresh_array(views):
    x = ag.from_numpy(_data()).requires_grad_()
    h = x * 2.0
    y = h * h
    y.retain_grad()
    await ag.backward(y.mean())
    assert _fresh(y.grad) and views == []
    np.testing.assert_array_equal(y.grad.numpy(), np.float32(1) / np.float32(y.numel()))


async def test_grad_and_inputs_results_are_fresh(views):
    x = ag.from_numpy(_data()).requires_grad_()
    h = x * 2.0
    y = h * h
    (gy,) = await ag.grad(y.mean(), [y])
    assert _fresh(gy)
    y2 = (x * 2.0) * (x * 2.0)
    y2.retain_grad()
    await ag.backward(y2.mean(), inputs=[y2])
    assert _fresh(y2.grad) and views == []


SEEN: list[bool] = []


class WritesIntoItsGradient(ag.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 3.0

    @staticmethod
    def backward(ctx, g):
        SEEN.append(_fresh(g))
        g *= 3.0  # users write in place
        return g


async def test_a_custom_function_gets_a_fresh_writeable_array(views):
    x = ag.from_numpy(_data()).requires_grad_()
    SEEN.clear()
    y = WritesIntoItsGradient.apply(x)
    await ag.backward(y.mean())
    assert SEEN == [True]
    np.testing.assert_allclose(x.grad.numpy(), np.float32(3) / np.float32(x.numel()))
    assert views == []


async def test_a_pass_through_child_gets_a_fresh_array(views):
    """``add`` passes its gradient on as it is: the view would reach the leaves."""
    a = ag.from_numpy(_data(seed=4)).requires_grad_()
    b = ag.from_numpy(_data(seed=5)).requires_grad_()
    got = []
    a.register_hook(lambda g: got.append(_fresh(g)))
    await ag.backward((a + b).mean())
    assert got == [True] and _fresh(b.grad) and views == []


async def test_create_graph_gets_fresh_arrays(views):
    x = ag.from_numpy(_data().astype(np.float64)).requires_grad_()
    h = x * 2.0
    (gx,) = await ag.grad((h * h).mean(), [x], create_graph=True)
    assert _fresh(gx) and gx.requires_grad and views == []
    np.testing.assert_allclose(gx.numpy(), 8.0 * x.numpy() / x.numel())


async def test_a_small_mean_keeps_its_own_path(views):
    x = ag.from_numpy(_data((10, 10))).requires_grad_()
    h = x * 2.0
    await ag.backward((h * h).mean())
    assert views == [()] or all(0 not in s for s in views)
    np.testing.assert_allclose(x.grad.numpy(), 8.0 * x.numpy() / x.numel(), rtol=1e-6)
