"""Intra-op threads: whether a large compiled kernel may split itself over the cores now.

Note [Intra-op threads]: the compiled elementwise and row kernels (``numba_kernels.py``)
have parallel forms (numba ``prange``) that split one call over the cores. They run only
when all of these hold, else the serial kernel runs (the same results, Note [Parallel
kernels give the serial bits] in ``numba_kernels.py``):

* numba's TBB threading layer is in use (``available``). TBB's pool is shared by every
  thread that calls into it (two kernels called at once share its threads, they do not
  add threads), a child process after ``fork`` starts its own, and its threads sleep soon
  after a parallel loop. The two other layers do not fit an engine that calls kernels from
  several threads: GNU OpenMP's threads spin ~7 ms of CPU per 50 ms after a loop and numba
  terminates a child forked after one; the workqueue layer aborts the process when two
  threads call parallel kernels at once and hands off in ~40 us, so it paid only at 2 M
  floats (``python -m bench.numba_layers``). Without TBB every kernel runs serially.
* the kernel is large: at least ``MIN_HEAVY`` or ``MIN_LIGHT`` elements (a parallel launch costs a few
  microseconds; below these sizes the serial kernel was as fast, ``python -m bench.intraop``);
* the process is not busy elsewhere: numpy's BLAS has its own threads (at most one
  backward call in flight, and the hysteresis of Note [BLAS hysteresis] relaxed; not
  pinned at one thread) and no engine BLAS kernel is running (``BLAS.intra_op_ok``, the
  same adaptive switch as BLAS's threads: Note [BLAS threads] in ``autograd/policy.py``).
  So several backward calls in flight, or a product on a worker, keep every kernel serial,
  and the second core is left to the engine's workers and BLAS;
* the switch is on. It is off by default: ``ASYNCGRAD_INTRA_OP=1`` at start-up, or
  :func:`set_enabled`, turns it on; ``ASYNCGRAD_INTRA_OP=0`` does not even compile the
  parallel forms (with TBB installed they add ~0.5 s to the background load, and a
  minute to the first compile after an install).

Why off: on this project's 2-core machine (shared, load 1-2) the parallel forms halve a
kernel in isolation (softmax 0.53 -> 0.21 ms at 262k float32, GELU 0.47 -> 0.24 at 524k)
but did not make the transformer step faster (``python -m bench.intraop --step``, on and
off interleaved round by round: on / off 1.016 and 0.995 alone in the process, 1.04-1.11
in five runs with PyTorch's step interleaved too). Timed inside the step, a split kernel waits for
its second half: after each product numpy's OpenBLAS keeps its helper thread spinning on the
other core (softmax in the step: 0.55 -> 0.45 ms with BLAS at 2 threads, 0.54 -> 0.26 at 1),
and other processes take that core too. PyTorch's intra-op parallelism pays because its
products and its elementwise kernels share one thread pool; here they are two pools on
two cores. TBB is not a dependency for the same reason; it is in the ``test`` extra so CI
checks the parallel forms.

Note [One pool]: the opt-in answer to "two pools on two cores" (``ASYNCGRAD_INTRA_OP=pool``
at start-up, or :func:`set_one_pool`): numpy's BLAS is pinned at one thread per call (no
OpenBLAS helper thread left spinning), the parallel kernels are on, and the large 2-D
products (the linear layers' forward and both gradients, a stack times a matrix: every
``linalg._mm``) split their rows into one block per core in a numba ``prange`` on TBB,
each block one single-threaded GEMM of numpy's own OpenBLAS (its CBLAS ``?gemm``, found
through threadpoolctl), so products and elementwise kernels share TBB's pool as in
PyTorch. The same conditions hold as above, except that BLAS must be at one thread; a
product goes parallel from ``MIN_PRODUCT`` multiply-adds, in a BLAS layout (one unit
stride per operand), float32 or float64. Off, ``linalg._mm`` is ``np.matmul`` itself, so
the default path pays nothing for it. The stacked attention products stay numpy's, and
so do the backward's products on the engine's workers (each runs inside ``BLAS.run``,
which takes a BLAS slot, so ``intra_op_ok`` says no): letting that one kernel split too,
and keeping a product node one kernel instead of the workers' split, made the step
slower (one pool / main 1.09 twice), as the backward already keeps both cores busy with
the engine's workers and the loop.

Measured (``python -m bench.onepool``, the transformer step, configurations interleaved
round by round, 2 shared cores): the split product halves in isolation (1024 x 128 by
128 x 384 float32: 0.85 ms at one thread, 0.46 split) and the no-grad forward pass gains
12% (45.7 ms with main's defaults, 40.4 one pool), but the whole step does not pay here:
one pool / main per round 0.97, 0.88, 0.99, 0.97, 0.98, 1.10 in six runs (load 1.3-2.3),
the parallel kernels alone 0.91, 0.96, 0.96, 1.11, 0.91, 1.00, BLAS at one thread alone
1.05-1.16, while PyTorch's step in the same runs stood at 0.65-0.76 of main's. A low
``OPENBLAS_THREAD_TIMEOUT`` (4: the helper thread sleeps at once) did not make the
parallel kernels pay either (1.11 in ``bench.onepool``; 1.005 and 1.024 on / off in
``python -m bench.intraop --step``, against 1.013 and 1.058 with the default spin), though
it sped up PyTorch's single steps interleaved with asyncgrad's there (60-70 ms against
150: OpenBLAS's spinning helper had taken torch's second core). So it stays opt-in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

ENV_VAR = "ASYNCGRAD_INTRA_OP"

# elements from which a kernel goes parallel (``python -m bench.intraop --parallel-kernels``,
# float32, 2 cores, TBB; parallel / serial time): the kernels with work per element (exp,
# erf, a row's mean and variance, Adam's square root) pay from 65,536 (0.62-0.91 at 65k,
# 0.42-0.71 at 131k); the light ones (a select, a multiply-add or two per element) only
# from 262,144 (0.89-1.32 at 131k, 0.33-0.68 at 262k).
MIN_HEAVY = 65536  # gelu (both forms) and its backward, sigmoid, softmax, log_softmax, layer_norm, Adam
MIN_PRODUCT = 1 << 22  # multiply-adds from which a product splits (Note [One pool]; untuned: the step's least is 8.5 M)
MIN_LIGHT = 262144  # tanh's, sigmoid's, relu's, softmax's, log_softmax's and layer_norm's backward, masks

available = False  # set by numba_kernels at import when it compiled the parallel forms (TBB)
_setting = os.environ.get(ENV_VAR, "").strip().lower()
load_forms = _setting not in ("0", "off", "false", "no")  # read by numba_kernels at import
_enabled = _setting in ("1", "on", "true", "yes", "pool")  # off unless asked for: Note [Intra-op threads]
launches = 0  # parallel kernel calls so far (tests observe the switch through it)
one_pool = _setting == "pool"  # Note [One pool]: BLAS at one thread, products in TBB's pool too
# a 2-D product ``(a, b, out) -> out`` or None (numpy's then), set by ``build_product`` once
# it compiled the split product over numpy's BLAS; ``linalg._mm`` calls it
product: Callable[[Any, Any, Any], Any] | None = None
# compiles ``product`` (once; whether it could), set by numba_kernels with the parallel
# forms: the split product is built the first time one pool is turned on
build_product: Callable[[], bool] | None = None
_pin: Any = None  # the BLAS.pinned(1) block one pool holds open


def set_enabled(on: bool) -> None:
    """Allow or forbid (the default) parallel kernels from now on, process-wide. Off
    also ends one pool (:func:`set_one_pool`)."""
    global _enabled
    _enabled = bool(on)
    if not on and one_pool:
        set_one_pool(False)
    if on_switch is not None:
        on_switch(_enabled)


def set_one_pool(on: bool) -> None:
    """Note [One pool]: on, numpy's BLAS runs at one thread per call (``BLAS.pinned(1)``,
    held until this is turned off), and the parallel kernels (:func:`set_enabled`) and
    large 2-D products split over TBB's pool; off, BLAS's threads adapt again and the
    parallel kernels stay as :func:`set_enabled` left them."""
    global one_pool, _pin
    from .. import linalg

    if on:
        if build_product is not None:
            build_product()
        set_enabled(True)
        _pin_blas()
    elif _pin is not None:
        pin, _pin = _pin, None
        pin.__exit__(None, None, None)
    one_pool = bool(on)
    linalg._mm = linalg._mm_pool if one_pool else np.matmul


def _pin_blas() -> None:
    """Hold BLAS at one thread per call for one pool (once; not before a gate is
    registered: the next kernel that asks pins it)."""
    global _pin
    if _pin is None and _gate is not None:
        _pin = _gate.pinned(1)
        _pin.__enter__()


on_switch: Callable[[bool], None] | None = None  # set by numba_kernels: installs or removes its dispatchers


def enabled() -> bool:
    """Whether the switch is on (parallel kernels still need TBB and an idle process)."""
    return _enabled


def allowed() -> bool:
    """Whether a large kernel called now may split itself over the cores (Note [Intra-op
    threads]); each True answer counts as one launch. Without a registered gate
    (:func:`use_gate`) nothing says the process is idle, so every kernel stays serial."""
    global launches
    if not (_enabled and available) or _gate is None:
        return False
    if one_pool and _pin is None:  # ASYNCGRAD_INTRA_OP=pool: pinned at the first kernel
        _pin_blas()
    if not _gate.intra_op_ok(one_pool):
        return False
    launches += 1
    return True


class Gate(Protocol):
    """What the intra-op switch asks of whoever runs numpy's BLAS (the engine's
    ``BLAS`` thread policy, which registers itself with :func:`use_gate`): ops never
    import the engine, the engine tells ops what they need."""

    def intra_op_ok(self, one_pool: bool = False) -> bool:
        """Whether a kernel may split itself over the cores now (Note [Intra-op threads])."""
        ...

    def pinned(self, n: int) -> AbstractContextManager[None]:
        """A block in which numpy's BLAS runs ``n`` threads per call."""
        ...


_gate: Gate | None = None  # registered by the engine at import (autograd/policy.py)


def use_gate(gate: Gate) -> None:
    """Ask ``gate`` from now on whether the process is idle enough for parallel kernels,
    and pin BLAS through it for one pool (Note [One pool])."""
    global _gate
    _gate = gate
