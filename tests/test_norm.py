"""BatchNorm1d/2d and GroupNorm: training and eval values and gradients against PyTorch,
running statistics after several steps (momentum, cumulative average), the buffers and
state_dict, gradcheck and gradgradcheck, and PyTorch's messages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn as nn
import asyncgrad.nn.functional as F
from asyncgrad.autograd import gradcheck, gradgradcheck
from test_conv import _rand, _torch_on_one_thread, assert_matches_torch  # noqa: F401  (the fixture applies here)


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 6), (2, 3, 4, 5)], ids=str)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_matches_torch(shape: tuple[int, ...], affine: bool, training: bool) -> None:
    torch = pytest.importorskip("torch")
    mean, var = _rand(3, seed=4), np.random.default_rng(5).uniform(0.5, 2.0, 3)
    ra, rt = [ag.tensor(mean.copy()), ag.tensor(var.copy())], [torch.tensor(mean.copy()), torch.tensor(var.copy())]
    arrays = [_rand(*shape)] + ([_rand(3, seed=1), _rand(3, seed=2)] if affine else [])
    assert_matches_torch(lambda x, *wb: F.batch_norm(x, *ra, *wb, training=training, momentum=0.3, eps=1e-3),
                         lambda x, *wb: torch.nn.functional.batch_norm(x, *rt, *wb, training=training, momentum=0.3,
                                                                       eps=1e-3), arrays)
    for a, t in zip(ra, rt):  # updated in place in training, untouched in eval
        np.testing.assert_allclose(a.numpy(), t.numpy(), rtol=1e-12)
    if training:
        assert not np.allclose(ra[0].numpy(), mean)


def test_batch_norm_without_running_stats_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    assert_matches_torch(lambda x: F.batch_norm(x, None, None, training=True),
                         lambda x: torch.nn.functional.batch_norm(x, None, None, training=True), [_rand(3, 2, 4)])


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("track", [True, False])
def test_module_running_stats_after_steps_match_torch(momentum: float | None, track: bool) -> None:
    torch = pytest.importorskip("torch")
    ours = nn.BatchNorm2d(3, momentum=momentum, track_running_stats=track)
    theirs = torch.nn.BatchNorm2d(3, momentum=momentum, track_running_stats=track).double()
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for step in range(3):
        x = _rand(4, 3, 3, 3, seed=step)
        np.testing.assert_allclose(ours(ag.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                                   rtol=1e-10, atol=1e-10)
    for (ka, a), (kt, t) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert ka == kt
        np.testing.assert_allclose(a.numpy(), t.numpy(), rtol=1e-12)
    if track:
        assert int(ours.num_batches_tracked.item()) == 3 and ours.num_batches_tracked.dtype == ag.int64
    ours.eval()
    theirs.eval()
    x = _rand(2, 3, 3, 3, seed=9)
    ya, yt = ours(ag.tensor(x)), theirs(torch.tensor(x))
    np.testing.assert_allclose(ya.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-10)


def test_eval_uses_running_stats_and_train_uses_the_batch() -> None:
    bn = nn.BatchNorm1d(2)
    with ag.no_grad():
        bn.running_mean.copy_(ag.tensor([1.0, -1.0]))
        bn.running_var.copy_(ag.tensor([4.0, 0.25]))
    x = ag.tensor([[3.0, 0.0], [5.0, 1.0]])
    bn.eval()
    np.testing.assert_allclose(bn(x).numpy(), (x.numpy() - [1.0, -1.0]) / np.sqrt(np.array([4.0, 0.25]) + 1e-5))
    bn.train()
    out = bn(x).numpy()
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(out.var(0), 1.0 / (1.0 + 1e-5 / np.array([1.0, 0.25])), rtol=1e-9)


def test_weights_load_from_torch_and_train_the_same() -> None:
    torch = pytest.importorskip("torch")
    theirs = torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
        theirs.bias.copy_(torch.tensor([0.1, 0.2, 0.3]))
    theirs(torch.tensor(_rand(4, 3)))
    ours = nn.BatchNorm1d(3)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    x = _rand(6, 3, seed=3)
    xa, xt = ag.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ya, yt = ours(xa), theirs(xt)
    g = _rand(6, 3, seed=4)
    grads = ag.grad_sync(ya, [xa, ours.weight, ours.bias], ag.tensor(g))
    t_grads = torch.autograd.grad(yt, [xt, theirs.weight, theirs.bias], torch.tensor(g))
    for a, t in zip(grads, t_grads):
        np.testing.assert_allclose(a.numpy(), t.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), rtol=1e-12)


@pytest.mark.parametrize("shape, groups", [((2, 6, 4, 3), 3), ((3, 4, 5), 1), ((2, 4, 2, 2), 4)], ids=str)
def test_group_norm_matches_torch(shape: tuple[int, ...], groups: int) -> None:
    torch = pytest.importorskip("torch")
    c = shape[1]
    assert_matches_torch(lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-4),
                         lambda x, w, b: torch.nn.functional.group_norm(x, groups, w, b, eps=1e-4),
                         [_rand(*shape), _rand(c, seed=1), _rand(c, seed=2)])
    ours, theirs = nn.GroupNorm(groups, c), torch.nn.GroupNorm(groups, c)
    assert repr(ours) == repr(theirs) and list(ours.state_dict()) == list(theirs.state_dict())


def _t(*shape: int, seed: int = 0) -> ag.Tensor:
    return ag.tensor(_rand(*shape, seed=seed), requires_grad=True)


GRADCHECK_CASES = [
    ("batch_norm 2d", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), ((3, 2, 2, 3), (2,), (2,))),
    ("batch_norm 1d", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), ((4, 3), (3,), (3,))),
    ("batch_norm eval", lambda x, w, b: F.batch_norm(x, ag.tensor([0.5, -0.2]), ag.tensor([1.5, 0.7]), w, b),
     ((3, 2, 2), (2,), (2,))),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), ((2, 4, 3), (4,), (4,))),
]


@pytest.mark.parametrize("name, fn, shapes", GRADCHECK_CASES, ids=[c[0] for c in GRADCHECK_CASES])
def test_gradcheck_and_gradgradcheck(name: str, fn: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
    inputs = tuple(_t(*s, seed=i) for i, s in enumerate(shapes))
    assert gradcheck(fn, inputs)
    assert gradgradcheck(fn, inputs)


def test_gradcheck_without_affine() -> None:
    x = _t(4, 2, 3)
    assert gradgradcheck(lambda a: F.batch_norm(a, None, None, training=True), (x,))


def test_one_gradient_alone_equals_the_joint_rule() -> None:
    """The per-input rules (one gradient needed) and the joint one (several) agree."""
    x, w, b = _t(3, 2, 4), _t(2, seed=1), _t(2, seed=2)
    g = ag.tensor(_rand(3, 2, 4, seed=3))
    together = ag.grad_sync(F.batch_norm(x, None, None, w, b, training=True), [x, w, b], g)
    for i, t in enumerate((x, w, b)):
        (alone,) = ag.grad_sync(F.batch_norm(x, None, None, w, b, training=True), [t], g)
        np.testing.assert_allclose(alone.numpy(), together[i].numpy(), rtol=1e-12, atol=1e-12)


def test_node_name_is_torchs() -> None:
    assert F.batch_norm(_t(3, 2), None, None, training=True).grad_fn.name() == "NativeBatchNormBackward0"


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.BatchNorm2d(3)(ag.zeros(2, 4, 5, 5)), RuntimeError, "running_mean should contain 4 elements not 3"),
    (lambda: nn.BatchNorm2d(3)(ag.zeros(2, 3, 5)), ValueError, "expected 4D input (got 3D input)"),
    (lambda: nn.BatchNorm1d(3)(ag.zeros(2, 3, 5, 5)), ValueError, "expected 2D or 3D input (got 4D input)"),
    (lambda: nn.BatchNorm1d(3)(ag.zeros(1, 3)), ValueError,
     "Expected more than 1 value per channel when training, got input size torch.Size([1, 3])"),
    (lambda: nn.GroupNorm(2, 3), ValueError, "num_channels (3) must be divisible by num_groups (2)"),
    (lambda: F.group_norm(ag.zeros(2, 3, 4), 2), RuntimeError,
     "Expected number of channels in input to be divisible by num_groups, but got input of shape [2, 3, 4] and "
     "num_groups=2"),
])
def test_errors_are_torchs(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


def test_a_failed_call_changes_no_running_stat() -> None:
    bn = nn.BatchNorm2d(3)
    with pytest.raises(RuntimeError):
        bn(ag.zeros(2, 4, 5, 5))
    np.testing.assert_array_equal(bn.running_mean.numpy(), np.zeros(3))
    assert int(bn.num_batches_tracked.item()) == 0
