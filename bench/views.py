"""The cost of the views added for PyTorch parity, against PyTorch measured in the same run.

    python bench/views.py [--sizes 64 256] [--rounds 7]

* ``unbind``: backward of ``stack([row * 2 for row in (x * 1).unbind(0)]).sum()`` for an
  ``n x n`` float32 ``x`` (the views share one node; its backward is one ``stack``).
* ``split``: the same with ``split(8)`` and ``cat``.
* ``view``: forward ``x.view(-1)`` of a 64 x 64 tensor that requires grad, against
  ``reshape`` (``view`` also checks that numpy made no copy).

Rounds interleave the libraries; the figure is the median over rounds of the best of a
few calls each, in microseconds, with the ratio asyncgrad / torch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import asyncgrad as ag


def _backward_time(lib: Any, n: int, kind: str) -> float:
    x = lib.randn(n, n, requires_grad=True)
    y = x * 1.0
    if kind == "unbind":
        loss = lib.stack([r * 2.0 for r in y.unbind(0)]).sum()
    else:
        loss = lib.cat([p * 2.0 for p in y.split(8)]).sum()
    t0 = time.perf_counter()
    loss.backward()
    return time.perf_counter() - t0


def _best(fn: Callable[[], float], calls: int = 3) -> float:
    return min(fn() for _ in range(calls))


def _view_time(lib: Any, method: str) -> float:
    x = lib.randn(64, 64, requires_grad=True) * 1.0
    f = getattr(x, method)
    t0 = time.perf_counter()
    for _ in range(1000):
        f(-1)
    return (time.perf_counter() - t0) / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    import torch

    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for n in args.sizes:
            for kind in ("unbind", "split"):
                row = rows.setdefault(f"{kind} backward n={n}", {"asyncgrad": [], "torch": []})
                row["asyncgrad"].append(_best(lambda: _backward_time(ag, n, kind)))  # noqa: B023
                row["torch"].append(_best(lambda: _backward_time(torch, n, kind)))  # noqa: B023
        for method in ("view", "reshape"):
            row = rows.setdefault(f"{method} forward 64x64", {"asyncgrad": [], "torch": []})
            row["asyncgrad"].append(_best(lambda: _view_time(ag, method)))  # noqa: B023
            row["torch"].append(_best(lambda: _view_time(torch, method)))  # noqa: B023
    print(f"{'case':28s} {'asyncgrad us':>13s} {'torch us':>10s} {'ratio':>6s}")
    for name, r in rows.items():
        a, t = statistics.median(r["asyncgrad"]) * 1e6, statistics.median(r["torch"]) * 1e6
        print(f"{name:28s} {a:13.1f} {t:10.1f} {a / t:6.2f}")


if __name__ == "__main__":
    main()
