"""examples/saliency_service.py end to end, as its own process (as tests/test_examples.py
runs the other examples): it trains its CNN, serves, and its client's requests get maps that
point at the pattern, a timeout cancels, bad requests get the library's message."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "saliency_service.py"


def counts(out, method):
    line = next(line for line in out.splitlines() if line.strip().startswith(method + " "))
    answered = int(line.split(" answered")[0].split()[-1].split("/")[0])
    right = int(line.split("predictions right ")[1].split("/")[0])
    share = float(line.split("|map| on the pattern ")[1].split("%")[0])
    area = float(line.split("(area ")[1].split("%")[0])
    peaks = int(line.split("peak there ")[1].split("/")[0])
    return answered, right, share, area, peaks


@pytest.mark.parametrize("backend", ["asyncio", pytest.param("trio", marks=pytest.mark.skipif(
    importlib.util.find_spec("trio") is None, reason="trio is not installed"))])
def test_saliency_service_example(backend):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--backend", backend],
                          capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    accuracy = float(out.split("test accuracy ")[1].split("%")[0])
    assert accuracy >= 95, out
    assert "32 requests at once (8 images x 4 methods), 4 computing at a time" in out
    for method in ("saliency", "smoothgrad", "integrated_gradients", "grad_cam"):
        answered, right, share, area, peaks = counts(out, method)
        assert answered == 8 and right >= 7, out
        # the maps point at the pattern (or next to it): more of |map| lies there than its share
        # of the image; for IG and Grad-CAM far more, and the peak too for all but one image at most
        assert share > area, out
        assert method not in ("integrated_gradients", "grad_cam") or (share > 2.5 * area and peaks >= 7), out
    assert "(IG, 4096 steps, 0.02 s): HTTP 504" in out and "running after: 0" in out
    assert "the same request after the timeout gives the same map as before: True" in out
    assert "a bad target: HTTP 400 (target must hold class indices < 4" in out
    assert "a bad image: HTTP 400 (image must be 12x12 finite numbers)" in out
    assert "parameters' .grad after every request: all None" in out
    assert "GET /stats: HTTP 200" in out and "'timeouts': 1" in out and "'backwards_running': 0" in out
