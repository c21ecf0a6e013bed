"""serving: 32 clients on one loop, each sending requests of 32 rows x 128 features to a
4-layer MLP (per-row cross-entropy), each request wanting its loss, its saliency (the
gradient of its loss with respect to its rows) and its parameter gradient.

Ways of serving them, interleaved in one run: one ``await ag.grad`` per request;
``asyncgrad.serving.GradientBatcher`` (the parameters' gradients summed into ``.grad``,
as an online-learning service wants them), and the same with
``per_request_param_grads=True`` (each request its own); a hand-written numpy forward
and backward per request on the loop (the floor of one pass per request); PyTorch per
request through ``asyncio.to_thread``, and PyTorch with the requests of one loop turn
batched by hand into one pass on a thread. Requests/s over all clients, p50/p99 latency
of a request (submit to answer), the p99 lag of a 1 ms ticker on the same loop, and the
peak growth of the resident memory while one session runs, measured in a fresh process
per way (``python -m bench.workloads.serving --memory WAY``), after a warm-up session:
the graphs and arrays each way keeps in flight (one graph per request waiting for its
backward, or a batcher's running and filling batches). In the timed process every way's
RSS is the whole run's, whatever ran before it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from .. import nets
from ..common import ASYNCGRAD, BLAS, NUMPY, SETTLE, TORCH, About, Column, Result, Target, median, percentile, \
    rss_bytes, ticked, trim_heap

DEFAULT_ROUNDS = 3
CLASSES = 10
MAX_WAIT = 0.002  # the batchers' max_wait (seconds)
ONE_BLAS_THREAD = "numpy per request (on the loop, 1 BLAS thread)"  # the floor without BLAS's own threads

ABOUT = About(
    title="Serving gradients per request: one pass each or batched",
    measures="32 clients on one asyncio loop, each sending 10 requests one after another and yielding to the "
             "loop between them (32 rows x 128 "
             "features, a 4-layer MLP with per-row cross-entropy); each request wants its loss, its saliency and "
             "its parameter gradient. Requests per second over all clients, the p50/p99 latency of one request, "
             "the p99 lag of a 1 ms timer on the same loop, and how much a fresh process's resident memory grows at "
             "most while one session of that way runs (the work it keeps in flight).",
    reading="Higher requests/s, lower latency and lag are better. \"numpy per request\" is the floor of one pass "
            "per request (no autograd, blocking the loop), with BLAS's own threads and with one (a product of "
            "32 rows gains nothing from a second thread, and on a busy machine waits for it). The batcher "
            "answers each request as if it ran alone but pays the per-call cost once per batch; \"per-request "
            "param grads\" also gives each request its own parameter gradient in the same pass (the plain "
            "batcher sums them into .grad).",
    plots=(("requests_per_s", "requests/s", False), ("p99_latency_ms", "p99 latency ms", False)),
)

Serve = Callable[[np.ndarray, np.ndarray], Awaitable[Any]]


def _labels(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CLASSES, rows)


def _head(params: list[np.ndarray], width: int, seed: int = 7) -> list[np.ndarray]:
    """The MLP's parameters with a last layer to CLASSES outputs."""
    rng = np.random.default_rng(seed)
    return params[:-2] + [(rng.standard_normal((CLASSES, width)) * np.sqrt(1.0 / width)).astype(np.float32),
                          np.zeros(CLASSES, np.float32)]


# --- the numpy floor: forward and backward by hand, per request ----------------------------------
def numpy_request(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray,
                                                                                   list[np.ndarray]]:
    acts, logits = nets.numpy_graph(params, x)
    z = logits - logits.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(p[rows, y]).mean())
    g = p
    g[rows, y] -= 1.0
    g *= np.float32(1.0 / len(y))
    n = len(params) // 2
    grads: list[np.ndarray] = [None] * len(params)  # type: ignore[list-item]
    for i in range(n - 1, -1, -1):
        a = acts[i]
        grads[2 * i] = g.T @ a
        grads[2 * i + 1] = g.sum(axis=0)
        g = g @ params[2 * i]
        if i > 0:
            g *= a > 0
    return loss, g, grads


class TurnBatcher:
    """PyTorch batched by hand: the requests submitted in one loop turn run as one pass on
    a thread (the loss is the sum of each request's mean loss); each gets its loss and
    saliency, the parameters' gradients are summed into ``.grad``."""

    def __init__(self, run_batch: Callable[[np.ndarray, np.ndarray, list[int]], tuple[np.ndarray, np.ndarray]]):
        self._run_batch = run_batch
        self._waiting: list[tuple[np.ndarray, np.ndarray, asyncio.Future[Any]]] = []
        self._flushes: set[asyncio.Task[None]] = set()

    async def submit(self, x: np.ndarray, y: np.ndarray) -> Any:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((x, y, done))
        if len(self._waiting) == 1:
            flush = loop.create_task(self._flush())
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        return await done

    async def _flush(self) -> None:
        batch, self._waiting = self._waiting, []
        sizes = [len(x) for x, _, _ in batch]
        losses, saliency = await asyncio.to_thread(self._run_batch, np.concatenate([x for x, _, _ in batch]),
                                                   np.concatenate([y for _, y, _ in batch]), sizes)
        bounds = np.cumsum(sizes)[:-1]
        for (_, _, done), loss, s in zip(batch, losses, np.split(saliency, bounds)):
            done.set_result((float(loss), s))


def _modes(impls: list[str], params: list[np.ndarray], max_rows: int) -> list[tuple[str, Serve, Any]]:
    """``(name, serve one request, its batcher or None)`` per way."""
    modes: list[tuple[str, Serve, Any]] = []
    for impl in impls:
        if impl == ASYNCGRAD:
            modes += _asyncgrad_modes(params, max_rows)
        elif impl == NUMPY:
            head = [p.copy() for p in params]

            async def numpy_inline(x: np.ndarray, y: np.ndarray, head: list[np.ndarray] = head) -> Any:
                return numpy_request(head, x, y)

            modes.append(("numpy per request (on the loop)", numpy_inline, None))
            modes.append((ONE_BLAS_THREAD, numpy_inline, None))
        elif impl == TORCH:
            modes += _torch_modes(params)
    return modes


def _asyncgrad_modes(params: list[np.ndarray], max_rows: int) -> list[tuple[str, Serve, Any]]:
    import asyncgrad as ag
    from asyncgrad import nn, serving
    from asyncgrad.nn import functional as F

    layers: list[Any] = []
    for i in range(len(params) // 2):
        w = params[2 * i]
        lin = nn.Linear(w.shape[1], w.shape[0], dtype=np.float32)
        lin.weight.data[...] = w
        lin.bias.data[...] = params[2 * i + 1]
        layers += [lin, nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    model_params = list(model.parameters())

    async def one_grad(x: np.ndarray, y: np.ndarray) -> Any:
        xt = ag.tensor(x, requires_grad=True)
        loss = F.cross_entropy(model(xt), ag.tensor(y))
        grads = await ag.grad(loss, [xt, *model_params])
        return loss.item(), grads

    def loss_fn(x: Any, y: Any) -> Any:
        return F.cross_entropy(model(x), y, reduction="none")

    plain = serving.GradientBatcher(loss_fn, max_rows=max_rows, max_wait=MAX_WAIT, grad_inputs=(0,))
    per_request = serving.GradientBatcher(loss_fn, max_rows=max_rows, max_wait=MAX_WAIT, grad_inputs=(0,),
                                          accumulate=False, per_request_param_grads=True)
    return [("asyncgrad: one await ag.grad per request", one_grad, None),
            ("asyncgrad: GradientBatcher", plain.submit, plain),
            ("asyncgrad: GradientBatcher, per-request param grads", per_request.submit, per_request)]


def _torch_modes(params: list[np.ndarray]) -> list[tuple[str, Serve, Any]]:
    import torch
    import torch.nn.functional as TF

    tps = nets.torch_params(params)

    def forward(xt: Any) -> Any:
        h = xt
        for i in range(len(tps) // 2):
            h = TF.linear(h, tps[2 * i], tps[2 * i + 1])
            if i < len(tps) // 2 - 1:
                h = torch.relu(h)
        return h

    def torch_one(x: np.ndarray, y: np.ndarray) -> Any:
        xt = torch.from_numpy(x).requires_grad_()
        loss = TF.cross_entropy(forward(xt), torch.from_numpy(y))
        grads = torch.autograd.grad(loss, [xt, *tps])
        return loss.item(), grads

    async def torch_thread(x: np.ndarray, y: np.ndarray) -> Any:
        return await asyncio.to_thread(torch_one, x, y)

    def torch_batch(x: np.ndarray, y: np.ndarray, sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        xt = torch.from_numpy(x).requires_grad_()
        row = TF.cross_entropy(forward(xt), torch.from_numpy(y), reduction="none")
        w = torch.from_numpy(np.repeat([1.0 / n for n in sizes], sizes).astype(np.float32))
        (row * w).sum().backward()
        per = np.add.reduceat(row.detach().numpy(), np.cumsum([0, *sizes[:-1]])) / np.asarray(sizes)
        assert xt.grad is not None
        return per, xt.grad.numpy()

    return [("torch per request (to_thread)", torch_thread, None),
            ("torch batched by hand (to_thread)", TurnBatcher(torch_batch).submit, None)]


async def session(serve: Serve, inputs: list[tuple[np.ndarray, np.ndarray]], requests: int) -> dict[str, float]:
    """Every client's requests, one after another, under a ticker."""
    latencies: list[float] = []
    peak = [rss_bytes()]
    stop = asyncio.Event()

    async def sample_rss() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes())
            await asyncio.sleep(0.005)

    async def client(x: np.ndarray, y: np.ndarray) -> None:
        for _ in range(requests):
            t0 = time.perf_counter()
            await serve(x, y)
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0)  # (a handler returns to the loop between requests, in every way)

    async def all_clients() -> None:
        await asyncio.gather(*(client(x, y) for x, y in inputs))

    sampler = asyncio.get_running_loop().create_task(sample_rss())
    out = await ticked(all_clients)
    stop.set()
    await sampler
    out["requests_per_s"] = len(inputs) * requests / (out["elapsed_ms"] / 1e3)
    out["p50_latency_ms"] = percentile(latencies, 50) * 1e3
    out["p99_latency_ms"] = percentile(latencies, 99) * 1e3
    out["peak_rss_mb"] = peak[0] / 2**20
    return out


def _row(name: str, sessions: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    keys = ("requests_per_s", "p50_latency_ms", "p99_latency_ms", "p99_lag_ms", "peak_rss_mb")
    return {"impl": name, **{k: median([s[k] for s in sessions]) for k in keys}, **extra, "sessions": sessions}


def _setup(clients: int, layers: int, rows: int, width: int) -> tuple[list[np.ndarray], list[tuple[np.ndarray,
                                                                                                  np.ndarray]]]:
    """The MLP's parameters and each client's request."""
    params = _head(nets.make_params(layers, width), width)
    return params, [(nets.make_input(rows, width, seed=100 + i), _labels(rows, 200 + i)) for i in range(clients)]


def _impl_of(way: str) -> str:
    return next(impl for impl in (ASYNCGRAD, TORCH, NUMPY) if way.startswith(impl))


def memory_child(way: str, clients: int, requests: int, layers: int, rows: int, width: int) -> float:
    """Run in a fresh process: the most its resident memory (MB) grows while one session of
    ``way`` runs, after a warm-up session (imports, the kernels, first allocations)."""

    async def main() -> float:
        params, inputs = _setup(clients, layers, rows, width)
        (_, serve, batcher), = [m for m in _modes([_impl_of(way)], params, clients * rows) if m[0] == way]
        if way.startswith(ASYNCGRAD):
            from asyncgrad.ops import kernels

            kernels.wait()
        async with _opened([batcher] if batcher is not None else []):
            with BLAS.limited(1) if way == ONE_BLAS_THREAD else contextlib.nullcontext():
                await session(serve, inputs, 2)
                _zero_grads(batcher)
                gc.collect()
                trim_heap()
                before = rss_bytes()
                s = await session(serve, inputs, requests)
        return s["peak_rss_mb"] - before / 2**20

    return asyncio.run(main())


def measure_memory(way: str, clients: int, requests: int, layers: int, rows: int, width: int) -> float:
    """``memory_child`` in a fresh process (NaN, with the reason on stderr, if it fails)."""
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "bench.workloads.serving", "--memory", way, "--clients", str(clients),
           "--requests", str(requests), "--layers", str(layers), "--rows", str(rows), "--width", str(width)]
    try:
        out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300, check=True)
        return float(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        detail = getattr(e, "stderr", "") or ""
        print(f"serving: memory child for {way!r} failed: {e} {detail[-500:]}", file=sys.stderr)
        return math.nan


def run(impls: list[str], rounds: int | None = None, clients: int = 32, requests: int = 10, layers: int = 4,
        rows: int = 32, width: int = 128, memory: bool = True) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    params, inputs = _setup(clients, layers, rows, width)
    res = Result(
        "serving", f"{clients} clients x {requests} requests of {rows} rows, MLP {layers} layers width {width} "
                   f"-> {CLASSES} classes, per-row cross-entropy; loss, saliency and parameter gradient per request",
        {"clients": clients, "requests_per_client": requests, "layers": layers, "rows": rows, "width": width,
         "max_wait_ms": MAX_WAIT * 1e3, "rounds": rounds},
        [Column("requests_per_s", "requests/s", "{:,.0f}"),
         Column("p50_latency_ms", "p50 latency ms", "{:.2f}"),
         Column("p99_latency_ms", "p99 latency ms", "{:.2f}"),
         Column("p99_lag_ms", "loop p99 lag ms", "{:.2f}"),
         Column("rss_growth_mb", "RSS growth MB", "{:,.1f}"),
         Column("batch_ms", "ms per batch", "{:.2f}")],
    )
    t_start = time.perf_counter()

    from asyncgrad.autograd.runtime.blas import RELAX_SECONDS

    async def main() -> None:
        modes = _modes(impls, params, clients * rows)
        async with _opened([cm for _, _, cm in modes if cm is not None]):
            by_mode: dict[str, list[dict[str, float]]] = {}
            for name, serve, _ in modes:
                BLAS.enter(name)
                with BLAS.limited(1) if name == ONE_BLAS_THREAD else contextlib.nullcontext():
                    # warm-up at the measured size: a batcher's first batch of all the clients'
                    # requests faults in its arrays (~1,300 page faults), which a warm-up of a
                    # few clients left to the first measured session
                    await session(serve, inputs, 2)
                BLAS.leave(name)
                by_mode[name] = []
            batches = {name: 0 for name, _, _ in modes}
            for i in range(rounds):  # interleaved, the order rotating
                k = i % len(modes) if modes else 0
                for name, serve, cm in modes[k:] + modes[:k]:
                    BLAS.enter(name)
                    # longer than the engine's BLAS hysteresis: each way is measured in its own
                    # steady state, not in the one the previous way left (32 backward calls in
                    # flight keep BLAS single-threaded for RELAX_SECONDS after they end)
                    await asyncio.sleep(max(SETTLE, RELAX_SECONDS + 0.1))
                    before = cm.statistics().batches if cm is not None else 0
                    with BLAS.limited(1) if name == ONE_BLAS_THREAD else contextlib.nullcontext():
                        s = await session(serve, inputs, requests)
                    if cm is not None:
                        s["batches"] = cm.statistics().batches - before
                        s["batch_ms"] = s["elapsed_ms"] / max(1, s["batches"])
                        batches[name] += int(s["batches"])
                    by_mode[name].append(s)
                    BLAS.leave(name)
                    _zero_grads(cm)
            for name, sessions in by_mode.items():
                extra = {"batch_ms": median([s["batch_ms"] for s in sessions])} if "batch_ms" in sessions[0] else {}
                if memory:
                    extra["rss_growth_mb"] = measure_memory(name, clients, requests, layers, rows, width)
                res.rows.append(_row(name, sessions, **extra))

    asyncio.run(main())
    res.notes.append(BLAS.describe())
    res.seconds = time.perf_counter() - t_start
    one = res.value("asyncgrad: one await ag.grad per request", "requests_per_s")
    plain = res.value("asyncgrad: GradientBatcher", "requests_per_s")
    per = res.value("asyncgrad: GradientBatcher, per-request param grads", "requests_per_s")
    floor = max(res.value("numpy per request (on the loop)", "requests_per_s"),
                res.value(ONE_BLAS_THREAD, "requests_per_s"))  # (the faster of the two floors)
    res.add_ratio("batcher/one ag.grad per request", plain, one)
    res.add_ratio("batcher/numpy per request (the faster floor)", plain, floor)
    res.add_ratio("batcher/torch per request (to_thread)", plain, res.value("torch per request (to_thread)",
                                                                              "requests_per_s"))
    res.add_ratio("batcher/torch batched by hand", plain, res.value("torch batched by hand (to_thread)",
                                                                      "requests_per_s"))
    res.add_ratio("per-request param grads time/batcher time", plain, per)
    row = res.row("asyncgrad: GradientBatcher")
    if row is not None:
        res.targets.append(Target("serving: batcher >= 3x one ag.grad per request", plain / one, 3.0, "x",
                                  at_least=True))
        if floor == floor:
            res.targets.append(Target("serving: batcher >= 1.0x numpy per request", plain / floor, 1.0, "x",
                                      at_least=True))
        res.targets.append(Target("serving: batcher loop p99 lag <= 5 ms", row["p99_lag_ms"], 5.0, "ms"))
        res.targets.append(Target("serving: per-request param grads <= 2x batcher time", plain / per, 2.0, "x"))
        bound = MAX_WAIT * 1e3 + 2 * row["batch_ms"]
        res.targets.append(Target(f"serving: batcher p99 latency <= max_wait + 2 batches ({bound:.1f} ms)",
                                  row["p99_latency_ms"], bound, "ms"))
    return res


class _opened:
    """Enter every batcher for the whole run (one task: anyio's task groups want that)."""

    def __init__(self, batchers: list[Any]) -> None:
        self.batchers = batchers

    async def __aenter__(self) -> None:
        for b in self.batchers:
            await b.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        for b in reversed(self.batchers):
            await b.__aexit__(*exc)


def _zero_grads(batcher: Any) -> None:
    if batcher is not None:
        for p in batcher.params:
            p.grad = None


def _main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--memory", required=True, metavar="WAY")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--width", type=int, default=128)
    a = p.parse_args()
    print(json.dumps(memory_child(a.memory, a.clients, a.requests, a.layers, a.rows, a.width)))


if __name__ == "__main__":
    _main()
