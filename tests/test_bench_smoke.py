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
    assert [row["impl"] for row in r.rows] == ["asyncgrad", "asyncgrad (1 thread)"]
    for row in r.rows:
        assert row["step_ms"] > 0
        assert 3.0 < row["loss"] < 6.0  # cross-entropy over 65 characters starts near log(65) = 4.17


def test_contended_workload_runs_tiny_beside_a_busy_process_it_ends():
    from bench.workloads.contended import busy_process

    with busy_process() as proc:
        assert proc.poll() is None  # spinning while the block runs
    assert proc.poll() is not None  # and gone after it
    r = run_workload("contended", ["asyncgrad", "numpy"], rounds=1, tasks=2)
    assert [row["impl"] for row in r.rows] == ["concurrent: asyncgrad (awaited)"] + [
        f"many_tasks: asyncgrad (awaited) N={n}" for n in (1, 8, 64, 256)]
    assert all(row["passes_per_s"] > 0 for row in r.rows)
    assert r.targets == []  # no peer measured: nothing to compare
