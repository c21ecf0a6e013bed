"""The compiled kernels give the same bits whoever filled numba's cache (issue 33, Note
[Parallel kernels give the serial bits] in ops/kernels/numba_kernels.py).

The reported scenario: a checkout whose cache other processes had filled failed
``test_parallel_form_gives_the_serial_kernels_bits[layer_norm_backward_joint-float64-*]``,
and a fresh clone passed. Here a copy of the package, its cache without the joint
backward's parallel form, is loaded by two processes in turn, each in another
configuration: the first compiles and caches the parallel form (one numba thread), the
second finds it in the cache (two threads, the parallel kernels switched on). Both must
see the serial kernel's bits from the parallel form, and the same bits as each other.
(The cause was not the configuration: a parallel form loaded from the cache gave other
bits than the same form just compiled.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncgrad.ops import kernels

pytest.importorskip("numba")

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "asyncgrad"
KERNEL = "layer_norm_backward_joint"

# the three row counts of test_intra_op's case (35 and 2331 are not multiples of 128: 3 rows there)
PROBE = f"""
    import hashlib, json
    import numpy as np
    from asyncgrad.ops import kernels
    from asyncgrad.ops.kernels import intra_op
    assert kernels.wait(900), kernels.status()
    k = kernels.compiled()
    out = {{"parallel forms": intra_op.available}}
    for dtype in (np.float32, np.float64):
        for rows in (3, 1027):
            rng = np.random.default_rng(rows)
            g, xhat = rng.standard_normal((2, rows, 128)) * 4
            g[0, :5] = [np.inf, -np.inf, np.nan, 0.0, -0.0]
            rstd = np.abs(rng.standard_normal((rows, 1)))
            w = rng.standard_normal(128)
            args = [a.astype(dtype) for a in (g, xhat, rstd, w)]
            forms = {{"serial": getattr(k, "_SERIAL", {{}}).get("{KERNEL}", k.{KERNEL})}}
            if intra_op.available:
                forms["parallel"] = k._DISPATCHING["{KERNEL}"].parallel
            for form, kernel in forms.items():
                dx, dw, db = np.empty_like(args[0]), np.empty(128, dtype), np.empty(128, dtype)
                with np.errstate(all="ignore"):
                    kernel(*args, True, dx, dw, db)
                out[f"{{dtype.__name__}} {{rows}} {{form}}"] = hashlib.sha256(dx.tobytes() + dw.tobytes()
                                                                              + db.tobytes()).hexdigest()
    print(json.dumps(out))
"""


def _run(root: Path, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items()
               if k not in (kernels.ENV_VAR, "ASYNCGRAD_INTRA_OP", "NUMBA_CACHE_DIR", "NUMBA_NUM_THREADS")}
    environ |= {"PYTHONPATH": str(root), **env}
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE)], capture_output=True, text=True,
                         env=environ, timeout=900)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def test_parallel_forms_give_the_serial_bits_whoever_compiled_them(tmp_path: Path) -> None:
    kernels.set_mode("auto")
    assert kernels.wait(900), kernels.status()  # (the package's own cache filled: the copy starts from it)
    root = tmp_path / "src"
    shutil.copytree(PACKAGE, root / "asyncgrad")  # (modification times kept: numba's cache stays valid)
    cache = root / "asyncgrad" / "ops" / "kernels" / "__pycache__"
    for entry in cache.glob(f"numba_kernels._{KERNEL}_p-*"):
        entry.unlink()

    compiled_here = _run(root, NUMBA_NUM_THREADS="1")
    from_cache = _run(root, ASYNCGRAD_INTRA_OP="1", NUMBA_NUM_THREADS="2")
    if not compiled_here.pop("parallel forms") or not from_cache.pop("parallel forms"):
        pytest.skip("numba's TBB threading layer is not available (pip install tbb)")
    assert list(cache.glob(f"numba_kernels._{KERNEL}_p-*.nbi")), "the parallel form was not cached"
    for case, digest in from_cache.items():
        assert digest == compiled_here[case], case  # cached == just compiled
        assert digest == from_cache[case.replace("parallel", "serial")], case  # parallel == serial
