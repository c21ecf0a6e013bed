"""The bench's serving workload: it runs (tiny), its rows are the ways it names, and its
hand-written numpy floor computes the same loss, saliency and parameter gradients as
one backward per request."""

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import run_workload  # noqa: E402
from bench.workloads import serving as workload  # noqa: E402


def test_the_serving_workload_runs_tiny():
    r = run_workload("serving", ["asyncgrad", "numpy"], rounds=1, clients=3, requests=2, layers=2, rows=2, width=4,
                     memory=False)
    assert [row["impl"] for row in r.rows] == [
        "asyncgrad: one await ag.grad per request", "asyncgrad: GradientBatcher",
        "asyncgrad: GradientBatcher, per-request param grads", "numpy per request (on the loop)",
        "numpy per request (on the loop, 1 BLAS thread)"]
    for row in r.rows:
        assert row["requests_per_s"] > 0 and row["p99_latency_ms"] >= row["p50_latency_ms"] > 0
        assert row["peak_rss_mb"] > 0 and "rss_growth_mb" not in row  # (memory=False: no fresh processes)
    assert r.row("asyncgrad: GradientBatcher")["batch_ms"] > 0
    assert "batcher/one ag.grad per request" in r.ratios and "batcher/numpy per request (the faster floor)" in r.ratios


def test_a_ways_memory_is_measured_in_a_fresh_process():
    growth = workload.measure_memory("asyncgrad: GradientBatcher", clients=3, requests=2, layers=2, rows=2, width=4)
    assert math.isfinite(growth) and growth > -1.0  # MB: the session's peak over the RSS before it
    assert math.isnan(workload.measure_memory("no such way", clients=1, requests=1, layers=1, rows=1, width=2))


def test_the_numpy_floor_equals_one_backward_per_request():
    import asyncgrad as ag
    from asyncgrad.nn import functional as F

    from bench import nets

    params = workload._head(nets.make_params(2, 6), 6)
    x = nets.make_input(5, 6, seed=3)
    y = workload._labels(5, seed=4)
    loss, saliency, grads = workload.numpy_request(params, x, y)
    ps = [ag.from_numpy(p.copy()).requires_grad_() for p in params]
    xt = ag.from_numpy(x.copy()).requires_grad_()
    h = xt
    for i in range(len(ps) // 2):
        h = F.linear(h, ps[2 * i], ps[2 * i + 1])
        if i < len(ps) // 2 - 1:
            h = h.relu()
    expected = F.cross_entropy(h, ag.tensor(y))
    want = ag.grad_sync(expected, [xt, *ps])
    assert np.isclose(loss, expected.item(), rtol=1e-5)
    np.testing.assert_allclose(saliency, want[0].numpy(), rtol=1e-4, atol=1e-6)
    for g, w in zip(grads, want[1:]):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-6)
