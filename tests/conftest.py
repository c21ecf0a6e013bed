import os

# BLAS threads follow other processes' load (Note [Other processes' load] in
# autograd/runtime/cpu_load.py): off in the suite, so what a test sees does not depend on what else
# the machine runs; tests/test_cpu_load.py checks it with injected samples.
os.environ.setdefault("ASYNCGRAD_ADAPT_TO_LOAD", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import asyncgrad as ag  # noqa: E402


@pytest.fixture(autouse=True)
def _float64_and_seed():
    """Every test runs in float64 with a fixed seed, and leaves the defaults as it found them."""
    prev = ag.get_default_dtype()
    ag.set_default_dtype(np.float64)
    ag.manual_seed(0)
    yield
    ag.set_default_dtype(prev)


def pytest_addoption(parser):
    parser.addoption(
        "--reference-engine", action="store_true",
        help="make the default engine the reference executor (asyncgrad/autograd/reference.py), "
             "so every backward on it runs each node through the plain sequence of steps",
    )
    parser.addoption(
        "--dynamic-engine", action="store_true",
        help="make the default engine run plain backwards through the ready queue, not as a "
             "flat schedule (Note [The flat schedule] in asyncgrad/autograd/task/schedule.py), "
             "so the suite's small graphs exercise the dynamic engine's fused step",
    )


@pytest.fixture(autouse=True)
def _reference_engine(request):
    """With ``--reference-engine``, each test starts on a ReferenceEngine; with
    ``--dynamic-engine``, on a DynamicEngine."""
    if request.config.getoption("--reference-engine"):
        from asyncgrad.autograd.tools.reference import ReferenceEngine as engine_type
    elif request.config.getoption("--dynamic-engine"):
        engine_type = DynamicEngine
    else:
        yield
        return
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(engine_type())
    yield
    ag.autograd.set_engine(prev)


class DynamicEngine(ag.autograd.Engine):
    """An Engine that runs every backward through its ready queue (no flat schedule)."""

    flat_schedule = False


@pytest.fixture
def on_path(monkeypatch):
    """``on_path("numpy" | "compiled")`` switches the kernels (compiled: skipped without
    numba; waits for them to load; elementwise ops take the compiled kernels at every
    size, not only from ``_fast.ELEMENTWISE_MIN`` elements, so small test inputs check
    them); the mode is restored after."""
    from asyncgrad.ops import kernels
    from asyncgrad.ops.kernels import compiled_path as _fast

    prev = kernels.mode()

    def switch(path):
        if path == "compiled":
            pytest.importorskip("numba")
            kernels.set_mode("auto")
            assert kernels.wait(300), kernels.status()
            monkeypatch.setattr(_fast, "ELEMENTWISE_MIN", 0)
        else:
            kernels.set_mode("numpy")

    yield switch
    kernels.set_mode(prev)


@pytest.fixture
def restore_engine():
    """Sets the process's engine back to the one before the test (for tests that call
    ``set_engine``)."""
    prev = ag.autograd.get_engine()
    yield
    ag.autograd.set_engine(prev)


@pytest.fixture
def blas_single(monkeypatch):
    """BLAS single-threaded (several backward calls in flight, or pinned at one): a
    product's gradients are split into one kernel each (Policy.splits). Other processes
    are taken to leave both cores free, so the split does not depend on the machine's
    load while the test runs (Note [Other processes' load] in runtime/cpu_load.py)."""
    import threadpoolctl

    from asyncgrad.autograd.runtime.blas import BlasThreads

    monkeypatch.setattr(BlasThreads, "per_call", property(lambda self: 1))
    monkeypatch.setattr(BlasThreads, "free_cores", property(lambda self: 2))
    # and BLAS itself at one thread, whatever the engine's hysteresis would set meanwhile:
    # tests compare products' bits across engines, and BLAS's blocking follows its threads
    monkeypatch.setattr(BlasThreads, "_adapt", lambda self: None)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture
def blas_threaded(monkeypatch):
    """BLAS as when one backward runs alone: threads of its own, so a product is not
    split into one kernel per gradient (Note [BLAS threads] in runtime/blas.py)."""
    from asyncgrad.autograd.runtime.blas import BlasThreads

    monkeypatch.setattr(BlasThreads, "per_call", property(lambda self: 2))


@pytest.fixture
def adopted(monkeypatch):
    """The ``owned`` flag of every first ``.grad`` the commit makes, in order (Note
    [Owned gradients]): True where the commit adopted the engine's fresh array as ``.grad``."""
    from asyncgrad.autograd.graph import accumulate
    from asyncgrad.autograd.task import commit

    flags: list[bool] = []
    real_take = accumulate._take

    def take(g, dtype, owned):
        flags.append(owned)
        return real_take(g, dtype, owned)

    monkeypatch.setattr(accumulate, "_take", take)  # (the in-place commit, through _accumulate)
    monkeypatch.setattr(commit, "_take", take)  # (the commit summed on a worker)
    return flags


async def cancel_while_blocked(backward, blocking, release) -> None:
    """Start ``backward`` (a coroutine) as a task, wait until a kernel of it sets
    ``blocking``, cancel the task, let the cancellation reach the driver while the kernel
    still waits, then ``release`` it: the task must end cancelled."""
    import asyncio

    task = asyncio.create_task(backward)
    while not blocking.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    for _ in range(20):  # let the cancellation reach the driver before the kernel ends
        await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
