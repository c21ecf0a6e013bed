"""Load the example service with concurrent requests and report what it sustained.

    python examples/async_service/load.py --url http://127.0.0.1:8000 --requests 400 --concurrency 32

Sends ``--requests`` POSTs (a mix of ``/explain`` and ``/learn``, ``--concurrency`` in
flight at once) built from scikit-learn's digits, scaled to [0, 1] as the service expects:
``/learn`` sends each image with its true label, so the load trains the served model on
real data instead of degrading it. Meanwhile a probe calls ``GET /healthz`` every
``--health-interval`` seconds. Then it prints the throughput, latency percentiles per endpoint, the status codes, the
health-check latency and the server's ``/stats``. It stops by itself: after the last
request or after ``--max-seconds``, whichever comes first. Point it only at a server you
run yourself (by default on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter, defaultdict

import anyio
import httpx
import numpy as np


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=_positive_int, default=400)
    p.add_argument("--concurrency", type=_positive_int, default=32)
    p.add_argument("--explain-fraction", type=_fraction, default=0.5, help="share of /explain among the requests")
    p.add_argument("--learn-timeout", type=_positive_float, default=None, help="per-request /learn timeout (seconds)")
    p.add_argument("--health-interval", type=_positive_float, default=0.05)
    p.add_argument("--max-seconds", type=_positive_float, default=60.0, help="hard stop")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (shipped with it, no download) as the service takes them."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).round(4), d.target.astype(int)


def percentiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    ms = np.asarray(values) * 1e3
    return (f"p50 {np.percentile(ms, 50):7.1f} ms  p90 {np.percentile(ms, 90):7.1f} ms  "
            f"p99 {np.percentile(ms, 99):7.1f} ms  max {ms.max():7.1f} ms  (n={len(ms)})")


async def run(args: argparse.Namespace) -> dict[str, object]:
    rng = np.random.default_rng(args.seed)
    images, labels = digits()
    latencies: dict[str, list[float]] = defaultdict(list)
    codes: Counter[str] = Counter()
    health: list[float] = []
    limiter = anyio.CapacityLimiter(args.concurrency)
    done = anyio.Event()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        async with limiter:
            k = int(rng.integers(len(images)))
            x = images[k].tolist()
            if rng.random() < args.explain_fraction:
                path, body = "/explain", {"x": x}
            else:
                path, body = "/learn", {"x": x, "label": int(labels[k])}
                if args.learn_timeout is not None:
                    body["timeout"] = args.learn_timeout
            t0 = time.perf_counter()
            try:
                r = await client.post(path, json=body)
                codes[f"{path} {r.status_code}"] += 1
            except httpx.HTTPError as e:
                codes[f"{path} {type(e).__name__}"] += 1
                return
            latencies[path].append(time.perf_counter() - t0)

    async def probe(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                r = await client.get("/healthz")
                if r.status_code == 200:
                    health.append(time.perf_counter() - t0)
            except httpx.HTTPError:
                codes["/healthz error"] += 1
            with anyio.move_on_after(args.health_interval):
                await done.wait()

    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=args.url, timeout=30.0, limits=limits) as client, \
            httpx.AsyncClient(base_url=args.url, timeout=30.0) as health_client:
        start = time.perf_counter()
        with anyio.move_on_after(args.max_seconds):
            async with anyio.create_task_group() as tg:
                tg.start_soon(probe, health_client)
                async with anyio.create_task_group() as requests:
                    for i in range(args.requests):
                        requests.start_soon(one, client, i)
                done.set()
        elapsed = time.perf_counter() - start
        done.set()
        stats = (await client.get("/stats")).json()

    sent = sum(len(v) for v in latencies.values())
    print(f"{sent} requests in {elapsed:.2f} s: {sent / elapsed:.1f} requests/s "
          f"(concurrency {args.concurrency})")
    for path in sorted(latencies):
        print(f"  {path:<9} {percentiles(latencies[path])}")
    print(f"  /healthz  {percentiles(health)}   <- while the requests above were in flight")
    print("status codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
    print("server stats: " + json.dumps({k: v for k, v in stats.items() if k != "engine"}))
    print("engine: " + json.dumps(stats["engine"]))
    return {"sent": sent, "elapsed": elapsed, "codes": dict(codes), "health": health, "stats": stats}


def main(argv: list[str] | None = None) -> int:
    result = anyio.run(run, parse_args(argv))
    return 0 if result["sent"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
