"""The docs site: ``mkdocs build --strict`` passes, and the code examples of the site's
pages run.

The build needs the ``docs`` extra (``pip install -e ".[docs]"``) and is skipped without
it. The examples need only the test extra: every ```` ```python ```` block of the pages
below is a complete program, run here in a subprocess (blocks in ```` ```text ```` or
```` ```sh ```` are not run).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Pages whose ```python blocks are all complete programs. (debugging.md and
# functions_and_checkpointing.md are design notes that also show fragments.)
RUNNABLE_PAGES = [
    "index.md",
    "getting_started.md",
    "concepts.md",
    "coming_from_pytorch.md",
    "guides/async_services.md",
    "guides/custom_functions.md",
    "guides/checkpointing.md",
    "guides/debugging.md",
    "guides/concurrency.md",
]

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in RUNNABLE_PAGES:
        path = DOCS / page
        if not path.exists():
            continue
        for i, m in enumerate(_BLOCK.finditer(path.read_text())):
            out.append((f"{page}#{i}", m.group(1)))
    return out


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "index.html").exists()


@pytest.mark.parametrize(("name", "code"), _blocks(), ids=[n for n, _ in _blocks()])
def test_docs_example_runs(name: str, code: str, tmp_path: Path) -> None:
    needs = [m for m in ("fastapi", "httpx", "trio") if re.search(rf"^\s*(import|from) {m}\b", code, re.M)]
    for m in needs:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"{m} is not installed")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{name} failed:\n{code}\n--- output ---\n{proc.stdout}{proc.stderr}"
