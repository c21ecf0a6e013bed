"""The image layers' two paths (issue 32): max pooling and training batch norm on the
compiled kernels (``ops/kernels/numba_kernels.py``) and on the numpy ones, against each other
and PyTorch, NaN, ties and padding included, in float32 and float64; gradcheck on both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as F
from asyncgrad.autograd import gradcheck, gradgradcheck

PATHS = ["numpy", "compiled"]

POOLS = [  # (kernel, stride, padding, dilation, ceil_mode)
    (2, 2, 0, 1, False),
    (3, 2, 1, 1, False),
    (3, 1, 1, 1, False),
    ((3, 2), (2, 1), (1, 0), (2, 1), True),
    (2, 3, 1, 1, True),
]


def _pool_input(dtype: type) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8))
    x[0, 0, 1, 1] = x[0, 0, 2, 2] = np.nan  # two NaNs in one window: the last wins
    x[0, 1, :4, :4] = 1.0  # ties: the first wins
    x[1, 0] = -np.inf  # all -inf windows, padding taps among them
    return x.astype(dtype)


def _run(fn: Callable[[ag.Tensor], Any], x: np.ndarray, seed: int = 1) -> list[np.ndarray]:
    t = ag.from_numpy(x.copy()).requires_grad_()
    out = fn(t)
    y, extra = (out[0], list(out[1:])) if isinstance(out, tuple) else (out, [])
    g = np.random.default_rng(seed).standard_normal(y.shape).astype(x.dtype)
    ag.backward_sync(y, ag.from_numpy(g))
    return [y.numpy(), t.grad.numpy(), *(e.numpy() for e in extra)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("args", POOLS, ids=str)
def test_max_pool_paths_agree_exactly_and_match_torch(on_path, args: tuple[Any, ...], dtype: type) -> None:
    torch = pytest.importorskip("torch")
    x = _pool_input(dtype)

    def pool(t: ag.Tensor) -> Any:
        return F.max_pool2d(t, *args, return_indices=True)

    on_path("numpy")
    plain = _run(pool, x)
    on_path("compiled")
    fast = _run(pool, x)
    for p, f in zip(plain, fast):
        assert f.dtype == p.dtype
    np.testing.assert_array_equal(fast[0], plain[0])
    np.testing.assert_array_equal(fast[2], plain[2])
    # an element in several windows sums its gradients: in float64 on the numpy path, in
    # the gradient's type (as PyTorch) on the compiled one
    np.testing.assert_allclose(fast[1], plain[1], rtol=1e-6 if dtype == np.float32 else 1e-15)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    yt, it = torch.nn.functional.max_pool2d(xt, *args, return_indices=True)
    yt.backward(torch.from_numpy(np.random.default_rng(1).standard_normal(yt.shape).astype(dtype)))
    np.testing.assert_array_equal(fast[0], yt.detach().numpy())
    np.testing.assert_array_equal(fast[2], it.numpy())
    np.testing.assert_allclose(fast[1], xt.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_backward_kernel_zeroes_what_no_window_won(on_path, dtype: type) -> None:
    """The compiled backward writes every element of the input's gradient (Note [Max
    pooling per output]): an output array full of NaN on entry comes back as the numpy
    scatter's result, zeros where no window's maximum was."""
    on_path("compiled")
    from asyncgrad.ops import kernels

    k = kernels.compiled()
    rng = np.random.default_rng(4)
    g = rng.standard_normal((2, 3, 4, 5)).astype(dtype)
    index = rng.integers(0, 7 * 9, g.shape).astype(np.int64)  # repeats: summed in output order
    out = np.full((2, 3, 7 * 9), np.nan, dtype=dtype)
    k.max_pool_backward(g.reshape(-1), index.reshape(-1), out.reshape(-1), 4 * 5, 7 * 9)
    want = np.zeros((6, 7 * 9), dtype=dtype)
    for p, (gp, ip) in enumerate(zip(g.reshape(6, -1), index.reshape(6, -1))):
        for v, i in zip(gp, ip):
            want[p, i] += v
    np.testing.assert_array_equal(out.reshape(6, -1), want)
    assert not np.signbit(out[out == 0]).any()


@pytest.mark.parametrize("path", PATHS)
def test_max_pool_gradcheck_on_both_paths(on_path, path: str) -> None:
    on_path(path)
    x = ag.tensor(np.random.default_rng(3).permutation(60).reshape(1, 2, 5, 6) * 0.1, requires_grad=True)
    assert gradcheck(lambda a: F.max_pool2d(a, 3, 2, 1), (x,))
    assert gradgradcheck(lambda a: F.max_pool2d(a, 2, 1, 1, 2, True), (x,))


BN_SHAPES = [(5, 3), (4, 3, 6), (6, 4, 5, 7)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_paths_agree_and_match_torch(on_path, shape: tuple[int, ...], affine: bool, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    c = shape[1]
    wb = [rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)] if affine else []
    g = rng.standard_normal(shape).astype(dtype)

    def ours() -> list[np.ndarray]:
        rm, rv = ag.zeros(c, dtype=x.dtype), ag.ones(c, dtype=x.dtype)
        leaves = [ag.from_numpy(a.copy()).requires_grad_() for a in (x, *wb)]
        y = F.batch_norm(leaves[0], rm, rv, *leaves[1:], training=True, momentum=0.3)
        ag.backward_sync(y, ag.from_numpy(g))
        return [y.numpy(), rm.numpy(), rv.numpy(), *(t.grad.numpy() for t in leaves)]

    on_path("numpy")
    plain = ours()
    on_path("compiled")
    fast = ours()
    rm, rv = torch.from_numpy(np.zeros(c, dtype=dtype)), torch.from_numpy(np.ones(c, dtype=dtype))
    leaves = [torch.from_numpy(a.copy()).requires_grad_() for a in (x, *wb)]
    y = torch.nn.functional.batch_norm(leaves[0], rm, rv, *leaves[1:], training=True, momentum=0.3)
    y.backward(torch.from_numpy(g))
    theirs = [y.detach().numpy(), rm.numpy(), rv.numpy(), *(t.grad.numpy() for t in leaves)]
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for p, f, t in zip(plain, fast, theirs):
        assert f.dtype == np.dtype(dtype)
        scale = np.abs(t).max()
        np.testing.assert_allclose(f, p, rtol=tol, atol=tol * scale)
        np.testing.assert_allclose(f, t, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("path", PATHS)
def test_batch_norm_gradcheck_on_both_paths(on_path, path: str) -> None:
    on_path(path)
    rng = np.random.default_rng(4)
    x = ag.tensor(rng.standard_normal((3, 2, 4)), requires_grad=True)
    w, b = (ag.tensor(rng.standard_normal(2), requires_grad=True) for _ in range(2))
    assert gradcheck(lambda a, c, d: F.batch_norm(a, None, None, c, d, training=True), (x, w, b))
    assert gradcheck(lambda a: F.batch_norm(a, None, None, training=True), (x,))
    assert gradgradcheck(lambda a, c, d: F.batch_norm(a, None, None, c, d, training=True), (x, w, b))


@pytest.mark.parametrize("path", PATHS)
def test_batch_norm_one_gradient_alone_equals_the_joint_rule(on_path, path: str) -> None:
    on_path(path)
    rng = np.random.default_rng(5)
    x, w, b = (ag.tensor(rng.standard_normal(s), requires_grad=True) for s in ((3, 2, 4), (2,), (2,)))
    g = ag.tensor(rng.standard_normal((3, 2, 4)))
    together = ag.grad_sync(F.batch_norm(x, None, None, w, b, training=True), [x, w, b], g)
    for i, t in enumerate((x, w, b)):
        (alone,) = ag.grad_sync(F.batch_norm(x, None, None, w, b, training=True), [t], g)
        np.testing.assert_allclose(alone.numpy(), together[i].numpy(), rtol=1e-12, atol=1e-12)


CONVS = [  # not on wide rows (strided, or small planes), where the compiled im2col/col2im run
    {"stride": 2, "padding": 1},
    {"stride": (2, 3), "padding": (2, 0), "dilation": (1, 2)},
    {"stride": 2, "groups": 2},
    {"padding": 1},  # (a 4-wide plane: not wide)
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", CONVS, ids=str)
def test_conv_windows_paths_agree_exactly_and_match_torch(on_path, monkeypatch: pytest.MonkeyPatch,
                                                         kw: dict[str, Any], dtype: type) -> None:
    """Note [Windows row by row]: the compiled im2col copies and col2im adds in the numpy
    kernels' order, so both paths give the same bits; and PyTorch's values. (Channels
    first: these geometries otherwise run on pixel rows, tests/test_conv_paths.py.)"""
    from asyncgrad.ops import conv as ops_conv

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(ops_conv, "PIXEL_ROWS", False)
    rng = np.random.default_rng(6)
    groups = kw.get("groups", 1)
    x = rng.standard_normal((3, 4, 7, 6)).astype(dtype)
    w = rng.standard_normal((6, 4 // groups, 3, 3)).astype(dtype)
    wt_ = rng.standard_normal((4, 6 // groups, 3, 3)).astype(dtype)  # a transposed convolution's

    def ours() -> list[np.ndarray]:
        xa, wa, wb = (ag.from_numpy(a.copy()).requires_grad_() for a in (x, w, wt_))
        y = F.conv2d(xa, wa, **kw)
        ag.backward_sync(y, ag.from_numpy(np.random.default_rng(1).standard_normal(y.shape).astype(dtype)))
        out = [y.numpy(), xa.grad.numpy(), wa.grad.numpy()]
        xa.grad = None
        yt = F.conv_transpose2d(xa, wb, **kw)
        ag.backward_sync(yt, ag.from_numpy(np.random.default_rng(2).standard_normal(yt.shape).astype(dtype)))
        return out + [yt.numpy(), xa.grad.numpy(), wb.grad.numpy()]

    on_path("numpy")
    plain = ours()
    on_path("compiled")
    fast = ours()
    for p, f in zip(plain, fast):
        np.testing.assert_array_equal(f, p)
    xt, wt = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w))
    yt = torch.nn.functional.conv2d(xt, wt, **kw)
    yt.backward(torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(yt.shape)).astype(dtype)))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for f, t in zip(fast[:3], (yt.detach().numpy(), xt.grad.numpy(), wt.grad.numpy())):
        np.testing.assert_allclose(f, t, rtol=tol, atol=tol)


ROW_POOLS = [  # (input H, W, kernel, stride, padding, dilation, ceil_mode): Note [Max pooling row by row]
    (7, 11, 3, 2, 1, 1, False),
    (7, 11, 3, 2, 1, 1, True),
    (9, 5, (2, 3), (1, 2), (1, 1), (1, 1), True),
    (10, 13, 3, (3, 1), (1, 0), (2, 3), False),
    (13, 10, (3, 2), 3, (2, 1), (2, 2), True),
    (5, 6, 5, 1, 2, 1, False),
    (1, 9, (1, 3), 2, (0, 1), 1, True),
]


def _hard_input(h: int, w: int, dtype: type, seed: int) -> np.ndarray:
    """Random values with NaNs scattered (some windows with two or more), runs of ties,
    -inf planes and rows: every rule of the winner met on odd sizes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, h, w))
    x[rng.random(x.shape) < 0.06] = np.nan
    x[0, 1] = np.round(x[0, 1])  # many ties
    x[0, 2, ::2] = 0.5
    x[1, 0] = -np.inf
    x[1, 1, 0] = -np.inf
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ROW_POOLS, ids=str)
def test_max_pool_row_kernel_matches_numpy_kernel_exactly(on_path, case: tuple[Any, ...], dtype: type) -> None:
    """The compiled forward gives the numpy kernel's maxima and indices bit for bit, on
    odd sizes, with padding, dilation, ceil_mode, NaN, ties and -inf windows; its int32
    index reaches users as int64, and the backward takes it as the int64 one."""
    h, w, *args = case
    for seed in range(3):
        x = _hard_input(h, w, dtype, seed)

        def pool(t: ag.Tensor) -> Any:
            return F.max_pool2d(t, *args, return_indices=True)

        on_path("numpy")
        plain = _run(pool, x, seed)
        on_path("compiled")
        fast = _run(pool, x, seed)
        np.testing.assert_array_equal(fast[0], plain[0])
        assert fast[2].dtype == np.int64
        np.testing.assert_array_equal(fast[2], plain[2])
        # (an element that won many windows sums their gradients: float32 on the compiled path)
        np.testing.assert_allclose(fast[1], plain[1], rtol=1e-6, atol=1e-5 if dtype == np.float32 else 1e-13)


def test_max_pool_row_kernel_index_is_int32_and_the_backward_reads_it(on_path) -> None:
    on_path("compiled")
    from asyncgrad.nn import _functional_pooling as FP
    from asyncgrad.ops import pooling as P

    x = _hard_input(9, 7, np.float64, 5)
    win = FP._pool_window(ag.from_numpy(x), 3, 2, 1, 1, False)
    out, index = P._max_pool(x, win=win)
    assert index.dtype == np.int32
    on_path("numpy")
    out64, index64 = P._max_pool(x, win=win)
    assert index64.dtype == np.int64
    np.testing.assert_array_equal(out, out64)
    np.testing.assert_array_equal(index, index64)
    on_path("compiled")
    from asyncgrad.ops.kernels import compiled_path as fast

    g = np.random.default_rng(6).standard_normal(out.shape)
    np.testing.assert_array_equal(fast.max_pool_backward(g, index, win.in_size),
                                  fast.max_pool_backward(g, index64, win.in_size))


def test_max_pool_row_kernel_on_a_non_contiguous_input(on_path) -> None:
    on_path("compiled")
    x = _hard_input(12, 10, np.float32, 7)[:, :, ::2, 1:]
    want = []
    for path in ("numpy", "compiled"):
        on_path(path)
        y, i = F.max_pool2d(ag.from_numpy(x), 3, 2, 1, 2, True, return_indices=True)
        want.append((y.numpy(), i.numpy()))
    np.testing.assert_array_equal(want[0][0], want[1][0])
    np.testing.assert_array_equal(want[0][1], want[1][1])


@pytest.mark.parametrize("path", PATHS)
def test_max_pool_dilated_gradcheck_and_double_backward(on_path, path: str) -> None:
    on_path(path)
    x = ag.tensor(np.random.default_rng(8).permutation(7 * 9 * 2).reshape(1, 2, 7, 9) * 0.1, requires_grad=True)
    assert gradcheck(lambda a: F.max_pool2d(a, (3, 2), (2, 3), 1, (2, 3), True), (x,))
    assert gradgradcheck(lambda a: F.max_pool2d(a, 3, 2, 1, 1, True), (x,))
