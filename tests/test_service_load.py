"""Many backward calls at once on one loop or across threads (issue 11, API.md §3): the
loop's shared scheduler, atomic commits, explicit nesting, no one-time stall on the loop.
Observed through values and the order of events, never through durations."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine
from asyncgrad.autograd.sched import loop as scheduler_module
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


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_256_concurrent_backward_calls_give_exact_sums(engine, backend):
    """Started at once: most wait in line for admission, and the runner completes most
    of them for their callers (Notes [Admission], [The runner completes small backward
    calls]); every one is committed exactly once."""
    rng = np.random.default_rng(0)
    w = ag.tensor(rng.integers(-3, 4, (16, 16)).astype(np.float64), requires_grad=True)
    xs = [ag.tensor(rng.integers(-2, 3, (4, 16)).astype(np.float64)) for _ in range(256)]
    expected = sum(np.ones((4, 16)).T @ x.numpy() for x in xs)
    losses = [linear(x, w).sum() for x in xs]

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for loss in losses:
                tg.start_soon(ag.backward, loss)

    anyio.run(main, backend=backend)
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
    calls). Several hand-overs of the runner role may share one slice: within a turn
    its end only moves earlier (Note [Wake-ups cost the loop]), never to a new slice."""
    slices: list[tuple[int, float]] = []
    original = scheduler_module.LoopScheduler._run_slice

    def counted(self, owner, deadline):
        slices.append((turns[0], self.slice_end))
        return original(self, owner, deadline)

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
    ends_per_turn: dict[int, list[float]] = {}
    for turn, slice_end in slices:
        ends_per_turn.setdefault(turn, []).append(slice_end)
    # (2,560 nodes take several slices on any machine; how many depends on its speed)
    assert len(ends_per_turn) > 4
    for ends in ends_per_turn.values():
        assert ends == sorted(ends, reverse=True)


async def test_each_woken_driver_shortens_the_slice_it_was_woken_in(engine, monkeypatch):
    """Note [Wake-ups cost the loop]: a driver the runner wakes costs the loop's next
    turn, so the slice it was woken in ends that much earlier, also when the runner
    goes on after handing over. With a wake-up charged a whole slice, no turn of the
    loop sees more than one woken caller return (and the runner's own)."""
    monkeypatch.setattr(scheduler_module, "WAKE_COST", 3600.0)
    monkeypatch.setattr(scheduler_module, "WAKE_COST_WEIGHT", 0.0)  # (the estimate stays)
    turns = [0]
    done = False

    async def heartbeat() -> None:
        while not done:
            turns[0] += 1
            await _yield_by_timer()

    w = ag.tensor(np.ones(4), requires_grad=True)
    returned_in: list[int] = []

    async def call() -> None:
        await ag.backward((w * 2.0).sum())  # a small call: the runner completes it
        returned_in.append(turns[0])

    beat = asyncio.ensure_future(heartbeat())
    await asyncio.sleep(0)
    await asyncio.gather(*(call() for _ in range(16)))
    done = True
    await beat
    assert w.grad.tolist() == [32.0] * 4
    per_turn = [returned_in.count(t) for t in set(returned_in)]
    assert max(per_turn) <= 2, returned_in


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
        from asyncgrad.autograd.runtime import blas as policy
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


async def test_blas_is_single_threaded_while_several_backward_calls_run(engine, monkeypatch):
    """Note [BLAS threads]: numpy's BLAS uses one thread per call while more than one
    backward is in flight, and its default again when one runs alone."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads() -> int:
        return max(lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                   if lib["user_api"] == "blas" and "numpy" in lib["filepath"])

    from asyncgrad.autograd.runtime.blas import BLAS, RELAX_SECONDS

    clock = _Clock(time.monotonic() + 3600.0)  # later than any overlap the process has seen
    monkeypatch.setattr(BLAS, "_overlap_at", BLAS._overlap_at)  # (restored after the clock)
    monkeypatch.setattr(BLAS, "clock", clock)
    x = ag.tensor([1.0], requires_grad=True)
    await ag.backward((x * 2.0).sum())  # starts the one-time set-up
    await anyio.to_thread.run_sync(engine.policy.ready.wait)
    await ag.backward((x * 2.0).sum())  # alone, and none overlapped in the last RELAX_SECONDS
    alone = blas_threads()
    if alone == 1:
        pytest.skip("numpy's BLAS is single-threaded here: nothing to adapt")
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
    # Note [BLAS hysteresis]: its own threads come back once no backward overlapped
    # another for RELAX_SECONDS, not before
    during: list[int] = []
    for step in (0.3, 0.3, 0.3, 0.2):  # in RELAX_SECONDS: 0.3, 0.6, 0.9, then 1.1 after the overlap
        clock.now += step * RELAX_SECONDS
        y = x * 3.0
        y.register_hook(lambda g: during.append(blas_threads()))
        await ag.backward(y.sum())
    assert during == [1, 1, 1, alone]
    assert blas_threads() == alone


async def test_a_reentrant_checkpoints_nested_backward_is_not_a_second_call_for_blas(engine, monkeypatch):
    """Note [BLAS threads]: a nested backward (a reentrant checkpoint's recomputation,
    run for its parent's node) does not make BLAS single-threaded: a training step with
    checkpoints alone keeps BLAS's own threads, inside the nested backward too."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from asyncgrad.autograd.runtime.blas import BLAS
    from asyncgrad.utils.checkpoint import checkpoint

    def blas_threads() -> int:
        return max(lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                   if lib["user_api"] == "blas" and "numpy" in lib["filepath"])

    monkeypatch.setattr(BLAS, "_overlap_at", BLAS._overlap_at)  # (restored after the clock)
    monkeypatch.setattr(BLAS, "clock", _Clock(time.monotonic() + 3600.0))  # no overlap for an hour
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    await ag.backward((x * 2.0).sum())  # starts the one-time set-up
    await anyio.to_thread.run_sync(engine.policy.ready.wait)
    await ag.backward((x * 2.0).sum())
    alone = blas_threads()
    if alone == 1:
        pytest.skip("numpy's BLAS is single-threaded here: nothing to adapt")
    inside: list[tuple[int, int]] = []

    def block(t: ag.Tensor) -> ag.Tensor:
        y = t * 3.0
        if y.requires_grad:  # (the recomputation, in the nested backward)
            y.register_hook(lambda g: inside.append((blas_threads(), BLAS.per_call)))
        return y.tanh()

    for _ in range(2):
        await ag.backward(checkpoint(block, x * 1.0, use_reentrant=True).sum())
    assert inside == [(alone, alone)] * 2
    assert blas_threads() == alone


class _Clock:
    """A clock moved by hand, for the BLAS policy's hysteresis (Note [BLAS hysteresis])."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _FakeBlas:
    """A BLAS library's threadpoolctl controller that records the counts it is set to."""

    def __init__(self) -> None:
        self.num_threads = 2
        self.calls: list[int] = []

    def set_num_threads(self, n: int) -> None:
        self.calls.append(n)
        self.num_threads = n


def test_blas_threads_do_not_flip_per_call_while_calls_alternate():
    """Note [BLAS hysteresis]: two callers whose backward calls overlap on and off (the
    count of calls in flight going 1, 2, 1, 2, ...) switch BLAS to one thread once, not
    twice per call; a lone caller gets BLAS's threads back once no call overlapped
    another for RELAX_SECONDS, and an overlap before that starts the wait again."""
    from asyncgrad.autograd.runtime.blas import RELAX_SECONDS, BlasThreads

    blas = BlasThreads(2)
    blas.clock = clock = _Clock()
    lib = _FakeBlas()
    blas._libs, blas._default = [lib], 2
    blas.backward_started()  # caller A alone, nothing ever overlapped: BLAS keeps its threads
    assert blas.per_call == 2
    for _ in range(50):  # B starts while A runs, A ends, A starts while B runs, B ends...
        clock.now += 0.01
        blas.backward_started()
        assert blas.per_call == 1
        blas.backward_ended()
        assert blas.per_call == 1
    assert lib.calls == [1]
    blas.backward_ended()  # A's call ends: the last overlap ended just before
    for _ in range(20):  # alone, but the overlap ended less than RELAX_SECONDS ago
        clock.now += 0.04 * RELAX_SECONDS
        blas.backward_started()
        assert blas.per_call == 1
        blas.backward_ended()
    blas.backward_started()  # a call, and another overlapping it: the wait starts again
    blas.backward_started()
    blas.backward_ended()
    clock.now += 0.9 * RELAX_SECONDS
    blas.backward_ended()  # the first ends 0.9 RELAX_SECONDS after the overlap...
    blas.backward_started()  # ...and a call alone starts: still single-threaded
    assert blas.per_call == 1 and lib.calls == [1]
    clock.now += 0.2 * RELAX_SECONDS  # a long call alone: its threads come back in the middle of it,
    blas.run(lambda: None)  # when a BLAS kernel of it ends (the policy looks again)
    assert blas.per_call == 2 and lib.calls == [1, 2]
    blas.backward_ended()
    blas.backward_started()
    assert blas.per_call == 2 and lib.calls == [1, 2]
    blas.backward_ended()


# --- the runner completes small backward calls for waiting callers ----------------------------
# Note [The runner completes small backward calls] (sched/loop.py). A long backward started
# first makes its driver the loop's runner for many slices; a small backward started next
# is run *and completed* by that runner while its own caller waits. Each test checks that
# premise (the completion ran in a task other than the small backward's caller).

def _long_loss() -> tuple[ag.Tensor, ag.Tensor]:
    a = ag.tensor(np.ones(4), requires_grad=True)
    h = a
    for _ in range(3000):  # thousands of inline nodes: many slices of the loop's time
        h = h / 1.0  # (a quotient's rule is no product: one by one, no fused run)
    return a, h.sum()


def _current_task() -> object:
    return anyio.get_current_task().id


async def _while_long_backward_runs(small: object) -> tuple[ag.Tensor, list[BaseException | None]]:
    """Start the long backward, then ``small()`` (an async function) once the long one's
    driver is the runner; returns the long one's leaf and what ``small`` raised."""
    a, long_loss = _long_loss()
    raised: list[BaseException | None] = []
    await ag.backward((ag.tensor([1.0], requires_grad=True) * 2.0).sum())  # (the engine's one-time set-up)

    async def run_small() -> None:
        for _ in range(1000):  # until the long backward's driver is the loop's runner
            if scheduler_module.loop_scheduler().runner is not None:
                break
            await anyio.sleep(0)
        try:
            await small()
            raised.append(None)
        except BaseException as e:  # noqa: BLE001  (the test inspects it)
            raised.append(e)
            if isinstance(e, anyio.get_cancelled_exc_class()):
                raise

    async with anyio.create_task_group() as tg:
        tg.start_soon(ag.backward, long_loss)
        tg.start_soon(run_small)
    return a, raised


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_runner_completes_a_waiting_callers_backward_with_hooks_callbacks_and_id(engine, backend):
    async def main() -> None:
        events: list[object] = []
        w = ag.tensor([1.0, 2.0], requires_grad=True)
        w.register_post_accumulate_grad_hook(lambda p: events.append(("post-acc", p.grad.tolist())))
        y = w * 3.0

        def callback() -> None:
            events.append(("callback", ag.autograd.current_graph_task_id(), _current_task(), w.grad.tolist()))

        def hook(g: ag.Tensor) -> None:
            events.append(("hook", ag.autograd.current_graph_task_id()))
            ag.autograd.queue_callback(callback)

        y.register_hook(hook)
        caller: list[object] = []

        async def small() -> None:
            caller.append(_current_task())
            await ag.backward(y.sum())
            events.append("returned")

        a, raised = await _while_long_backward_runs(small)
        assert raised == [None]
        (_, graph_task_id), post_acc, cb, returned = events
        assert cb[1] == graph_task_id and cb[2] != caller[0]  # its id; run by the runner
        assert post_acc == ("post-acc", [3.0, 3.0]) and cb[3] == [3.0, 3.0]  # after the commit
        assert returned == "returned" and w.grad.tolist() == [3.0, 3.0] and a.grad.tolist() == [1.0] * 4

    anyio.run(main, backend=backend)


async def test_a_callback_error_in_a_runner_completed_backward_reaches_its_caller(engine):
    w = ag.tensor([1.0, 2.0], requires_grad=True)
    y = w * 3.0
    ran_in: list[object] = []

    def failing() -> None:
        ran_in.append(_current_task())
        raise KeyError("from a final callback")

    y.register_hook(lambda g: ag.autograd.queue_callback(failing))
    caller: list[object] = []

    async def small() -> None:
        caller.append(_current_task())
        await ag.backward(y.sum())

    a, raised = await _while_long_backward_runs(small)
    assert ran_in != caller
    assert isinstance(raised[0], KeyError) and "from a final callback" in str(raised[0])
    assert w.grad.tolist() == [3.0, 3.0]  # final callbacks run after the commit (as in PyTorch)
    assert a.grad.tolist() == [1.0] * 4  # the runner's own backward is unaffected
    stats = engine.statistics()
    assert (stats.graph_tasks_succeeded, stats.graph_tasks_failed) == (2, 1)  # (with the warm-up)


async def test_abort_functions_of_a_runner_completed_backward_run_only_if_it_did_not_commit(engine):
    """The runner commits a waiting caller's small backward (Note [The runner completes
    small backward calls]): from that commit on the backward is never aborted, as on the
    driver's own path (Note [Abort functions]); a node error still aborts it."""
    aborted: list[str] = []
    w = ag.tensor([1.0, 2.0], requires_grad=True)

    def queue_abort(g: ag.Tensor, label: str) -> None:
        ag.autograd.queue_on_abort(lambda e: aborted.append(f"{label}: {type(e).__name__}"))

    y = w * 3.0
    y.register_hook(lambda g: queue_abort(g, "committed"))
    y.register_hook(lambda g: ag.autograd.queue_callback(lambda: (_ for _ in ()).throw(KeyError("late"))))

    async def small() -> None:
        await ag.backward(y.sum())

    _, raised = await _while_long_backward_runs(small)
    assert isinstance(raised[0], KeyError)  # a final callback failed after the commit
    assert aborted == [] and w.grad.tolist() == [3.0, 3.0]

    z = w * 2.0
    z.register_hook(lambda g: queue_abort(g, "failed"))
    z.register_hook(lambda g: 1 / 0)

    async def failing() -> None:
        await ag.backward(z.sum())

    _, raised = await _while_long_backward_runs(failing)
    assert isinstance(raised[0], ZeroDivisionError)
    assert aborted == ["failed: ZeroDivisionError"] and w.grad.tolist() == [3.0, 3.0]


async def test_an_async_callback_and_those_after_it_run_in_the_callers_own_task(engine):
    w = ag.tensor([1.0], requires_grad=True)
    y = w * 2.0
    order: list[tuple[str, object]] = []

    async def second() -> None:
        await anyio.sleep(0)
        order.append(("async", _current_task()))

    def queue_all(g: ag.Tensor) -> None:
        ag.autograd.queue_callback(lambda: order.append(("first", _current_task())))
        ag.autograd.queue_callback(second)
        ag.autograd.queue_callback(lambda: order.append(("third", _current_task())))

    y.register_hook(queue_all)
    caller: list[object] = []

    async def small() -> None:
        caller.append(_current_task())
        await ag.backward(y.sum())

    _, raised = await _while_long_backward_runs(small)
    assert raised == [None]
    assert [name for name, _ in order] == ["first", "async", "third"]
    assert order[0][1] != caller[0]  # the runner ran the first
    assert order[1][1] == order[2][1] == caller[0]  # the driver the rest
    assert w.grad.tolist() == [2.0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_cancelled_caller_whose_backward_the_runner_was_running_commits_nothing(engine, backend):
    async def main() -> None:
        w = ag.tensor([1.0, 2.0], requires_grad=True)
        scope = anyio.CancelScope()
        ran_in: list[object] = []

        def cancel_the_caller(g: ag.Tensor) -> None:  # runs in the runner, while the caller waits
            ran_in.append(_current_task())
            scope.cancel()

        y = w * 3.0
        y.register_hook(cancel_the_caller)
        caller: list[object] = []

        async def small() -> None:
            caller.append(_current_task())
            with scope:
                await ag.backward(y.sum())
            assert scope.cancelled_caught

        a, raised = await _while_long_backward_runs(small)
        assert raised == [None] and ran_in != caller
        assert w.grad is None  # nothing committed for the cancelled caller
        assert a.grad.tolist() == [1.0] * 4
        await ag.backward((w * 3.0).sum())  # saved tensors were kept: it can be run again
        assert w.grad.tolist() == [3.0, 3.0]

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_cancellation_after_the_runner_committed_arrives_at_the_callers_next_await(engine, backend):
    async def main() -> None:
        w = ag.tensor([1.0], requires_grad=True)
        scope = anyio.CancelScope()
        y = w * 3.0
        y.register_hook(lambda g: ag.autograd.queue_callback(scope.cancel))  # after the commit
        events: list[str] = []

        async def small() -> None:
            with scope:
                await ag.backward(y.sum())
                events.append("returned")
                await anyio.sleep(0)
                events.append("not reached")
            events.append(f"cancelled {scope.cancelled_caught}")

        _, raised = await _while_long_backward_runs(small)
        assert raised == [None]
        assert events == ["returned", "cancelled True"] and w.grad.tolist() == [3.0]

    anyio.run(main, backend=backend)


# --- admission (Note [Admission] in sched/admission.py) ------------------------------------------------

async def test_a_burst_of_callers_is_admitted_in_order_a_few_per_turn(monkeypatch):
    """64 callers started at once while a long backward runs start their backward in the
    order they arrived, a few per turn of the loop (one per slice of a tiny yield
    interval), and all finish with exact sums."""
    from asyncgrad.autograd import api

    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(Engine(max_workers=2, yield_interval=1e-5))
    try:
        turns = [0]
        started: list[tuple[int, int]] = []  # (caller, turn) when its backward started
        prepare = api._prepare_backward
        w = ag.tensor(np.zeros(3), requires_grad=True)
        losses = [(w * float(i)).sum() for i in range(64)]
        caller_of = {id(loss): i for i, loss in enumerate(losses)}

        def recorded(tensors, *args, **kwargs):
            started.append((caller_of.get(id(tensors), -1), turns[0]))
            return prepare(tensors, *args, **kwargs)

        monkeypatch.setattr(api, "_prepare_backward", recorded)
        done = False

        async def heartbeat() -> None:
            while not done:
                turns[0] += 1
                await asyncio.sleep(0)

        a, long_loss = _long_loss()
        await ag.backward((ag.tensor([1.0], requires_grad=True) * 2.0).sum())  # (one-time set-up)

        beat = asyncio.ensure_future(heartbeat())
        long_one = asyncio.ensure_future(ag.backward(long_loss))
        await asyncio.sleep(0)  # its driver is the runner now
        await asyncio.gather(*(ag.backward(loss) for loss in losses))
        await long_one
        done = True
        await beat
        callers = [i for i, _ in started if i >= 0]
        assert callers == list(range(64))  # first come, first served
        per_turn = np.bincount([turn for i, turn in started if i >= 0])
        assert per_turn.max() <= 4  # not all 64 first steps in one turn
        assert w.grad.tolist() == [float(sum(range(64)))] * 3 and a.grad.tolist() == [1.0] * 4
    finally:
        ag.autograd.set_engine(prev)


async def test_a_caller_cancelled_while_waiting_in_line_commits_nothing_and_blocks_no_one():
    prev = ag.autograd.get_engine()
    ag.autograd.set_engine(Engine(max_workers=2, yield_interval=1e-5))
    try:
        scheduler = scheduler_module.loop_scheduler()
        a, long_loss = _long_loss()
        await ag.backward((ag.tensor([1.0], requires_grad=True) * 2.0).sum())  # (one-time set-up)
        w = ag.tensor(np.zeros(2), requires_grad=True)
        long_one = asyncio.ensure_future(ag.backward(long_loss))
        await asyncio.sleep(0)  # its driver is the runner now
        callers = [asyncio.ensure_future(ag.backward((w * float(2 ** i)).sum())) for i in range(8)]
        await asyncio.sleep(0)
        assert len(scheduler.admission) >= 4  # (premise: they wait in line)
        callers[3].cancel()
        results = await asyncio.gather(*callers, return_exceptions=True)
        await long_one
        assert isinstance(results[3], asyncio.CancelledError)
        assert [r for i, r in enumerate(results) if i != 3] == [None] * 7
        assert w.grad.tolist() == [float(255 - 8)] * 2 and a.grad.tolist() == [1.0] * 4
        assert not scheduler.admission and scheduler.runner is None
    finally:
        ag.autograd.set_engine(prev)


# --- a finished backward leaves nothing for the garbage collector ------------------------------
# Note [A finished GraphTask is freed at once] (sched/blocking.py): the GraphTask and the graph it
# walked are freed by reference counting when the call returns, however it was completed.

def _watched_backward_graph() -> tuple[ag.Tensor, ag.Tensor, list[object]]:
    """A leaf, a loss whose graph is watched, and weak references to the loss's node and
    (filled in by a hook while the backward runs) its GraphTask."""
    import weakref

    from asyncgrad.autograd.runtime.threads import running_graph_task

    w = ag.tensor([1.0, 2.0], requires_grad=True)
    y = w * 3.0
    refs: list[object] = []
    y.register_hook(lambda g: refs.append(weakref.ref(running_graph_task())))
    loss = y.sum()
    refs.append(weakref.ref(loss.grad_fn))
    return w, loss, refs


def _alive(refs: list[object]) -> list[bool]:
    assert len(refs) == 2, "the hook did not run"
    return [r() is not None for r in refs]  # type: ignore[operator]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_finished_backward_and_its_graph_are_freed_without_the_garbage_collector(engine, backend):
    """Alone (the caller is the loop's runner), and while a long backward runs (the runner
    completes it for its waiting caller), with the cyclic collector off."""
    import gc

    async def alone() -> list[bool]:
        w, loss, refs = _watched_backward_graph()
        await ag.backward(loss)
        del loss
        assert w.grad.tolist() == [3.0, 3.0]
        return _alive(refs)

    async def completed_by_the_runner() -> list[bool]:
        w, loss, refs = _watched_backward_graph()
        by: list[object] = []
        loss.grad_fn.register_hook(lambda gi, go: by.append(_current_task()))
        held = [loss]
        del loss

        async def small() -> None:
            by.append(_current_task())
            await ag.backward(held.pop())

        await _while_long_backward_runs(small)
        assert by[0] != by[1]  # the premise: another task (the runner) ran the node
        assert w.grad.tolist() == [3.0, 3.0]
        return _alive(refs)

    gc.collect()
    gc.disable()
    try:
        assert anyio.run(alone, backend=backend) == [False, False]
        assert anyio.run(completed_by_the_runner, backend=backend) == [False, False]
    finally:
        gc.enable()


def test_a_finished_synchronous_backward_is_freed_without_the_garbage_collector():
    import gc

    gc.collect()
    gc.disable()
    try:
        w, loss, refs = _watched_backward_graph()
        loss.backward()
        del loss
        assert w.grad.tolist() == [3.0, 3.0]
        assert _alive(refs) == [False, False]
    finally:
        gc.enable()
