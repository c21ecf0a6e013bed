"""Mistakes a newcomer makes, answered clearly: numpy's ``axis``/``keepdims`` spellings, and
an optimizer step that finds no gradient (usually a forgotten ``await``)."""

import warnings

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import nn, optim

DATA = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7.0


def _x(requires_grad=False):
    return ag.tensor(DATA, requires_grad=requires_grad)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reductions_accept_axis_and_keepdims(op):
    ref = getattr(np, op)
    for x_op in (lambda **kw: getattr(_x(), op)(**kw), lambda **kw: getattr(ag, op)(_x(), **kw)):
        np.testing.assert_allclose(x_op(axis=1).numpy(), ref(DATA, axis=1))
        np.testing.assert_allclose(x_op(axis=(0, 2), keepdims=True).numpy(), ref(DATA, axis=(0, 2), keepdims=True))
        np.testing.assert_allclose(x_op(dim=1, keepdims=True).numpy(), ref(DATA, axis=1, keepdims=True))


def test_axis_alias_gradients_equal_dim_ones():
    x = _x(requires_grad=True)
    (g_axis,) = ag.grad_sync((x.sum(axis=1) ** 2).sum(), [x])
    (g_dim,) = ag.grad_sync((x.sum(dim=1) ** 2).sum(), [x])
    np.testing.assert_array_equal(g_axis.numpy(), g_dim.numpy())
    assert ag.autograd.gradcheck(lambda t: t.mean(axis=2, keepdims=True).exp(), (x,))


def test_other_dim_taking_calls_accept_axis():
    x = _x()
    np.testing.assert_allclose(x.var(axis=0).numpy(), np.var(DATA, axis=0, ddof=1))
    values, indices = x.max(axis=2)
    np.testing.assert_array_equal(values.numpy(), DATA.max(axis=2))
    np.testing.assert_array_equal(indices.numpy(), DATA.argmax(axis=2))
    np.testing.assert_array_equal(ag.min(x, axis=0, keepdims=True).values.numpy(), DATA.min(axis=0, keepdims=True))
    np.testing.assert_array_equal(x.argmax(axis=1).numpy(), DATA.argmax(axis=1))
    np.testing.assert_array_equal(x.argmin(axis=1, keepdims=True).numpy(), DATA.argmin(axis=1, keepdims=True))
    np.testing.assert_allclose(x.softmax(axis=-1).numpy().sum(axis=-1), np.ones((2, 3)))
    np.testing.assert_allclose(ag.log_softmax(x, axis=0).exp().numpy().sum(axis=0), np.ones((3, 4)))
    assert x.unsqueeze(axis=0).shape == (1, 2, 3, 4)
    assert ag.tensor(np.zeros((2, 1))).squeeze(axis=1).shape == (2,)
    assert ag.cat([x, x], axis=1).shape == (2, 6, 4)
    assert ag.stack([x, x], axis=0).shape == (2, 2, 3, 4)
    assert x.size(axis=2) == 4


@pytest.mark.parametrize(("call", "name"), [
    (lambda x: x.sum(dim=0, axis=1), "sum"),
    (lambda x: ag.mean(x, dim=0, axis=0), "mean"),
    (lambda x: x.sum(keepdim=True, keepdims=True), "sum"),
    (lambda x: x.max(dim=0, axis=0), "max"),
])
def test_both_spellings_is_a_clear_type_error(call, name):
    with pytest.raises(TypeError, match=rf"^{name}\(\) got both '(dim|keepdim)' and its numpy alias '(axis|keepdims)'"):
        call(_x())


def test_axis_alias_matches_torch():
    torch = pytest.importorskip("torch")
    t = torch.tensor(DATA)
    np.testing.assert_allclose(_x().sum(axis=1).numpy(), t.sum(axis=1).numpy())
    np.testing.assert_allclose(_x().mean(axis=0, keepdim=True).numpy(), t.mean(axis=0, keepdim=True).numpy())


def _model_and_opt(opt_cls):
    ag.manual_seed(0)
    model = nn.Linear(3, 2)
    return model, opt_cls(model.parameters(), lr=0.1)


@pytest.mark.parametrize("opt_cls", [optim.SGD, optim.Adam, optim.AdamW])
def test_step_without_any_gradient_warns_once_naming_await(opt_cls):
    model, opt = _model_and_opt(opt_cls)
    before = [p.numpy().copy() for p in model.parameters()]
    with pytest.warns(UserWarning, match=r"step\(\) found no parameter with a gradient.*forget to `await ag.backward"):
        opt.step()
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()  # once per optimizer: no second warning


def test_forgotten_await_is_named_by_the_step():
    model, opt = _model_and_opt(optim.SGD)
    loss = model(ag.ones(1, 3)).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        coro = ag.backward(loss)  # the mistake: no await
        opt.step()
        coro.close()
    messages = [str(w.message) for w in caught]
    assert any("Did you forget to `await ag.backward(loss)`" in m for m in messages), messages


def test_step_with_gradients_does_not_warn():
    model, opt = _model_and_opt(optim.SGD)
    model(ag.ones(1, 3)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()
