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
