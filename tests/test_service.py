"""The example service (examples/async_service) against a real uvicorn server on 127.0.0.1:
correct answers, a timeout that leaves the parameters untouched, the load script, and a
table of bad requests, each of which must get its status code, no echo of the input, and
no change to the model."""

import contextlib
import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "httpx", "sklearn")),
    reason="needs the examples extra (fastapi, uvicorn, httpx, scikit-learn)")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SERVICE = EXAMPLES / "async_service"
MAX_BODY = 16 * 1024  # the server's default --max-body-bytes


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_app_module():
    spec = importlib.util.spec_from_file_location("asyncgrad_example_app", SERVICE / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def app_module():
    return _load_app_module()


@pytest.fixture(scope="module")
def service(tmp_path_factory, app_module):
    """One real server for the tests below (they compare its state before and after)."""
    import httpx

    import asyncgrad as ag

    ag.manual_seed(5)
    model = app_module.make_model(32).eval()
    tmp_path = tmp_path_factory.mktemp("service")
    weights = tmp_path / "weights.npz"
    model.save(weights)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    log = open(log_path, "w+")
    proc = subprocess.Popen([sys.executable, str(SERVICE / "app.py"), "--port", str(port), "--weights", str(weights),
                             "--hidden", "32"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30  # bounded: the server comes up or the test fails
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"the server did not come up:\n{log.read()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url, model, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _get(url, path):
    import httpx

    r = httpx.get(f"{url}{path}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_startup_line_and_healthz_report_the_model(service):
    import asyncgrad as ag

    url, _, log_path = service
    line = log_path.read_text()
    assert f"serving on {url}" in line and "parameters" in line, line
    health = _get(url, "/healthz")
    assert health["status"] == "ok" and health["parameters_finite"] is True
    assert health["asyncgrad"] == ag.__version__ and health["version"]
    assert isinstance(health["steps"], int)


def test_explain_learn_and_timeout(service):
    import httpx

    import asyncgrad as ag

    url, model, _ = service
    x = np.linspace(0, 1, 64)
    r = httpx.post(f"{url}/explain", json={"x": x.tolist(), "target": 3}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    # in the model's dtype: a float32 Linear given float64 input raises, as in PyTorch
    xt = ag.tensor(x[None, :], dtype=next(iter(model.parameters())).dtype, requires_grad=True)
    (expected,) = ag.grad_sync(model(xt)[0, 3], [xt])
    np.testing.assert_allclose(body["saliency"], expected.numpy()[0], rtol=1e-4, atol=1e-6)
    assert body["target"] == 3 and len(body["probabilities"]) == 10

    before = _get(url, "/stats")
    r = httpx.post(f"{url}/learn", json={"x": x.tolist(), "label": 1, "timeout": 1e-9}, timeout=10)
    assert r.status_code == 504 and "untouched" in r.json()["detail"]
    after = _get(url, "/stats")
    assert after["timeouts"] == before["timeouts"] + 1
    assert (after["steps"], after["param_digest"]) == (before["steps"], before["param_digest"])

    r = httpx.post(f"{url}/learn", json={"x": x.tolist(), "label": 1}, timeout=10)
    assert r.status_code == 200 and r.json()["step"] == before["steps"] + 1
    assert math.isfinite(r.json()["loss"])
    after = _get(url, "/stats")
    assert after["applied"] == before["applied"] + 1 and after["param_digest"] != before["param_digest"]
    assert _get(url, "/healthz")["steps"] == after["steps"]


# --- bad input: (name, path, body, expected status) ------------------------------------------
def _pixels(bad=None, at=5, n=64):
    tokens = ["0.25"] * n
    if bad is not None:
        tokens[at] = bad
    return "[" + ",".join(tokens) + "]"


def _learn(bad=None, label="1", extra="", n=64):
    return f'{{"x":{_pixels(bad, n=n)},"label":{label}{extra}}}'


def _explain(bad=None, extra=""):
    return f'{{"x":{_pixels(bad)}{extra}}}'


BAD_INPUT = [
    ("learn NaN pixel", "/learn", _learn("NaN"), 422),
    ("learn Infinity pixel", "/learn", _learn("Infinity"), 422),
    ("learn -Infinity pixel", "/learn", _learn("-Infinity"), 422),
    ("learn 1e39 pixel (overflows float32)", "/learn", _learn("1e39"), 422),
    ("learn pixel above 1", "/learn", _learn("1.5"), 422),
    ("learn negative pixel", "/learn", _learn("-0.25"), 422),
    ("learn pixel as string", "/learn", _learn('"0.777777"'), 422),
    ("learn pixels all strings", "/learn", '{"x":[' + ",".join(['"0.5"'] * 64) + '],"label":1}', 422),
    ("learn pixel as bool", "/learn", _learn("true"), 422),
    ("learn label true", "/learn", _learn(label="true"), 422),
    ("learn label as float", "/learn", _learn(label="1.0"), 422),
    ("learn label as string", "/learn", _learn(label='"1"'), 422),
    ("learn label out of range", "/learn", _learn(label="10"), 422),
    ("learn negative label", "/learn", _learn(label="-1"), 422),
    ("learn 63 pixels", "/learn", _learn(n=63), 422),
    ("learn 65 pixels", "/learn", _learn(n=65), 422),
    ("learn missing label", "/learn", f'{{"x":{_pixels()}}}', 422),
    ("learn unknown field", "/learn", _learn(extra=',"lr":1000'), 422),
    ("learn timeout NaN", "/learn", _learn(extra=',"timeout":NaN'), 422),
    ("learn timeout Infinity", "/learn", _learn(extra=',"timeout":Infinity'), 422),
    ("learn timeout 0", "/learn", _learn(extra=',"timeout":0'), 422),
    ("learn timeout 1e39", "/learn", _learn(extra=',"timeout":1e39'), 422),
    ("learn not JSON", "/learn", '{"x": [0.5, ', 422),
    ("learn JSON array", "/learn", "[1, 2, 3]", 422),
    ("explain NaN pixel", "/explain", _explain("NaN"), 422),
    ("explain Infinity pixel", "/explain", _explain("Infinity"), 422),
    ("explain 1e39 pixel", "/explain", _explain("1e39"), 422),
    ("explain target true", "/explain", _explain(extra=',"target":true'), 422),
    ("explain target out of range", "/explain", _explain(extra=',"target":11'), 422),
    ("explain unknown field", "/explain", _explain(extra=',"debug":1'), 422),
    ("saliency unknown method", "/saliency", _explain(extra=',"method":"occlusion"'), 422),
    ("saliency 0 samples", "/saliency", _explain(extra=',"samples":0'), 422),
    ("saliency 65 samples", "/saliency", _explain(extra=',"samples":65'), 422),
    ("saliency samples as float", "/saliency", _explain(extra=',"samples":4.0'), 422),
    ("saliency noise 0", "/saliency", _explain(extra=',"noise":0'), 422),
    ("saliency noise NaN", "/saliency", _explain(extra=',"noise":NaN'), 422),
    ("saliency NaN pixel", "/saliency", _explain("NaN"), 422),
    ("learn body over the limit", "/learn", _learn(extra=',"pad":"' + "7" * (4 * MAX_BODY) + '"'), 413),
    ("explain huge x", "/explain", '{"x":[' + ",".join(["0.123456"] * 50_000) + "]}", 413),
]


@pytest.mark.parametrize(("name", "path", "body", "status"), BAD_INPUT, ids=[r[0] for r in BAD_INPUT])
def test_bad_input_is_refused_and_changes_nothing(service, name, path, body, status):
    import httpx

    url, _, _ = service
    before = _get(url, "/stats")
    r = httpx.post(f"{url}{path}", content=body.encode(), headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == status, (name, r.status_code, r.text[:500])
    assert len(r.content) < 4096, f"{name}: a {len(r.content)}-byte error body"
    for marker in ("0.777777", "7777777", "0.123456", "1e39", '"input"', "NaN", "Infinity"):
        assert marker not in r.text, f"{name}: the error echoes {marker!r}: {r.text[:300]}"
    detail = r.json()["detail"]
    assert detail
    after = _get(url, "/stats")
    assert (after["param_digest"], after["steps"], after["applied"]) == \
        (before["param_digest"], before["steps"], before["applied"]), name
    health = _get(url, "/healthz")
    assert health["status"] == "ok" and health["parameters_finite"] is True


def test_chunked_body_over_the_limit_is_refused(service):
    import httpx

    url, _, _ = service
    before = _get(url, "/stats")
    chunks = [b'{"x":[', b"0.5," * (MAX_BODY // 4), b"0.5]", b',"label":1}']  # no Content-Length: chunked
    r = httpx.post(f"{url}/learn", content=iter(chunks), headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 413 and "0.5" not in r.text
    assert _get(url, "/stats")["param_digest"] == before["param_digest"]
    small = [b'{"x":', _pixels().encode(), b',"label":2}']  # chunked and small: served
    r = httpx.post(f"{url}/learn", content=iter(small), headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 200, r.text


def test_load_script_trains_on_real_samples(service):
    url, _, _ = service
    before = _get(url, "/stats")
    proc = subprocess.run([sys.executable, str(SERVICE / "load.py"), "--url", url, "--requests", "60",
                           "--concurrency", "8", "--max-seconds", "30"], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "requests/s" in out and "/healthz" in out
    assert "/explain 200" in out and "/learn 200" in out
    assert '"pending": 0' in out and '"graph_tasks_failed": 0' in out and '"refused": 0' in out
    after = _get(url, "/stats")
    assert after["applied"] > before["applied"] and after["parameters_finite"] is True


@pytest.mark.parametrize(("args", "message"), [
    (["--concurrency", "0"], "--concurrency: must be at least 1, got 0"),
    (["--concurrency", "-1"], "--concurrency: must be at least 1, got -1"),
    (["--requests", "0"], "--requests: must be at least 1"),
    (["--explain-fraction", "1.5"], "--explain-fraction: must be between 0 and 1"),
    (["--max-seconds", "nan"], "--max-seconds: must be a positive number"),
    (["--health-interval", "0"], "--health-interval: must be a positive number"),
])
def test_load_script_validates_its_arguments(args, message):
    proc = subprocess.run([sys.executable, str(SERVICE / "load.py"), "--url", "http://127.0.0.1:9", *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


# --- the learning step's own guards, in process (states a client cannot reach) -------------
@contextlib.asynccontextmanager
async def _client(app):
    """An in-process client, with the app's lifespan (its batchers) running around it."""
    import httpx

    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://service") as client:
        yield client


async def test_nonfinite_loss_is_refused_and_parameters_untouched(app_module):
    app = app_module.create_app(hidden=16)
    state = app.state.service
    big = np.finfo(state.model[-1].bias.dtype).max
    state.model[-1].bias.data[:2] = [big, -big]  # finite parameters whose loss for label 1 overflows
    before = state.digest()
    async with _client(app) as client:
        r = await client.post("/learn", json={"x": [0.5] * 64, "label": 1})
        assert r.status_code == 422 and "non-finite loss" in r.json()["detail"]
        stats = (await client.get("/stats")).json()
    assert stats["refused"] == 1 and stats["steps"] == 0 and state.digest() == before


async def test_nonfinite_gradient_is_refused_and_parameters_untouched(app_module):
    app = app_module.create_app(hidden=16)
    state = app.state.service
    before = state.digest()

    def poison(g):
        with np.errstate(invalid="ignore"):  # 0 * inf is the NaN this test feeds on purpose
            return g * float("inf")

    state.model[0].weight.register_hook(poison)  # a finite loss whose gradient is not finite
    async with _client(app) as client:
        r = await client.post("/learn", json={"x": [0.5] * 64, "label": 3})
        assert r.status_code == 422 and "non-finite gradient" in r.json()["detail"]
    assert state.refused == 1 and state.steps == 0 and state.digest() == before
    assert all(p.grad is None for p in state.params())


async def test_healthz_reports_nonfinite_parameters(app_module, tmp_path):
    import asyncgrad as ag

    model = app_module.make_model(16)
    with ag.no_grad():
        model[0].bias.data[0] = float("nan")
    model.save(tmp_path / "bad.npz")
    app = app_module.create_app(str(tmp_path / "bad.npz"), hidden=16)
    async with _client(app) as client:
        r = await client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["status"] == "unhealthy" and r.json()["parameters_finite"] is False


async def test_saliency_methods_equal_one_backward_per_copy(app_module):
    """/saliency's rows (the input, its noisy copies, the steps from black to it) are one
    request of the batcher; each map equals the gradients of one backward per row."""
    import hashlib

    import asyncgrad as ag

    app = app_module.create_app(hidden=16)
    model = app.state.service.model
    dtype = next(iter(model.parameters())).dtype
    x = np.linspace(0, 1, 64).astype(dtype)[None, :]

    async def grad_at(row, target):
        xt = ag.tensor(row[None, :], requires_grad=True)
        (g,) = await ag.grad(model(xt)[0, target], [xt])
        return g.numpy()[0]

    async with _client(app) as client:
        answers = {}
        for method in ("gradient", "smoothgrad", "integrated_gradients"):
            r = await client.post("/saliency", json={"x": x[0].tolist(), "target": 2, "method": method, "samples": 5})
            assert r.status_code == 200, r.text
            answers[method] = r.json()
        stats = (await client.get("/stats")).json()
    assert answers["gradient"]["samples"] == 1 and answers["smoothgrad"]["samples"] == 5
    np.testing.assert_allclose(answers["gradient"]["saliency"], await grad_at(x[0], 2), rtol=1e-4, atol=1e-6)
    rng = np.random.default_rng(int(hashlib.sha256(x.tobytes()).hexdigest()[:8], 16))
    noisy = (x + rng.normal(0.0, 0.1, (5, 64))).astype(dtype)
    np.testing.assert_allclose(answers["smoothgrad"]["saliency"], np.mean([await grad_at(r, 2) for r in noisy], 0),
                               rtol=1e-4, atol=1e-6)
    steps = x * (np.arange(1, 6, dtype=dtype) / 5)[:, None]
    np.testing.assert_allclose(answers["integrated_gradients"]["saliency"],
                               x[0] * np.mean([await grad_at(r, 2) for r in steps], 0), rtol=1e-4, atol=1e-6)
    assert stats["batchers"]["saliency"]["requests"] == 3 and stats["batchers"]["saliency"]["rows"] == 11
