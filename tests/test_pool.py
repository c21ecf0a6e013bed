"""MaxPool2d, AvgPool2d, AdaptiveAvgPool2d and AdaptiveMaxPool2d: values, indices and
gradients against PyTorch over a grid of arguments, gradcheck and gradgradcheck, PyTorch's
messages and the modules' repr."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn as nn
import asyncgrad.nn.functional as F
from asyncgrad.autograd import gradcheck, gradgradcheck
from test_conv import _rand, _torch_on_one_thread, assert_matches_torch  # noqa: F401  (the fixture applies here)


def _valid_in_torch(fn: Any, *args: Any) -> bool:
    torch = pytest.importorskip("torch")
    try:
        fn(torch.zeros(1, 1, 7, 8, dtype=torch.float64), *args)
    except RuntimeError:
        return False
    return True


MAX_GRID = list(itertools.product([2, 3, (3, 2)], [None, 1, 2], [0, 1], [1, 2], [False, True]))


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", MAX_GRID, ids=str)
def test_max_pool2d_matches_torch(kernel: Any, stride: Any, padding: int, dilation: int, ceil_mode: bool) -> None:
    torch = pytest.importorskip("torch")
    args = (kernel, stride, padding, dilation, ceil_mode)
    if not _valid_in_torch(torch.nn.functional.max_pool2d, *args):
        with pytest.raises(RuntimeError):
            F.max_pool2d(ag.zeros(1, 1, 7, 8), *args)
        return
    x = _rand(2, 3, 7, 8)
    assert_matches_torch(lambda a: F.max_pool2d(a, *args), lambda a: torch.nn.functional.max_pool2d(a, *args), [x])
    _, ours = F.max_pool2d(ag.tensor(x), *args, return_indices=True)
    _, theirs = torch.nn.functional.max_pool2d(torch.tensor(x), *args, return_indices=True)
    assert ours.dtype == ag.int64
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


AVG_GRID = list(itertools.product([2, 3, (3, 2)], [None, 2], [0, 1], [False, True], [False, True], [None, 5]))


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad, divisor_override", AVG_GRID, ids=str)
def test_avg_pool2d_matches_torch(kernel: Any, stride: Any, padding: int, ceil_mode: bool, count_include_pad: bool,
                                  divisor_override: int | None) -> None:
    torch = pytest.importorskip("torch")
    args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    if not _valid_in_torch(torch.nn.functional.avg_pool2d, *args):
        return
    assert_matches_torch(lambda a: F.avg_pool2d(a, *args), lambda a: torch.nn.functional.avg_pool2d(a, *args),
                         [_rand(2, 3, 7, 8)])


@pytest.mark.parametrize("size", [1, 3, (2, 5), (None, 3), 7, (8, 9)], ids=str)
def test_adaptive_pools_match_torch(size: Any) -> None:
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    x = _rand(2, 3, 7, 8)
    assert_matches_torch(lambda a: F.adaptive_avg_pool2d(a, size), lambda a: TF.adaptive_avg_pool2d(a, size), [x])
    assert_matches_torch(lambda a: F.adaptive_max_pool2d(a, size), lambda a: TF.adaptive_max_pool2d(a, size), [x])
    _, ours = F.adaptive_max_pool2d(ag.tensor(x), size, return_indices=True)
    _, theirs = TF.adaptive_max_pool2d(torch.tensor(x), size, return_indices=True)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_unbatched_input_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    x = _rand(3, 6, 6)
    assert_matches_torch(lambda a: F.max_pool2d(a, 2), lambda a: TF.max_pool2d(a, 2), [x])
    assert_matches_torch(lambda a: F.avg_pool2d(a, 3, 1, 1), lambda a: TF.avg_pool2d(a, 3, 1, 1), [x])


def test_max_pool_ties_and_nan_pick_as_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.zeros((1, 1, 4, 4))
    x[0, 0, 1, 1] = x[0, 0, 1, 0] = np.nan
    x[0, 0, 2:, 2:] = 1.0  # a tie of four
    ya, ia = F.max_pool2d(ag.tensor(x, requires_grad=True), 2, return_indices=True)
    yt, it = torch.nn.functional.max_pool2d(torch.tensor(x), 2, return_indices=True)
    np.testing.assert_array_equal(ya.numpy(), yt.numpy())
    np.testing.assert_array_equal(ia.numpy(), it.numpy())  # the first of a tie, the NaN


def _t(*shape: int) -> ag.Tensor:
    # distinct values, far apart: no ties for finite differences to cross
    n = int(np.prod(shape))
    return ag.tensor(np.random.default_rng(3).permutation(n).reshape(shape) * 0.1, requires_grad=True)


GRADCHECK_CASES = [
    ("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1)),
    ("max_pool2d dilated ceil", lambda x: F.max_pool2d(x, 2, 2, 0, 2, True)),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool2d overlapping", lambda x: F.avg_pool2d(x, 2, 1)),
    ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (2, 3))),
    ("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (2, 3))),
]


@pytest.mark.parametrize("name, fn", GRADCHECK_CASES, ids=[c[0] for c in GRADCHECK_CASES])
def test_gradcheck_and_gradgradcheck(name: str, fn: Any) -> None:
    x = _t(1, 2, 5, 6)
    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


def test_max_pool_gradient_reaches_only_the_maxima() -> None:
    x = ag.tensor(np.arange(16.0).reshape(1, 1, 4, 4), requires_grad=True)
    (g,) = ag.grad_sync(F.max_pool2d(x, 2).sum(), [x])
    expected = np.zeros((4, 4))
    expected[1, 1] = expected[1, 3] = expected[3, 1] = expected[3, 3] = 1.0
    np.testing.assert_array_equal(g.numpy()[0, 0], expected)


def test_node_names_are_torchs() -> None:
    x = _t(1, 1, 4, 4)
    assert F.max_pool2d(x, 2).grad_fn.name() == "MaxPool2DWithIndicesBackward0"
    assert F.avg_pool2d(x, 2).grad_fn.name() == "AvgPool2DBackward0"


@pytest.mark.parametrize("call, message", [
    (lambda: F.max_pool2d(ag.zeros(1, 1, 4, 4), 2, padding=2),
     "pad should be at most half of effective kernel size, but got pad=2, kernel_size=2 and dilation=1"),
    (lambda: F.avg_pool2d(ag.zeros(1, 1, 4, 4), 2, padding=2),
     "pad should be at most half of effective kernel size, but got pad=2, kernel_size=2 and dilation=1"),
    (lambda: F.max_pool2d(ag.zeros(1, 1, 1, 1), 3),
     "Given input size: (1x1x1). Calculated output size: (1x0x0). Output size is too small"),
])
def test_errors_are_torchs(call: Any, message: str) -> None:
    with pytest.raises(RuntimeError) as info:
        call()
    assert str(info.value) == message


@pytest.mark.parametrize("name, args", [("MaxPool2d", (2,)), ("MaxPool2d", (3, 2, 1, 2, False, True)),
                                        ("AvgPool2d", (3, 2, 1)), ("AvgPool2d", (2, None, 0, True, False)),
                                        ("AdaptiveAvgPool2d", ((1, 1),)), ("AdaptiveMaxPool2d", (3,))], ids=str)
def test_modules_match_torch(name: str, args: tuple[Any, ...]) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == []
    x = _rand(2, 3, 8, 7)
    ya, yt = ours(ag.tensor(x)), theirs(torch.tensor(x))
    if isinstance(yt, tuple):
        np.testing.assert_array_equal(ya[1].numpy(), yt[1].numpy())
        ya, yt = ya[0], yt[0]
    np.testing.assert_allclose(ya.numpy(), yt.numpy(), rtol=1e-12, atol=1e-12)
