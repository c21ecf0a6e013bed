"""The benchmark runner imports and runs one tiny workload (asyncgrad and the numpy floor
only, no timing assertions: timing belongs to ``python -m bench``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.run import run_workload  # noqa: E402


def test_chain_workload_runs_tiny():
    r = run_workload("chain", ["asyncgrad", "numpy"], rounds=2, n=40, size=4)
    assert [row["impl"] for row in r.rows] == ["asyncgrad", "numpy"]
    assert all(row["backward_us_per_node"] > 0 for row in r.rows)
    assert "asyncgrad/numpy backward" in r.ratios


def test_ops_workload_runs_tiny():
    r = run_workload("ops", ["asyncgrad"], rounds=1, sizes=("small",), only=("exp", "layer_norm"))
    assert [row["impl"] for row in r.rows] == ["layer_norm", "exp"]
    assert all(row["ag_fwd_ms"] > 0 and row["ag_bwd_ms"] > 0 and row["ag_bwd_inline_ms"] > 0 for row in r.rows)
    assert all(row["torch_fwd_ms"] is None and row["fwd_ratio"] is None for row in r.rows)


def test_transformer_workload_runs_tiny():
    r = run_workload("transformer", ["asyncgrad"], rounds=1, layers=1, heads=2, dims=16, block=8, batch=2)
    assert [row["impl"] for row in r.rows] == ["asyncgrad manual", "asyncgrad sdpa", "asyncgrad manual (1 thread)",
                                               "asyncgrad sdpa (1 thread)"]
    for row in r.rows:
        assert row["step_ms"] > 0
        assert 3.0 < row["loss"] < 6.0  # cross-entropy over 65 characters starts near log(65) = 4.17


def test_contended_workload_runs_tiny_beside_a_busy_process_it_ends():
    from bench.workloads.contended import busy_process

    with busy_process() as proc:
        assert proc.poll() is None  # spinning while the block runs
    assert proc.poll() is not None  # and gone after it
    r = run_workload("contended", ["asyncgrad", "numpy"], rounds=1, tasks=2, layers=1, heads=2, dims=16, block=8,
                     batch=2)
    assert [row["impl"] for row in r.rows] == ["asyncgrad (awaited): concurrent"] + [
        f"asyncgrad (awaited): many_tasks N={n}" for n in (1, 8, 64, 256)] + ["asyncgrad: transformer step"]
    assert [row["tasks"] for row in r.rows] == [2, 1, 8, 64, 256, 1]
    assert all(row["passes_per_s"] > 0 for row in r.rows)
    assert r.targets == []  # no peer measured: nothing to compare


def test_bench_blas_threads_give_asyncgrad_its_engines_choice_after_a_one_thread_section():
    """The runner restores, before each asyncgrad measurement, the BLAS thread count
    asyncgrad's engine last chose, not the count BLAS had when asyncgrad's previous rounds
    ended: after a one-thread section (the ops workload's), asyncgrad's default-thread
    rows (the transformer's) ran on one BLAS thread while its engine believed it had all."""
    import pytest

    from asyncgrad.autograd.runtime.blas import BLAS as ENGINE_BLAS
    from bench.common import BlasThreads

    blas = BlasThreads()
    blas.snapshot()
    if blas.default is None:
        pytest.skip("threadpoolctl finds no BLAS")
    try:
        with blas.limited(1):
            for impl in ("asyncgrad", "torch"):
                blas.enter(impl)
                assert blas.get() == 1
                blas.leave(impl)
        chosen = ENGINE_BLAS.chosen
        assert chosen is not None  # limited() had the engine inspect BLAS first
        blas.enter("torch")
        assert blas.get() == blas.default
        blas.leave("torch")
        blas.enter("asyncgrad")
        assert blas.get() == chosen
        blas.leave("asyncgrad")
        assert blas.engine == chosen
    finally:
        blas.set(blas.default)


ONE_THREAD_SECTION = """
import asyncio, sys
import asyncgrad as ag
from asyncgrad.autograd.runtime import blas as policy
from bench.common import BlasThreads

blas = BlasThreads()
blas.snapshot()
if blas.default is None or blas.default < 2:
    print("no BLAS with two or more threads")
    sys.exit(0)
x = ag.ones(3, requires_grad=True)

async def two() -> None:
    await asyncio.gather(ag.backward((x * 2).sum()), ag.backward((x * 3).sum()))

now = [1e9]  # the engine's clock, moved by hand (Note [BLAS hysteresis])
policy.BLAS.clock = lambda: now[0]
policy.BLAS.configure()
asyncio.run(two())
assert policy.BLAS.chosen == 1  # two in flight: single-threaded
with blas.limited(1):
    now[0] += 2 * policy.RELAX_SECONDS  # long enough alone to get BLAS's threads back...
    for _ in range(3):
        ag.backward_sync((x * 2).sum())
        assert blas.get() == 1 and policy.BLAS.per_call == 1  # ...but pinned
ag.backward_sync((x * 2).sum())
assert policy.BLAS.chosen == blas.default  # adapting again: its own threads back
blas.enter("asyncgrad")
assert blas.get() == blas.default
print("ok")
"""


def test_bench_one_thread_section_pins_the_engine_so_it_cannot_give_blas_its_threads_back():
    """After concurrent backward calls the engine is single-threaded and gives BLAS its
    threads back once none overlapped for a while (Note [BLAS hysteresis]); inside the bench's
    one-thread section it must not, and after the section the adaptive state resumes.
    In a fresh interpreter, where BLAS starts with its own threads (in this process an
    earlier test's concurrent backward calls may have left it at one)."""
    import os
    import subprocess

    import pytest

    import asyncgrad

    root = Path(__file__).resolve().parents[1]
    src = Path(asyncgrad.__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(root), str(src), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", ONE_THREAD_SECTION], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, cwd=root, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.strip() == "no BLAS with two or more threads":
        pytest.skip(proc.stdout.strip())
    assert proc.stdout.strip() == "ok"


def test_loader_lag_runs_tiny(capsys):
    """``python -m bench.loader_lag``: fresh processes per variant, a table row each."""
    from bench import loader_lag

    loader_lag.main(["--procs", "1", "--steps", "3", "--variant", "numpy:ASYNCGRAD_KERNELS=numpy"])
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].startswith("# load ") and rows[1].startswith("variant")
    assert rows[2].split()[0] == "numpy" and len(rows) == 3


def test_blas_spin_runs_tiny(capsys):
    """``python -m bench.blas_spin``: the four combinations of BLAS setting and way, with
    the loop's thread's CPU time; and the checkpointed step with the threads chosen."""
    import asyncio

    import pytest

    if not Path("/proc/self/task").exists():
        pytest.skip("per-thread CPU times need Linux's /proc")
    from bench import blas_spin

    asyncio.run(blas_spin.rounds(tasks=2, hidden=8, batch=4, repeats=2))
    rows = [r.split("|")[1:-1] for r in capsys.readouterr().out.splitlines() if r.startswith("| ")][1:]
    assert sorted((r[0].strip(), r[1].strip()) for r in rows) == [
        ("adaptive", "one by one"), ("adaptive", "together"), ("pinned", "one by one"), ("pinned", "together")]
    assert all(float(r[3]) > 0 for r in rows)  # the loop's thread ran every round
    asyncio.run(blas_spin.checkpointed(2, width=8, batch=4))
    assert "BLAS threads per call during backward: [" in capsys.readouterr().out


def test_concurrent_workloads_turn_batcher_gives_each_pass_its_gradient_sum_and_its_errors():
    """The "requests batched" rows: the passes submitted in one turn run as one pass whose
    parameter gradients equal the passes' own, summed; a failing batch pass raises in
    every pass that joined it."""
    import asyncio

    import numpy as np
    import pytest

    import asyncgrad as ag
    from bench import nets
    from bench.workloads.concurrent import TurnBatcher

    params = [p.astype(np.float64) for p in nets.make_params(2, 8)]
    xs = [nets.make_input(4, 8, seed=s).astype(np.float64) for s in range(3)]
    one_by_one, batched = nets.ag_params(params), nets.ag_params(params)
    sizes: list[int] = []

    async def run_batch(batch: list[np.ndarray]) -> None:
        sizes.append(len(batch))
        await ag.backward(nets.ag_graph(batched, np.concatenate(batch)) * len(batch))

    async def main() -> None:
        for x in xs:
            await ag.backward(nets.ag_graph(one_by_one, x))
        batcher = TurnBatcher(run_batch)
        await asyncio.gather(*(batcher.submit(x) for x in xs))

        async def fail(batch: list[np.ndarray]) -> None:
            raise ValueError(f"batch of {len(batch)}")

        failing = TurnBatcher(fail)
        results = await asyncio.gather(*(failing.submit(x) for x in xs), return_exceptions=True)
        assert [str(r) for r in results] == ["batch of 3"] * 3

    asyncio.run(main())
    assert sizes == [3]  # one pass for the three
    for a, b in zip(one_by_one, batched):
        np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=1e-12, atol=1e-14)
    with pytest.raises(AssertionError):  # (the check can fail: a pass's gradient alone differs)
        np.testing.assert_allclose(batched[0].grad.numpy() / 3, one_by_one[0].grad.numpy(), rtol=1e-6)


def test_concurrent_workload_runs_tiny_with_the_batched_rows():
    r = run_workload("concurrent", ["asyncgrad", "numpy"], rounds=1, tasks=3, passes=2, layers=1, batch=2, width=4)
    assert [row["impl"] for row in r.rows] == ["asyncgrad (awaited)", "asyncgrad (requests batched)",
                                               "numpy inline", "numpy to_thread"]
    assert all(row["passes_per_s"] > 0 for row in r.rows)


def test_lag_trace_runs_tiny(capsys):
    """``python -m bench.lag_trace``: a session's worst ticks, the loop's CPU per tick
    window, and the stack watcher (which restores the switch interval it lowers)."""
    from bench import lag_trace

    interval = sys.getswitchinterval()
    lag_trace.main(["--width", "16", "--batch", "4", "--backwards", "2", "--sessions", "1", "--show", "2",
                    "--stacks", "1"])
    out = capsys.readouterr().out
    assert "callbacks' CPU per tick window: p99" in out and out.splitlines()[-1].startswith("median: p99")
    assert sys.getswitchinterval() == interval and lag_trace.STACKS_AFTER == 0.0
