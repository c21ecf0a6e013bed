"""An async web service that computes gradients per request, with FastAPI and uvicorn.

    pip install "asyncgrad[examples]"
    python examples/train_digits.py --save digits.npz          # optional: trained weights
    python examples/async_service/app.py --weights digits.npz --port 8000
    python examples/async_service/load.py --url http://127.0.0.1:8000

Endpoints (inputs are 8x8 digit images flattened to 64 floats in [0, 1]):

* ``POST /explain {"x": [...64], "target": 3?}`` — the model's prediction and a
  *saliency map*: the gradient of the target class's logit (default: the predicted
  class) with respect to the input, from ``await ag.grad(score, [x])``.
* ``POST /learn {"x": [...64], "label": 3, "timeout": 0.5?}`` — one online-learning step:
  ``await ag.backward(loss)`` accumulates the example's gradient into the shared
  parameters' ``.grad``, then an optimizer step applies everything accumulated so far
  (requests in flight together are applied together, as a mini-batch). When the request
  exceeds its timeout, ``anyio.fail_after`` cancels its backward: asyncgrad leaves every
  ``.grad`` exactly as it was, so the parameters never see that example (HTTP 504).
* ``GET /healthz`` — answers at once, also while heavy backward calls run (large kernels
  run on worker threads, so the event loop stays free).
* ``GET /stats`` — steps taken, examples applied, timeouts, a parameter checksum and the
  engine's statistics.

Concurrency: many requests run their forward and backward at once on the shared model.
An optimizer step changes the parameters in place, which would invalidate the saved
tensors of backward calls still running, so a small readers-writer lock lets any number
of forward+backward passes (readers) run together and gives the optimizer step (the
writer) exclusive access between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.nn import functional as F

N_FEATURES, N_CLASSES = 64, 10
OFFLOAD_STEP_ABOVE = 1 << 18  # parameters; smaller models step inline (a thread hop costs more)


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


class ExplainRequest(BaseModel):
    x: list[float] = Field(min_length=N_FEATURES, max_length=N_FEATURES)
    target: int | None = Field(default=None, ge=0, lt=N_CLASSES)


class LearnRequest(BaseModel):
    x: list[float] = Field(min_length=N_FEATURES, max_length=N_FEATURES)
    label: int = Field(ge=0, lt=N_CLASSES)
    timeout: float | None = Field(default=None, gt=0, description="seconds; default: the server's")


@dataclasses.dataclass
class ServiceState:
    model: nn.Module
    optimizer: ag.optim.Optimizer
    learn_timeout: float
    lock: ReadWriteLock = dataclasses.field(default_factory=ReadWriteLock)
    pending: int = 0  # examples whose gradients sit in .grad, not yet applied
    steps: int = 0
    applied: int = 0
    timeouts: int = 0
    in_flight: int = 0

    def checksum(self) -> float:
        return float(sum(np.float64(p.numpy().astype(np.float64).sum()) for p in self.model.parameters()))


def create_app(weights: str | None = None, *, hidden: int = 128, lr: float = 1e-3,
               learn_timeout: float = 2.0, seed: int = 0) -> FastAPI:
    """The service around a fresh (or loaded) model; ``uvicorn --factory`` can call this."""
    ag.manual_seed(seed)
    model = make_model(hidden)
    if weights:
        model.load(weights)
    model.eval()
    state = ServiceState(model, ag.optim.Adam(model.parameters(), lr=lr), learn_timeout)
    n_params = sum(p.numel() for p in model.parameters())
    app = FastAPI(title="asyncgrad service", description=__doc__)
    app.state.service = state

    def as_input(values: list[float], requires_grad: bool = False) -> ag.Tensor:
        return ag.tensor(np.asarray(values, dtype=np.float32)[None, :], requires_grad=requires_grad)

    def apply_step(pending: int) -> None:
        with ag.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.grad = p.grad * (1.0 / pending)  # the mean over the examples
        state.optimizer.step()
        state.optimizer.zero_grad()

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "in_flight": state.in_flight}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {
            "steps": state.steps, "applied": state.applied, "pending": state.pending,
            "timeouts": state.timeouts, "in_flight": state.in_flight, "param_checksum": state.checksum(),
            "engine": dataclasses.asdict(ag.autograd.get_engine().statistics()),
        }

    @app.post("/explain")
    async def explain(req: ExplainRequest) -> dict[str, Any]:
        x = as_input(req.x, requires_grad=True)
        state.in_flight += 1
        try:
            async with state.lock.read():
                logits = model(x)
                target = int(logits.numpy().argmax()) if req.target is None else req.target
                score = logits[0, target]
                (saliency,) = await ag.grad(score, [x])
        finally:
            state.in_flight -= 1
        assert saliency is not None
        probs = F.softmax(logits.detach(), 1).numpy()[0]
        return {"prediction": int(probs.argmax()), "target": target, "score": score.item(),
                "probabilities": probs.tolist(), "saliency": saliency.numpy()[0].tolist()}

    @app.post("/learn")
    async def learn(req: LearnRequest) -> dict[str, Any]:
        x = as_input(req.x)
        timeout = req.timeout if req.timeout is not None else state.learn_timeout
        committed = False
        loss_value = math.nan
        state.in_flight += 1
        try:
            with anyio.fail_after(timeout):
                async with state.lock.read():
                    loss = F.cross_entropy(model(x), ag.tensor([req.label]))
                    # Cancellation: if the timeout fires here, the backward stops and no
                    # .grad changes, so this example never reaches the parameters.
                    await ag.backward(loss)
                    committed = True  # set with no await after the commit: counted exactly once
                    state.pending += 1
                    loss_value = loss.item()
        except TimeoutError:
            if not committed:
                state.timeouts += 1
                raise HTTPException(504, detail=f"backward cancelled after {timeout} s; parameters untouched") from None
        finally:
            state.in_flight -= 1
        async with state.lock.write():  # no forward or backward is running now
            if state.pending:
                with anyio.CancelScope(shield=True):  # a step, once started, completes
                    if n_params >= OFFLOAD_STEP_ABOVE:
                        # a large model's step takes a while: run it on a worker thread so the
                        # loop keeps answering /healthz (the write lock keeps readers out)
                        await anyio.to_thread.run_sync(apply_step, state.pending)
                    else:
                        apply_step(state.pending)
                    state.applied += state.pending
                    state.pending = 0
                    state.steps += 1
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
    args = p.parse_args(argv)
    app = create_app(args.weights, hidden=args.hidden, lr=args.lr, learn_timeout=args.learn_timeout)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
