"""One pool (``ops/kernels/intra_op.py``, Note [One pool]; issue 15): BLAS pinned at one thread and
the large 2-D products split in row blocks over TBB's pool. The split product equals
numpy's (float32 and float64, every BLAS layout of its operands, ``out``, rows that do
not split evenly, inf and NaN), the ops take it only when one pool is on, the product is
large and the process is otherwise idle, other layouts fall back to numpy's, gradcheck
passes through it, and the switch pins and releases BLAS. The product hook's fallback
runs everywhere; the split product needs numba's TBB layer (``pip install tbb``)."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import gradcheck
from asyncgrad.autograd.policy import BLAS
from asyncgrad.ops import kernels
from asyncgrad.ops.kernels import intra_op as _intra
from asyncgrad.ops import linalg as L


def test_by_default_products_are_numpys_matmul() -> None:
    assert not _intra.one_pool and L._mm is np.matmul  # the default path: no dispatch


def test_one_pool_without_a_split_product_falls_back_to_numpy(monkeypatch) -> None:
    monkeypatch.setattr(_intra, "product", None)  # no TBB, or no CBLAS symbol found
    was = _intra.enabled()
    _intra.set_one_pool(True)
    try:
        assert L._mm is L._mm_pool and BLAS.per_call == 1
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((5, 3, 4)), rng.standard_normal((6, 4))
        assert np.array_equal(L._linear(x, w), (x.reshape(-1, 4) @ w.T).reshape(5, 3, 6))
        out = np.empty((15, 4))
        assert L._mm(x.reshape(-1, 4), w.T @ w, out) is out
        assert np.array_equal(out, x.reshape(-1, 4) @ (w.T @ w))
    finally:
        _intra.set_one_pool(False)
        _intra.set_enabled(was)
    assert L._mm is np.matmul


@pytest.fixture(scope="module")
def k():  # type: ignore[no-untyped-def]
    pytest.importorskip("numba")
    kernels.set_mode("auto")
    assert kernels.wait(600), kernels.status()
    if not _intra.available:
        pytest.skip("numba's TBB threading layer is not available (pip install tbb)")
    if _intra.build_product is None or not _intra.build_product():
        pytest.skip("numpy's BLAS has no CBLAS gemm symbol found: products stay numpy's")
    return kernels.compiled()


@pytest.fixture
def pool(k, monkeypatch):  # type: ignore[no-untyped-def]
    was = _intra.enabled()
    monkeypatch.setattr(_intra, "MIN_PRODUCT", 0)
    _intra.set_one_pool(True)
    yield k
    _intra.set_one_pool(False)
    _intra.set_enabled(was)


def _operands(dtype: type, n: int, kk: int, m: int, layout: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, kk)).astype(dtype)
    b = rng.standard_normal((kk, m)).astype(dtype)
    if layout[0] == "F":
        a = np.asfortranarray(a)
    if layout[1] == "F":
        b = np.asfortranarray(b)
    return a, b


def _numpy_one_thread(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with BLAS.pinned(1), np.errstate(invalid="ignore"):
        return np.matmul(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["CC", "CF", "FC", "FF"])
def test_the_split_product_equals_numpys(pool, dtype, layout) -> None:
    a, b = _operands(dtype, 37, 19, 23, layout, 1)
    before = _intra.launches
    got = L._mm(a, b)
    assert _intra.launches == before + 1
    assert got.dtype == dtype and got.shape == (37, 23) and got.flags.c_contiguous
    np.testing.assert_allclose(got, _numpy_one_thread(a, b), rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_into_out_and_slices_with_a_leading_stride(pool, dtype) -> None:
    big_a, big_b = _operands(dtype, 40, 30, 26, "CC", 2)
    a, b = big_a[3:36, 2:27], big_b[2:27, 1:20]  # rows longer than the view (lda > k)
    out = np.full((33, 19), 7, dtype)
    before = _intra.launches
    assert L._mm(a, b, out) is out
    assert _intra.launches == before + 1
    np.testing.assert_allclose(out, _numpy_one_thread(a, b), rtol=1e-5, atol=1e-5)


def test_inf_and_nan_propagate_as_in_numpy(pool) -> None:
    a, b = _operands(np.float64, 9, 5, 7, "CC", 3)
    a[1, 2], a[4, 0], b[3, 5] = np.inf, np.nan, -np.inf
    got, want = L._mm(a, b), _numpy_one_thread(a, b)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12)


def test_other_layouts_mixed_types_and_small_products_are_numpys(pool, monkeypatch) -> None:
    a, b = _operands(np.float64, 12, 10, 8, "CC", 4)
    before = _intra.launches
    strided = a[:, ::2]  # no unit stride: not a BLAS layout
    np.testing.assert_allclose(L._mm(strided, b[:5]), strided @ b[:5], rtol=1e-12)
    np.testing.assert_allclose(L._mm(a.astype(np.float32), b), a.astype(np.float32) @ b, rtol=1e-6)
    out_f = np.empty((12, 8), order="F")  # an out the kernel does not write: numpy's
    assert L._mm(a, b, out_f) is out_f
    np.testing.assert_allclose(out_f, a @ b, rtol=1e-12)
    monkeypatch.setattr(_intra, "MIN_PRODUCT", 12 * 10 * 8 + 1)
    np.testing.assert_allclose(L._mm(a, b), a @ b, rtol=1e-12)
    assert _intra.launches == before


def test_only_with_one_pool_on_and_the_process_idle(pool) -> None:
    a, b = _operands(np.float32, 64, 32, 16, "CC", 5)
    before = _intra.launches
    BLAS.backward_started()
    BLAS.backward_started()  # a second backward call in flight: products stay numpy's
    try:
        L._mm(a, b)
    finally:
        BLAS.backward_ended()
        BLAS.backward_ended()
    BLAS.run(L._mm, a, b)  # an engine BLAS kernel running (itself): numpy's
    assert _intra.launches == before
    _intra.set_one_pool(False)
    L._mm(a, b)
    assert _intra.launches == before
    _intra.set_one_pool(True)
    L._mm(a, b)
    assert _intra.launches == before + 1


def test_the_switch_pins_blas_at_one_thread_and_releases_it(k) -> None:
    was = _intra.enabled()
    with BLAS.pinned(2):
        try:
            _intra.set_one_pool(True)
            assert _intra.enabled() and _intra.one_pool and BLAS.per_call == 1
            assert BLAS.intra_op_ok(one_pool=True) and not BLAS.intra_op_ok()
            _intra.set_one_pool(False)
            assert not _intra.one_pool and _intra.enabled() and BLAS.per_call == 2
            _intra.set_one_pool(True)
            _intra.set_enabled(False)  # off ends one pool too
            assert not _intra.one_pool and BLAS.per_call == 2
        finally:
            _intra.set_one_pool(False)
            _intra.set_enabled(was)


def test_a_linear_layer_through_the_split_products(pool) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 5, 8))
    w, bias = rng.standard_normal((6, 8)), rng.standard_normal(6)
    t, tw, tb = (ag.from_numpy(v.copy()).requires_grad_() for v in (x, w, bias))
    g = rng.standard_normal((4, 5, 6))
    before = _intra.launches
    y = AF.linear(t, tw, tb)
    ag.backward_sync(y, ag.from_numpy(g))
    assert _intra.launches - before >= 3  # forward, dx and dW
    np.testing.assert_allclose(y.numpy(), x @ w.T + bias, rtol=1e-12)
    np.testing.assert_allclose(t.grad.numpy(), g @ w, rtol=1e-12)
    np.testing.assert_allclose(tw.grad.numpy(), g.reshape(-1, 6).T @ x.reshape(-1, 8), rtol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), g.sum((0, 1)), rtol=1e-12)


def test_gradcheck_in_float64_through_the_split_products(pool) -> None:
    rng = np.random.default_rng(7)
    x = ag.from_numpy(rng.standard_normal((3, 4, 5))).requires_grad_()
    w = ag.from_numpy(rng.standard_normal((6, 5))).requires_grad_()
    v = ag.from_numpy(rng.standard_normal((6, 3))).requires_grad_()
    before = _intra.launches
    assert gradcheck(lambda a, b, c: AF.linear(AF.linear(a, b), c.transpose(0, 1)), (x, w, v))
    assert gradcheck(lambda a, b: ag.matmul(a, b.transpose(0, 1)), (x, w))
    assert _intra.launches > before


def test_the_environment_variable_turns_one_pool_on_at_start_up(k) -> None:
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import numpy as np
        from asyncgrad.autograd.policy import BLAS
        from asyncgrad.ops import kernels, linalg as L
        from asyncgrad.ops.kernels import intra_op as _intra
        assert kernels.wait(600)
        a = np.ones((512, 128), np.float32)
        b = np.ones((128, 256), np.float32)
        assert (L._mm(a, b) == 128).all()
        print(_intra.one_pool, _intra.enabled(), L._mm is L._mm_pool, _intra.launches, BLAS.per_call)
    """)
    env = dict(os.environ, ASYNCGRAD_INTRA_OP="pool", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "True", "1", "1"], (r.stdout, r.stderr)
