"""MkDocs hook: ship mermaid.js with the site, so diagrams render offline.

Material for MkDocs loads mermaid.js from a CDN unless the page already defines
``mermaid``. This hook puts a pinned ``mermaid.min.js`` into the docs (from the npm
package, fetched once with ``npm pack`` into ``docs/assets/vendor/``, which git ignores)
and adds it to ``extra_javascript``, so the built site needs no network to draw diagrams.
Building without npm works when the file is already there (copy it from any
``mermaid@MERMAID_VERSION`` package's ``dist/``).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

MERMAID_VERSION = "11.12.0"  # Material 9.x expects mermaid 11
TARGET = "assets/vendor/mermaid.min.js"


def vendor_mermaid(docs_dir: Path) -> Path:
    """``docs_dir/TARGET``, fetched from npm if it is not there yet."""
    target = docs_dir / TARGET
    if target.exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise PluginError(f"mermaid.js is not vendored yet and npm is not installed: install npm (apt-get install "
                          f"npm) or copy dist/mermaid.min.js of mermaid@{MERMAID_VERSION} to {target}")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([npm, "pack", f"mermaid@{MERMAID_VERSION}", "--silent", "--pack-destination", tmp],
                              capture_output=True, text=True, timeout=300)
        tarballs = list(Path(tmp).glob("mermaid-*.tgz"))
        if proc.returncode != 0 or not tarballs:
            raise PluginError(f"npm pack mermaid@{MERMAID_VERSION} failed: {proc.stderr.strip()[-500:]}")
        with tarfile.open(tarballs[0]) as tar:
            member = tar.extractfile("package/dist/mermaid.min.js")
            if member is None:
                raise PluginError(f"mermaid@{MERMAID_VERSION} has no dist/mermaid.min.js")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".part")
            partial.write_bytes(member.read())
            partial.replace(target)  # never leave half a file behind
    return target


def on_config(config: Any, **kwargs: Any) -> Any:
    vendor_mermaid(Path(config["docs_dir"]))
    if TARGET not in [str(s) for s in config["extra_javascript"]]:
        config["extra_javascript"].append(TARGET)
    return config
