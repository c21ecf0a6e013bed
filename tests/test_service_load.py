"""Many backward calls at once on one loop or across threads (issue 11, API.md §3): the
loop's shared scheduler, atomic commits, explicit nesting, no one-time stall on the loop.
Observed through values and the order of events, never through durations."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import warnings
import textwrap

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd import scheduler as scheduler_module
from asyncgrad.nn.functional import linear

LEAVES, SIZE = 8, 200_000  # large: the commit's sums are computed off the loop


@pytest.fixture
def engine():
    prev = ag.autograd.get_engine()
    eng = Engine(max_workers=2)
    ag.autograd.set_engine(eng)
    yield eng
    ag.autograd.set_engine(prev)


def _params() -> list[ag.Tensor]:
    return [ag.zeros(SIZE, requires_grad=True) for _ in range(LEAVES)]


def _loss(ps: list[ag.Tensor]) -> ag.Tensor:
    return sum(((p * 1.0).sum() for p in ps), ag.tensor(0.0))


def _whole(ps: list[ag.Tensor]) -> int | None:
    """The number of commits every leaf has seen, or raise if the leaves (or the elements
    of one leaf) disagree: a half-committed state."""
    seen = set()
    for p in ps:
        g = p.grad
        if g is None:
            seen.add(None)
            continue
        a = g.numpy()
        assert a.min() == a.max(), "one leaf partly committed"
        seen.add(float(a[0]))
    assert len(seen) == 1, f"leaves disagree: {sorted(map(str, seen))}"
    value = seen.pop()
    return None if value is None else int(value)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_polling_task_never_sees_a_half_committed_backward(engine, backend):
    async def main() -> list[int | None]:
        ps = _params()
        observed: list[int | None] = []
        done = anyio.Event()

        async def poll() -> None:
            while not done.is_set():
                observed.append(_whole(ps))  # one read of every leaf, no await inside
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            for _ in range(6):
                await ag.backward(_loss(ps))
            done.set()
        assert _whole(ps) == 6
        return observed

    observed = anyio.run(main, backend=backend)
    assert len(observed) > 6 and observed == sorted(observed, key=lambda v: -1 if v is None else v)


def test_optimizer_step_and_zero_grad_in_another_thread_see_whole_commits(engine):
    """Commits from a thread with its own loop while another thread steps and zeroes:
    every step sees all leaves at the same commit, and zero_grad never splits one."""
    ps = _params()
    seen: list[int | None] = []

    class Recording(ag.optim.SGD):
        def step(self, closure=None):
            seen.append(_whole(ps))
            return super().step(closure)

    opt = Recording(ps, lr=0.0)
    stop = threading.Event()

    def commits() -> None:
        async def run() -> None:
            for _ in range(12):
                await ag.backward(_loss(ps))
        try:
            asyncio.run(run())
        finally:
            stop.set()

    thread = threading.Thread(target=commits)
    thread.start()
    k = 0
    while not stop.is_set():
        with warnings.catch_warnings():  # before the first commit every .grad is None
            warnings.filterwarnings("ignore", "Recording.step", UserWarning)
            opt.step()
        k += 1
        if k % 3 == 0:
            opt.zero_grad()
    thread.join()
    assert len(seen) > 1
    _whole(ps)  # the final state is whole too


async def test_a_large_commit_adds_into_existing_grads_of_every_shape(engine):
    # The large-commit path sums into fresh arrays off the loop and publishes them: also
    # for a 0-d leaf (numpy returns a scalar there) and into .grad tensors that exist.
    big = ag.ones(SIZE, requires_grad=True)
    scalar = ag.tensor(2.0, requires_grad=True)
    big.grad, scalar.grad = ag.ones(SIZE), ag.tensor(1.0)
    grad_before = big.grad
    for _ in range(2):
        await ag.backward((big * 3.0).sum() + scalar * scalar)
    assert big.grad is grad_before  # the same Tensor object, as PyTorch keeps it
    np.testing.assert_array_equal(big.grad.numpy(), np.full(SIZE, 7.0))
    assert scalar.grad.shape == () and scalar.grad.item() == 9.0


async def test_256_concurrent_backward_calls_give_exact_sums(engine):
    rng = np.random.default_rng(0)
    w = ag.tensor(rng.integers(-3, 4, (16, 16)).astype(np.float64), requires_grad=True)
    xs = [ag.tensor(rng.integers(-2, 3, (4, 16)).astype(np.float64)) for _ in range(256)]
    expected = sum(np.ones((4, 16)).T @ x.numpy() for x in xs)
    losses = [linear(x, w).sum() for x in xs]
    async with anyio.create_task_group() as tg:
        for loss in losses:
            tg.start_soon(ag.backward, loss)
    np.testing.assert_array_equal(w.grad.numpy(), expected)
    assert engine.statistics().graph_tasks_succeeded == 256


async def _yield_by_timer() -> None:
    """Yield until a timer that is already due fires (a task woken by a timer, as
    ``asyncio.sleep(t)`` is, without depending on durations)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_at(loop.time() - 1.0, fut.set_result, None)
    await fut


@pytest.mark.parametrize("heartbeat_yield", ["sleep(0)", "timer"])
async def test_the_loop_gets_a_turn_between_two_slices_of_engine_work(engine, monkeypatch, heartbeat_yield):
    """Note [One runner per loop], Note [A turn after the timers]: with 64 backward calls
    in flight, engine work runs in slices of the loop's time, and a task gets a turn
    between any two of them, whether it yields with ``sleep(0)`` or waits on a timer
    (so the loop waits at most about one ``yield_interval`` whatever the number of
    calls). Several hand-overs of the runner role may share one slice (its end)."""
    slices: list[tuple[int, float]] = []
    original = scheduler_module.LoopScheduler._run_slice

    def counted(self, owner, threshold, deadline):
        slices.append((turns[0], self.slice_end))
        return original(self, owner, threshold, deadline)

    monkeypatch.setattr(scheduler_module.LoopScheduler, "_run_slice", counted)
    turns = [0]
    done = False
    pause = (lambda: asyncio.sleep(0)) if heartbeat_yield == "sleep(0)" else _yield_by_timer

    async def heartbeat() -> None:
        while not done:
            turns[0] += 1
            await pause()

    rng = np.random.default_rng(1)
    w = ag.tensor(rng.standard_normal((8, 8)), requires_grad=True)
    losses = []
    for _ in range(64):
        h = ag.tensor(rng.standard_normal((2, 8)))
        for _ in range(40):  # deep enough to need several slices each
            h = linear(h, w).tanh()
        losses.append(h.sum())
    beat = asyncio.ensure_future(heartbeat())
    await asyncio.gather(*(ag.backward(loss) for loss in losses))
    done = True
    await beat
    slices_per_turn: dict[int, set[float]] = {}
    for turn, slice_end in slices:
        slices_per_turn.setdefault(turn, set()).add(slice_end)
    # (2,560 nodes take several slices on any machine; how many depends on its speed)
    assert len(set(end for _, end in slices)) > 4
    assert max(len(ends) for ends in slices_per_turn.values()) == 1


class Gate(ag.autograd.Function):
    """Passes its gradient on once ``gate`` is set (an async backward)."""

    gate: anyio.Event | None = None

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    async def backward(ctx, g):
        assert Gate.gate is not None
        await Gate.gate.wait()
        return g


@pytest.mark.parametrize("spawn_from", ["hook", "async_backward", "callback"])
async def test_a_backward_spawned_in_a_task_is_independent(engine, spawn_from):
    """A task created from a hook, an async backward or a callback starts a top-level
    backward: the running backward does not wait for it, nor take it for a nested one."""
    Gate.gate = anyio.Event()
    events: list[str] = []
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    z = ag.tensor([3.0], requires_grad=True)
    spawned: list[asyncio.Task] = []
    later = Gate.apply(z * 2.0).sum()

    async def independent() -> None:
        # it starts with the grad mode its creator ran with: off in a plain backward
        events.append(f"grad mode {ag.is_grad_enabled()}")
        await ag.backward(later)
        stats = ag.autograd.current_graph_task_statistics()
        events.append(f"spawned done {stats}")

    def spawn() -> None:
        spawned.append(asyncio.ensure_future(independent()))

    class Spawner(ag.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1.0

        @staticmethod
        async def backward(ctx, g):
            spawn()
            return g

    if spawn_from == "hook":
        y = x * 3.0
        y.register_hook(lambda g: spawn())
    elif spawn_from == "async_backward":
        y = Spawner.apply(x) * 3.0
    else:
        y = x * 3.0
        y.register_hook(lambda g: ag.autograd.queue_callback(spawn))
    with anyio.fail_after(10):
        await ag.backward(y.sum())
    events.append("outer done")
    assert x.grad.tolist() == [3.0, 3.0] and z.grad is None
    Gate.gate.set()
    with anyio.fail_after(10):
        await spawned[0]
    assert events[-1] == "spawned done None" and sorted(events[:2]) == ["grad mode False", "outer done"]
    assert z.grad.tolist() == [2.0]


async def test_a_backward_in_a_node_s_own_task_is_still_nested(engine):
    depths: list[int] = []

    class Nested(ag.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1.0

        @staticmethod
        async def backward(ctx, g):
            inner = ag.tensor([1.0], requires_grad=True)

            def record(grad):
                depths.append(ag.autograd.current_graph_task_statistics().depth)

            inner.register_hook(record)
            with ag.enable_grad():  # (a backward runs its nodes with grad mode off)
                loss = (inner * 2.0).sum()
            await ag.backward(loss)
            return g

    x = ag.tensor([1.0], requires_grad=True)
    await ag.backward(Nested.apply(x).sum())
    assert depths == [1] and x.grad.tolist() == [1.0]


def test_first_backward_of_a_process_inspects_blas_off_the_loop():
    """Note [No one-time stall]: BLAS inspection (threadpoolctl) and malloc tuning run on
    a set-up thread, never on the thread running the event loop, and anyio's back end is
    imported with asyncgrad."""
    script = textwrap.dedent("""
        import asyncio, threading
        import threadpoolctl
        calls = []
        class Recorded(threadpoolctl.ThreadpoolController):
            def __init__(self, *a, **k):
                calls.append(threading.current_thread().name)
                super().__init__(*a, **k)
        threadpoolctl.ThreadpoolController = Recorded
        import sys
        import asyncgrad as ag
        from asyncgrad.autograd import policy
        # anyio's asyncio back end is imported with asyncgrad, not in the first backward
        assert "anyio._backends._asyncio" in sys.modules
        async def main():
            loop_thread = threading.current_thread().name
            w = ag.randn(64, 64, requires_grad=True)
            await ag.backward((w @ w).sum())
            await asyncio.to_thread(ag.autograd.get_engine().policy.ready.wait)
            print(loop_thread, calls)
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loop_thread, calls = out.stdout.strip().split(" ", 1)
    assert calls == "['asyncgrad-setup']", out.stdout


async def test_blas_is_single_threaded_while_several_backward_calls_run(engine):
    """Note [BLAS threads]: numpy's BLAS uses one thread per call while more than one
    backward is in flight, and its default again when one runs alone."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads() -> int:
        return max(lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                   if lib["user_api"] == "blas" and "numpy" in lib["filepath"])

    x = ag.tensor([1.0], requires_grad=True)
    await ag.backward((x * 2.0).sum())  # starts the one-time set-up
    await anyio.to_thread.run_sync(engine.policy.ready.wait)
    alone = blas_threads()
    seen: list[int] = []
    Gate.gate = anyio.Event()
    z = ag.tensor([3.0], requires_grad=True)
    blocked = Gate.apply(z * 2.0).sum()
    y = x * 3.0
    y.register_hook(lambda g: seen.append(blas_threads()))
    async with anyio.create_task_group() as tg:
        tg.start_soon(ag.backward, blocked)  # in flight until the gate opens
        await anyio.sleep(0)
        await ag.backward(y.sum())
        Gate.gate.set()
    assert seen == [1]
    assert blas_threads() == alone
