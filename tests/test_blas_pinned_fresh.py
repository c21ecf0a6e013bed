"""``BLAS.pinned(n)`` in a fresh process, before any backward inspected numpy's BLAS: the
block's count reaches BLAS, and afterwards the engine still adapts (it used to drop the
inspection made inside the block, and never set or adapted BLAS again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("threadpoolctl")

_SCRIPT = r"""
import asyncio, json
from threadpoolctl import threadpool_info
import asyncgrad as ag
from asyncgrad.autograd.runtime.blas import BLAS

def threads():
    return max(i["num_threads"] for i in threadpool_info()
               if i["user_api"] == "blas" and ("numpy" in i["filepath"] or "scipy_openblas" in i["filepath"]))

async def one_backward():
    x = ag.randn(8, 8, requires_grad=True)
    await ag.backward((x @ x).sum())

out = {"before": threads(), "chosen_before": BLAS.chosen}
with BLAS.pinned(1):
    out["in_block"] = threads()
    asyncio.run(one_backward())  # the engine's set-up runs inside the block
    out["in_block_after_backward"] = threads()
out["after"] = threads()
out["chosen_after"] = BLAS.chosen
BLAS.backward_started(); BLAS.backward_started()  # two calls in flight: one thread each
out["two_in_flight"] = threads()
BLAS.backward_ended(); BLAS.backward_ended()
print(json.dumps(out))
"""


def test_pinned_before_the_first_backward_reaches_blas_and_adapting_resumes():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}  # BLAS's default: 2 on any machine
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["before"] != 2:
        pytest.fail(f"numpy's BLAS did not start at OPENBLAS_NUM_THREADS=2: {out}")
    assert out["chosen_before"] is None  # nothing inspected yet
    assert out["in_block"] == 1
    assert out["in_block_after_backward"] == 1
    assert out["after"] == 2  # the block's end resumes the default the inspection found
    assert out["chosen_after"] == 2
    assert out["two_in_flight"] == 1  # and the engine adapts again
