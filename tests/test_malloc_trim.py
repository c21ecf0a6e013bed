"""Note [Page faults] (autograd/sched/placement.py): once the engine tuned malloc, freeing what a
large backward saved (the wide benchmark: ~190 MB at its end) keeps the memory in the
process for the next arrays instead of handing it back to the OS page by page."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import asyncgrad

SCRIPT = textwrap.dedent("""
    import os, numpy as np
    from asyncgrad.autograd.runtime.blas import keep_large_allocations
    keep_large_allocations()
    page = os.sysconf("SC_PAGE_SIZE")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page
    arrays = [np.ones(1_000_000, dtype=np.float32) for _ in range(48)]  # 192 MB, touched
    before = rss()
    del arrays
    print((before - rss()) / 2**20)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc: Linux only")
def test_freeing_the_saved_tensors_of_a_large_backward_keeps_the_memory() -> None:
    src = os.path.dirname(os.path.dirname(asyncgrad.__file__))  # this checkout's asyncgrad
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env=env)
    returned_mb = float(out.stdout.strip())
    assert returned_mb < 32, f"{returned_mb:.0f} MB went back to the OS on free"
