"""The compiled kernels (``ops/kernels/numba_kernels.py``, issue 15) and how they are chosen and
loaded (``ops/kernels/loader.py``): each op's compiled path against its numpy path on the same
input, tricky values included, in float32 and float64; gradcheck through the compiled
path; the modes; and, in a fresh interpreter, that a running loop's first op does not
wait for numba. ``tests/test_kernels.py`` runs its checks on both paths as well."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import gradcheck
from asyncgrad.ops import kernels
from asyncgrad.ops.kernels import compiled_path as _fast
from asyncgrad.ops.kernels import loader

pytest.importorskip("numba")

TRICKY = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-30, -1e-30, 88.0, -88.0, 100.0, -104.0,
          3.3, -3.3, 4.0, -4.0, 10.0, -10.0]


def _input(dtype: type, shape: tuple[int, ...] = (37, 64)) -> np.ndarray:
    x = np.random.default_rng(7).standard_normal(shape) * 4
    x.reshape(-1)[: len(TRICKY)] = TRICKY
    return x.astype(dtype)


def _both(on_path: Callable[[str], None], fn: Callable[[], list[np.ndarray]]) -> tuple[list[np.ndarray], ...]:
    on_path("numpy")
    plain = fn()
    on_path("compiled")
    return plain, fn()


def _forward_backward(op: Callable[[ag.Tensor], ag.Tensor], x: np.ndarray) -> Callable[[], list[np.ndarray]]:
    def run() -> list[np.ndarray]:
        t = ag.from_numpy(x.copy()).requires_grad_()
        y = op(t)
        g = np.random.default_rng(3).standard_normal(y.shape).astype(x.dtype)
        ag.backward_sync(y, ag.from_numpy(g))
        return [y.numpy(), t.grad.numpy()]
    return run


# ops whose every row holds finite values and tricky ones (softmax rows, layer_norm rows)
ELEMENTWISE = {
    "gelu": lambda t: AF.gelu(t),
    "gelu_tanh": lambda t: AF.gelu(t, approximate="tanh"),
    "sigmoid": lambda t: ag.sigmoid(t),
    "tanh": lambda t: ag.tanh(t),
}
ROWS = {
    "softmax": lambda t: AF.softmax(t, -1),
    "log_softmax": lambda t: AF.log_softmax(t, -1),
    "layer_norm": lambda t: AF.layer_norm(t, t.shape[-1:], ag.ones(t.shape[-1:], dtype=t.dtype) * 1.5,
                                          ag.zeros(t.shape[-1:], dtype=t.dtype) + 0.25),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_compiled_equals_numpy_path_on_tricky_values(on_path, name: str, dtype: type) -> None:
    x = _input(dtype)
    with np.errstate(all="ignore"):
        plain, fast = _both(on_path, _forward_backward(ELEMENTWISE[name], x))
    for p, f in zip(plain, fast):
        assert f.dtype == np.dtype(dtype)  # float32 never upcast
        np.testing.assert_array_equal(np.isnan(f), np.isnan(p))
        # atol: where the tanh form's 1 + tanh(u) cancels (x << 0), numpy's path rounds it,
        # the compiled sigmoid(2u) does not (float32: up to 4e-6, float64: 5e-15)
        tol = {"rtol": 3e-6, "atol": 5e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
        np.testing.assert_allclose(f, p, equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_compiled_is_numpys_maximum_bit_for_bit(on_path, dtype: type) -> None:
    """The compiled ReLU forward gives numpy's ``maximum(x, 0)`` exactly: NaN passes
    (payload too), -0 and negatives give +0, infinities and tiny values as they are."""
    x = _input(dtype, (64, 128))
    ints = np.int32 if dtype == np.float32 else np.int64
    x.reshape(-1)[len(TRICKY)] = np.array(-1, ints).view(dtype)  # a NaN with a payload and its sign set
    on_path("compiled")
    fast = _fast.relu(x)
    assert fast is not None and fast.dtype == np.dtype(dtype)  # (the compiled path was taken)
    np.testing.assert_array_equal(fast.view(ints), np.maximum(x, 0).view(ints))
    y = ag.from_numpy(x.copy()).relu().numpy()
    np.testing.assert_array_equal(y.view(ints), np.maximum(x, 0).view(ints))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_compiled_keeps_signed_zero_infinities_and_nan(on_path, dtype: type) -> None:
    x = np.array([0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30], dtype=dtype)
    on_path("compiled")
    y = AF.gelu(ag.from_numpy(x)).numpy()
    assert y[0] == 0 and not np.signbit(y[0]) and np.signbit(y[1])  # gelu(-0) = -0, as PyTorch
    assert y[2] == math.inf and math.isnan(y[3]) and math.isnan(y[4])  # -inf * Phi(-inf) = NaN
    assert y[5] == np.asarray(1e30, dtype) and y[6] == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(ROWS))
def test_row_ops_compiled_equal_numpy_path(on_path, name: str, dtype: type) -> None:
    x = (np.random.default_rng(1).standard_normal((3, 5, 96)) * 6).astype(dtype)
    x[0, 0, :] = 0.0  # a constant row (layer_norm: rstd = 1/sqrt(eps))
    x[0, 1, 3] = 80.0  # one dominant logit
    x[0, 2, :] = -1e4  # a row far from 0
    plain, fast = _both(on_path, _forward_backward(ROWS[name], x))
    tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    for p, f in zip(plain, fast):
        assert f.dtype == np.dtype(dtype)
        np.testing.assert_allclose(f, p, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_compiled_masks_exactly_and_all_masked_rows_are_nan(on_path, dtype: type) -> None:
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(dtype)
    x[np.triu_indices(8, 1)[0][:10] % 4, np.triu_indices(8, 1)[1][:10]] = -math.inf
    x[3, :] = -math.inf
    on_path("compiled")
    with np.errstate(invalid="ignore"):
        p = AF.softmax(ag.from_numpy(x), -1).numpy()
        logp = AF.log_softmax(ag.from_numpy(x), -1).numpy()
    masked = np.isneginf(x[:3])
    assert np.all(p[:3][masked] == 0) and np.all(np.isneginf(logp[:3][masked]))
    np.testing.assert_allclose(p[:3].sum(-1), 1, rtol=1e-6)
    assert np.all(np.isnan(p[3])) and np.all(np.isnan(logp[3]))  # as PyTorch: -inf - -inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ops_compiled_match_torch(on_path, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x = (np.random.default_rng(4).standard_normal((64, 128)) * 3).astype(dtype)
    pairs = [(ELEMENTWISE["gelu"], tf.gelu), (ELEMENTWISE["gelu_tanh"], lambda t: tf.gelu(t, approximate="tanh")),
             (ELEMENTWISE["sigmoid"], torch.sigmoid), (ROWS["softmax"], lambda t: tf.softmax(t, -1)),
             (ROWS["log_softmax"], lambda t: tf.log_softmax(t, -1)),
             (lambda t: AF.layer_norm(t, (128,)), lambda t: tf.layer_norm(t, (128,)))]
    on_path("compiled")
    tol = {"rtol": 1e-5, "atol": 5e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    for ours, theirs in pairs:
        y, gx = _forward_backward(ours, x)()
        tx = torch.from_numpy(x.copy()).requires_grad_()
        ty = theirs(tx)
        ty.backward(torch.from_numpy(np.random.default_rng(3).standard_normal(y.shape).astype(dtype)))
        np.testing.assert_allclose(y, ty.detach().numpy(), **tol)
        np.testing.assert_allclose(gx, tx.grad.numpy(), **tol)


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu", "gelu_tanh", "softmax", "log_softmax", "layer_norm",
                                  "cross_entropy", "embedding"])
def test_gradcheck_in_float64_through_the_compiled_path(on_path, name: str) -> None:
    on_path("compiled")
    x = ag.tensor(np.random.default_rng(5).standard_normal((3, 6)), requires_grad=True)
    if name == "cross_entropy":
        assert gradcheck(lambda a: AF.cross_entropy(a, np.array([0, 5, -100])), (x,))
        assert gradcheck(lambda a: AF.cross_entropy(a, np.array([1, 2, 3]), reduction="none"), (x,))
    elif name == "embedding":
        assert gradcheck(lambda w: AF.embedding(np.array([[0, 2], [2, -1]]) % 3, w), (x,))
    else:
        assert gradcheck({**ELEMENTWISE, **ROWS}[name], (x,))


def test_embedding_backward_compiled_sums_repeated_and_negative_rows(on_path) -> None:
    w = np.random.default_rng(6).standard_normal((5, 3)).astype(np.float32)
    idx = np.array([4, -1, 0, 4, -5, 2])
    g = np.random.default_rng(7).standard_normal((6, 3)).astype(np.float32)
    on_path("compiled")
    t = ag.from_numpy(w.copy()).requires_grad_()
    ag.backward_sync(t[idx], ag.from_numpy(g))
    want = np.zeros_like(w)
    np.add.at(want, idx, g)
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-6)
    out = np.zeros((5, 3), dtype=np.float32)
    assert not _fast.add_rows(out, np.array([0, 5]), g[:2])  # out of range: left to numpy's IndexError
    assert not out.any()


def test_set_mode_rejects_unknown_modes_and_changes_nothing() -> None:
    before = kernels.mode()
    with pytest.raises(ValueError, match=r"set_mode's mode must be one of auto, numpy, compiled; got 'fast'"):
        kernels.set_mode("fast")
    assert kernels.mode() == before


def test_numpy_mode_reports_itself_and_never_uses_compiled_kernels(on_path) -> None:
    on_path("numpy")
    assert not kernels.ready() and kernels.compiled() is None and not kernels.wait()
    assert kernels.status() == "ASYNCGRAD_KERNELS=numpy: numpy kernels"


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != kernels.ENV_VAR} | env
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environ, timeout=300)


def test_a_bad_environment_variable_is_named_in_the_error() -> None:
    res = _python("""
        import asyncgrad as ag
        from asyncgrad.ops import kernels
        kernels.mode()
    """, ASYNCGRAD_KERNELS="fastest")
    assert res.returncode != 0
    assert "ValueError: ASYNCGRAD_KERNELS must be one of auto, numpy, compiled; got 'fastest'" in res.stderr


def test_environment_numpy_never_imports_numba() -> None:
    res = _python("""
        import sys
        import numpy as np
        import asyncgrad as ag
        import asyncgrad.nn.functional as AF
        from asyncgrad.ops import kernels
        x = ag.from_numpy(np.linspace(-3, 3, 12, dtype=np.float32)).requires_grad_()
        ag.backward_sync(AF.softmax(AF.gelu(x), 0).sum())
        print(kernels.wait(), "numba" in sys.modules, kernels.status())
    """, ASYNCGRAD_KERNELS="numpy")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False", "ASYNCGRAD_KERNELS=numpy:", "numpy", "kernels"]


def test_without_numba_the_ops_run_numpy_and_compiled_mode_names_the_extra() -> None:
    """numba is an optional extra: without it ``auto`` runs the numpy kernels and says
    why, and ``compiled`` fails in ``wait()`` naming the extra to install."""
    code = """
        import sys
        sys.modules["numba"] = None  # as if not installed: importing it raises ModuleNotFoundError
        import numpy as np
        import asyncgrad as ag
        import asyncgrad.nn.functional as AF
        from asyncgrad.ops import kernels
        x = ag.from_numpy(np.linspace(-3, 3, 12, dtype=np.float32)).requires_grad_()
        ag.backward_sync(AF.gelu(x).sum())
        print(round(float(x.grad.numpy()[-1]), 4))
        try:
            print(kernels.wait(60))
        finally:
            print(kernels.status())
    """
    auto = _python(code, ASYNCGRAD_KERNELS="auto")
    assert auto.returncode == 0, auto.stderr
    grad, ready, status = auto.stdout.strip().splitlines()
    assert grad == "1.0119" and ready == "False"  # GELU'(3) on the numpy path
    assert 'numba is not installed; install the "fast" extra: pip install "asyncgrad[fast]"' in status
    strict = _python(code, ASYNCGRAD_KERNELS="compiled")
    assert strict.returncode != 0
    assert ('RuntimeError: ASYNCGRAD_KERNELS=compiled, but the compiled kernels failed to load: numba is not '
            'installed; install the "fast" extra') in strict.stderr


def test_first_gelu_on_a_running_loop_does_not_wait_for_the_compiled_kernels() -> None:
    """A fresh interpreter: the loader is held at a gate, so numba cannot be ready; the
    loop's first GELU (forward and backward) must complete on the numpy path all the same,
    and after the gate opens and the loader finishes, the next one runs compiled."""
    res = _python("""
        import asyncio, sys, threading
        import numpy as np
        import asyncgrad as ag
        import asyncgrad.nn.functional as AF
        from asyncgrad.ops.kernels import loader as kernels

        events = []
        gate = threading.Event()
        load = kernels._load
        def gated_load():
            events.append("loader started")
            gate.wait()
            load()
            events.append("loader done")
        kernels._load = gated_load
        events.append(f"numba imported by asyncgrad: {'numba' in sys.modules}")

        async def main():
            x = ag.from_numpy(np.linspace(-3, 3, 1000, dtype=np.float32)).requires_grad_()
            y = AF.gelu(x)
            await ag.backward(y.sum())
            events.append(f"first gelu done, ready={kernels.ready()}")
            first = x.grad.numpy().copy()
            gate.set()
            await asyncio.get_running_loop().run_in_executor(None, kernels.wait)
            x.grad = None
            await ag.backward(AF.gelu(x).sum())
            events.append(f"second gelu done, ready={kernels.ready()}")
            np.testing.assert_allclose(x.grad.numpy(), first, rtol=1e-5, atol=1e-6)

        asyncio.run(main())
        print("|".join(events))
    """)
    assert res.returncode == 0, res.stderr
    events = res.stdout.strip().split("|")
    # the loader thread starts without the loop waiting for it (Note [Starting the loader
    # does not wait]), so whether it ran before the first GELU finished is the OS's choice
    assert events[0] == "numba imported by asyncgrad: False"
    assert sorted(events[1:3]) == ["first gelu done, ready=False", "loader started"]
    assert events[3:] == ["loader done", "second gelu done, ready=True"]


def test_the_loader_runs_with_the_collector_off_and_a_short_switch_interval_then_restores_both() -> None:
    """Note [The loader yields the loop its turns]: while the loader imports numba, the
    cyclic collector is off (its full collections of numba's new objects held the GIL
    ~45 ms each) and the GIL switch interval is 0.5 ms; afterwards both are as they were,
    nothing is left frozen, and a cycle that became garbage during the load is collected
    by the next collection."""
    res = _python("""
        import gc, sys, threading, weakref
        from asyncgrad.ops.kernels import loader as kernels

        seen = {}
        load = kernels._import_kernels
        def observed_load():
            seen["during"] = (gc.isenabled(), sys.getswitchinterval())
            class Cycle:
                pass
            c = Cycle()
            c.me = c
            seen["cycle"] = weakref.ref(c)
            load()
        kernels._import_kernels = observed_load
        sys.setswitchinterval(0.004)
        print(kernels.wait(300))
        print(seen["during"], (gc.isenabled(), sys.getswitchinterval()), gc.get_freeze_count())
        gc.collect()
        print(seen["cycle"]() is None)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:3] == ["True", "(False, 0.0005) (True, 0.004) 0", "True"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_loader_runs_at_nice_19_and_threads_it_starts_get_their_priority_back() -> None:
    """Note [The loader runs at low CPU priority]: the loader thread runs at nice 19, the
    loop's thread keeps its priority, and a thread started during the load (inheriting
    19) gets the old value back afterwards where the process may raise priorities (root),
    else keeps 19; the kernels load all the same."""
    res = _python("""
        import os, threading
        from asyncgrad.ops.kernels import loader as kernels

        seen = {}
        started = threading.Event()
        stop = threading.Event()
        def helper():
            seen["helper"] = threading.get_native_id()
            seen["helper during"] = os.getpriority(os.PRIO_PROCESS, seen["helper"])
            started.set()
            stop.wait()
        load = kernels._import_kernels
        def observed_load():
            seen["loader"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            seen["main"] = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id)
            threading.Thread(target=helper, daemon=True).start()
            started.wait()
            load()
        kernels._import_kernels = observed_load
        print(kernels.wait(300))
        print(seen["loader"], seen["main"], seen["helper during"],
              os.getpriority(os.PRIO_PROCESS, seen["helper"]), os.getpriority(os.PRIO_PROCESS, 0))
        stop.set()
    """)
    assert res.returncode == 0, res.stderr
    ready, nices = res.stdout.split("\n")[:2]
    assert ready == "True"
    before = os.getpriority(os.PRIO_PROCESS, 0)  # the child inherits the test process's nice
    after = before if os.geteuid() == 0 else max(before, loader.LOADER_NICE)
    assert nices.split() == [str(max(before, loader.LOADER_NICE)), str(before),
                             str(max(before, loader.LOADER_NICE)), str(after), str(before)]


@pytest.mark.parametrize("name", [*ELEMENTWISE, *ROWS])
def test_read_only_inputs_and_gradients_take_the_compiled_path(on_path, name):
    """A read-only array (a broadcast gradient, a frozen user array) is not a type the
    kernels were compiled for: the compiled path copies it and gives the numpy path's
    results, instead of failing inside numba."""
    op = {**ELEMENTWISE, **ROWS}[name]
    x = np.random.default_rng(5).standard_normal((16, 32)).astype(np.float32)
    x.setflags(write=False)
    g = np.broadcast_to(np.float32(0.5), (16, 32))  # read-only, as a sum's backward gives

    def run() -> list[np.ndarray]:
        t = ag.tensor(x, requires_grad=True)
        src = ag.from_numpy(x)
        y = op(src)  # a read-only input in the forward
        ag.backward_sync(op(t), ag.from_numpy(g))  # a read-only gradient in the backward
        return [y.numpy(), t.grad.numpy()]

    plain, fast = _both(on_path, run)
    for a, b in zip(plain, fast):
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=2e-6)


def test_small_elementwise_ops_keep_their_numpy_kernels_by_default() -> None:
    """Below ``ELEMENTWISE_MIN`` elements a compiled call costs more than the ufunc it
    replaces (graphs of many tiny nodes pay it per node), so the compiled path declines
    and the numpy kernel runs; from that size on it applies."""
    kernels.set_mode("auto")
    assert kernels.wait(300), kernels.status()
    small = np.linspace(-2, 2, _fast.ELEMENTWISE_MIN - 1, dtype=np.float32)
    large = np.linspace(-2, 2, _fast.ELEMENTWISE_MIN, dtype=np.float32)
    assert _fast.sigmoid(small) is None and _fast.tanh_backward(small, small) is None
    np.testing.assert_allclose(_fast.sigmoid(large), 1 / (1 + np.exp(-large)), rtol=2e-6)
    np.testing.assert_allclose(_fast.tanh_backward(large, large), large * (1 - large * large), rtol=2e-6, atol=1e-6)
    assert _fast.softmax(small.reshape(1, -1), -1) is not None  # row ops: compiled at every size


def test_starting_the_loader_does_not_wait_for_its_thread_to_run() -> None:
    """Note [Starting the loader does not wait]: the first op's thread (the event loop's)
    starts the loader without ``threading.Thread.start``, which would wait for the OS to
    schedule the new thread; the loader still runs, named, and loads the kernels."""
    res = _python("""
        import threading
        from asyncgrad.ops.kernels import loader

        real_start = threading.Thread.start
        def start(self):
            if threading.current_thread() is threading.main_thread():
                raise AssertionError("the first op waited for a thread to start")
            real_start(self)
        threading.Thread.start = start
        seen = []
        load = loader._load
        def observed_load():
            seen.append(threading.current_thread().name)
            load()
        loader._load = observed_load
        loader.start()
        print(loader.wait(300), seen)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[0] == "True ['asyncgrad-kernels-loader']"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/self/maps")
def test_the_loader_opens_llvms_library_before_numba_imports_it() -> None:
    """Note [LLVM's library loads without the GIL]: the loader opens llvmlite's LLVM with a
    foreign ``dlopen`` (the GIL released) before the import, without importing llvmlite's
    bindings; llvmlite's own ``ctypes.CDLL`` of it (which holds the GIL) then finds the
    library loaded, and the kernels load."""
    res = _python("""
        import ctypes, sys
        from asyncgrad.ops.kernels import loader

        def mapped():
            with open("/proc/self/maps") as maps:
                return any("libllvmlite" in line for line in maps)

        print(mapped())
        loader._preload_llvm()
        print(mapped(), "llvmlite.binding" in sys.modules)
        seen = []
        real = ctypes.CDLL.__init__
        def init(self, name, *args, **kwargs):
            if name is not None and "libllvmlite" in str(name):
                seen.append(mapped())
            real(self, name, *args, **kwargs)
        ctypes.CDLL.__init__ = init
        print(loader.wait(300), seen)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:3] == ["False", "True False", "True [True]"]
