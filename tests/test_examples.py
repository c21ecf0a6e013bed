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


@pytest.mark.parametrize("backend", ["asyncio", pytest.param("trio", marks=pytest.mark.skipif(
    not _has("trio"), reason="trio is not installed"))])
def test_concurrent_backward_example(backend):
    proc = run("concurrent_backward.py", "--tasks", "6", "--batch", "16", "--hidden", "32", "--backend", backend)
    assert "gradients equal to the sequential sum (float32 tolerance): True" in proc.stdout
    assert "graph_tasks_succeeded    6" in proc.stdout
    assert "why: " in proc.stdout  # the example says why concurrency pays (or not)


def test_custom_function_example():
    out = run("custom_function.py").stdout
    assert "Exp: gradcheck: True" in out and "gradients correct: True" in out


def test_checkpointing_example():
    out = run("checkpointing.py").stdout
    assert out.count("gradients equal to the plain run: True") == 2, out


# --- the async service: a real uvicorn server on 127.0.0.1, briefly ---------------------------------
needs_service = pytest.mark.skipif(not _has("fastapi", "uvicorn", "httpx"),
                                   reason="needs the examples extra (fastapi, uvicorn, httpx)")


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_app_module():
    spec = importlib.util.spec_from_file_location("asyncgrad_example_app", EXAMPLES / "async_service" / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One server for the tests below (they only compare its state before and after)."""
    import time

    import httpx

    import asyncgrad as ag

    app = _load_app_module()
    ag.manual_seed(5)
    model = app.make_model(32).eval()
    tmp_path = tmp_path_factory.mktemp("service")
    weights = tmp_path / "weights.npz"
    model.save(weights)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "async_service" / "app.py"), "--port", str(port),
                             "--weights", str(weights), "--hidden", "32"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"the server did not come up:\n{log.read()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url, model
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@needs_service
def test_service_explain_learn_and_timeout(service):
    import httpx

    import asyncgrad as ag

    url, model = service
    x = np.linspace(0, 1, 64)
    r = httpx.post(f"{url}/explain", json={"x": x.tolist(), "target": 3}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    xt = ag.tensor(x[None, :], requires_grad=True)
    (expected,) = ag.grad_sync(model(xt)[0, 3], [xt])
    np.testing.assert_allclose(body["saliency"], expected.numpy()[0], rtol=1e-4, atol=1e-6)
    assert body["target"] == 3 and len(body["probabilities"]) == 10

    before = httpx.get(f"{url}/stats", timeout=10).json()
    r = httpx.post(f"{url}/learn", json={"x": x.tolist(), "label": 1, "timeout": 1e-9}, timeout=10)
    assert r.status_code == 504 and "untouched" in r.json()["detail"]
    after = httpx.get(f"{url}/stats", timeout=10).json()
    assert after["timeouts"] == before["timeouts"] + 1
    assert (after["steps"], after["param_checksum"]) == (before["steps"], before["param_checksum"])

    r = httpx.post(f"{url}/learn", json={"x": x.tolist(), "label": 1}, timeout=10)
    assert r.status_code == 200 and r.json()["step"] == before["steps"] + 1
    after = httpx.get(f"{url}/stats", timeout=10).json()
    assert after["applied"] == before["applied"] + 1 and after["param_checksum"] != before["param_checksum"]
    assert httpx.post(f"{url}/learn", json={"x": [0.0], "label": 1}, timeout=10).status_code == 422


@needs_service
def test_service_under_load(service):
    url, _ = service
    proc = run(str(Path("async_service") / "load.py"), "--url", url, "--requests", "60", "--concurrency", "8",
               "--max-seconds", "30", timeout=60)
    out = proc.stdout
    assert "requests/s" in out and "/healthz" in out
    assert "/explain 200" in out and "/learn 200" in out
    assert '"pending": 0' in out and '"graph_tasks_failed": 0' in out


async def test_main_demo_runs_small(capsys):
    from asyncgrad.__main__ import main

    assert await main(steps=40, workers=4, batch=16) == 0
    out = capsys.readouterr().out
    assert "concurrent gradients equal to sequential: True" in out
    assert "event loop lag" in out and "loss:" in out
