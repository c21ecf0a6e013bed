"""A CNN saliency service end to end: a small CNN, a plain-anyio HTTP server that explains
each request with ``ag.attribution`` (saliency, SmoothGrad, Integrated Gradients, Grad-CAM),
per-request timeouts that cancel the backward, and a CapacityLimiter bounding memory.

    python examples/saliency_service.py                      # train, serve, run the demo client, exit
    python examples/saliency_service.py --backend trio
    python examples/saliency_service.py --serve --port 8000  # keep serving; then, e.g.:
    curl -s localhost:8000/explain -d '{"image": [[0, ...12 rows of 12...]], "method": "grad_cam"}'

The task: 12x12 grayscale images of noise with one bright pattern of 4-5 pixels anywhere
(a horizontal bar, a vertical bar, a diagonal, a plus); the class is the pattern. A model
that learned it should attribute its answer to the pattern, and the demo checks that it
does: the largest cell of each map lies on the pattern or next to it.

Endpoints:

* ``POST /explain {"image": 12x12 numbers, "method": "saliency" | "smoothgrad" |
  "integrated_gradients" | "grad_cam", "target": int?, "timeout": seconds?, "n_steps": int?,
  "nt_samples": int?}`` -> ``{"prediction", "target", "method", "attributions": 12x12}``
  (``n_steps`` and ``nt_samples`` at most ``MAX_COPIES``).
  A bad body or argument is answered 400 with the library's message (its ``ValueError``
  names the argument); a request over its timeout 504.
* ``GET /stats`` -> the engine's statistics and the limiter's state.

Memory: a request's perturbed copies (``nt_samples`` or ``n_steps`` per image) go through
the model ``INTERNAL_BATCH`` rows at a time, and at most ``--concurrent`` requests compute
at once (``anyio.CapacityLimiter``); the others wait their turn, still under their
timeouts. So the activations held at any moment are bounded by
``concurrent * INTERNAL_BATCH`` rows, however many requests arrive or how many steps they ask for.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from typing import Any

import anyio
import numpy as np
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.nn import functional as F

SIDE, CLASSES = 12, 4
INTERNAL_BATCH = 64  # perturbed copies per forward and backward
MAX_BODY = 1 << 16
MAX_COPIES = 4096  # n_steps, nt_samples: the work one request may ask for
METHODS = ("saliency", "smoothgrad", "integrated_gradients", "grad_cam")


# --- the model -------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """conv, ReLU, 2x2 average pool, conv, ReLU, global average pool, linear: the global
    pool is what Grad-CAM's spatial mean of the gradients presumes (see the guide)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, CLASSES)

    @property
    def last_conv_block(self) -> nn.Module:
        return self.features[4]  # the ReLU after the last convolution: Grad-CAM's usual layer

    def forward(self, x: ag.Tensor) -> ag.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


SHAPES = {  # the classes: a bright pattern of 4 or 5 pixels, anywhere on the image
    "horizontal bar": [(0, 0), (0, 1), (0, 2), (0, 3)],
    "vertical bar": [(0, 0), (1, 0), (2, 0), (3, 0)],
    "diagonal": [(0, 0), (1, 1), (2, 2), (3, 3)],
    "plus": [(0, 1), (1, 0), (1, 1), (1, 2), (2, 1)],
}


def make_images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noise with one bright pattern at a random place; the label is the pattern's class.
    Also a mask of the pattern's pixels and their neighbours (where an explanation should point)."""
    labels = rng.integers(0, CLASSES, n)
    images = rng.normal(0, 0.1, (n, 1, SIDE, SIDE))
    near = np.zeros((n, SIDE, SIDE), dtype=bool)
    for image, mask, label in zip(images, near, labels):
        cells = np.array(list(SHAPES.values())[label])
        top, left = rng.integers(1, SIDE - 1 - cells.max(0))
        for r, c in cells + (top, left):
            image[0, r, c] += 1.0
            mask[r - 1:r + 2, c - 1:c + 2] = True
    return images, labels, near


async def train(model: SmallCNN, steps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    opt = ag.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        images, labels, _ = make_images(32, rng)
        loss = F.cross_entropy(model(ag.tensor(images)), ag.tensor(labels))
        opt.zero_grad()
        await ag.backward(loss)
        opt.step()
    images, labels, _ = make_images(256, rng)
    with ag.no_grad():
        predictions = model(ag.tensor(images)).numpy().argmax(1)
    return float((predictions == labels).mean())


# --- explaining one request --------------------------------------------------------------------

class BadRequest(Exception):
    pass


class Explainer:
    """Runs the attribution methods on the shared model, at most ``concurrent`` at once."""

    def __init__(self, model: SmallCNN, concurrent: int) -> None:
        self.model = model
        self.limiter = anyio.CapacityLimiter(concurrent)
        self.timeouts = 0

    async def explain(self, body: dict[str, Any]) -> dict[str, Any]:
        image = np.asarray(body.get("image"), dtype=object)
        if image.shape != (SIDE, SIDE) or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                                 and math.isfinite(v) for v in image.flat):
            raise BadRequest(f"image must be {SIDE}x{SIDE} finite numbers")
        x = ag.tensor(image.astype(np.float64)[None, None])
        method = body.get("method", "saliency")
        if method not in METHODS:
            raise BadRequest(f"method must be one of {', '.join(METHODS)}")
        with ag.no_grad():
            prediction = int(self.model(x).numpy().argmax())
        target = body.get("target", prediction)
        for name in ("n_steps", "nt_samples"):
            value = body.get(name, 32)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COPIES:
                raise BadRequest(f"{name} must be an int in [1, {MAX_COPIES}]")
        timeout = body.get("timeout", 10.0)
        if not isinstance(timeout, int | float) or not 0 < timeout <= 60:
            raise BadRequest("timeout must be a number of seconds in (0, 60]")
        with anyio.fail_after(timeout):  # TimeoutError: the wait or the backward cancelled
            async with self.limiter:  # the memory bound: at most `concurrent` requests compute
                attributions = await self._attribute(method, x, target, body)
        return {"prediction": prediction, "target": target, "method": method,
                "attributions": attributions.numpy()[0, 0].round(6).tolist()}

    async def _attribute(self, method: str, x: ag.Tensor, target: Any, body: dict[str, Any]) -> ag.Tensor:
        m = self.model
        if method == "saliency":
            return await ag.attribution.saliency(m, x, target)
        if method == "smoothgrad":
            return await ag.attribution.smoothgrad(m, x, target, nt_samples=body.get("nt_samples", 32),
                                                   stdevs=0.15, internal_batch_size=INTERNAL_BATCH)
        if method == "integrated_gradients":
            return await ag.attribution.integrated_gradients(m, x, target=target, n_steps=body.get("n_steps", 32),
                                                             internal_batch_size=INTERNAL_BATCH)
        return await ag.attribution.grad_cam(m, m.last_conv_block, x, target, upsample_to_input=True)

    def stats(self) -> dict[str, Any]:
        s = ag.autograd.get_engine().statistics()
        return {"backwards_started": s.graph_tasks_started, "backwards_cancelled": s.graph_tasks_cancelled,
                "backwards_running": s.graph_tasks_running, "timeouts": self.timeouts,
                "computing": self.limiter.borrowed_tokens, "waiting": self.limiter.statistics().tasks_waiting}


# --- HTTP on anyio streams ---------------------------------------------------------------------

def response(status: int, payload: dict[str, Any]) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large",
              500: "Internal Server Error", 504: "Gateway Timeout"}[status]
    body = json.dumps(payload).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


async def handle(explainer: Explainer, stream: SocketStream) -> None:
    async with stream:
        reader = BufferedByteReceiveStream(stream)
        try:
            head = (await reader.receive_until(b"\r\n\r\n", 8192)).decode("latin-1")
        except (anyio.IncompleteRead, anyio.DelimiterNotFound, anyio.EndOfStream):
            return
        request_line, *header_lines = head.split("\r\n")
        verb, path, *_ = (request_line.split(" ") + ["", ""])[:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        await stream.send(await route(explainer, reader, verb, path, headers))


async def route(explainer: Explainer, reader: BufferedByteReceiveStream, verb: str, path: str,
                headers: dict[str, str]) -> bytes:
    if verb == "GET" and path == "/stats":
        return response(200, explainer.stats())
    if verb != "POST" or path != "/explain":
        return response(404, {"error": f"no {verb} {path}"})
    length = headers.get("content-length", "")
    if not length.isdigit():
        return response(400, {"error": "Content-Length required"})
    if int(length) > MAX_BODY:
        return response(413, {"error": f"body over {MAX_BODY} bytes"})
    try:
        body = json.loads(await reader.receive_exactly(int(length)))
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return response(200, await explainer.explain(body))
    except (BadRequest, json.JSONDecodeError, UnicodeDecodeError) as e:
        return response(400, {"error": str(e)})
    except ValueError as e:  # ag.attribution's: it names the bad argument (e.g. target out of range)
        return response(400, {"error": str(e)})
    except TimeoutError:
        explainer.timeouts += 1
        return response(504, {"error": "the request's timeout expired: its wait or its backward was cancelled"})
    except Exception as e:  # anything else is this request's failure, not the server's
        logging.getLogger("saliency_service").exception("request failed")
        return response(500, {"error": type(e).__name__})


# --- a demo client -----------------------------------------------------------------------------

async def post(port: int, path: str, payload: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    body = json.dumps(payload).encode() if payload is not None else b""
    verb = "POST" if payload is not None else "GET"
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(f"{verb} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n"
                          .encode() + body)
        reader = BufferedByteReceiveStream(stream)
        head = (await reader.receive_until(b"\r\n\r\n", 8192)).decode()
        length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
        return int(head.split(" ")[1]), json.loads(await reader.receive_exactly(length))


async def demo(port: int, explainer: Explainer) -> None:
    rng = np.random.default_rng(1)
    images, labels, near = make_images(8, rng)
    results: dict[tuple[int, str], tuple[int, dict[str, Any], float]] = {}

    async def ask(i: int, method: str) -> None:
        start = time.perf_counter()
        status, reply = await post(port, "/explain", {"image": images[i, 0].tolist(), "method": method})
        results[i, method] = status, reply, time.perf_counter() - start

    async with anyio.create_task_group() as tg:  # 32 requests at once; the limiter lets a few compute
        for i in range(len(images)):
            for method in METHODS:
                tg.start_soon(ask, i, method)
    print(f"{len(results)} requests at once ({len(images)} images x {len(METHODS)} methods), "
          f"{explainer.limiter.total_tokens:g} computing at a time:")
    area = near.mean()  # the share of the image on or next to the patterns
    for method in METHODS:
        replies = [results[i, method] for i in range(len(images))]
        ok = [r for status, r, _ in replies if status == 200]
        right = sum(r["prediction"] == label for r, label in zip(ok, labels))
        maps = [np.abs(np.array(r["attributions"])) for r in ok]
        share = np.mean([m[mask].sum() / m.sum() for m, mask in zip(maps, near)])
        peaks = sum(bool(mask.flat[m.argmax()]) for m, mask in zip(maps, near))
        slowest = max(t for _, _, t in replies)
        print(f"  {method:21s} {len(ok)}/{len(replies)} answered 200, predictions right {right}/{len(ok)}, "
              f"|map| on the pattern {share:.0%} (area {area:.0%}), peak there {peaks}/{len(ok)}, "
              f"slowest {slowest * 1e3:.0f} ms")

    before = explainer.stats()
    status, reply = await post(port, "/explain", {"image": images[0, 0].tolist(), "method": "integrated_gradients",
                                                 "n_steps": 4096, "timeout": 0.02})
    after = explainer.stats()
    print(f"a request over its timeout (IG, 4096 steps, 0.02 s): HTTP {status} ({reply['error']}); "
          f"backwards cancelled: {after['backwards_cancelled'] - before['backwards_cancelled']}, "
          f"running after: {after['backwards_running']}")
    status, reply = await post(port, "/explain", {"image": images[0, 0].tolist(), "method": "saliency"})
    same = np.array_equal(reply["attributions"], results[0, "saliency"][1]["attributions"])
    print(f"the same request after the timeout gives the same map as before: {same}")
    status, reply = await post(port, "/explain", {"image": images[0, 0].tolist(), "method": "grad_cam",
                                                 "target": 7})
    print(f"a bad target: HTTP {status} ({reply['error']})")
    status, reply = await post(port, "/explain", {"image": [[1.0]], "method": "saliency"})
    print(f"a bad image: HTTP {status} ({reply['error']})")
    grads = [p.grad for p in explainer.model.parameters()]
    print(f"parameters' .grad after every request: {'all None' if all(g is None for g in grads) else 'set'}")
    status, stats = await post(port, "/stats")
    print(f"GET /stats: HTTP {status} {stats}")


async def main(args: argparse.Namespace) -> None:
    ag.manual_seed(0)
    ag.set_default_dtype(np.float64)
    model = SmallCNN()
    accuracy = await train(model, args.steps, seed=0)
    model.eval()
    for p in model.parameters():  # the service only reads the weights
        p.grad = None
    print(f"[{args.backend}] trained {args.steps} steps: test accuracy {accuracy:.1%}")
    explainer = Explainer(model, args.concurrent)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=args.port)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        async def serve_one(stream: SocketStream) -> None:
            await handle(explainer, stream)

        tg.start_soon(listener.serve, serve_one)
        if args.serve:
            print(f"serving on http://127.0.0.1:{port} (POST /explain, GET /stats)")
            return
        await demo(port, explainer)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--steps", type=int, default=150, help="training steps before serving")
    parser.add_argument("--concurrent", type=int, default=4, help="requests computing at once (the limiter)")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--serve", action="store_true", help="keep serving instead of running the demo client")
    anyio.run(main, parser.parse_args(), backend=parser.parse_args().backend)
