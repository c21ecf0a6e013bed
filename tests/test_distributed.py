"""``asyncgrad.distributed`` (API.md §9) under ``mpiexec -n 2``: each test runs one
scenario of tests/mpi_scenarios.py in a bounded subprocess and checks every rank's
result against gradients recomputed here on one process. Skipped only when mpi4py (the
``mpi`` extra) is not installed; CI installs it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason='needs the "mpi" extra: pip install "asyncgrad[mpi]"')

import asyncgrad as ag  # noqa: E402
import mpi_scenarios as sc  # noqa: E402

SCRIPT = Path(__file__).with_name("mpi_scenarios.py")
TIMEOUT = 60  # seconds for one whole mpiexec job
_cache: dict[tuple[str, str], list[dict]] = {}


def mpiexec() -> str:
    here = Path(sys.executable).with_name("mpiexec")  # the MPICH wheel installs it beside python
    found = str(here) if here.exists() else shutil.which("mpiexec")
    assert found, "mpi4py is installed but no mpiexec was found (install the mpich wheel)"
    return found


def run_job(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Run an mpiexec job in its own process group; past ``timeout`` kill the whole group
    (mpiexec and every rank), so a hung job can neither block the suite nor linger."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run(name: str, backend: str = "asyncio") -> list[dict]:
    """Both ranks' results, by rank (one job per scenario and backend)."""
    key = (name, backend)
    if key not in _cache:
        with tempfile.TemporaryDirectory() as outdir:
            cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(SCRIPT), name, backend, outdir]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
            proc = run_job(cmd, TIMEOUT, env=env)
            assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
            _cache[key] = [json.loads((Path(outdir) / f"{r}.json").read_text()) for r in (0, 1)]
    return _cache[key]


def model_from(params: dict) -> sc.Net:
    model = sc.Net()
    for n, p in model.named_parameters():
        p.data[...] = np.array(params[n])
    return model


def local_grads(params: dict, rank: int, *, step: int = 0, use_extra: bool = False) -> dict:
    """The gradients one rank's batch gives on one process, with no communication."""
    model = model_from(params)
    model.use_extra = use_extra
    x, y = sc.batch(rank, step)
    sc.loss_of(model(x), y).backward()
    return {n: None if p.grad is None else p.grad.numpy() for n, p in model.named_parameters()}


def assert_grads(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for n in want:
        if want[n] is None:
            assert got[n] is None, n
        else:
            np.testing.assert_allclose(np.array(got[n]), want[n], rtol=0, atol=1e-12, err_msg=n)


def test_averaged_gradients_equal_the_gradient_of_the_concatenated_batch():
    res = run("average")
    assert res[0]["params"] == res[1]["params"]  # rank 0's weights were broadcast (seeds differed)
    model = model_from(res[0]["params"])
    xs, ys = zip(*(sc.batch(r) for r in (0, 1)))
    sc.loss_of(model(ag.cat(xs, 0)), ag.cat(ys, 0)).backward()
    want = {n: None if p.grad is None else p.grad.numpy() for n, p in model.named_parameters()}
    assert want["never.weight"] is None and want["extra.weight"] is None
    for r in (0, 1):
        assert_grads(res[r]["grads"], want)
    # Reverse registration order, at most 100 bytes (or one parameter) per bucket: never.bias,
    # never.weight and extra.bias (72 bytes), then extra.weight, l2.bias, l2.weight, l1.bias, l1.weight.
    assert res[0]["buckets"] == res[1]["buckets"] == [3, 1, 1, 1, 1, 1]


def test_a_failed_node_or_a_cancelled_rank_commits_nothing_anywhere_and_the_next_round_works():
    res = run("failure")
    for r in (0, 1):
        assert res[r]["after1"] == res[r]["before"] and res[r]["after2"] == res[r]["before"]
    assert res[1]["round1"][:2] == ["ValueError", "injected failure"]  # its own error
    assert res[0]["round1"][0] == "RemoteBackwardError" and res[0]["round1"][2] == [1]
    assert "rank(s) 1" in res[0]["round1"][1]
    assert res[0]["round2"] == "cancelled"
    assert res[1]["round2"][0] == "RemoteBackwardError" and res[1]["round2"][2] == [0]
    params = res[0]["params"]
    g = [local_grads(params, r) for r in (0, 1)]
    want = {n: None if g[0][n] is None else 7.0 + (g[0][n] + g[1][n]) / 2 for n in g[0]}
    want = {n: (np.full(np.shape(res[0]["before"][n]), 7.0) if v is None else v) for n, v in want.items()}
    for r in (0, 1):
        assert_grads(res[r]["after3"], want)


def test_a_parameter_unused_on_one_rank_gets_the_average_with_zeros_and_one_unused_everywhere_none():
    res = run("unused")
    params = res[0]["params"]
    g0, g1 = local_grads(params, 0), local_grads(params, 1, use_extra=True)
    assert g0["extra.weight"] is None and g1["extra.weight"] is not None
    want = {}
    for n in g0:
        parts = [g[n] for g in (g0, g1) if g[n] is not None]
        want[n] = sum(parts) / 2 if parts else None
    assert want["never.weight"] is None
    for r in (0, 1):
        assert_grads(res[r]["grads"], want)
    # on rank 0 (extra unused there) the commit itself wrote extra's average: a callback
    # queued before DDP's pre-commit, and extra's post-accumulate-grad hook, both see it
    for r in (0, 1):
        np.testing.assert_allclose(res[r]["seen"]["callback"], want["extra.weight"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(res[r]["seen"]["hook"], want["extra.weight"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_failure_or_cancellation_in_the_loss_before_any_ddp_node_is_voted_and_rounds_stay_in_step(backend):
    res = run("loss_failures", backend)
    for r in (0, 1):  # nothing committed on any rank in rounds 1-3
        assert res[r]["after1"] == res[r]["after2"] == res[r]["after3"] == res[r]["before"]
    for rnd in ("round1", "round2"):  # async, then the blocking form loss.backward()
        assert res[1][rnd][:2] == ["ValueError", "injected failure"], rnd  # its own error
        assert res[0][rnd][0] == "RemoteBackwardError" and res[0][rnd][2] == [1], rnd  # not a timeout
    assert res[0]["round3"] == "cancelled"
    assert res[1]["round3"][0] == "RemoteBackwardError" and res[1]["round3"][2] == [0]
    assert res[0]["round4"] == res[1]["round4"] == "ok"
    params = res[0]["params"]
    g = [local_grads(params, r) for r in (0, 1)]
    want = {n: (np.full(np.shape(res[0]["before"][n]), 7.0) if g[0][n] is None else 7.0 + (g[0][n] + g[1][n]) / 2)
            for n in g[0]}
    for r in (0, 1):  # round 4 averaged this round's batches: the ranks were in step
        assert_grads(res[r]["after4"], want)


def test_no_sync_accumulates_locally_then_the_next_backward_averages_the_sum():
    res = run("no_sync")
    params = res[0]["params"]
    per_rank = []
    for r in (0, 1):
        steps = [local_grads(params, r, step=s) for s in (0, 1, 2)]
        local = {n: None if steps[0][n] is None else steps[0][n] + steps[1][n] for n in steps[0]}
        assert_grads(res[r]["local"], local)  # no communication inside no_sync
        per_rank.append({n: None if v is None else v + steps[2][n] for n, v in local.items()})
    want = {n: None if v is None else (v + per_rank[1][n]) / 2 for n, v in per_rank[0].items()}
    for r in (0, 1):
        assert_grads(res[r]["grads"], want)


def test_a_concurrent_request_grad_does_not_feed_the_buckets():
    res = run("concurrent_grad")
    params = res[0]["params"]
    want = {n: None if v is None else (v + local_grads(params, 1)[n]) / 2 for n, v in local_grads(params, 0).items()}
    for r in (0, 1):
        assert_grads(res[r]["grads"], want)
        request = local_grads(params, r, step=5)
        for n in list(request)[:4]:  # the request's own gradients: this rank's batch only
            np.testing.assert_allclose(res[r]["request"][n], request[n], rtol=0, atol=1e-12)
            np.testing.assert_allclose(res[r]["request"]["ddp_" + n], request[n], rtol=0, atol=1e-12)


def test_two_forwards_in_one_backward_and_the_blocking_form():
    res = run("two_forwards_and_sync")
    params = res[0]["params"]
    per_rank = []
    for r in (0, 1):
        a, b = local_grads(params, r, step=0), local_grads(params, r, step=1)
        per_rank.append({n: None if a[n] is None else a[n] + b[n] for n in a})
    two = {n: None if v is None else (v + per_rank[1][n]) / 2 for n, v in per_rank[0].items()}
    sync = {n: None if v is None else (v + local_grads(params, 1, step=2)[n]) / 2
            for n, v in local_grads(params, 0, step=2).items()}
    for r in (0, 1):
        assert_grads(res[r]["two"], two)
        assert_grads(res[r]["sync"], sync)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_ddp_on_both_backends(backend):
    res = run("average", backend)
    model = model_from(res[0]["params"])
    xs, ys = zip(*(sc.batch(r) for r in (0, 1)))
    sc.loss_of(model(ag.cat(xs, 0)), ag.cat(ys, 0)).backward()
    for r in (0, 1):
        assert_grads(res[r]["grads"], {n: None if p.grad is None else p.grad.numpy()
                                       for n, p in model.named_parameters()})


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_collectives(backend):
    res = run("collectives", backend)
    for r in (0, 1):
        d = res[r]
        assert (d["rank"], d["size"]) == (r, 2)
        assert d["sum"] == [3.0, 17.0] and d["mean"] == [1.5, 8.5]
        assert d["max"] == [2.0, 10.0] and d["min"] == [1.0, 7.0]
        assert d["broadcast"] == [1.0, 1.0] and d["bumped"] == (r == 0)
        assert d["errors"] == [
            ["ValueError", "all_reduce: unknown op 'prod'; expected one of 'sum', 'mean', 'max', 'min'"],
            ["ValueError", "broadcast: src=2 is not a rank (world size 2)"],
            ["TypeError", "all_reduce expects an asyncgrad Tensor, got list"],
            ["TypeError", "comm must be an mpi4py intracommunicator, got str"],
        ]
        assert d["cancelled"] == [5.0]


def test_a_rank_sleeping_past_the_timeout_makes_the_other_raise_distributed_timeout():
    res = run("timeout")
    r0, r1 = res
    assert r0["round1"][0] == "DistributedTimeout" and "no progress for 1 s" in r0["round1"][1]
    assert r0["waited"] >= 0.9  # not before `timeout` ...
    assert r0["raised_at"] < r1["woke_at"]  # ... and without waiting for rank 1 to wake
    assert r1["round1"][0] == "RemoteBackwardError" and r1["round1"][2] == [0]
    for d in res:
        assert all(v is None for v in d["after1"].values())  # nothing committed
    params = r0["params"]
    want = {n: None if v is None else (v + local_grads(params, 1)[n]) / 2 for n, v in local_grads(params, 0).items()}
    for d in res:
        assert_grads(d["after2"], want)  # both ranks are in step again


def test_importing_asyncgrad_does_not_import_mpi4py_and_ag_distributed_loads_on_use():
    code = ("import sys, asyncgrad as ag; assert 'mpi4py' not in sys.modules, 'mpi4py imported'\n"
            "assert issubclass(ag.distributed.RemoteBackwardError, RuntimeError)\n"
            "assert issubclass(ag.distributed.DistributedTimeout, RuntimeError)\n"
            "assert 'mpi4py.MPI' not in sys.modules, 'MPI started at import'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_mpi4py_the_import_error_names_the_extra():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "try:\n    import asyncgrad.distributed\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert 'pip install "asyncgrad[mpi]"' in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("backend", ["trio"])
def test_failure_and_cancellation_on_trio(backend):
    res = run("failure", backend)
    assert res[1]["round1"][:2] == ["ValueError", "injected failure"]
    assert res[0]["round1"][0] == "RemoteBackwardError" and res[0]["round1"][2] == [1]
    assert res[0]["round2"] == "cancelled" and res[1]["round2"][2] == [0]
    for r in (0, 1):
        assert res[r]["after1"] == res[r]["before"] == res[r]["after2"]


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"module": object()}, TypeError, "wraps an ag.nn.Module, got object"),
    ({"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb must be a positive number, got 0"),
    ({"timeout": -1.0}, ValueError, "timeout must be a positive number of seconds, got -1.0"),
])
def test_bad_arguments_are_refused_before_any_communication(kwargs, error, message):
    from asyncgrad import distributed as dist

    module = kwargs.pop("module", None) or sc.Net()
    with pytest.raises(error, match=message):
        dist.DistributedDataParallel(module, **kwargs)
    assert "mpi4py.MPI" not in sys.modules  # refused before MPI was even started


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs the examples extra")
def test_ddp_digits_example_matches_one_process():
    example = Path(__file__).resolve().parent.parent / "examples" / "ddp_digits.py"
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(example),
           "--epochs", "2", "--hidden", "32", "--reference"]
    proc = run_job(cmd, 180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for r in (0, 1):
        assert f"[rank {r}/2] epoch   2/2" in out
    finals = re.findall(r"\[(rank \d/2|one process)\] final test accuracy: ([\d.]+)%", out)
    accs = {f"[{who}]": acc for who, acc in finals}
    assert accs["[rank 0/2]"] == accs["[rank 1/2]"] == accs["[one process]"], out
    assert float(out.split("DDP vs one process: ")[1].split()[0]) < 1e-4, out


def test_bench_ddp_workload_runs_tiny():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.run import run_workload

    r = run_workload("ddp", ["asyncgrad"], rounds=1, ranks=(2,), layers=2, width=32, batch=4, timeout=120)
    assert [row["impl"] for row in r.rows] == [
        "ddp (2 ranks)", "backward then all-reduce (2 ranks)", "local backward, all ranks (2 ranks)",
        "alone, half data (2 ranks)",
        "all-reduce only (2 ranks)"]
    assert all(row["step_ms"] > 0 for row in r.rows)
    assert {"comm hidden (2 ranks)", "ddp/sequential (2 ranks)"} <= r.ratios.keys()
    assert r.targets[0].name == "loop p99 lag <= 5 ms during DDP backward (2 ranks)"
