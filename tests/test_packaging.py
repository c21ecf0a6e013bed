"""The package runs with only its declared runtime dependencies installed.

A venv is built with exactly ``[project] dependencies`` from pyproject.toml (no test
extras, which pull in sniffio and trio), and asyncgrad is imported from ``src/``. Both
the blocking and the awaited backward forms must work there.
"""

import os
import subprocess
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import asyncio, sys
import asyncgrad as ag
for name in ("sniffio", "trio", "pytest"):
    assert name not in sys.modules, name + " was imported"
w = ag.tensor([1.0, 2.0], requires_grad=True)
(w * w).sum().backward()
assert w.grad.tolist() == [2.0, 4.0], w.grad
(g,) = ag.grad_sync((w * 3).sum(), w)
assert g.tolist() == [3.0, 3.0], g
ag.backward_sync((w * w).sum())
assert w.grad.tolist() == [4.0, 8.0], w.grad

async def main():
    await ag.backward((w * w).sum())
    (g,) = await ag.grad((w * w).sum(), w)
    assert g.tolist() == [2.0, 4.0], g
asyncio.run(main())
assert w.grad.tolist() == [6.0, 12.0], w.grad
for name in ("sniffio", "trio"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise AssertionError(name + " is installed in the minimal venv")
print("ok")
"""


def test_sync_and_async_backward_with_only_declared_dependencies(tmp_path):
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *deps],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([str(python), "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"
