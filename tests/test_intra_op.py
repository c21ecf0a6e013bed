"""Intra-op parallel kernels (``ops/kernels/intra_op.py``, Note [Intra-op threads]; issue 15): each
parallel form gives the serial kernel's bits (float32 and float64, tricky values, sizes
that do not split evenly), the ops take it above the size threshold and only while the
process is otherwise idle (the policy's ``BLAS.intra_op_ok``), gradcheck through it, and
it is safe under threads and ``fork``. Skipped without numba's TBB layer (``pip install
tbb``, part of the ``fast`` and ``test`` extras)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import gradcheck
from asyncgrad.autograd.policy import BLAS
from asyncgrad.ops import kernels
from asyncgrad.ops.kernels import intra_op as _intra

pytest.importorskip("numba")

TRICKY = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-30, -1e-30, 88.0, -88.0, 100.0, -104.0,
          3.3, -3.3, 4.0, -4.0, 10.0, -10.0, 1e300, -1e300]


@pytest.fixture(scope="module")
def k():  # type: ignore[no-untyped-def]
    kernels.set_mode("auto")
    assert kernels.wait(600), kernels.status()
    if not _intra.available:
        pytest.skip("numba's TBB threading layer is not available (pip install tbb)")
    return kernels.compiled()


def _data(dtype: type, n: int, seed: int, tricky: bool = True) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n) * 4
    if tricky:
        x[:: max(1, n // len(TRICKY))][: len(TRICKY)] = TRICKY[: len(x[:: max(1, n // len(TRICKY))])]
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bits, -0 and inf included; NaN where the other is NaN (a NaN's sign bit
    depends on whether the vector or the scalar part of a loop made it, in the serial
    kernel too, so it is not part of the result)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    u = np.uint32 if a.dtype == np.float32 else np.uint64
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b)), np.flatnonzero(nan != np.isnan(b))[:10]
    same = (a.view(u) == b.view(u)) | nan
    assert same.all(), np.flatnonzero(~same)[:10]


def _cases(k, dtype: type, n: int) -> dict[str, tuple[str, Callable[[], tuple[np.ndarray, ...]], tuple[int, ...]]]:
    """case -> (kernel's name, fresh arguments, indices of the arguments it writes)."""
    f = np.dtype(dtype).type
    x, g = _data(dtype, n, 1), _data(dtype, n, 2)
    cdf = np.empty_like(x)
    k._SERIAL["gelu"](x, np.empty_like(x), cdf)
    cols = 128 if n % 128 == 0 else 7
    rows, g_rows = x.reshape(-1, cols), g.reshape(-1, cols)
    with np.errstate(all="ignore"):
        sm = np.empty_like(rows)
        k._SERIAL["softmax"](rows, sm)
    w, b = _data(dtype, cols, 3, tricky=False), _data(dtype, cols, 4, tricky=False)
    xhat, rstd = np.empty_like(rows), np.empty((rows.shape[0], 1), dtype)
    with np.errstate(all="ignore"):
        k._SERIAL["layer_norm"](_data(dtype, n, 5, tricky=False).reshape(-1, cols), w, b, 1e-5, np.empty_like(rows),
                            xhat, rstd)
    mask = np.random.default_rng(6).random(cols) < 0.5
    e = lambda: np.empty_like(x)  # noqa: E731
    er = lambda: np.empty_like(rows)  # noqa: E731
    m0, v0 = _data(dtype, n, 8, tricky=False), np.abs(_data(dtype, n, 9))
    adam = lambda decoupled: (lambda: (x.copy(), g, m0.copy(), v0.copy(), decoupled, f(0.99), False,  # noqa: E731
                                       not decoupled, f(0.01), True, f(0.1), f(0.9), f(0.999), f(0.001),
                                       f(-1e-3), f(0.3), f(1e-8)))
    return {
        "gelu": ("gelu", lambda: (x, e(), e()), (1, 2)),
        "gelu_backward": ("gelu_backward", lambda: (g, x, cdf, e()), (3,)),
        "gelu_tanh": ("gelu_tanh", lambda: (x, e()), (1,)),
        "gelu_tanh_backward": ("gelu_tanh_backward", lambda: (g, x, e()), (2,)),
        "sigmoid": ("sigmoid", lambda: (x, e()), (1,)),
        "sigmoid_backward": ("sigmoid_backward", lambda: (g, x, e()), (2,)),
        "tanh_backward": ("tanh_backward", lambda: (g, x, e()), (2,)),
        "threshold_backward": ("threshold_backward", lambda: (g, x, e()), (2,)),
        "softmax": ("softmax", lambda: (rows, er()), (1,)),
        "softmax_backward": ("softmax_backward", lambda: (g_rows, sm, er()), (2,)),
        "log_softmax": ("log_softmax", lambda: (rows, er()), (1,)),
        "log_softmax_backward": ("log_softmax_backward", lambda: (g_rows, sm, er()), (2,)),
        "layer_norm": ("layer_norm", lambda: (rows, w, b, 1e-5, er(), er(), np.empty_like(rstd)), (4, 5, 6)),
        "layer_norm_no_affine": ("layer_norm", lambda: (rows, w[:0], b[:0], 1e-5, er(), er(), np.empty_like(rstd)),
                                 (4, 5, 6)),
        "layer_norm_backward": ("layer_norm_backward", lambda: (g_rows, xhat, rstd, w, er()), (4,)),
        "layer_norm_backward_joint": ("layer_norm_backward_joint",
                                      lambda: (g_rows, xhat, rstd, w, True, er(), np.empty(cols, dtype),
                                               np.empty(cols, dtype)), (5, 6, 7)),
        "layer_norm_backward_joint_no_dx": ("layer_norm_backward_joint",
                                            lambda: (g_rows, xhat, rstd, w, False, er()[:0], np.empty(cols, dtype),
                                                     np.empty(cols, dtype)), (6, 7)),
        "select_rows": ("select_rows", lambda: (rows, mask, True, f(-np.inf), er()), (4,)),
        "adamw_step": ("adam_step", adam(True), (0, 2, 3)),
        "adam_l2_step": ("adam_step", adam(False), (0, 2, 3)),
    }


NAMES = ["gelu", "gelu_backward", "gelu_tanh", "gelu_tanh_backward", "sigmoid", "sigmoid_backward", "tanh_backward",
         "threshold_backward", "softmax", "softmax_backward", "log_softmax", "log_softmax_backward", "layer_norm",
         "layer_norm_no_affine", "layer_norm_backward", "layer_norm_backward_joint",
         "layer_norm_backward_joint_no_dx", "select_rows", "adamw_step", "adam_l2_step"]


@pytest.mark.parametrize("n", [7 * 5, 7 * 333, 128 * 1027])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", NAMES)
def test_parallel_form_gives_the_serial_kernels_bits(k, name: str, dtype: type, n: int) -> None:
    if n % 128 and name.startswith("layer_norm_backward_joint"):
        n = 128 * 3  # fewer rows than one block
    kern, make, written = _cases(k, dtype, n)[name]
    with np.errstate(all="ignore"):
        a, b = make(), make()
        k._SERIAL[kern](*a)
        k._DISPATCHING[kern].parallel(*b)
    for i in written:
        _same_bits(a[i], b[i])


def test_every_kernel_with_a_parallel_form_is_covered(k) -> None:
    covered = {kern for kern, _, _ in _cases(k, np.float32, 7 * 5).values()}
    assert set(k._PARALLEL_FORMS) == covered


@pytest.fixture
def switched_on(k):  # type: ignore[no-untyped-def]
    was = _intra.enabled()
    _intra.set_enabled(True)
    yield k
    _intra.set_enabled(was)


@pytest.fixture
def low_thresholds(monkeypatch, switched_on):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_intra, "MIN_HEAVY", 0)
    monkeypatch.setattr(_intra, "MIN_LIGHT", 0)
    from asyncgrad.ops.kernels import compiled_path as _fast

    monkeypatch.setattr(_fast, "ELEMENTWISE_MIN", 0)
    return switched_on


def test_the_switch_installs_the_dispatchers_and_off_restores_the_serial_kernels(k) -> None:
    was = _intra.enabled()
    try:
        _intra.set_enabled(False)
        assert k.gelu is k._SERIAL["gelu"] and not hasattr(k.gelu, "parallel")
        _intra.set_enabled(True)
        assert k.gelu is k._DISPATCHING["gelu"] and k.gelu.parallel is not None
    finally:
        _intra.set_enabled(was)


def _gelu_layer_norm_softmax(x: np.ndarray) -> list[np.ndarray]:
    t = ag.from_numpy(x.copy()).requires_grad_()
    w = ag.from_numpy(np.linspace(0.5, 1.5, x.shape[-1]).astype(x.dtype)).requires_grad_()
    y = AF.softmax(AF.gelu(AF.layer_norm(t, x.shape[-1:], w)), -1)
    g = np.random.default_rng(3).standard_normal(y.shape).astype(x.dtype)
    ag.backward_sync(y, ag.from_numpy(g))
    return [y.numpy(), t.grad.numpy(), w.grad.numpy()]


def test_ops_take_the_parallel_form_when_idle_and_large_with_the_serial_results(low_thresholds) -> None:
    x = _data(np.float32, 64 * 128, 11, tricky=False).reshape(64, 128)
    _intra.set_enabled(False)
    try:
        before = _intra.launches
        serial = _gelu_layer_norm_softmax(x)
        assert _intra.launches == before
    finally:
        _intra.set_enabled(True)
    with BLAS.pinned(2):  # BLAS with threads of its own: the process counts as idle
        before = _intra.launches
        parallel = _gelu_layer_norm_softmax(x)
        assert _intra.launches - before >= 6  # 3 forward kernels, 3 backward
    for a, b in zip(serial, parallel):
        _same_bits(a, b)


def test_parallel_from_the_threshold_only(switched_on) -> None:
    k = switched_on
    x = _data(np.float32, _intra.MIN_HEAVY - 1, 12, tricky=False)
    with BLAS.pinned(2):
        before = _intra.launches
        k.gelu(x, np.empty_like(x), np.empty_like(x))
        assert _intra.launches == before
        x = _data(np.float32, _intra.MIN_HEAVY, 12, tricky=False)
        k.gelu(x, np.empty_like(x), np.empty_like(x))
        assert _intra.launches == before + 1


def test_serial_while_two_backward_calls_are_in_flight_or_blas_is_pinned_at_one(low_thresholds) -> None:
    x = _data(np.float32, 64 * 128, 13, tricky=False).reshape(64, 128)
    with BLAS.pinned(2):
        assert BLAS.intra_op_ok()
        BLAS.backward_started()
        BLAS.backward_started()  # a second backward call in flight
        try:
            assert not BLAS.intra_op_ok()
            before = _intra.launches
            _gelu_layer_norm_softmax(x)
            assert _intra.launches == before
        finally:
            BLAS.backward_ended()
            BLAS.backward_ended()
        assert BLAS.intra_op_ok()
    with BLAS.pinned(1):
        assert not BLAS.intra_op_ok()
        before = _intra.launches
        _gelu_layer_norm_softmax(x)
        assert _intra.launches == before


def test_serial_while_an_engine_blas_kernel_runs(low_thresholds) -> None:
    seen: list[bool] = []
    with BLAS.pinned(2):
        BLAS.run(lambda: seen.append(BLAS.intra_op_ok()))
        seen.append(BLAS.intra_op_ok())
    assert seen == [False, True]


def test_gradcheck_in_float64_through_the_parallel_forms(low_thresholds) -> None:
    x = ag.from_numpy(np.random.default_rng(14).standard_normal((6, 8))).requires_grad_()
    w = ag.from_numpy(np.linspace(0.5, 1.5, 8)).requires_grad_()
    with BLAS.pinned(2):
        before = _intra.launches
        assert gradcheck(lambda a, b: AF.softmax(AF.gelu(AF.layer_norm(a, (8,), b)), -1), (x, w))
        assert gradcheck(lambda a: ag.tanh(AF.gelu(a, approximate="tanh")) * ag.sigmoid(a), (x,))
        assert _intra.launches > before


def test_two_threads_calling_parallel_kernels_at_once_get_correct_results(k) -> None:
    x = _data(np.float32, 1 << 18, 15, tricky=False)
    want_out, want_cdf = np.empty_like(x), np.empty_like(x)
    k._SERIAL["gelu"](x, want_out, want_cdf)
    bad: list[int] = []

    def run() -> None:
        out, cdf = np.empty_like(x), np.empty_like(x)
        for _ in range(200):
            k._DISPATCHING["gelu"].parallel(x, out, cdf)
            if not (np.array_equal(out, want_out) and np.array_equal(cdf, want_cdf)):
                bad.append(1)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_a_child_forked_after_a_parallel_kernel_runs_one_too(k) -> None:
    script = textwrap.dedent("""
        import os, numpy as np
        from asyncgrad.ops import kernels
        from asyncgrad.ops.kernels import intra_op as _intra
        assert kernels.wait(600) and _intra.available
        k = kernels.compiled()
        x = np.linspace(-3, 3, 1 << 18).astype(np.float32)
        out, cdf = np.empty_like(x), np.empty_like(x)
        par = k._DISPATCHING["gelu"].parallel
        par(x, out, cdf)
        want = out.copy()
        pid = os.fork()
        if pid == 0:
            out[:] = 0
            par(x, out, cdf)
            os._exit(0 if np.array_equal(out, want) else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("child 0"), (r.stdout, r.stderr)


_SWITCH_SCRIPT = textwrap.dedent("""
    import numpy as np
    from asyncgrad.autograd.policy import BLAS
    from asyncgrad.ops import kernels
    from asyncgrad.ops.kernels import intra_op as _intra
    assert kernels.wait(600)
    k = kernels.compiled()
    x = np.linspace(-3, 3, 1 << 20).astype(np.float32)
    with BLAS.pinned(2):  # idle, BLAS with its threads
        k.gelu(x, np.empty_like(x), np.empty_like(x))
    print(_intra.available, _intra.enabled(), hasattr(k, "_DISPATCHING"), _intra.launches)
""")


@pytest.mark.parametrize(("setting", "want"), [
    ("0", ["False", "False", "False", "0"]),  # never compiled
    ("", ["True", "False", "True", "0"]),  # the default: compiled, off (Note [Intra-op threads])
    ("1", ["True", "True", "True", "1"]),
])
def test_the_environment_switch(k, setting: str, want: list[str]) -> None:
    env = dict(os.environ, ASYNCGRAD_INTRA_OP=setting, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", _SWITCH_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == want
