"""More of torch.nn's activations and losses (nn/activations.py, issue 32): gradcheck and
gradgradcheck in float64, modules' arguments, and values and gradients equal to PyTorch's."""

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck, gradgradcheck

X = np.array([[0.3, -1.2, 0.7, 2.5], [-0.4, 1.1, -0.9, -3.2]])
P = np.array([[0.2, 0.9, 0.5, 0.7], [0.6, 0.1, 0.35, 0.8]])  # probabilities
Y = np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.5, 1.0]])

# name, the call with namespace ``F`` (asyncgrad's or torch's nn.functional) and module ``m``
ACTIVATIONS = [
    ("silu", lambda F, m, x: F.silu(x)), ("leaky_relu", lambda F, m, x: F.leaky_relu(x, 0.2)),
    ("elu", lambda F, m, x: F.elu(x, 0.5)), ("selu", lambda F, m, x: F.selu(x)),
    ("celu", lambda F, m, x: F.celu(x, 2.0)),
    ("softplus", lambda F, m, x: F.softplus(x, beta=2.0, threshold=3.0)),
    ("logsigmoid", lambda F, m, x: F.logsigmoid(x)),
    ("hardtanh", lambda F, m, x: F.hardtanh(x, -0.5, 0.5)), ("relu6", lambda F, m, x: F.relu6(x * 3)),
    ("hardsigmoid", lambda F, m, x: F.hardsigmoid(x)), ("hardswish", lambda F, m, x: F.hardswish(x)),
    ("mish", lambda F, m, x: F.mish(x)), ("softsign", lambda F, m, x: F.softsign(x)),
    ("tanhshrink", lambda F, m, x: F.tanhshrink(x)), ("glu", lambda F, m, x: F.glu(x, -1)),
    ("softmin", lambda F, m, x: F.softmin(x, dim=1)), ("normalize", lambda F, m, x: F.normalize(x, dim=1)),
    ("cosine_similarity", lambda F, m, x: F.cosine_similarity(x, x * x + 1, dim=1)),
    ("pairwise_distance", lambda F, m, x: F.pairwise_distance(x, x * 2)),
    ("l1_loss", lambda F, m, x: F.l1_loss(x, m.tensor(Y))),
    ("smooth_l1_loss", lambda F, m, x: F.smooth_l1_loss(x, m.tensor(Y), beta=0.5)),
    ("huber_loss", lambda F, m, x: F.huber_loss(x, m.tensor(Y), reduction="sum", delta=0.8)),
    ("bce_logits", lambda F, m, x: F.binary_cross_entropy_with_logits(x, m.tensor(Y))),
    ("bce_logits_pos", lambda F, m, x: F.binary_cross_entropy_with_logits(
        x, m.tensor(Y), pos_weight=m.tensor([1.0, 2.0, 0.5, 3.0]))),
    ("bce", lambda F, m, x: F.binary_cross_entropy(m.sigmoid(x), m.tensor(Y))),
    ("kl_div", lambda F, m, x: F.kl_div(F.log_softmax(x, dim=1), m.tensor(P / P.sum(1, keepdims=True)),
                                        reduction="batchmean")),
]


@pytest.mark.parametrize("name, fn", ACTIVATIONS, ids=[n for n, _ in ACTIVATIONS])
def test_derivatives(name, fn):
    x = ag.tensor(X, requires_grad=True)
    assert gradcheck(lambda t: fn(ag.nn.functional, ag, t), (x,))
    assert gradgradcheck(lambda t: fn(ag.nn.functional, ag, t), (x,))


def test_equal_to_pytorch():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as TF

    for name, fn in ACTIVATIONS:
        x = ag.tensor(X, requires_grad=True)
        tx = torch.tensor(X, requires_grad=True)
        y, ty = fn(ag.nn.functional, ag, x), fn(TF, torch, tx)
        assert np.allclose(y.numpy(), ty.detach().numpy()), name
        g = np.ones(y.shape)
        (gx,) = ag.grad_sync(y, x, ag.tensor(g))
        (tgx,) = torch.autograd.grad(ty, tx, torch.tensor(g))
        assert np.allclose(gx.numpy(), tgx.numpy()), name
    assert ag.nn.functional.one_hot(ag.tensor([0, 2, 1])).tolist() == TF.one_hot(torch.tensor([0, 2, 1])).tolist()
    for module, args in [("SiLU", ()), ("LeakyReLU", (0.1,)), ("ELU", ()), ("Softplus", (2.0,)),
    ("Hardtanh", (-2.0, 2.0)),
                         ("GLU", ()), ("Mish", ()), ("ReLU6", ()), ("Hardswish", ())]:
        a, t = getattr(ag.nn, module)(*args), getattr(torch.nn, module)(*args)
        assert np.allclose(a(ag.tensor(X)).numpy(), t(torch.tensor(X)).numpy()), module
        assert repr(a) == repr(t), module
    for module, kwargs in [("L1Loss", {}), ("SmoothL1Loss", {"beta": 0.5}), ("HuberLoss", {"delta": 2.0}),
                           ("BCEWithLogitsLoss", {"reduction": "sum"})]:
        a, t = getattr(ag.nn, module)(**kwargs), getattr(torch.nn, module)(**kwargs)
        assert np.allclose(a(ag.tensor(X), ag.tensor(Y)).numpy(), t(torch.tensor(X), torch.tensor(Y)).numpy()), module


def test_modules_and_errors():
    x = ag.tensor(X)
    assert ag.nn.LeakyReLU(negative_slope=0.5)(x).tolist()[0][1] == -0.6
    assert ag.nn.BCELoss(reduction="none")(ag.tensor(P), ag.tensor(Y)).shape == (2, 4)
    assert ag.nn.Unflatten(1, (2, 2))(x).shape == (2, 2, 2)
    assert ag.nn.CosineSimilarity(dim=1)(x, x).tolist() == pytest.approx([1.0, 1.0])
    with pytest.raises(TypeError, match="unexpected keyword argument 'slope'"):
        ag.nn.LeakyReLU(slope=0.1)
    with pytest.raises(ValueError, match="is not a valid value for reduction"):
        ag.nn.functional.l1_loss(x, x, reduction="avg")
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        ag.nn.functional.one_hot(ag.tensor([3]), 3)
    y = ag.tensor(X, requires_grad=True) * 1
    ag.nn.functional.silu(y, inplace=True)
    assert np.allclose(y.numpy(), X / (1 + np.exp(-X)))
