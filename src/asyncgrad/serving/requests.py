"""One request: its checked arrays, where it is in its life, and its answer.

Validation happens here, before a request joins a batch, so bad input fails alone
(``ValueError`` naming the argument) and never reaches a pass."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..tensor import Tensor

NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integers, floating point


@dataclass(frozen=True)
class GradientResult:
    """One request's answer, equal to what one backward of its own would give.

    ``loss``: the mean of its rows' losses; ``input_grads``: the gradients of that loss
    with respect to its own rows of each argument named in ``grad_inputs``;
    ``param_grads``: its own gradient of each parameter (``per_request_param_grads``),
    else None; ``rows``: its number of rows."""

    loss: float
    input_grads: tuple[np.ndarray, ...]
    param_grads: tuple[np.ndarray, ...] | None
    rows: int


class DoneEvent(Protocol):
    """What a request's waiter waits on: anyio's Event, or a ``FutureEvent``."""

    def set(self) -> None: ...

    async def wait(self) -> Any: ...


class FutureEvent:
    """On asyncio, a request's done event as one bare future: its waiter awaits the
    future itself, where an anyio Event wraps an asyncio Event whose ``wait`` makes a
    future of its own and whose ``set`` walks a list of them (every request makes one,
    waits on it and is woken by it, on the loop, with the whole batch waiting behind).
    A waiter cancelled meanwhile cancels the future; ``set`` is then a no-op."""

    __slots__ = ("_future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    async def wait(self) -> None:
        await self._future


@dataclass(eq=False, slots=True)
class Request:
    """A request in the batcher. ``state`` goes waiting -> running -> done; a request
    whose caller was cancelled is ``withdrawn`` (it leaves the queue, or is left out of
    its batch's commit and rerun). ``done`` is set when it has its answer or its error."""

    arrays: tuple[np.ndarray, ...]
    priority: float
    seq: int  # arrival order, for ties in priority
    arrived: float  # anyio.current_time() at submit
    rows: int
    key: tuple[Any, ...]  # the batch it may join: trailing shapes and dtypes
    done: DoneEvent
    state: str = "waiting"
    withdrawn: bool = False
    result: GradientResult | None = None
    error: BaseException | None = None

    def answer(self, result: GradientResult) -> None:
        if self.state != "done":
            self.result, self.state = result, "done"
            self.done.set()

    def fail(self, error: BaseException) -> None:
        if self.state != "done":
            self.error, self.state = error, "done"
            self.done.set()


class Signature:
    """How many arrays ``loss_fn`` takes, and their names for error messages."""

    def __init__(self, loss_fn: Callable[..., Any], grad_inputs: Sequence[int]) -> None:
        self.grad_inputs = tuple(grad_inputs)
        self.names: list[str] = []
        self.fixed: int | None = None  # the number of arrays, when the signature says it
        try:
            sig = inspect.signature(loss_fn)
        except (TypeError, ValueError):
            return
        params = list(sig.parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            self.names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            return
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        self.names = [p.name for p in positional]
        if len(required) == len(positional):
            self.fixed = len(positional)

    def name(self, i: int) -> str:
        return f"argument {i} ({self.names[i]})" if i < len(self.names) else f"argument {i}"

    def check(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The arrays of one request as numpy arrays, or ``ValueError`` naming what is
        wrong: their number, an argument without rows, different row counts, an array
        that is not numeric (or not floating point where ``grad_inputs`` names it)."""
        if self.fixed is not None and len(arrays) != self.fixed:
            names = ", ".join(self.names)
            raise ValueError(f"loss_fn takes {self.fixed} arrays ({names}), got {len(arrays)}")
        if not arrays:
            raise ValueError("a request needs at least one array")
        missing = [i for i in self.grad_inputs if i >= len(arrays)]
        if missing:
            raise ValueError(f"grad_inputs names argument {missing[0]}, but the request has {len(arrays)} arrays")
        out: list[np.ndarray] = []
        for i, a in enumerate(arrays):
            if type(a) is np.ndarray:  # (the common case: nothing to convert)
                arr = a
            else:
                try:
                    arr = np.asarray(a.data if isinstance(a, Tensor) else a)
                except Exception as e:  # (ragged lists and the like)
                    raise ValueError(f"{self.name(i)} is not an array: {e}") from None
            kind = arr.dtype.kind
            if kind not in NUMERIC_KINDS:
                raise ValueError(f"{self.name(i)} is not a numeric array (dtype {arr.dtype})")
            if kind != "f" and i in self.grad_inputs:
                raise ValueError(f"{self.name(i)} is in grad_inputs, so it must be floating point, "
                                 f"got dtype {arr.dtype}")
            shape = arr.shape
            if not shape or shape[0] == 0:
                raise ValueError(f"{self.name(i)} has no rows (shape {shape})")
            if out and shape[0] != out[0].shape[0]:
                raise ValueError(f"{self.name(i)} has {shape[0]} rows, but {self.name(0)} has "
                                 f"{out[0].shape[0]}")
            out.append(arr)
        return tuple(out)


def batch_key(arrays: Sequence[np.ndarray]) -> tuple[Any, ...]:
    """Requests with the same key can be concatenated along dim 0."""
    return tuple([(a.shape[1:], a.dtype) for a in arrays])
