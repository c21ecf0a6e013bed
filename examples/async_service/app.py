"""An async web service that computes gradients per request, with FastAPI and uvicorn.

    pip install "asyncgrad[examples]"
    python examples/train_digits.py --save digits.npz          # optional: trained weights
    python examples/async_service/app.py --weights digits.npz --port 8000
    python examples/async_service/load.py --url http://127.0.0.1:8000

Endpoints (inputs are 8x8 digit images flattened to 64 floats in [0, 1]):

* ``POST /explain {"x": [...64], "target": 3?}`` — the model's prediction and a
  *saliency map*: the gradient of the target class's logit (default: the predicted
  class) with respect to the input.
* ``POST /saliency {"x": [...64], "target": 3?, "method": "smoothgrad"?, "samples": 16?,
  "noise": 0.1?}`` — the same map by ``"gradient"``, ``"smoothgrad"`` (the mean gradient
  over ``samples`` noisy copies of the input) or ``"integrated_gradients"`` (from a black
  image to the input in ``samples`` steps). The copies are one request of ``samples``
  rows, so they are computed in one pass with the other requests in flight.
* ``POST /learn {"x": [...64], "label": 3, "timeout": 0.5?}`` — one online-learning step:
  the example's own gradient is computed without touching the shared parameters; a
  finite one joins the examples waiting for the next optimizer step (requests in flight
  together are applied together, as a mini-batch). When the request exceeds its timeout,
  ``anyio.fail_after`` cancels it and the example is dropped (HTTP 504). A non-finite
  loss or gradient is refused (HTTP 422); the step itself clips the mean gradient with
  ``clip_grad_norm_(..., error_if_nonfinite=True)``. Either way a bad example never
  reaches the parameters.

Batching: every gradient goes through ``asyncgrad.serving.GradientBatcher`` (one for the
saliency maps, one for ``/learn`` with ``per_request_param_grads=True``): the requests in
flight at the same moment are computed in one forward and one backward, and each is
answered as if it ran alone (docs/guides/serving.md); a request at fault fails alone.
* ``GET /healthz`` — the model's state (parameters finite, steps taken, versions); HTTP
  503 if the parameters ever stopped being finite. It answers at once, also while heavy
  backward calls run (large kernels run on worker threads, so the event loop stays free).
* ``GET /stats`` — steps taken, examples applied and refused, timeouts, a digest of the
  parameters, the batchers' and the engine's statistics.

Bad input: the models are strict (numbers must be JSON numbers in the documented range,
no NaN or infinity, no strings or booleans for numbers, no unknown fields); a body over
``--max-body-bytes`` is answered 413 before it is parsed; error bodies never echo the
input back.

Concurrency: many requests wait for their batch's pass at once on the shared model. An
optimizer step changes the parameters in place, which would invalidate the saved tensors
of a pass still running, so a small readers-writer lock lets any number of requests
(readers, each holding it until its answer) run together and gives the optimizer step
(the writer) exclusive access between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import anyio
import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

import asyncgrad as ag
from asyncgrad import nn, serving
from asyncgrad.nn import functional as F

SERVICE_VERSION = "1.1.0"
N_FEATURES, N_CLASSES = 64, 10
OFFLOAD_STEP_ABOVE = 1 << 18  # parameters; smaller models step inline (a thread hop costs more)
MAX_BODY_BYTES = 16 * 1024  # a 64-float request is ~1.5 KB of JSON
MAX_TIMEOUT = 60.0  # seconds a client may ask /learn to wait
MAX_REPORTED_ERRORS = 8  # 64 bad pixels need not produce 64 error entries
FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_SAMPLES = 64  # noisy copies or steps a /saliency request may ask for
BATCH_ROWS = 512  # rows per pass of the batchers
BATCH_WAIT = 0.002  # seconds a request waits for others to join its pass

log = logging.getLogger("asyncgrad.service")


class ReadWriteLock:
    """Any number of readers at once, or one writer; a waiting writer holds back new
    readers so steps are not starved.

    Cancellation: a task cancelled while waiting does not get the lock; releasing is
    shielded, so a cancelled holder always gives the lock back.
    """

    def __init__(self) -> None:
        self._cond = anyio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        async with self._cond:
            while self._writer or self._writers_waiting:
                await self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                async with self._cond:
                    self._readers -= 1
                    self._cond.notify_all()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        async with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    await self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                async with self._cond:
                    self._writer = False
                    self._cond.notify_all()


def make_model(hidden: int = 128) -> nn.Sequential:
    """The digits MLP of ``examples/train_digits.py`` (same layer names, so its saved
    weights load here); dropout is off in the service (``eval()``)."""
    return nn.Sequential(
        nn.Linear(N_FEATURES, hidden), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(hidden, N_CLASSES),
    )


# --- the request models: strict, so bad input fails here and never reaches the model -----------
def _fits_float32(v: float) -> float:
    # the range below already implies this; kept so a wider range cannot silently overflow
    if abs(v) > FLOAT32_MAX:
        raise ValueError("number overflows float32")
    return v


Pixel = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=True), AfterValidator(_fits_float32)]
ClassIndex = Annotated[int, Field(ge=0, lt=N_CLASSES, strict=True)]
Image = Annotated[list[Pixel], Field(min_length=N_FEATURES, max_length=N_FEATURES)]


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: Image
    target: ClassIndex | None = None


class SaliencyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: Image
    target: ClassIndex | None = None
    method: Literal["gradient", "smoothgrad", "integrated_gradients"] = "smoothgrad"
    samples: Annotated[int, Field(ge=1, le=MAX_SAMPLES, strict=True)] = 16
    noise: Annotated[float, Field(gt=0, le=1.0, allow_inf_nan=False, strict=True)] = 0.1


class LearnRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: Image
    label: ClassIndex
    timeout: Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False, strict=True)] | None = Field(
        default=None, description="seconds; default: the server's")


class BodySizeLimit:
    """ASGI middleware: answer 413 to a request body over ``max_bytes`` before anything
    parses it. A declared ``Content-Length`` is checked without reading the body; a body
    without one (chunked) is read up to the limit, then replayed to the app."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_bytes:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._reject(send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Any) -> None:
        body = f'{{"detail":"request body over {self.max_bytes} bytes"}}'.encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 naming where and what was wrong, never the input itself (FastAPI's default
    echoes it, which for a large body is a large response and can leak what was sent)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    detail = [{"loc": [str(p)[:40] for p in e.get("loc", ())][:4], "type": e.get("type"), "msg": e.get("msg")}
              for e in errors[:MAX_REPORTED_ERRORS]]
    return JSONResponse({"detail": detail, "errors": len(errors)}, status_code=422)


@dataclasses.dataclass
class ServiceState:
    model: nn.Module
    optimizer: ag.optim.Optimizer
    learn_timeout: float
    max_grad_norm: float
    lock: ReadWriteLock = dataclasses.field(default_factory=ReadWriteLock)
    pending: list[np.ndarray] | None = None  # the sum of the gradients waiting for the next step
    n_pending: int = 0
    steps: int = 0
    applied: int = 0
    refused: int = 0  # examples or steps refused for a non-finite loss or gradient
    timeouts: int = 0
    in_flight: int = 0
    params_finite: bool = True
    saliency: serving.GradientBatcher | None = None  # score gradients with respect to the input rows
    examples: serving.GradientBatcher | None = None  # each example's own parameter gradient

    def params(self) -> list[ag.Tensor]:
        return list(self.model.parameters())

    def digest(self) -> str:
        h = hashlib.sha256()
        for p in self.params():
            h.update(np.ascontiguousarray(p.numpy()).tobytes())
        return h.hexdigest()[:16]


def create_app(weights: str | None = None, *, hidden: int = 128, lr: float = 1e-3, learn_timeout: float = 2.0,
               max_grad_norm: float = 10.0, max_body_bytes: int = MAX_BODY_BYTES, seed: int = 0) -> FastAPI:
    """The service around a fresh (or loaded) model; ``uvicorn --factory`` can call this."""
    ag.manual_seed(seed)
    model = make_model(hidden)
    if weights:
        model.load(weights)
    model.eval()
    state = ServiceState(model, ag.optim.Adam(model.parameters(), lr=lr), learn_timeout, max_grad_norm)
    state.params_finite = all(ag.isfinite(p).all().item() for p in state.params())
    n_params = sum(p.numel() for p in model.parameters())

    def scores(x: ag.Tensor, target: ag.Tensor) -> ag.Tensor:
        """Per row: the logit of its target class."""
        logits = model(x)
        return logits[np.arange(len(target.numpy())), target.numpy()]

    def losses(x: ag.Tensor, label: ag.Tensor) -> ag.Tensor:
        return F.cross_entropy(model(x), label, reduction="none")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the batchers run for as long as the app does (their passes are tasks of theirs)
        state.saliency = serving.GradientBatcher(scores, max_rows=BATCH_ROWS, max_wait=BATCH_WAIT, grad_inputs=(0,),
                                                 params=(), accumulate=False)
        state.examples = serving.GradientBatcher(losses, max_rows=BATCH_ROWS, max_wait=BATCH_WAIT,
                                                 params=state.params(), accumulate=False,
                                                 per_request_param_grads=True)
        async with state.saliency, state.examples:
            yield

    app = FastAPI(title="asyncgrad service", version=SERVICE_VERSION, description=__doc__, lifespan=lifespan)
    app.state.service = state
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_exception_handler(RequestValidationError, validation_error)

    dtype = next(iter(model.parameters())).dtype  # float32 unless the default dtype was changed

    def apply_step() -> bool:
        """The mean of the pending gradients, clipped, then one optimizer step; False (and
        no change) when the mean is not finite."""
        assert state.pending is not None
        params = state.params()
        for p, g in zip(params, state.pending):
            p.grad = ag.tensor(g / state.n_pending)
        try:
            nn.utils.clip_grad_norm_(params, state.max_grad_norm, error_if_nonfinite=True)
        except RuntimeError:  # a non-finite norm: refuse the whole step
            return False
        state.optimizer.step()
        return True

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        body = {"status": "ok" if state.params_finite else "unhealthy", "parameters_finite": state.params_finite,
                "steps": state.steps, "in_flight": state.in_flight, "version": SERVICE_VERSION,
                "asyncgrad": ag.__version__}
        return JSONResponse(body, status_code=200 if state.params_finite else 503)

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {
            "steps": state.steps, "applied": state.applied, "pending": state.n_pending, "refused": state.refused,
            "timeouts": state.timeouts, "in_flight": state.in_flight, "parameters_finite": state.params_finite,
            "param_digest": state.digest(),
            "batchers": {name: dataclasses.asdict(b.statistics()) for name, b in
                         (("saliency", state.saliency), ("learn", state.examples)) if b is not None},
            "engine": dataclasses.asdict(ag.autograd.get_engine().statistics()),
        }

    async def saliency_of(rows: np.ndarray, target: int) -> np.ndarray:
        """The gradient of the target's logit with respect to each of ``rows``, computed in
        one pass with the other requests in flight; 500 if it is not finite."""
        assert state.saliency is not None
        state.in_flight += 1
        try:
            async with state.lock.read():
                r = await state.saliency.submit(rows, np.full(len(rows), target))
        except FloatingPointError:
            raise HTTPException(500, detail="the model produced a non-finite output") from None
        finally:
            state.in_flight -= 1
        return r.input_grads[0] * len(rows)  # (the request's loss is the mean over its rows)

    def predict(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with ag.no_grad():
            logits = model(ag.tensor(x))
        if not ag.isfinite(logits).all().item():
            raise HTTPException(500, detail="the model produced a non-finite output")
        return logits.numpy()[0], F.softmax(logits, 1).numpy()[0]

    @app.post("/explain")
    async def explain(req: ExplainRequest) -> dict[str, Any]:
        x = np.asarray(req.x, dtype=dtype)[None, :]
        logits, probs = predict(x)
        target = int(logits.argmax()) if req.target is None else req.target
        saliency = await saliency_of(x, target)
        return {"prediction": int(probs.argmax()), "target": target, "score": float(logits[target]),
                "probabilities": probs.tolist(), "saliency": saliency[0].tolist()}

    @app.post("/saliency")
    async def saliency(req: SaliencyRequest) -> dict[str, Any]:
        x = np.asarray(req.x, dtype=dtype)[None, :]
        logits, probs = predict(x)
        target = int(logits.argmax()) if req.target is None else req.target
        n = 1 if req.method == "gradient" else req.samples
        if req.method == "smoothgrad":  # the mean gradient at noisy copies of x
            rng = np.random.default_rng(int(hashlib.sha256(x.tobytes()).hexdigest()[:8], 16))
            rows = (x + rng.normal(0.0, req.noise, (n, x.shape[1]))).astype(dtype)
            result = (await saliency_of(rows, target)).mean(0)
        elif req.method == "integrated_gradients":  # (x - 0) times the mean gradient on the path 0 -> x
            rows = (x * (np.arange(1, n + 1, dtype=dtype) / n)[:, None]).astype(dtype)
            result = x[0] * (await saliency_of(rows, target)).mean(0)
        else:
            result = (await saliency_of(x, target))[0]
        return {"prediction": int(probs.argmax()), "target": target, "method": req.method, "samples": n,
                "saliency": result.tolist()}

    @app.post("/learn")
    async def learn(req: LearnRequest) -> dict[str, Any]:
        x = np.asarray(req.x, dtype=dtype)[None, :]
        timeout = req.timeout if req.timeout is not None else state.learn_timeout
        assert state.examples is not None
        state.in_flight += 1
        try:
            with anyio.fail_after(timeout):
                async with state.lock.read():
                    # Cancellation: if the timeout fires while this example waits or its pass
                    # runs, it is withdrawn, so it never reaches the parameters.
                    try:
                        r = await state.examples.submit(x, np.array([req.label]))
                    except FloatingPointError as e:  # (check_finite: its loss or its gradient)
                        state.refused += 1
                        what = "loss" if str(e).startswith("loss") else "gradient"
                        raise HTTPException(422, detail=f"non-finite {what}; example refused, parameters "
                                                        f"untouched") from None
                    loss_value = r.loss
                    assert r.param_grads is not None
                    arrays = list(r.param_grads)
                    # no await from here to the end of the block: the example joins exactly once
                    state.pending = arrays if state.pending is None else [s + a for s, a in zip(state.pending, arrays)]
                    state.n_pending += 1
        except TimeoutError:
            state.timeouts += 1
            raise HTTPException(504, detail=f"backward cancelled after {timeout} s; parameters untouched") from None
        finally:
            state.in_flight -= 1
        async with state.lock.write():  # no forward or backward is running now
            if state.n_pending:
                with anyio.CancelScope(shield=True):  # a step, once started, completes
                    if n_params >= OFFLOAD_STEP_ABOVE:
                        # a large model's step takes a while: run it on a worker thread so the
                        # loop keeps answering /healthz (the write lock keeps readers out)
                        stepped = await anyio.to_thread.run_sync(apply_step)
                    else:
                        stepped = apply_step()
                    state.optimizer.zero_grad()
                    if stepped:
                        state.applied += state.n_pending
                        state.steps += 1
                    else:
                        state.refused += state.n_pending
                    state.pending, state.n_pending = None, 0
                    state.params_finite = all(ag.isfinite(p).all().item() for p in state.params())
            step = state.steps
        return {"loss": loss_value, "step": step}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(description="asyncgrad example service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--weights", default=None, help=".npz written by train_digits.py --save")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--learn-timeout", type=float, default=2.0, help="default /learn timeout in seconds")
    p.add_argument("--max-grad-norm", type=float, default=10.0, help="clip each step's mean gradient to this norm")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="larger request bodies get 413")
    args = p.parse_args(argv)
    for name in ("hidden", "lr", "learn_timeout", "max_grad_norm", "max_body_bytes"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            p.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    app = create_app(args.weights, hidden=args.hidden, lr=args.lr, learn_timeout=args.learn_timeout,
                     max_grad_norm=args.max_grad_norm, max_body_bytes=args.max_body_bytes)
    n_params = sum(p.numel() for p in app.state.service.model.parameters())
    model_desc = f"weights {args.weights}" if args.weights else "random weights (--weights loads trained ones)"

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # the socket is bound: say so, once
                log.info("serving on http://%s:%d — %s, %d parameters, asyncgrad %s (service %s)",
                         args.host, args.port, model_desc, n_params, ag.__version__, SERVICE_VERSION)

    Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)).run()


if __name__ == "__main__":
    main()
