"""Finding and refusing non-finite values: ``ag.isfinite``/``ag.isinf`` and the gradient
clipping utilities (``nn.utils.clip_grad_norm_``/``clip_grad_value_``), against numpy and,
when installed, PyTorch."""

import math

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import nn

VALUES = [1.0, -0.0, math.inf, -math.inf, math.nan, 3e38]


@pytest.mark.parametrize("dtype", [ag.float32, ag.float64])
def test_isfinite_isinf_functions_and_methods(dtype):
    x = ag.tensor(VALUES, dtype=dtype)
    for got in (ag.isfinite(x), x.isfinite()):
        assert got.dtype == np.bool_
        assert got.tolist() == [True, True, False, False, False, True]
    for got in (ag.isinf(x), x.isinf()):
        assert got.dtype == np.bool_
        assert got.tolist() == [False, False, True, True, False, False]


def test_isfinite_on_integers_bools_python_values_and_graph_tensors():
    assert ag.isfinite(ag.tensor([1, 2])).tolist() == [True, True]
    assert ag.isinf(ag.tensor([True, False])).tolist() == [False, False]
    assert ag.isfinite([1.0, math.nan]).tolist() == [True, False]
    w = ag.tensor([1.0, 2.0], requires_grad=True)
    out = ag.isfinite(w * 2)  # outside the graph, like PyTorch's
    assert not out.requires_grad and out.grad_fn is None


def test_isfinite_matches_torch():
    torch = pytest.importorskip("torch")
    data = np.array(VALUES, dtype=np.float32)
    assert ag.isfinite(ag.tensor(data)).tolist() == torch.isfinite(torch.tensor(data)).tolist()
    assert ag.isinf(ag.tensor(data)).tolist() == torch.isinf(torch.tensor(data)).tolist()


def _params_with_grads(grads):
    ps = []
    for g in grads:
        p = ag.tensor(np.zeros(len(g), dtype=np.float32), requires_grad=True)
        p.grad = ag.tensor(np.asarray(g, dtype=np.float32))
        ps.append(p)
    return ps


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_scales_and_returns_the_total_norm(norm_type):
    a, b = _params_with_grads([[3.0, 4.0], [12.0]])
    flat = np.array([3.0, 4.0, 12.0])
    expected = np.linalg.norm(flat, ord=norm_type)
    total = nn.utils.clip_grad_norm_([a, b], max_norm=1.0, norm_type=norm_type, foreach=True)
    assert total.shape == () and total.dtype == np.float32
    assert total.item() == pytest.approx(expected, rel=1e-6)
    scale = 1.0 / (expected + 1e-6)
    np.testing.assert_allclose(a.grad.numpy(), [3.0 * scale, 4.0 * scale], rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), [12.0 * scale], rtol=1e-6)
    # below max_norm: unchanged
    before = a.grad.numpy().copy()
    nn.utils.clip_grad_norm_(a, max_norm=100.0, norm_type=norm_type)
    np.testing.assert_array_equal(a.grad.numpy(), before)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_clip_grad_norm_error_if_nonfinite_raises_and_changes_nothing(bad):
    a, b = _params_with_grads([[3.0, 4.0], [bad]])
    before = [a.grad.numpy().copy(), b.grad.numpy().copy()]
    with pytest.raises(RuntimeError, match=r"total norm of order 2.0 .* is non-finite, so it cannot be clipped"):
        nn.utils.clip_grad_norm_([a, b], max_norm=1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(a.grad.numpy(), before[0])
    np.testing.assert_array_equal(b.grad.numpy(), before[1])


def test_clip_grad_norm_norm_beyond_float32_range_is_reported():
    (a,) = _params_with_grads([[3e38, 3e38]])  # each finite; the norm overflows float32
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_([a], max_norm=1.0, error_if_nonfinite=True)
    assert ag.isfinite(a.grad).all().item()


def test_clip_grad_norm_without_grads_and_nonfinite_without_error_match_torch():
    torch = pytest.importorskip("torch")
    p = ag.tensor([1.0], requires_grad=True)
    assert nn.utils.clip_grad_norm_([p], 1.0).item() == 0.0
    for bad in (math.nan, math.inf):
        data = [np.array([3.0, 4.0], np.float32), np.array([bad], np.float32)]
        ours = _params_with_grads(data)
        theirs = [torch.zeros(len(d), requires_grad=True) for d in data]
        for t, d in zip(theirs, data):
            t.grad = torch.tensor(d)
        n_ours = nn.utils.clip_grad_norm_(ours, 1.0)
        n_theirs = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        np.testing.assert_array_equal(n_ours.numpy(), n_theirs.numpy())
        for o, t in zip(ours, theirs):
            np.testing.assert_array_equal(o.grad.numpy(), t.grad.numpy())


def test_clip_grad_norm_matches_torch_on_random_grads():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(s).astype(np.float32) * 5 for s in (7, 3, 11)]
    for norm_type in (2.0, 1.0, 3.0, math.inf):
        ours = _params_with_grads(data)
        theirs = [torch.zeros(len(d), requires_grad=True) for d in data]
        for t, d in zip(theirs, data):
            t.grad = torch.tensor(d)
        n_ours = nn.utils.clip_grad_norm_(ours, 2.0, norm_type=norm_type)
        n_theirs = torch.nn.utils.clip_grad_norm_(theirs, 2.0, norm_type=norm_type)
        assert n_ours.item() == pytest.approx(n_theirs.item(), rel=1e-5)
        for o, t in zip(ours, theirs):
            np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_clip_grad_value_clamps_and_keeps_nan():
    (a,) = _params_with_grads([[-3.0, 0.5, 2.0, math.nan]])
    nn.utils.clip_grad_value_(a, 1.0, foreach=None)
    got = a.grad.numpy()
    np.testing.assert_array_equal(got[:3], [-1.0, 0.5, 1.0])
    assert math.isnan(got[3]) and a.grad.dtype == np.float32
