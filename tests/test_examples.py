"""The examples run end to end (small sizes), each as its own process, as a user runs them."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _has(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_digits = pytest.mark.skipif(not _has("sklearn", "tqdm"), reason="needs the examples extra (scikit-learn, tqdm)")


def run(script, *args, timeout=120, check=True):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@needs_digits
def test_train_digits_reaches_95_percent(tmp_path):
    weights = tmp_path / "digits.npz"
    proc = run("train_digits.py", "--epochs", "10", "--save", str(weights))
    assert "epoch  10/10" in proc.stdout + proc.stderr  # progress bar / epoch lines
    acc = float(proc.stdout.split("final test accuracy: ")[1].split("%")[0])
    assert acc >= 95.0, proc.stdout
    with np.load(weights, allow_pickle=False) as z:
        assert z["0.weight"].shape == (128, 64)


@needs_digits
def test_train_digits_with_checkpoint_sequential():
    proc = run("train_digits.py", "--epochs", "2", "--limit", "256", "--hidden", "32", "--no-progress",
               "--checkpoint", "--segments", "2")
    assert "checkpoint_sequential(2 segments)" in proc.stdout
    assert "final test accuracy" in proc.stdout


needs_tqdm = pytest.mark.skipif(not _has("tqdm"), reason="needs the examples extra (tqdm)")


@needs_tqdm
def test_train_gpt_tiny_loss_falls_and_it_samples_text():
    proc = run("train_gpt.py", "--tiny", "--steps", "60", "--no-progress", "--sample", "40")
    out = proc.stdout
    first, last = (float(v) for v in out.split("train loss: first ")[1].split(" (")[0].split(" -> last "))
    assert last < first - 0.5, out  # from ~4.2 (uniform over ~96 characters) to ~3.2
    val, uniform = (float(v) for v in out.split("validation loss: ")[1].split(")")[0].split(" (uniform guess: "))
    assert val < uniform - 0.5, out
    sample = out.split("-" * 60 + "\n")[1]  # between the two rules
    assert len(sample) == 16 // 2 + 40 + 1, out  # half a block of prompt, 40 generated, a newline
    assert "1 layers, 2 heads, 32 dims, block 16" in out


@pytest.mark.parametrize("backend", ["asyncio", pytest.param("trio", marks=pytest.mark.skipif(
    not _has("trio"), reason="trio is not installed"))])
def test_concurrent_backward_example(backend):
    proc = run("concurrent_backward.py", "--tasks", "6", "--batch", "16", "--hidden", "32", "--rounds", "3",
               "--backend", backend)
    out = proc.stdout
    assert "numpy's BLAS: adapted by the engine" in out
    assert "gradients equal to the sequential sum (float32 tolerance): True" in out
    assert "medians of 3 rounds, after a warm-up" in out
    # the statistics are one concurrent round's: its 6 calls, not the warm-up's or all rounds'
    assert "graph_tasks_succeeded    6\n" in out and "graph_tasks_started      6\n" in out
    assert "why: " in out and "busy " in out  # it says why concurrency pays (or not), with the loop's share
    # and with how many cores the process kept busy each way, and a verdict that matches the speed-up
    assert "cores busy together, " in out and " one by one. " in out
    speedup = float(out.split(" one by one (")[1].split("x;")[0])
    verdict = ("Together, the calls overlap" if speedup >= 1.05 else
               "Here it was about as fast" if speedup > 0.95 else "Here it was slower")
    assert verdict in out, out


def test_concurrent_backward_example_with_blas_fixed():
    out = run("concurrent_backward.py", "--tasks", "4", "--batch", "8", "--hidden", "16", "--rounds", "1",
              "--blas-threads", "1").stdout
    assert "numpy's BLAS: 1 thread(s) per call" in out
    assert "gradients equal to the sequential sum (float32 tolerance): True" in out


@pytest.mark.parametrize("backend", ["asyncio", pytest.param("trio", marks=pytest.mark.skipif(
    not _has("trio"), reason="trio is not installed"))])
def test_batched_requests_example(backend):
    out = run("batched_requests.py", "--tasks", "4", "--requests", "3", "--rows", "4", "--width", "16",
              "--rounds", "2", "--max-wait", "0.005", "--backend", backend).stdout
    assert f"[{backend}] 4 clients x 3 requests of 4 rows" in out
    assert "same losses, saliency maps and parameter gradients both ways (float32 tolerance): True" in out, out
    assert "requests/s" in out and "loop lag p50" in out
    per_pass = float(out.split(" requests per pass")[0].rsplit(", ", 1)[1])
    assert per_pass > 1, out  # the 4 clients' requests in flight were batched together


def _batched_requests_module():
    spec = importlib.util.spec_from_file_location("batched_requests", EXAMPLES / "batched_requests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up while it loads)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


async def _submit_all(submit, requests, outcomes, errors=(ValueError, RuntimeError)):
    """Each of ``requests`` (name -> (x, y)) submitted by its own task at once; its answer,
    or the error it raised, goes to ``outcomes[name]``."""
    import anyio

    async def client(name, x, y):
        try:
            outcomes[name] = await submit(x, y)
        except errors as e:
            outcomes[name] = e

    async with anyio.create_task_group() as clients:
        for name, (x, y) in requests.items():
            clients.start_soon(client, name, x, y)


async def test_batched_requests_isolate_a_failing_pass_and_commit_nothing_of_it():
    """A pass that fails is rerun on halves until each failing request is alone: each gets
    the error, nothing reaches any gradient (asyncgrad's commit on success); the next batch's
    results equal one backward per request."""
    import asyncgrad as ag
    from asyncgrad import nn

    ex = _batched_requests_module()
    ag.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    rng = np.random.default_rng(1)
    dtype = model[0].weight.numpy().dtype
    reqs = {i: (rng.standard_normal((2, 6)).astype(dtype), rng.integers(0, 3, 2)) for i in range(3)}
    failing = [True]

    def hook(g):
        if failing[0]:
            raise RuntimeError("hook refused this batch")
        return None

    model[0].weight.register_hook(hook)
    outcomes = {}
    # a batch starts when its 6 rows are in (max_rows), never by the clock
    async with ex.make_batcher(model, max_rows=6, max_wait=60) as batcher:
        def submit(x, y):
            return ex.batched_request(batcher, x, y, 6, 3)

        await _submit_all(submit, reqs, outcomes)
        stats = batcher.statistics()
        assert (stats.batches, stats.failed, stats.retries) == (1, 3, 4)  # 3 -> [0] [1 2] -> [1] [2]
        refused = [isinstance(outcomes[i], RuntimeError) and "hook refused" in str(outcomes[i]) for i in range(3)]
        assert all(refused), outcomes
        assert all(p.grad is None for p in model.parameters())  # nothing committed
        failing[0] = False
        await _submit_all(submit, reqs, outcomes)
        assert batcher.statistics().batches == 2
    batched = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    for i, (x, y) in reqs.items():
        alone = await ex.one_request(model, x, y)
        assert np.isclose(outcomes[i].loss, alone.loss, rtol=1e-6)
        np.testing.assert_allclose(outcomes[i].saliency, alone.saliency, rtol=1e-5, atol=1e-7)
    for b, p in zip(batched, model.parameters()):
        np.testing.assert_allclose(b, p.grad.numpy(), rtol=1e-5, atol=1e-7)


async def test_batched_requests_refuse_bad_requests_alone_and_withdraw_cancelled_ones():
    """A bad request fails with a ValueError naming the problem, before it joins a batch:
    the good requests sent with it are answered. A request cancelled while it waits is
    not computed."""
    import anyio

    import asyncgrad as ag
    from asyncgrad import nn

    ex = _batched_requests_module()
    ag.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    dtype = model[0].weight.numpy().dtype
    good = (np.ones((2, 4), dtype), np.array([0, 2]))
    bad = {
        "wide": ((np.ones((2, 5), dtype), np.array([0, 1])), "x must be (rows, 4) floats"),
        "label": ((np.ones((2, 4), dtype), np.array([0, 3])), "labels must be in range(3), got 0..3"),
        "nan": ((np.full((1, 4), np.nan, dtype), np.array([1])), "x has NaN or infinite values"),
        "count": ((np.ones((2, 4), dtype), np.array([1])), "argument 1 (y) has 1 rows, but argument 0 (x) has 2"),
        "empty": ((np.ones((0, 4), dtype), np.array([], np.int64)), "argument 0 (x) has no rows"),
    }
    outcomes = {}
    # the good request's 2 rows start a batch (max_rows), never the clock
    async with ex.make_batcher(model, max_rows=2, max_wait=60) as batcher:
        def submit(x, y):
            return ex.batched_request(batcher, x, y, 4, 3)

        await _submit_all(submit, {"good": good, **{name: request for name, (request, _) in bad.items()}},
                          outcomes, errors=ValueError)
        for name, (_, message) in bad.items():
            assert isinstance(outcomes[name], ValueError) and message in str(outcomes[name]), outcomes[name]
        assert isinstance(outcomes["good"], ex.Answer) and batcher.statistics().batches == 1
        first = [p.grad.numpy().copy() for p in model.parameters()]
        with anyio.CancelScope() as waiting:  # one row of two: it waits, then is cancelled
            async with anyio.create_task_group() as tg:
                tg.start_soon(submit, *(a[:1] for a in good))
                while batcher.statistics().requests < 2:
                    await anyio.sleep(0)
                waiting.cancel()
        stats = batcher.statistics()
        assert (stats.batches, stats.cancelled) == (1, 1)  # withdrawn: no pass ran for it
        for a, p in zip(first, model.parameters()):
            np.testing.assert_array_equal(a, p.grad.numpy())
        # the next batch (2 rows again) holds the next request only, not the withdrawn one
        await submit(*good)
        assert batcher.statistics().batches == 2
        for a, p in zip(first, model.parameters()):
            np.testing.assert_array_equal(2 * a, p.grad.numpy())


def test_custom_function_example():
    out = run("custom_function.py").stdout
    assert "Exp: gradcheck: True" in out and "gradients correct: True" in out


def test_checkpointing_example():
    out = run("checkpointing.py").stdout
    assert out.count("gradients equal to the plain run: True") == 2, out


# The async service runs against a real server in tests/test_service.py.


async def test_main_demo_runs_small(capsys):
    from asyncgrad.__main__ import main

    assert await main(steps=40, workers=4, batch=16) == 0
    out = capsys.readouterr().out
    assert "concurrent gradients equal to sequential: True" in out
    assert "event loop lag" in out and "loss:" in out
    # the lag figure comes with the same figure for a blocking baseline, and "offloaded" is explained
    assert "awaited backward (asyncgrad): p99" in out and "blocking backward (baseline): p99" in out
    assert "offloaded to worker threads (only nodes with at least" in out
