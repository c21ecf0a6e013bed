"""Check the built docs site in headless Chromium: the diagram and the plots render offline.

    apt-get install chromium            # Debian's package (once)
    python docs/screenshot.py --out /tmp/asyncgrad-docs-shots

Builds the site (``mkdocs build --strict``, the ``docs`` extra), serves it on 127.0.0.1 for
the length of the check, and for each page below takes a screenshot with Chromium and
reads the rendered DOM: the Concepts page's mermaid flowchart must have been drawn by the
shipped mermaid.js (Material replaces the ``<pre class="mermaid">`` source with a drawing
only when mermaid.js ran), and every image of the Benchmarks page must be served as a PNG.
Exits non-zero, naming what failed, otherwise; look at the screenshots to see the pages.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"concepts": ("concepts/", 2600), "benchmarks": ("benchmarks/", 9000), "home": ("", 1600)}  # path, height
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("headless Chromium is not installed: apt-get install chromium")


def build_site(site: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"mkdocs build failed:\n{proc.stdout}{proc.stderr}")


def chromium(browser: str, url: str, *args: str) -> str:
    """Run headless Chromium on ``url`` with ``args``; returns its stdout. The virtual time
    budget lets the page's scripts (mermaid) finish before the capture."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
                               *args, url], capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise SystemExit(f"chromium failed on {url}:\n{proc.stderr[-2000:]}")
    return proc.stdout


def check_page(name: str, dom: str, base: str) -> list[str]:
    problems = []
    if name == "concepts":
        if '<pre class="mermaid"' in dom:
            problems.append("concepts: the mermaid diagram is still raw source (mermaid.js did not run)")
        if '<div class="mermaid"' not in dom:
            problems.append("concepts: no rendered mermaid diagram found")
    if name == "benchmarks":
        images = re.findall(r'<img[^>]+src="([^"]+)"', dom)
        if not images:
            problems.append("benchmarks: no images on the page")
        for src in images:
            url = urllib.request.urljoin(base, src)
            with urllib.request.urlopen(url, timeout=10) as r:  # our own server on 127.0.0.1
                head = r.read(8)
            if head != b"\x89PNG\r\n\x1a\n":
                problems.append(f"benchmarks: {src} is not a PNG")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "asyncgrad-docs-shots"),
                   help="where the screenshots go")
    p.add_argument("--site", default=None, help="an already built site to check (default: build one)")
    p.add_argument("--width", type=int, default=1280)
    args = p.parse_args(argv)
    browser = find_chromium()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(args.site) if args.site else Path(tmp) / "site"
        if not args.site:
            build_site(site)
        handler = functools.partial(_QuietHandler, directory=str(site))
        server = _QuietServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        problems: list[str] = []
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}/"
            for name, (path, height) in PAGES.items():
                url = base + path
                shot = out / f"{name}.png"
                chromium(browser, url, f"--window-size={args.width},{height}", f"--screenshot={shot}")
                dom = chromium(browser, url, "--dump-dom")
                problems += check_page(name, dom, url)
                print(f"wrote {shot}")
        finally:
            server.shutdown()
            server.server_close()
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    if not problems:
        print("diagram and plots rendered: OK")
    return 1 if problems else 0


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # Chromium closes connections it no longer needs; that is not an error here


if __name__ == "__main__":
    raise SystemExit(main())
