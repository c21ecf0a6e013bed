"""Convolution's two layouts (Note [Convolution on pixel rows] in ops/conv.py): the
geometries that run on pixel rows and those handed back to channels first, each against
PyTorch (float64) and the two layouts against each other (float32); gradcheck on pixel
rows; the compiled fold and the numpy one give the same bits. The same for the geometries
that run by shifted taps (Note [Convolution by shifted taps] in ops/_shifted_taps.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as F
from asyncgrad.autograd import gradcheck, gradgradcheck
from asyncgrad.ops import _pixel_rows as ops_rows
from asyncgrad.ops import _shifted_taps as ops_shifted
from asyncgrad.ops import conv as ops_conv
from test_conv import CONV2D, CONV_T
from test_conv import _torch_on_one_thread  # noqa: F401  (the fixture applies here)

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")  # (PyTorch's own)


def _runs_on_rows(x_shape: tuple[int, ...], w_shape: tuple[int, ...], kw: dict[str, Any]) -> bool:
    """Whether conv2d's kernels for these arguments run on pixel rows (the geometry the
    op records)."""
    x = ag.tensor(np.zeros(x_shape), requires_grad=True)
    y = F.conv2d(x, ag.tensor(np.zeros(w_shape)), **kw)
    return ops_conv.on_pixel_rows(y.grad_fn.params["geo"], x_shape[1])


# (x shape, weight shape, arguments): each takes pixel rows (strided, narrow images, or
# 32 channels and more on wide rows)
ON_ROWS = [
    ((2, 3, 7, 6), (5, 3, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 3, 7, 8), (4, 3, 3, 2), {"stride": (2, 3), "padding": (2, 0), "dilation": (1, 2)}),
    ((3, 2, 5, 4), (3, 2, 3, 3), {"padding": 1}),  # (a 4-wide plane: not on wide rows)
    ((2, 2, 6, 5), (3, 2, 3, 3), {"padding": "same", "dilation": 2}),
    ((2, 32, 5, 9), (3, 32, 3, 3), {"padding": 1}),  # wide rows, 32 channels
    ((2, 32, 6, 9), (4, 32, 2, 3), {"padding": (0, 2)}),
    ((2, 3, 9, 9), (2, 3, 3, 3), {"stride": 3}),  # windows that do not overlap
]
# handed back to channels first
OFF_ROWS = [
    ((2, 4, 5, 13), (4, 4, 3, 3), {"padding": 1}),  # wide rows, few channels
    ((2, 4, 6, 6), (4, 2, 3, 3), {"stride": 2, "padding": 1, "groups": 2}),
    ((2, 32, 6, 6), (4, 32, 1, 1), {"stride": 2}),  # a 1 x 1 kernel
]


def _rand(shape: tuple[int, ...], seed: int, dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ours(x: np.ndarray, w: np.ndarray, b: np.ndarray, kw: dict[str, Any], transposed: bool) -> list[np.ndarray]:
    """Output and the three gradients (for a fixed output gradient) of conv2d, or of
    conv_transpose2d with the same weight read as (C_in, C_out/groups, kh, kw)."""
    xa, wa, ba = (ag.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    fn = F.conv_transpose2d if transposed else F.conv2d
    y = fn(xa, wa, ba, **kw)
    g = _rand(y.shape, 9, x.dtype)
    grads = ag.grad_sync(y, [xa, wa, ba], ag.from_numpy(g))
    return [y.numpy(), *(t.numpy() for t in grads)]


def _theirs(x: np.ndarray, w: np.ndarray, b: np.ndarray, kw: dict[str, Any], transposed: bool) -> list[np.ndarray]:
    torch = pytest.importorskip("torch")
    xt, wt, bt = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    fn = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    y = fn(xt, wt, bt, **kw)
    g = torch.from_numpy(_rand(tuple(y.shape), 9, x.dtype))
    grads = torch.autograd.grad(y, [xt, wt, bt], g)
    return [y.detach().numpy(), *(t.numpy() for t in grads)]


def _arrays(x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: Any, transposed: bool = False,
            groups: int = 1) -> tuple[np.ndarray, ...]:
    out_channels = w_shape[0]
    if transposed:  # the weight of the transposed convolution from x's channels
        w_shape = (x_shape[1], out_channels // groups, *w_shape[2:])
    return _rand(x_shape, 0, dtype), _rand(w_shape, 1, dtype), _rand((out_channels,), 2, dtype)


@pytest.mark.parametrize("case", ON_ROWS + OFF_ROWS, ids=str)
def test_the_decision_is_the_notes(case: tuple[Any, ...]) -> None:
    x_shape, w_shape, kw = case
    assert _runs_on_rows(x_shape, w_shape, kw) == (case in ON_ROWS)


def _with_transposed(cases: list[tuple[Any, ...]]) -> list[tuple[tuple[Any, ...], bool]]:
    """Each case as a convolution and as a transposed one (which takes no padding='same',
    as PyTorch's)."""
    return [(c, t) for c in cases for t in (False, True) if not (t and c[2].get("padding") == "same")]


@pytest.mark.parametrize(("case", "transposed"), _with_transposed(ON_ROWS + OFF_ROWS), ids=str)
def test_values_and_gradients_match_torch(case: tuple[Any, ...], transposed: bool) -> None:
    x_shape, w_shape, kw = case
    x, w, b = _arrays(x_shape, w_shape, np.float64, transposed, kw.get("groups", 1))
    for a, t in zip(_ours(x, w, b, kw, transposed), _theirs(x, w, b, kw, transposed)):
        np.testing.assert_allclose(a, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("case", "transposed"), _with_transposed(ON_ROWS), ids=str)
def test_both_layouts_agree_in_float32(monkeypatch: pytest.MonkeyPatch, case: tuple[Any, ...],
                                       transposed: bool) -> None:
    x_shape, w_shape, kw = case
    x, w, b = _arrays(x_shape, w_shape, np.float32, transposed)
    rows = _ours(x, w, b, kw, transposed)
    monkeypatch.setattr(ops_conv, "PIXEL_ROWS", False)
    first = _ours(x, w, b, kw, transposed)
    for r, f in zip(rows, first):
        assert r.dtype == np.float32
        np.testing.assert_allclose(r, f, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows_per_part", [1, 40, 10**6], ids=["an image a part", "some images a part", "one part"])
def test_batches_cut_into_parts_match_torch(monkeypatch: pytest.MonkeyPatch, rows_per_part: int) -> None:
    """Parts of one image (whose weight gradient multiplies the gradient's planes as they
    are), of several, and the whole batch in one: the same values."""
    monkeypatch.setattr(ops_rows, "ROWS_PER_PART", rows_per_part)
    for x_shape, w_shape, kw in (ON_ROWS[0], ON_ROWS[4]):
        x, w, b = _arrays((5, *x_shape[1:]), w_shape, np.float64)
        assert _runs_on_rows(x.shape, w.shape, kw)
        for a, t in zip(_ours(x, w, b, kw, False), _theirs(x, w, b, kw, False)):
            np.testing.assert_allclose(a, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fn, shapes", [
    (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), ((2, 2, 5, 4), (3, 2, 3, 3), (3,))),
    (lambda x, w, b: F.conv2d(x, w, b, padding=(1, 0), dilation=(1, 2)), ((1, 2, 4, 5), (2, 2, 2, 2), (2,))),
    (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
     ((1, 3, 3, 2), (3, 2, 3, 3), (2,))),
], ids=["strided", "dilated narrow", "transposed strided"])
def test_gradcheck_on_pixel_rows(fn: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
    inputs = tuple(ag.tensor(_rand(s, i), requires_grad=True) for i, s in enumerate(shapes))
    assert gradcheck(fn, inputs)


@pytest.mark.parametrize("fn, shapes", [
    (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), ((1, 9, 8, 9), (3, 9, 3, 3), (3,))),
    (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1), ((1, 8, 4, 5), (8, 9, 3, 3), (9,))),
], ids=["strided", "transposed strided"])
def test_gradcheck_on_compiled_pixel_rows(on_path: Any, fn: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
    """gradcheck through the compiled windows and fold on pixel rows, with a block of 8
    channels of 8 pixels and channels and pixels left over (Note [Channels last by a
    compiled copy] in ops/kernels/numba_kernels.py)."""
    on_path("compiled")
    inputs = tuple(ag.tensor(_rand(s, i), requires_grad=True) for i, s in enumerate(shapes))
    assert gradcheck(fn, inputs)


# geometries on pixel rows with odd sizes, uneven padding, dilation, stride 2 on odd inputs
ROWS_ODD = [
    ON_ROWS[1],
    ((3, 5, 9, 7), (4, 5, 3, 3), {"stride": 2, "padding": 1}),  # stride 2, odd input sizes
    ((2, 3, 7, 3), (2, 3, 2, 2), {"padding": "same"}),  # "same" pads one more at the end; a narrow image
    ((2, 33, 5, 7), (3, 33, 3, 2), {"padding": (2, 1), "dilation": 2}),  # wide rows, 33 channels
    # blocks of 8 channels of 8 pixels and what is left over (Note [Channels last by a
    # compiled copy]): stride 2, and 40 channels on wide rows
    ((2, 19, 11, 13), (4, 19, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 40, 9, 17), (3, 40, 3, 3), {"padding": 1}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ROWS_ODD, ids=str)
def test_compiled_fold_gives_the_numpy_bits(on_path: Any, dtype: Any, case: tuple[Any, ...]) -> None:
    """Output and gradients of convolutions on pixel rows (windows copied into the
    channels-last input, folded back tap by tap and copied back to channels first) on the
    compiled kernels and on numpy: the same bits."""
    x_shape, w_shape, kw = case
    assert _runs_on_rows(x_shape, w_shape, kw)
    x, w, b = _arrays(x_shape, w_shape, dtype)
    wt, bt = _arrays(x_shape, w_shape, dtype, transposed=True)[1:]
    transposed = kw.get("padding") != "same"  # (PyTorch's transposed convolution takes no "same")

    def both() -> list[np.ndarray]:
        return _ours(x, w, b, kw, False) + (_ours(x, wt, bt, kw, True) if transposed else [])

    on_path("numpy")
    plain = both()
    on_path("compiled")
    fast = both()
    for p, f in zip(plain, fast):
        np.testing.assert_array_equal(f, p)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ROWS_ODD, ids=str)
def test_compiled_pixel_rows_match_torch(on_path: Any, dtype: Any, case: tuple[Any, ...]) -> None:
    """The same convolutions on the compiled kernels (windows straight from the input,
    folded straight back to channels first: Note [Pixel rows straight from the input] in
    ops/kernels/numba_kernels.py) against PyTorch."""
    x_shape, w_shape, kw = case
    x, w, b = _arrays(x_shape, w_shape, dtype)
    on_path("compiled")
    tol = 1e-10 if dtype == np.float64 else 1e-4
    for a, t in zip(_ours(x, w, b, kw, False), _theirs(x, w, b, kw, False)):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, t, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape", "pad"), [((3, 5, 7, 9), ((1, 1), (1, 1))), ((2, 1, 4, 3), ((0, 1), (2, 0))),
                                            ((1, 3, 2, 5), ((0, 0), (0, 0))), ((2, 17, 3, 19), ((1, 2), (0, 1))),
                                            ((1, 16, 2, 16), ((0, 0), (0, 0)))], ids=str)
def test_compiled_layout_copies_give_the_numpy_bits(on_path: Any, dtype: Any, shape: tuple[int, ...],
                                                    pad: tuple[tuple[int, int], ...]) -> None:
    """The padded channels-last copy of an input (here a strided view, not contiguous) and
    the cropped channels-first copy back (Note [Channels last by a compiled copy] in
    ops/kernels/numba_kernels.py): the compiled copies and numpy's, the same bits, and
    the way there and back is the identity."""
    from asyncgrad.ops import _windows as ops_windows

    h, w = shape[2:]
    win = ops_windows.Window((1, 1), (1, 1), (1, 1), pad, (h, w), (h, w))  # type: ignore[arg-type]
    x = _rand((shape[0], shape[1], h, 2 * w), 3, dtype)[..., ::2]
    on_path("numpy")
    plain = ops_rows.padded_channels_last(x, win, np.dtype(dtype))
    on_path("compiled")
    fast = ops_rows.padded_channels_last(x, win, np.dtype(dtype))
    assert fast.shape == (shape[0], *win.padded, shape[1])
    np.testing.assert_array_equal(fast, plain)
    back = ops_rows.cropped_channels_first(fast, win)
    assert back.flags.c_contiguous
    np.testing.assert_array_equal(back, x)
    on_path("numpy")
    np.testing.assert_array_equal(ops_rows.cropped_channels_first(fast, win), back)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv2d", "conv_transpose2d"])
@pytest.mark.parametrize("case", [ON_ROWS[0], ON_ROWS[4], *OFF_ROWS], ids=str)
def test_an_empty_batch_matches_torch(case: tuple[Any, ...], transposed: bool) -> None:
    """An empty batch, on either layout: empty outputs, zero weight and bias gradients."""
    x_shape, w_shape, kw = case
    x, w, b = _arrays((0, *x_shape[1:]), w_shape, np.float64, transposed, kw.get("groups", 1))
    for a, t in zip(_ours(x, w, b, kw, transposed), _theirs(x, w, b, kw, transposed)):
        assert a.shape == t.shape
        np.testing.assert_array_equal(a, t)


def test_a_broadcast_gradient_on_pixel_rows() -> None:
    """An output gradient that is a broadcast view (zero strides)."""
    torch = pytest.importorskip("torch")
    x, w = _rand((2, 32, 6, 6), 0), _rand((3, 32, 3, 3), 1)
    xa, wa = ag.tensor(x, requires_grad=True), ag.tensor(w, requires_grad=True)
    y = F.conv2d(xa, wa, stride=2)
    g = np.broadcast_to(_rand((1, 3, 1, 1), 2), y.shape)
    ours = ag.grad_sync(y, [xa, wa], ag.tensor(g))
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    theirs = torch.autograd.grad(torch.nn.functional.conv2d(xt, wt, stride=2), [xt, wt], torch.tensor(g.copy()))
    for a, t in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), t.numpy(), rtol=1e-10, atol=1e-10)


# --- shifted taps ----------------------------------------------------------------------------
def _runs_shifted(x_shape: tuple[int, ...], w_shape: tuple[int, ...], kw: dict[str, Any],
                  weight_grad: bool = True) -> bool:
    """Whether conv2d's weight gradient (or its forward) for these arguments runs by shifted taps."""
    x = ag.tensor(np.zeros(x_shape), requires_grad=True)
    y = F.conv2d(x, ag.tensor(np.zeros(w_shape)), **kw)
    return ops_conv.on_shifted_taps(y.grad_fn.params["geo"], x_shape[1], weight_grad=weight_grad)


# 16 to 31 input channels, one group, a kernel of several taps, a quarter of junk at most
ON_SHIFTED = [
    ((2, 16, 5, 9), (3, 16, 3, 3), {"padding": 1}),  # stride 1: wide rows
    ((3, 16, 9, 10), (4, 16, 3, 3), {"stride": 2, "padding": 1}),  # strided: by phases
    ((2, 20, 8, 14), (3, 20, 3, 2), {"stride": (2, 3), "padding": (1, 2), "dilation": (1, 2)}),
]
OFF_SHIFTED = [
    ((2, 15, 5, 9), (3, 15, 3, 3), {"padding": 1}),  # too few channels
    ((2, 32, 5, 9), (3, 32, 3, 3), {"padding": 1}),  # pixel rows
    ((2, 32, 5, 9), (4, 16, 3, 3), {"padding": 1, "groups": 2}),  # grouped
    ((2, 16, 5, 9), (3, 16, 1, 1), {}),  # one tap
    ((2, 16, 5, 4), (3, 16, 3, 3), {"padding": 1}),  # a narrow plane: half its outputs junk
]


@pytest.mark.parametrize("case", ON_SHIFTED + OFF_SHIFTED, ids=str)
def test_the_shifted_taps_decision_is_the_notes(monkeypatch: pytest.MonkeyPatch, case: tuple[Any, ...]) -> None:
    """Each ON_SHIFTED case by shifted taps with stride 1; a strided one's weight gradient
    by phases only when ``STRIDED_BY_PHASES``, its forward never."""
    x_shape, w_shape, kw = case
    stride_1 = case in ON_SHIFTED and "stride" not in kw
    assert _runs_shifted(x_shape, w_shape, kw) == stride_1
    assert _runs_shifted(x_shape, w_shape, kw, weight_grad=False) == stride_1
    monkeypatch.setattr(ops_conv, "STRIDED_BY_PHASES", True)
    assert _runs_shifted(x_shape, w_shape, kw) == (case in ON_SHIFTED)
    assert _runs_shifted(x_shape, w_shape, kw, weight_grad=False) == stride_1


@pytest.fixture(params=[False, True], ids=["strided on pixel rows", "strided by phases"])
def by_phases(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways of a strided weight gradient (Note [Convolution on pixel rows] in ops/conv.py)."""
    monkeypatch.setattr(ops_conv, "STRIDED_BY_PHASES", request.param)
    return bool(request.param)


@pytest.mark.parametrize(("case", "transposed"), _with_transposed(ON_SHIFTED), ids=str)
def test_shifted_taps_match_torch(by_phases: bool, case: tuple[Any, ...], transposed: bool) -> None:
    x_shape, w_shape, kw = case
    x, w, b = _arrays(x_shape, w_shape, np.float64, transposed)
    for a, t in zip(_ours(x, w, b, kw, transposed), _theirs(x, w, b, kw, transposed)):
        np.testing.assert_allclose(a, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("case", "transposed"), _with_transposed(ON_SHIFTED), ids=str)
def test_shifted_taps_and_the_other_layouts_agree_in_float32(monkeypatch: pytest.MonkeyPatch,
                                                            case: tuple[Any, ...], transposed: bool) -> None:
    x_shape, w_shape, kw = case
    x, w, b = _arrays(x_shape, w_shape, np.float32, transposed)
    shifted = _ours(x, w, b, kw, transposed)
    monkeypatch.setattr(ops_conv, "SHIFTED_TAPS", False)
    other = _ours(x, w, b, kw, transposed)
    for s, o in zip(shifted, other):
        assert s.dtype == np.float32
        np.testing.assert_allclose(s, o, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 40], ids=["an image a chunk", "one chunk"])
def test_shifted_taps_in_chunks_match_torch(by_phases: bool, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int) -> None:
    monkeypatch.setattr(ops_shifted, "CHUNK_BYTES", chunk_bytes)
    for x_shape, w_shape, kw in ON_SHIFTED[:2]:
        x, w, b = _arrays(x_shape, w_shape, np.float64)
        for a, t in zip(_ours(x, w, b, kw, False), _theirs(x, w, b, kw, False)):
            np.testing.assert_allclose(a, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("kw", "transposed"), [(kw, False) for kw in CONV2D] + [(kw, True) for kw in CONV_T],
                         ids=str)
def test_every_geometry_by_shifted_taps_matches_torch(by_phases: bool, monkeypatch: pytest.MonkeyPatch,
                                                      kw: dict[str, Any], transposed: bool) -> None:
    """test_conv.py's grids, with shifted taps taken from one channel on: the geometries
    that fit (one group, a quarter of junk at most) run by them, and all match PyTorch."""
    monkeypatch.setattr(ops_conv, "SHIFT_CHANNELS", 1)
    groups = kw.get("groups", 1)
    x_shape = (2, 4, 7, 6) if not transposed else (2, 4, 4, 5)
    w_shape = (6 if groups != 4 else 4, 4 // groups, 3, 2) if not transposed else (6, 4, 3, 3)
    x, w, b = _arrays(x_shape, w_shape, np.float64, transposed, groups)
    for a, t in zip(_ours(x, w, b, kw, transposed), _theirs(x, w, b, kw, transposed)):
        np.testing.assert_allclose(a, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fn, shapes", [
    (lambda x, w, b: F.conv2d(x, w, b, padding=1), ((2, 2, 4, 5), (3, 2, 3, 3), (3,))),
    (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=(1, 2), dilation=(2, 1)), ((1, 2, 6, 7), (2, 2, 2, 3), (2,))),
    (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
     ((1, 3, 4, 5), (3, 2, 3, 3), (2,))),
], ids=["stride 1", "strided dilated", "transposed strided"])
def test_gradcheck_and_gradgradcheck_by_shifted_taps(by_phases: bool, monkeypatch: pytest.MonkeyPatch, fn: Any,
                                                     shapes: tuple[tuple[int, ...], ...]) -> None:
    monkeypatch.setattr(ops_conv, "SHIFT_CHANNELS", 1)
    inputs = tuple(ag.tensor(_rand(s, i), requires_grad=True) for i, s in enumerate(shapes))
    assert gradcheck(fn, inputs)
    assert gradgradcheck(fn, inputs)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv2d", "conv_transpose2d"])
@pytest.mark.parametrize("case", ON_SHIFTED[:2], ids=str)
def test_an_empty_batch_by_shifted_taps(case: tuple[Any, ...], transposed: bool) -> None:
    x_shape, w_shape, kw = case
    x, w, b = _arrays((0, *x_shape[1:]), w_shape, np.float64, transposed)
    for a, t in zip(_ours(x, w, b, kw, transposed), _theirs(x, w, b, kw, transposed)):
        assert a.shape == t.shape
        np.testing.assert_array_equal(a, t)
