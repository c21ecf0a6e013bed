"""The docs site: ``mkdocs build --strict`` passes offline (mermaid.js shipped with the
site), and every fenced Python snippet of the docs and of README.md runs.

The build needs the ``docs`` extra (``pip install -e ".[docs]"``) and is skipped without
it. The snippets need only the test extra: every ```` ```python ```` block of every page
under ``docs/`` and of ``README.md`` is a complete program, run here in a subprocess,
unless the line right before it is ``<!-- snippet: not runnable, REASON -->`` (blocks in
```` ```text ```` or ```` ```sh ```` are not Python and not run).
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

_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.M | re.S)
_NOT_RUNNABLE = re.compile(r"<!-- snippet: not runnable, [^>]*\S[^>]*-->\s*$")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _blocks() -> list[tuple[str, str]]:
    out = []
    for path in _pages():
        text = path.read_text()
        for i, m in enumerate(_BLOCK.finditer(text)):
            if _NOT_RUNNABLE.search(text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1] + "\n"):
                continue
            out.append((f"{path.relative_to(ROOT)}#{i}", m.group(1)))
    return out


def test_every_page_is_searched_and_few_snippets_are_exempt() -> None:
    pages = {p.relative_to(ROOT).as_posix() for p in _pages()}
    assert {"README.md", "docs/index.md", "docs/debugging.md", "docs/functions_and_checkpointing.md"} <= pages
    total = sum(len(_BLOCK.findall(p.read_text())) for p in _pages())
    exempt = total - len(_blocks())
    assert total >= 30 and exempt <= 3, (total, exempt)


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert (site / "index.html").exists()
    assert (site / "api" / "index.html").exists()
    # offline: mermaid.js ships with the site, and no page loads a script from elsewhere
    assert (site / "assets" / "vendor" / "mermaid.min.js").stat().st_size > 1_000_000
    concepts = (site / "concepts" / "index.html").read_text()
    assert 'class="mermaid"' in concepts and "assets/vendor/mermaid.min.js" in concepts
    for page in site.rglob("*.html"):
        scripts = re.findall(r'<script[^>]+src="([^"]+)"', page.read_text())
        assert not [s for s in scripts if s.startswith(("http:", "https:", "//"))], (page, scripts)


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


def test_mermaid_hook_names_what_is_missing_without_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("mermaid_offline", DOCS / "_hooks" / "mermaid_offline.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    monkeypatch.setattr(hook.shutil, "which", lambda name: None)
    from mkdocs.exceptions import PluginError

    with pytest.raises(PluginError, match=r"npm is not installed: install npm .* or copy dist/mermaid.min.js"):
        hook.vendor_mermaid(tmp_path)
    assert not (tmp_path / "assets").exists()
    vendored = tmp_path / hook.TARGET  # already there: no npm needed
    vendored.parent.mkdir(parents=True)
    vendored.write_text("/* mermaid */")
    assert hook.vendor_mermaid(tmp_path) == vendored
