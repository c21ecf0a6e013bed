"""The compiled row sums (``numba_kernels.row_sums``, Note [Row sums in numpy's order]):
``sum``/``mean`` over the last axis give numpy's bits, NaN, inf and -0.0 included, in
float32 and float64, at every row length's split of numpy's pairwise summation; the ops
take them only where they apply (one row at a time for large arrays: Note [Row sums from
memory]), and fall back to numpy elsewhere."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck
from asyncgrad.ops import reductions

# row lengths around numpy's pairwise splits: < 8 (one by one), 8..128 (eight lanes and a
# tail), > 128 (halves at multiples of 8), and longer rows with several levels of halves
LENGTHS = [1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 130, 136, 255, 256, 257, 300, 512, 1000,
           1024, 4097]
ROWS = [1, 3, 4, 5, 9]  # the kernel sums four rows together: whole groups, remainders, both


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, signs of zero included; NaN where the other has NaN."""
    nan = np.isnan(a)
    if not np.array_equal(nan, np.isnan(b)):
        return False
    return bool(np.array_equal(a[~nan].view(np.uint8), b[~nan].view(np.uint8)))


def _spread(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    # magnitudes over many orders, so that a different order of additions shows in the bits
    return (rng.standard_normal(shape) * np.exp(rng.standard_normal(shape) * 4)).astype(dtype)


@pytest.fixture
def compiled_rows(on_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The compiled kernels in use, and the ops taking row_sums at every size."""
    on_path("compiled")
    monkeypatch.setattr(reductions, "ROW_SUMS_MIN", 0)
    from asyncgrad.ops import kernels

    return kernels.compiled()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel", ["row_sums", "row_sums_streamed"])
def test_kernel_gives_numpys_bits_at_every_split(compiled_rows, kernel: str, dtype: type) -> None:
    """Both kernels: four rows at a time, and one at a time (Note [Row sums from memory])."""
    rng = np.random.default_rng(0)
    for n in LENGTHS:
        for rows in ROWS:
            x = _spread(rng, (rows, n), dtype)
            out = np.empty(rows, dtype=dtype)
            getattr(compiled_rows, kernel)(x, out)
            assert _bits_equal(out, np.add.reduce(x, axis=-1)), (kernel, n, rows)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_streamed_kernel_sums_empty_rows_to_plus_zero(compiled_rows, dtype: type) -> None:
    out = np.full(3, 7.0, dtype=dtype)
    compiled_rows.row_sums_streamed(np.empty((3, 0), dtype=dtype), out)
    assert np.array_equal(out, np.zeros(3)) and not np.signbit(out).any()


def test_large_arrays_take_the_streamed_kernel_with_numpys_bits(compiled_rows, monkeypatch) -> None:
    calls: list[str] = []

    class Spy:
        ROW_SUMS_MATCH_NUMPY = True

        def row_sums(self, x: np.ndarray, out: np.ndarray) -> None:
            calls.append("rows")
            compiled_rows.row_sums(x, out)

        def row_sums_streamed(self, x: np.ndarray, out: np.ndarray) -> None:
            calls.append("streamed")
            compiled_rows.row_sums_streamed(x, out)

    monkeypatch.setattr(reductions, "compiled", lambda: Spy())
    x = _spread(np.random.default_rng(11), (5, 3, 300), np.float32)
    monkeypatch.setattr(reductions, "ROW_SUMS_STREAM_BYTES", x.nbytes)
    got = [ag.from_numpy(x).sum(-1).numpy(), ag.from_numpy(x[:4]).sum(-1).numpy(), ag.from_numpy(x).mean(-1).numpy()]
    assert calls == ["streamed", "rows", "streamed"]
    assert _bits_equal(got[0], np.sum(x, axis=-1)) and _bits_equal(got[1], np.sum(x[:4], axis=-1))
    assert _bits_equal(got[2], np.mean(x, axis=-1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_on_tricky_values(compiled_rows, dtype: type) -> None:
    big = float(np.finfo(dtype).max)
    rows = [
        [0.0] * 9, [-0.0] * 3, [-0.0] * 20, [-0.0] * 200,  # numpy: +0.0 (0.0 + a sum from -0.0)
        [math.inf] + [1.0] * 10, [math.inf, -math.inf] + [0.0] * 12, [math.nan] + [1.0] * 140,
        [-math.inf] * 5, [big] * 16, [big, -big] * 70, [1e-45] * 33, [1e8, 1.0, -1e8] * 50,
    ]
    width = max(len(r) for r in rows)
    for r in rows:  # each row alone (its own length) and padded with zeros into one array
        x = np.array([r] * 5, dtype=dtype)
        out = np.empty(5, dtype=dtype)
        with np.errstate(all="ignore"):
            compiled_rows.row_sums(x, out)
            assert _bits_equal(out, np.add.reduce(x, axis=-1)), r[:3]
    x = np.zeros((len(rows), width), dtype=dtype)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    out = np.empty(len(rows), dtype=dtype)
    with np.errstate(all="ignore"):
        compiled_rows.row_sums(x, out)
        assert _bits_equal(out, np.add.reduce(x, axis=-1))
        compiled_rows.row_sums_streamed(x, out)
        assert _bits_equal(out, np.add.reduce(x, axis=-1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_on_empty_input(compiled_rows, dtype: type) -> None:
    out = np.full(3, 7.0, dtype=dtype)
    compiled_rows.row_sums(np.empty((3, 0), dtype=dtype), out)
    assert np.array_equal(out, np.zeros(3)) and not np.signbit(out).any()
    compiled_rows.row_sums(np.empty((0, 4), dtype=dtype), np.empty(0, dtype=dtype))  # no rows: nothing


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("shape", [(5,), (2, 3, 129), (4, 1), (6, 512), (2, 0, 7), (3, 0)])
def test_sum_and_mean_over_last_axis_equal_numpy(compiled_rows, shape: tuple[int, ...], keepdim: bool,
                                                 dtype: type) -> None:
    x = _spread(np.random.default_rng(1), shape, dtype)
    t = ag.from_numpy(x)
    with np.errstate(all="ignore"), warnings.catch_warnings():  # the mean of no elements: NaN, as numpy
        warnings.simplefilter("ignore", RuntimeWarning)
        got_sum = t.sum(-1, keepdim=keepdim).numpy()
        got_mean = t.mean(-1, keepdim=keepdim).numpy()
        want_mean = np.mean(x, axis=-1, keepdims=keepdim)
    want_sum = np.sum(x, axis=-1, keepdims=keepdim)
    assert got_sum.dtype == np.dtype(dtype) and got_mean.dtype == np.dtype(dtype)  # float32 never upcast
    assert got_sum.shape == want_sum.shape and got_mean.shape == want_mean.shape
    assert _bits_equal(np.asarray(got_sum), np.asarray(want_sum))
    assert _bits_equal(np.asarray(got_mean), np.asarray(want_mean))


def test_ops_take_the_kernel_where_it_applies_and_numpy_elsewhere(compiled_rows, monkeypatch) -> None:
    calls: list[tuple[int, ...]] = []

    class Spy:
        ROW_SUMS_MATCH_NUMPY = True

        def row_sums(self, x: np.ndarray, out: np.ndarray) -> None:
            calls.append(x.shape)
            compiled_rows.row_sums(x, out)

    monkeypatch.setattr(reductions, "compiled", lambda: Spy())
    x = _spread(np.random.default_rng(2), (4, 6, 40), np.float32)
    ag.from_numpy(x).sum(-1)
    ag.from_numpy(x).mean(2, keepdim=True)
    assert calls == [(24, 40), (24, 40)]
    transposed = ag.from_numpy(x).transpose(1, 2)  # not C-contiguous: numpy's reduction, its bits
    readonly = x.copy()
    readonly.flags.writeable = False
    half = np.clip(x, -1e4, 1e4).astype(np.float16)
    out = [transposed.sum(-1).numpy(), ag.from_numpy(x).sum(1).numpy(), ag.from_numpy(x).sum((1, 2)).numpy(),
           ag.from_numpy(half).sum(-1).numpy(), ag.from_numpy(readonly).sum(-1).numpy()]
    assert calls == [(24, 40), (24, 40)]
    assert _bits_equal(out[0], np.sum(x.transpose(0, 2, 1), axis=-1))
    assert _bits_equal(out[4], np.sum(x, axis=-1))
    monkeypatch.setattr(reductions, "ROW_SUMS_MIN", x.size + 1)  # below the size: numpy
    ag.from_numpy(x).sum(-1)
    assert calls == [(24, 40), (24, 40)]


def test_numpy_path_gives_the_same_bits(on_path) -> None:
    x = _spread(np.random.default_rng(3), (33, 300), np.float32)
    on_path("numpy")
    plain = [ag.from_numpy(x).sum(-1).numpy(), ag.from_numpy(x).mean(-1).numpy()]
    on_path("compiled")
    fast = [ag.from_numpy(x).sum(-1).numpy(), ag.from_numpy(x).mean(-1).numpy()]
    for p, f in zip(plain, fast):
        assert _bits_equal(p, f)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_and_mean_match_torch(compiled_rows, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    x = (np.random.default_rng(4).standard_normal((16, 8, 512)) * 3).astype(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    for name in ("sum", "mean"):
        ours = getattr(ag.from_numpy(x), name)(-1).numpy()
        theirs = getattr(torch.from_numpy(x), name)(-1).numpy()
        np.testing.assert_allclose(ours, theirs, **tol)


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_gradcheck_through_the_kernel(compiled_rows, name: str) -> None:
    x = ag.from_numpy(np.random.default_rng(5).standard_normal((3, 2, 9))).requires_grad_()
    assert gradcheck(lambda t: getattr(t, name)(-1), (x,))
    assert gradcheck(lambda t: getattr(t, name)(-1, keepdim=True) * 2.0, (x,))


def test_a_numpy_that_sums_otherwise_keeps_its_own_reduction(compiled_rows, monkeypatch) -> None:
    """The kernel is checked against numpy's bits at load; where it differs (another
    numpy's order), the ops take numpy's reduction."""
    assert compiled_rows.ROW_SUMS_MATCH_NUMPY  # this numpy: the kernel's bits are its
    calls: list[tuple[int, ...]] = []

    class Differs:
        ROW_SUMS_MATCH_NUMPY = False

        def row_sums(self, x: np.ndarray, out: np.ndarray) -> None:
            calls.append(x.shape)

    monkeypatch.setattr(reductions, "compiled", lambda: Differs())
    x = _spread(np.random.default_rng(5), (8, 700), np.float32)
    got = [ag.from_numpy(x).sum(-1).numpy(), ag.from_numpy(x).mean(-1).numpy()]
    assert calls == []
    assert _bits_equal(got[0], np.sum(x, axis=-1)) and _bits_equal(got[1], np.mean(x, axis=-1))
