"""``GradientBatcher``: requests in, one pass per batch, each request answered as if alone."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from ..tensor import Tensor
from .batched_pass import BatchedPass
from .isolation import serve_batch
from .queue import RequestQueue
from .requests import DoneEvent, FutureEvent, GradientResult, Request, Signature, batch_key
from .statistics import BatcherStatistics, Counters


class GradientBatcher:
    """Batch concurrent gradient requests into one forward and one backward pass.

    ``loss_fn(*batched)`` gets each argument of a batch's requests concatenated along
    dim 0 (Tensors; those whose index is in ``grad_inputs`` require grad) and returns a
    Tensor of per-row losses of shape ``(rows,)``; rows of different requests must not
    interact in it. It may be sync or ``async``. Each request's answer (a
    :class:`GradientResult`) equals one backward of its own: its mean loss, the gradients
    of that loss with respect to its own rows, and with ``per_request_param_grads`` its
    own gradient of each parameter (``params``; default: every leaf requiring grad that
    the losses reach, the layers' ones in ``parameters()`` order). With ``accumulate``,
    each parameter's ``.grad`` grows by the gradients of the requests that succeeded, in
    one atomic commit per batch.

    A batch starts when ``max_rows`` rows of one kind (trailing shapes and dtypes) wait,
    or ``max_wait`` seconds after its oldest request arrived; while one batch runs the
    next fills, so at most about ``2 * max_rows`` rows are in flight. Higher ``priority``
    requests are taken first.

    Errors: bad input fails its request alone with ``ValueError`` naming the argument;
    a request at fault inside a pass fails with the pass's exception, or with
    ``FloatingPointError`` (``check_finite``) naming what was not finite, and the others
    are rerun without it. ``submit`` outside ``async with`` raises ``RuntimeError``, and
    leaving the ``async with`` fails the requests still waiting with ``RuntimeError``.

    Cancellation: a request cancelled while it waits leaves the queue; one cancelled while
    its batch runs adds nothing to ``.grad`` (the batch's commit is abandoned and the
    others are rerun), unless its batch had already begun to commit."""

    def __init__(self, loss_fn: Callable[..., Any], *, max_rows: int = 256, max_wait: float = 0.002,
                 grad_inputs: Sequence[int] = (), params: Sequence[Tensor] | None = None, accumulate: bool = True,
                 per_request_param_grads: bool = False, check_finite: bool = True) -> None:
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be a positive int, got {max_rows!r}")
        if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not (
                math.isfinite(max_wait) and max_wait >= 0):
            raise ValueError(f"max_wait must be a finite number of seconds >= 0, got {max_wait!r}")
        grad_inputs = tuple(grad_inputs)
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in grad_inputs):
            raise ValueError(f"grad_inputs must be argument indices (ints >= 0), got {grad_inputs!r}")
        if params is not None:
            params = list(params)
            for i, p in enumerate(params):
                if not isinstance(p, Tensor) or not p.requires_grad:
                    raise ValueError(f"params[{i}] must be a Tensor that requires grad")
        self._signature = Signature(loss_fn, grad_inputs)
        self._queue = RequestQueue(max_rows, float(max_wait))
        self._counters = Counters()
        self._pass = BatchedPass(loss_fn, self._signature, params, accumulate, per_request_param_grads,
                                 check_finite, self._counters)
        self._seq = itertools.count()
        self._open = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._wakeup: DoneEvent | None = None
        self._new_event: Callable[[], DoneEvent] = anyio.Event
        self._clock: Callable[[], float] = anyio.current_time

    @property
    def params(self) -> tuple[Tensor, ...]:
        """The parameters, in ``r.param_grads`` order (with ``params=None``: those the
        batches so far have reached)."""
        return tuple(self._pass.params)

    def statistics(self) -> BatcherStatistics:
        """A snapshot of the counters (see :class:`BatcherStatistics`)."""
        return self._counters.snapshot()

    async def __aenter__(self) -> GradientBatcher:
        if self._open or self._task_group is not None:
            raise RuntimeError("this GradientBatcher is already open")
        # one event per request: on asyncio one bare future (FutureEvent), else made by
        # the running backend's Event class directly (``anyio.Event()`` looks the backend
        # up on every call)
        self._new_event = _request_event(type(anyio.Event()))
        self._wakeup = self._new_event()
        self._clock = _backend_clock()
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._open = True
        self._task_group.start_soon(self._serve)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        self._open = False
        for r in self._queue.drain():
            self._counters.failed += 1
            r.fail(RuntimeError("the GradientBatcher was closed before this request's batch started"))
        assert self._task_group is not None and self._wakeup is not None
        self._wakeup.set()
        if exc is not None:
            self._task_group.cancel_scope.cancel()
        try:
            return await self._task_group.__aexit__(exc_type, exc, tb)
        finally:
            self._task_group = None
            self._pass.close()

    async def submit(self, *arrays: Any, priority: float = 0) -> GradientResult:
        """One request: its rows of each argument of ``loss_fn``; returns its answer.

        Errors: ``ValueError`` for bad input (before it joins a batch); the pass's own
        exception or ``FloatingPointError`` if this request is at fault in its pass;
        ``RuntimeError`` outside ``async with`` or if the batcher closes first.
        Cancellation: withdraws the request (see the class docstring)."""
        if not self._open:
            raise RuntimeError("GradientBatcher.submit() outside `async with GradientBatcher(...)`")
        if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not math.isfinite(priority):
            self._counters.failed += 1
            raise ValueError(f"priority must be a finite number, got {priority!r}")
        try:
            checked = self._signature.check(arrays)
        except ValueError:
            self._counters.failed += 1
            raise
        r = Request(checked, priority, next(self._seq), self._clock(), checked[0].shape[0], batch_key(checked),
                    self._new_event())
        self._counters.requests += 1
        if self._queue.push(r):
            assert self._wakeup is not None
            self._wakeup.set()
        try:
            await r.done.wait()
        except BaseException:
            if r.state != "done":  # withdrawn: out of the queue, or out of its batch's commit
                r.withdrawn = True
                self._counters.cancelled += 1
                if r.state == "waiting":
                    self._queue.remove(r)
                else:
                    self._pass.withdraw(r)
            raise
        if r.error is not None:
            raise r.error
        assert r.result is not None
        return r.result

    async def _serve(self) -> None:
        """Form batches and run them, one at a time, until closed and empty."""
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            self._counters.batches += 1
            self._counters.rows += sum(r.rows for r in batch)
            for r in batch:
                r.state = "running"
            try:
                await serve_batch(self._pass.run, batch, self._counters)
            finally:
                for r in batch:  # (the batcher was cancelled while the batch ran)
                    if r.state != "done":
                        r.fail(RuntimeError("the GradientBatcher was closed while this request's batch ran"))

    async def _next_batch(self) -> list[Request] | None:
        while True:
            if not self._open and not len(self._queue):
                return None
            now = self._clock()
            deadline = self._queue.deadline()
            if deadline <= now:
                return self._queue.take()
            self._wakeup = self._new_event()
            with anyio.move_on_after(deadline - now):
                await self._wakeup.wait()


def _request_event(backend_event: Callable[[], DoneEvent]) -> Callable[[], DoneEvent]:
    """What makes a request's done event on the running backend."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # (trio)
        return backend_event
    return lambda: FutureEvent(loop)


def _backend_clock() -> Callable[[], float]:
    """``anyio.current_time`` of the running backend without its per-call look-up of the
    backend (anyio >= 4.11 names it); the same clock, so a test's mock clock still rules."""
    token = getattr(anyio.lowlevel, "current_token", None)
    if token is None:
        return anyio.current_time
    clock: Callable[[], float] = token().backend_class.current_time
    return clock
