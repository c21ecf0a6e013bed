"""Which numba threading layer for asyncgrad's intra-op parallel kernels (issue 15)?

    python -m bench.numba_layers [--tbb-lib DIR]

Runs one child process per layer (``NUMBA_THREADING_LAYER`` = workqueue, omp, tbb; tbb
only when ``libtbb.so.12`` loads, from ``--tbb-lib`` or the library path) and prints,
per layer, medians of 9 rounds of 200 calls on 2 threads:

* an elementwise add (serial numba loop and ``prange``) at 32k-2M float32, and the
  serial/prange ratio;
* the process's CPU time while it sleeps 50 ms after a parallel call (threads that
  spin after a parallel region burn a core the engine's workers or BLAS could use);
* two Python threads calling parallel kernels at once (workqueue is documented as not
  thread-safe: the child aborts or not);
* ``os.fork`` after a parallel call, the child calling it again (hangs or not, 20 s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = r"""
import os, sys, statistics, threading, time
import numpy as np
import numba
from numba import njit, prange

@njit(nogil=True)
def add_s(a, b, out):
    for i in range(a.size):
        out[i] = a[i] + b[i]

@njit(nogil=True, parallel=True)
def add_p(a, b, out):
    for i in prange(a.size):
        out[i] = a[i] + b[i]

what = sys.argv[1]
numba.set_num_threads(2)
x = np.ones(1 << 16, np.float32); o = np.empty_like(x)
add_s(x, x, o); add_p(x, x, o)
layer = numba.threading_layer()
if what == "speed":
    for n in (32768, 131072, 524288, 2097152):
        a = np.random.default_rng(0).standard_normal(n).astype(np.float32); b = a.copy(); out = np.empty_like(a)
        t = {"s": [], "p": []}
        for r in range(9):
            for k, f in (("s", add_s), ("p", add_p)) if r % 2 else (("p", add_p), ("s", add_s)):
                t0 = time.perf_counter()
                for _ in range(200):
                    f(a, b, out)
                t[k].append((time.perf_counter() - t0) / 200 * 1e3)
        s, p = statistics.median(t["s"]), statistics.median(t["p"])
        print(f"{layer}: add {n:>9,} float32: serial {s:.4f} ms, prange {p:.4f} ms, ratio {p / s:.2f}")
    a = np.ones(524288, np.float32); out = np.empty_like(a)
    add_p(a, a, out)
    c0 = time.process_time(); time.sleep(0.05); c1 = time.process_time()
    print(f"{layer}: CPU while sleeping 50 ms after a parallel call: {(c1 - c0) * 1e3:.1f} ms")
elif what == "threads":
    a = np.ones(524288, np.float32)
    def run():
        out = np.empty_like(a)
        for _ in range(2000):
            add_p(a, a, out)
        assert (out == 2).all()
    ts = [threading.Thread(target=run) for _ in range(2)]
    for t in ts: t.start()
    for t in ts: t.join()
    print(f"{layer}: two threads calling parallel kernels at once: ok")
elif what == "fork":
    a = np.ones(524288, np.float32); out = np.empty_like(a)
    add_p(a, a, out)
    pid = os.fork()
    if pid == 0:
        add_p(a, a, out)
        os._exit(0 if (out == 2).all() else 3)
    _, status = os.waitpid(pid, 0)
    print(f"{layer}: fork after a parallel call, child calls again: exit status {status}")
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tbb-lib", default="", help="directory holding libtbb.so.12 (the tbb wheel's data/lib)")
    args = p.parse_args(argv)
    print(f"# load {os.getloadavg()[0]:.2f}; command: python -m bench.numba_layers"
          + (f" --tbb-lib {args.tbb_lib}" if args.tbb_lib else ""))
    for layer in ("workqueue", "omp", "tbb"):
        env = dict(os.environ, NUMBA_THREADING_LAYER=layer, NUMBA_NUM_THREADS="2")
        if args.tbb_lib:
            env["LD_LIBRARY_PATH"] = args.tbb_lib + ":" + env.get("LD_LIBRARY_PATH", "")
        for what in ("speed", "threads", "fork"):
            try:
                r = subprocess.run([sys.executable, "-c", CHILD, what], env=env, capture_output=True,
                                   text=True, timeout=60 if what == "speed" else 20)
                out = r.stdout.strip() or f"{layer}: {what}: exit {r.returncode}: {r.stderr.strip()[-300:]}"
            except subprocess.TimeoutExpired:
                out = f"{layer}: {what}: hung (killed after the timeout)"
            print(out)


if __name__ == "__main__":
    main()
