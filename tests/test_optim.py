"""ag.optim: the update rules by hand, against PyTorch, state dicts and the engine's version checks."""

import math

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import nn, optim


def _param(values):
    return ag.tensor(np.asarray(values, dtype=float), requires_grad=True)


def _set_grad(p, values):
    p.grad = ag.tensor(np.asarray(values, dtype=p.dtype))


# --- hand-computed references (no torch needed) -----------------------------------------------
def test_sgd_plain_by_hand():
    p = _param([1.0, -2.0])
    opt = optim.SGD([p], lr=0.1)
    _set_grad(p, [0.5, 1.0])
    opt.step()
    np.testing.assert_allclose(p.numpy(), [1.0 - 0.05, -2.0 - 0.1])
    assert opt.state == {}


def test_sgd_momentum_weight_decay_nesterov_by_hand():
    lr, mom, wd = 0.1, 0.9, 0.01
    p = _param([1.0])
    opt = optim.SGD([p], lr=lr, momentum=mom, weight_decay=wd, nesterov=True)
    x, buf = 1.0, None
    for g in (0.5, -0.25, 2.0):
        _set_grad(p, [g])
        opt.step()
        d = g + wd * x
        buf = d if buf is None else mom * buf + d
        x -= lr * (d + mom * buf)
        assert p.item() == pytest.approx(x, rel=1e-14)
    assert opt.state[p]["momentum_buffer"].item() == pytest.approx(buf, rel=1e-14)


def test_sgd_dampening_by_hand():
    p = _param([0.0])
    opt = optim.SGD([p], lr=1.0, momentum=0.5, dampening=0.5)
    for g in (1.0, 1.0):
        _set_grad(p, [g])
        opt.step()
    # buf: 1.0, then 0.5 * 1.0 + 0.5 * 1.0 = 1.0; p = -1 - 1
    assert p.item() == pytest.approx(-2.0)


def _adam_reference(x, grads, lr, b1, b2, eps, wd, decoupled):
    m = v = 0.0
    for t, g in enumerate(grads, start=1):
        if decoupled:
            x *= 1 - lr * wd
        else:
            g = g + wd * x
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
        x -= lr * mhat / (math.sqrt(vhat) + eps)
    return x


@pytest.mark.parametrize("cls,wd", [(optim.Adam, 0.0), (optim.Adam, 0.1), (optim.AdamW, 0.1)])
def test_adam_by_hand(cls, wd):
    grads = [0.3, -1.2, 0.7, 0.05]
    p = _param([0.8])
    opt = cls([p], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd)
    for g in grads:
        _set_grad(p, [g])
        opt.step()
    ref = _adam_reference(0.8, grads, 0.01, 0.8, 0.99, 1e-6, wd, cls is optim.AdamW)
    assert p.item() == pytest.approx(ref, rel=1e-12)
    assert opt.state[p]["step"] == 4


def test_adam_first_step_is_lr_times_sign():
    p = _param([1.0, 1.0, 1.0])
    opt = optim.Adam([p], lr=0.1, eps=0.0)
    _set_grad(p, [3.0, -0.001, 50.0])
    opt.step()
    np.testing.assert_allclose(p.numpy(), [0.9, 1.1, 0.9], rtol=1e-12)


def test_adamw_decay_only_with_zero_grad():
    p = _param([2.0])
    opt = optim.AdamW([p], lr=0.1, weight_decay=0.5)
    _set_grad(p, [0.0])
    opt.step()
    assert p.item() == pytest.approx(2.0 * (1 - 0.05), rel=1e-14)


def test_amsgrad_keeps_the_max_second_moment():
    p = _param([0.0])
    opt = optim.Adam([p], lr=0.1, amsgrad=True)
    for g in (10.0, 0.0):
        _set_grad(p, [g])
        opt.step()
    s = opt.state[p]
    assert s["max_exp_avg_sq"].item() == pytest.approx(0.001 * 100.0)
    assert s["exp_avg_sq"].item() < s["max_exp_avg_sq"].item()


# --- behaviour ------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: optim.Adam(ps),
                                  lambda ps: optim.AdamW(ps)])
def test_params_without_grad_are_skipped(make):
    a, b = _param([1.0]), _param([2.0])
    opt = make([a, b])
    _set_grad(a, [1.0])
    opt.step()
    assert b.item() == 2.0 and b._version == 0 and b not in opt.state
    assert a.item() != 1.0 and a._version == 1


async def test_step_bumps_the_version_so_stale_backward_raises():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = optim.SGD(model.parameters(), lr=0.1)
    loss = model(ag.randn(2, 3)).sum()  # the second layer saved its weight
    await ag.backward(loss, retain_graph=True)
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        await ag.backward(loss)


def test_zero_grad_and_param_groups():
    a, b = _param([1.0]), _param([1.0])
    opt = optim.SGD([{"params": [a]}, {"params": b, "lr": 1.0}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 1.0]
    _set_grad(a, [1.0])
    _set_grad(b, [1.0])
    opt.step()
    assert (a.item(), b.item()) == (pytest.approx(0.9), pytest.approx(0.0))
    opt.zero_grad(set_to_none=False)
    assert a.grad.item() == 0.0
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_invalid_arguments():
    p = _param([1.0])
    with pytest.raises(ValueError):
        optim.SGD([p], lr=-1)
    with pytest.raises(ValueError):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError):
        optim.Adam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.Adam([])
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([p, p], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([p * 2], lr=0.1)


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: optim.Adam(ps, lr=0.05)])
def test_state_dict_round_trip_resumes_identically(make):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(3) for _ in range(6)]
    a = _param([1.0, 2.0, 3.0])
    opt_a = make([a])
    for g in grads[:3]:
        _set_grad(a, g)
        opt_a.step()
    sd = opt_a.state_dict()
    assert sd["param_groups"][0]["params"] == [0] and set(sd["state"]) == {0}
    b = ag.tensor(a.numpy().copy(), requires_grad=True)
    opt_b = make([b])
    opt_b.load_state_dict(sd)
    for g in grads[3:]:
        _set_grad(a, g)
        _set_grad(b, g)
        opt_a.step()
        opt_b.step()
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    # the loaded state is a copy
    assert not any(np.shares_memory(x.numpy(), y.numpy()) for x, y in
                   zip(opt_a.state[a].values(), opt_b.state[b].values()) if isinstance(x, ag.Tensor))


async def test_training_loop_reduces_loss():
    ag.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = optim.Adam(model.parameters(), lr=0.05)
    x = ag.randn(64, 4)
    y = ag.tensor(np.tanh(x.numpy() @ np.array([[1.0], [-2.0], [0.5], [0.0]])))
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        await ag.backward(loss)
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.1 * first


# --- against PyTorch ------------------------------------------------------------------------------
CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.3, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.3, 0.9), weight_decay=0.1, eps=1e-6)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.02, weight_decay=0.3, amsgrad=True)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,kwargs", CASES)
def test_matches_torch(name, kwargs, dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((20, 7)).astype(dtype)
    p = ag.tensor(x0.copy(), requires_grad=True)
    tp = torch.tensor(x0.copy(), requires_grad=True)
    opt = getattr(optim, name)([p], **kwargs)
    topt = getattr(torch.optim, name)([tp], foreach=False, **kwargs)
    for _ in range(5):
        g = rng.standard_normal(x0.shape).astype(dtype)
        p.grad, tp.grad = ag.tensor(g.copy()), torch.tensor(g.copy())
        opt.step()
        topt.step()
    # equal up to rounding: PyTorch's CPU kernels fuse some multiply-adds
    tol = 2e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=tol, atol=tol)
    for key, value in topt.state[tp].items():
        ours = opt.state[p][key]
        ours = ours.numpy() if isinstance(ours, ag.Tensor) else ours
        np.testing.assert_allclose(ours, value.detach().numpy(), rtol=tol, atol=tol)
