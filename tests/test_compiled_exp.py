"""The compiled float32 ``exp`` (Note [Compiled exp] in ops/kernels/numba_kernels.py) against
float64 ``np.exp``, and the float32 row ops built on it against their float64 values and
PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import gradcheck

pytest.importorskip("numba")


@pytest.fixture(scope="module")
def compiled_exp():  # type: ignore[no-untyped-def]
    """``exp(x, out)``: the kernels' float32 ``_exp`` over a float32 array."""
    from numba import njit, types

    from asyncgrad.ops import kernels

    prev = kernels.mode()
    kernels.set_mode("auto")
    assert kernels.wait(60)
    K = kernels.compiled()
    assert K is not None

    @njit([(types.float32[::1], types.float32[::1])], fastmath=K._FLAGS, error_model="numpy")
    def exp(x, out):  # type: ignore[no-untyped-def]
        for i in range(x.size):
            out[i] = K._exp(x[i])
    yield exp
    kernels.set_mode(prev)


def _run(exp, x: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = np.empty_like(x)
    exp(x, out)
    return out


def test_exp_within_2_ulps_over_a_dense_sweep_subnormal_results_included(compiled_exp) -> None:  # type: ignore[no-untyped-def]
    bits = np.arange(0, 2**32, 61, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (x > -110) & (x < 88.72283)]  # every result finite
    got = _run(compiled_exp, x)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)  # 2**-149 for subnormals
    err = np.abs(got - want) / ulp
    assert err.max() <= 2.0  # 0.996 on this machine; Cephes' expf reached 5.1
    sub = (want < np.finfo(np.float32).tiny) & (want > 2.0**-149)
    assert sub.sum() > 1000 and np.all(got[sub] > 0)  # subnormal results, not flushed


def test_exp_specials(compiled_exp) -> None:  # type: ignore[no-untyped-def]
    x = np.float32([math.inf, -math.inf, math.nan, 0.0, -0.0, 88.7228317, 88.7228394, 100.0, 1e30, -1e30,
                    -87.5, -100.0, -103.9, -104.0, -110.0, 1e-30, -1e-30])
    got = _run(compiled_exp, x)
    assert got.dtype == np.float32
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    assert got[0] == math.inf and got[1] == 0.0 and math.isnan(got[2])
    assert got[3] == got[4] == 1.0
    assert np.isfinite(got[5]) and got[5] > 3.4e38
    assert np.all(got[6:9] == math.inf) and np.all(got[9:10] == 0.0)
    np.testing.assert_allclose(got[10:13], want[10:13], rtol=2 * 2.0**-23, atol=2.0**-149)
    assert np.all(got[10:13] > 0) and np.all(got[13:15] == 0.0)
    assert got[15] == got[16] == 1.0


def _rows(dtype: type) -> np.ndarray:
    x = np.random.default_rng(11).standard_normal((64, 65)) * 6
    x[0, :] = np.linspace(-120, 0, 65)  # results down to subnormals and 0
    x[1, 5:] = -math.inf  # masked
    return x.astype(dtype)


def test_float32_row_ops_agree_with_their_float64_values(on_path) -> None:  # type: ignore[no-untyped-def]
    on_path("compiled")
    x32 = _rows(np.float32)
    x64 = x32.astype(np.float64)
    p32, p64 = (AF.softmax(ag.from_numpy(a), -1).numpy() for a in (x32, x64))
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, p64, rtol=4e-6, atol=1e-44)
    l32, l64 = (AF.log_softmax(ag.from_numpy(a), -1).numpy() for a in (x32, x64))
    fin = np.isfinite(l64)
    assert np.array_equal(fin, np.isfinite(l32))
    np.testing.assert_allclose(l32[fin], l64[fin], rtol=2e-6, atol=2e-6)
    t = np.arange(64) % 5
    c32, c64 = (AF.cross_entropy(ag.from_numpy(a), t).numpy() for a in (x32, x64))
    assert c32.dtype == np.float32
    np.testing.assert_allclose(c32, c64, rtol=2e-6)


def test_float32_row_ops_agree_with_torch(on_path) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    on_path("compiled")
    x = _rows(np.float32)
    tx = torch.from_numpy(x)
    np.testing.assert_allclose(AF.softmax(ag.from_numpy(x), -1).numpy(), torch.softmax(tx, -1).numpy(),
                               rtol=1e-5, atol=1e-40)
    got = AF.log_softmax(ag.from_numpy(x), -1).numpy()
    want = torch.log_softmax(tx, -1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    t = np.arange(64) % 5
    want_ce = torch.nn.functional.cross_entropy(tx[2:], torch.from_numpy(t[2:])).item()
    np.testing.assert_allclose(AF.cross_entropy(ag.from_numpy(x[2:]), t[2:]).numpy(), want_ce, rtol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "cross_entropy"])
def test_float64_row_ops_gradcheck_on_the_compiled_path(on_path, name: str) -> None:  # type: ignore[no-untyped-def]
    on_path("compiled")
    x = ag.from_numpy(np.random.default_rng(5).standard_normal((4, 7))).requires_grad_()
    fn = {"softmax": lambda a: AF.softmax(a, -1), "log_softmax": lambda a: AF.log_softmax(a, -1),
          "cross_entropy": lambda a: AF.cross_entropy(a, np.array([0, 3, 6, 2]))}[name]
    assert gradcheck(fn, (x,))
