"""F.pad (constant, reflect, replicate, circular), F.interpolate (nearest, nearest-exact,
linear, bilinear with align_corners) and nn.Upsample against PyTorch; gradgradcheck; messages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn as nn
import asyncgrad.nn.functional as F
from asyncgrad.autograd import gradcheck, gradgradcheck
from test_conv import _rand, _torch_on_one_thread, assert_matches_torch  # noqa: F401  (the fixture applies here)


@pytest.mark.parametrize("pad, value", [((1, 2), 0.0), ((1, 2, 2, 1), 1.5), ((-1, 2, 0, 1), None),
                                        ((0, 0, 1, 1, 2, 0), 0.5)], ids=str)
def test_constant_pad_matches_torch(pad: tuple[int, ...], value: float | None) -> None:
    torch = pytest.importorskip("torch")
    assert_matches_torch(lambda x: F.pad(x, pad, value=value), lambda x: torch.nn.functional.pad(x, pad, value=value),
                         [_rand(2, 3, 5, 6)])


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad, shape", [((1, 2, 2, 1), (2, 3, 5, 6)), ((0, 3, 4, 0), (2, 3, 5, 6)),
                                        ((2, 1), (2, 3, 5))], ids=str)
def test_other_pad_modes_match_torch(mode: str, pad: tuple[int, ...], shape: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    assert_matches_torch(lambda x: F.pad(x, pad, mode), lambda x: torch.nn.functional.pad(x, pad, mode),
                         [_rand(*shape)])


SIZES = [{"size": (7, 13)}, {"size": 3}, {"scale_factor": 2}, {"scale_factor": (1.5, 0.7)},
         {"scale_factor": 0.5, "recompute_scale_factor": True}]


@pytest.mark.parametrize("mode, align_corners", [("nearest", None), ("nearest-exact", None), ("bilinear", False),
                                                 ("bilinear", True)])
@pytest.mark.parametrize("kw", SIZES, ids=str)
def test_interpolate_2d_matches_torch(mode: str, align_corners: bool | None, kw: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    assert_matches_torch(lambda x: F.interpolate(x, mode=mode, align_corners=align_corners, **kw),
                         lambda x: torch.nn.functional.interpolate(x, mode=mode, align_corners=align_corners, **kw),
                         [_rand(2, 3, 5, 6)])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_interpolate_1d_matches_torch(mode: str) -> None:
    torch = pytest.importorskip("torch")
    assert_matches_torch(lambda x: F.interpolate(x, scale_factor=2.5, mode=mode),
                         lambda x: torch.nn.functional.interpolate(x, scale_factor=2.5, mode=mode), [_rand(2, 3, 5)])


@pytest.mark.parametrize("kw", [{"scale_factor": 2}, {"size": (4, 9), "mode": "bilinear", "align_corners": True}],
                         ids=str)
def test_upsample_matches_torch(kw: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = nn.Upsample(**kw), torch.nn.Upsample(**kw)
    assert repr(ours) == repr(theirs)
    x = _rand(1, 2, 3, 4)
    np.testing.assert_allclose(ours(ag.tensor(x)).numpy(), theirs(torch.tensor(x)).numpy(), rtol=1e-12)


@pytest.mark.parametrize("fn", [lambda x: F.pad(x, (1, -1, 2, 0)), lambda x: F.pad(x, (1, 2, 0, 1), "reflect"),
                                lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                                lambda x: F.interpolate(x, size=(3, 5))], ids=["constant", "reflect", "bilinear",
                                                                               "nearest"])
def test_gradcheck_and_gradgradcheck(fn: Any) -> None:
    x = ag.tensor(_rand(1, 2, 3, 3), requires_grad=True)
    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


@pytest.mark.parametrize("call, error, message", [
    (lambda: F.pad(ag.zeros(2, 3), (1,)), RuntimeError, "Padding length must be divisible by 2"),
    (lambda: F.pad(ag.zeros(1, 1, 3, 3), (3, 3, 0, 0), "reflect"), RuntimeError,
     "Argument #4: Padding size should be less than the corresponding input dimension, but got: padding (3, 3) at "
     "dimension 3 of input [1, 1, 3, 3]"),
    (lambda: F.interpolate(ag.zeros(1, 1, 3, 3), scale_factor=2, align_corners=True), ValueError,
     "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear"),
    (lambda: F.interpolate(ag.zeros(1, 1, 3, 3)), ValueError, "either size or scale_factor should be defined"),
])
def test_errors_are_torchs(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message
