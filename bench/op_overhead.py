"""Per-op costs touched by the PyTorch-parity semantics (issue 13), for an A/B between two
source trees: reading ``.data`` (a property since ``x.data = y`` swaps the storage), the
kernels made ``quiet`` (no numpy RuntimeWarnings: div, log, exp, sqrt), a view of a plain
tensor (registered so it follows its base into the graph), and plain and recorded ``mul``.

    python bench/op_overhead.py                    # this tree, one round
    # A/B: export the other commit's sources and interleave rounds, e.g.
    git archive f0467fe src | tar -x -C /tmp/before
    for r in 1 2 3 4 5; do
      python bench/op_overhead.py --src /tmp/before/src --tag before
      python bench/op_overhead.py --tag after
    done

Times are CPU time of this thread (``time.thread_time``): the best of ``--repeat`` runs of
``--number`` calls, in microseconds per call, so that other processes on a shared machine
disturb them less than wall-clock times. Compare medians of interleaved rounds.
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
import warnings

CASES = {
    "x.data read": "x.data",
    "mul plain": "x * y",
    "mul recorded": "w * y",
    "div plain (quiet)": "x / y",
    "log plain (quiet)": "ag.log(x)",
    "exp plain (quiet)": "x.exp()",
    "sqrt plain (quiet)": "x.sqrt()",
    "getitem view": "x[1:3]",
    "transpose view": "m.t()",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="import asyncgrad from this directory instead")
    parser.add_argument("--tag", default="", help="a label printed on every line")
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, args.src)
    import asyncgrad as ag

    warnings.simplefilter("ignore")  # (the tree before issue 13 warns in log)
    x = ag.randn(4).abs() + 1
    y = ag.randn(4).abs() + 1
    w = ag.randn(4, requires_grad=True)
    m = ag.randn(4, 4)
    env = {"ag": ag, "x": x, "y": y, "w": w, "m": m}
    for name, stmt in CASES.items():
        best = min(timeit.repeat(stmt, globals=env, number=args.number, repeat=args.repeat,
                                 timer=time.thread_time))
        print(f"{args.tag}\t{name}\t{best / args.number * 1e6:.3f} us")


if __name__ == "__main__":
    main()
