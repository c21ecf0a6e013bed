"""The MLP's light nodes in one pass (issue 15): mean's gradient divided once and
written out (Note [Mean's gradient in one pass] in ops/reductions.py), and relu's
gradient as one compiled select (``numba_kernels.threshold_backward``). Each is
checked bit for bit against the plain numpy rule it replaces and against PyTorch
where installed, in float32 and float64, with tricky values, plus gradcheck."""

from __future__ import annotations

import math

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck
from asyncgrad.ops.kernels import compiled_path as _fast

TRICKY = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-30, -1e-30, 3e38, -3e38, 1.0, -1.0]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


# --- mean ------------------------------------------------------------------------------------
def _mean_grad(x0: np.ndarray, g0: np.ndarray, dim: int | None, keepdim: bool) -> np.ndarray:
    x = ag.from_numpy(x0).requires_grad_()
    y = x.mean() if dim is None else x.mean(dim, keepdim=keepdim)
    ag.backward_sync(y, ag.from_numpy(g0))
    return x.grad.numpy()


def _plain_mean_grad(x0: np.ndarray, g0: np.ndarray, dim: int | None, keepdim: bool) -> np.ndarray:
    """The rule before the change: broadcast, then divide element by element."""
    g = g0 if dim is None or keepdim else np.expand_dims(g0, dim)
    n = x0.size if dim is None else x0.shape[dim]
    return np.broadcast_to(g, x0.shape) / n


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (0, False), (1, False), (1, True)])
def test_mean_gradient_is_the_plain_rule_bit_for_bit(dtype: type, dim: int | None, keepdim: bool) -> None:
    x0 = np.random.default_rng(0).standard_normal((7, 13)).astype(dtype)
    out_shape = () if dim is None else tuple(1 if keepdim and d == dim else s
                                             for d, s in enumerate(x0.shape) if keepdim or d != dim)
    values = np.array(TRICKY * 2, dtype=np.float64)[: max(1, int(np.prod(out_shape)))]
    with np.errstate(over="ignore"):
        g0 = np.resize(values, out_shape).astype(dtype)
    with np.errstate(all="ignore"):
        ours = _mean_grad(x0, g0, dim, keepdim)
        plain = _plain_mean_grad(x0, g0, dim, keepdim)
    assert _bits_equal(ours, plain)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("g", [0.0, -0.0, math.inf, -math.inf, math.nan, 3e38, 1e-38])
def test_mean_gradient_matches_torch(dtype: type, g: float) -> None:
    torch = pytest.importorskip("torch")
    x0 = np.random.default_rng(1).standard_normal((256, 64)).astype(dtype)
    g0 = np.asarray(g, dtype=dtype)
    ours = _mean_grad(x0, g0, None, False)
    tx = torch.from_numpy(x0.copy()).requires_grad_()
    tx.mean().backward(torch.from_numpy(g0.copy()))
    assert _bits_equal(ours, tx.grad.numpy())
    g1 = np.random.default_rng(2).standard_normal(64).astype(dtype)
    g1[:5] = [0.0, math.inf, math.nan, -3e38, -0.0]
    ours = _mean_grad(x0, g1, 0, False)
    tx.grad = None
    tx.mean(0).backward(torch.from_numpy(g1.copy()))
    assert _bits_equal(ours, tx.grad.numpy())


def test_mean_gradient_is_a_fresh_writeable_array_a_function_may_write_into() -> None:
    # as PyTorch's (sum's gradient, a zero-stride view, refuses this in both libraries)
    seen = []

    class Double(ag.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x * 1

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            seen.append((g.numpy().flags.writeable, g.numpy().flags.c_contiguous))
            g.mul_(2)
            return g

    x = ag.from_numpy(np.ones((4, 5), dtype=np.float32)).requires_grad_()
    ag.backward_sync(Double.apply(x).mean())
    assert seen == [(True, True)]
    np.testing.assert_array_equal(x.grad.numpy(), np.full((4, 5), 0.1, dtype=np.float32))


def test_mean_gradcheck_float64() -> None:
    rng = np.random.default_rng(3)
    x = ag.from_numpy(rng.standard_normal((4, 6))).requires_grad_()
    assert gradcheck(lambda a: (a.mean() * a).sin(), (x,))
    assert gradcheck(lambda a: a.mean(1) * a.mean(0, keepdim=True).sum(), (x,))
    assert gradcheck(lambda a: (a * a).mean(), (x,))


def test_mean_gradient_under_create_graph_is_differentiable() -> None:
    x = ag.from_numpy(np.array([1.0, 2.0, 3.0, 4.0])).requires_grad_()
    (g,) = ag.grad_sync((x * x).mean(), x, create_graph=True)
    np.testing.assert_allclose(g.numpy(), 2 * x.numpy() / 4)
    (gg,) = ag.grad_sync(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), np.full(4, 0.5))


# --- relu: the compiled select -----------------------------------------------------------------
def _relu_case(dtype: type, n: int = 64 * 1024) -> tuple[np.ndarray, np.ndarray]:
    """An input and a gradient above ELEMENTWISE_MIN, with tricky values in both."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(n).astype(dtype)
    g = (rng.standard_normal(n) * 1e3).astype(dtype)
    k = len(TRICKY)
    with np.errstate(over="ignore"):
        x[:k * k] = np.repeat(np.array(TRICKY), k).astype(dtype)  # every pair of tricky values
        g[:k * k] = np.tile(np.array(TRICKY), k).astype(dtype)
    return x.reshape(256, -1), g.reshape(256, -1)


def _relu_grad(x0: np.ndarray, g0: np.ndarray) -> np.ndarray:
    x = ag.from_numpy(x0).requires_grad_()
    ag.backward_sync(x.relu(), ag.from_numpy(g0))
    return x.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_compiled_select_is_the_numpy_rule_bit_for_bit(on_path, dtype: type) -> None:
    x0, g0 = _relu_case(dtype)
    plain = np.where(np.maximum(x0, 0) > 0, g0, dtype(0))
    on_path("numpy")
    assert _fast.threshold_backward(g0, np.maximum(x0, 0)) is None  # (the numpy path runs)
    numpy_path = _relu_grad(x0, g0)
    on_path("compiled")
    kernel = _fast.threshold_backward(g0, np.maximum(x0, 0))
    assert kernel is not None
    compiled = _relu_grad(x0, g0)
    assert _bits_equal(numpy_path, plain)
    assert _bits_equal(kernel, plain)
    assert _bits_equal(compiled, plain)  # NaN payloads, inf and the sign of 0 too


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_compiled_select_matches_torch(on_path, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    x0, g0 = _relu_case(dtype)
    x0[np.isnan(x0)] = 1.0  # (PyTorch passes g where relu's output is NaN; the rule gives 0)
    on_path("compiled")
    ours = _relu_grad(x0, g0)
    tx = torch.from_numpy(x0.copy()).requires_grad_()
    torch.relu(tx).backward(torch.from_numpy(g0.copy()))
    assert _bits_equal(ours, tx.grad.numpy())


def test_relu_compiled_select_on_a_read_only_and_a_transposed_gradient(on_path) -> None:
    x0, g0 = _relu_case(np.float32)
    ans = np.maximum(x0, 0)
    on_path("compiled")
    frozen = g0.copy()
    frozen.flags.writeable = False
    assert _bits_equal(_fast.threshold_backward(frozen, ans), np.where(ans > 0, g0, np.float32(0)))
    gt = np.asfortranarray(g0)
    assert _bits_equal(_relu_grad(x0, gt), np.where(ans > 0, g0, np.float32(0)))


def test_relu_gradcheck_float64_through_the_compiled_select(on_path) -> None:
    on_path("compiled")  # (the kernels at every size)
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((5, 7))
    x0[np.abs(x0) < 0.05] = 0.5  # away from the kink
    x = ag.from_numpy(x0).requires_grad_()
    assert _fast.threshold_backward(x0, x0) is not None
    assert gradcheck(lambda a: (a.relu() * a).relu().sin(), (x,))


# --- a constant (broadcast) gradient into the compiled kernels ----------------------------------
def _sum_of(op: str, x0: np.ndarray, s: float) -> np.ndarray:
    """d/dx of ``op(x).sum()`` with the output gradient ``s``: ``op``'s rule receives
    ``s`` broadcast (zero strides)."""
    x = ag.from_numpy(x0).requires_grad_()
    y = getattr(x, op)()
    ag.backward_sync(y.sum(), ag.from_numpy(np.asarray(s, dtype=x0.dtype)))
    return x.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["tanh", "sigmoid", "relu"])
@pytest.mark.parametrize("s", [1.0, -0.0, math.inf, math.nan, 3e38, 1e-30])
def test_compiled_kernels_read_a_broadcast_gradient_once_with_the_same_bits(on_path, monkeypatch, dtype: type,
                                                                            op: str, s: float) -> None:
    x0, _ = _relu_case(dtype)
    x0 = np.nan_to_num(x0, nan=0.5, posinf=30.0, neginf=-30.0)
    on_path("compiled")
    copy = _fast._c

    def no_broadcast_copies(a: np.ndarray) -> np.ndarray:
        assert a.size <= 1 or any(a.strides), "a broadcast gradient was copied out"
        return copy(a)

    monkeypatch.setattr(_fast, "_c", no_broadcast_copies)
    with np.errstate(all="ignore"):
        ours = _sum_of(op, x0, s)
        ans = {"tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0)}[op](x0)
        gfull = np.full(x0.shape, s, dtype=dtype)  # the same gradient, written out
        name = {"tanh": "tanh_backward", "sigmoid": "sigmoid_backward", "relu": "threshold_backward"}[op]
        scalar = getattr(_fast, name)(np.broadcast_to(np.asarray(s, dtype=dtype), x0.shape), ans)
        full = getattr(_fast, name)(gfull, ans)
    assert _bits_equal(scalar, full)
    if op != "sigmoid":  # (sigmoid's forward is recomputed here, not the saved output)
        assert _bits_equal(ours, full)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcast_gradient_kernels_match_the_numpy_path_and_torch(on_path, dtype: type) -> None:
    x0 = (np.random.default_rng(6).standard_normal((128, 64)) * 3).astype(dtype)
    on_path("numpy")
    plain = [_sum_of(op, x0, 0.75) for op in ("tanh", "sigmoid", "relu")]
    on_path("compiled")
    fast = [_sum_of(op, x0, 0.75) for op in ("tanh", "sigmoid", "relu")]
    tol = {"rtol": 3e-6, "atol": 3e-7} if dtype == np.float32 else {"rtol": 1e-13, "atol": 1e-15}
    for p, f in zip(plain, fast):
        np.testing.assert_allclose(f, p, **tol)
    torch = pytest.importorskip("torch")
    for op, f in zip(("tanh", "sigmoid", "relu"), fast):
        tx = torch.from_numpy(x0.copy()).requires_grad_()
        getattr(torch, op)(tx).sum().backward(torch.tensor(0.75, dtype=tx.dtype))
        np.testing.assert_allclose(f, tx.grad.numpy(), **tol)
