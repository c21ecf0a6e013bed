"""Awaitable collectives for users: ``all_reduce``, ``broadcast``, ``barrier``, and
``rank`` / ``world_size``. Each runs on the communication thread (Note [One
communication thread]) on a communicator of its own, so it never matches DDP traffic.
Every rank must call the same collectives in the same order, as with MPI."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import grad_mode
from ..creation import from_numpy
from ..tensor import Tensor
from ._runtime import runtime
from ._wakeup import wait_future

_OPS = ("sum", "mean", "max", "min")


def rank() -> int:
    """This process's rank in ``COMM_WORLD`` (0 when not launched by ``mpiexec``)."""
    return runtime().rank


def world_size() -> int:
    """The number of processes in ``COMM_WORLD`` (1 when not launched by ``mpiexec``)."""
    return runtime().size


def _check_tensor(t: Any, fn: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn} expects an asyncgrad Tensor, got {type(t).__name__}")
    return t


async def all_reduce(t: Tensor, op: str = "sum") -> None:
    """Reduce ``t`` over every rank with ``op`` ("sum", "mean", "max" or "min") and
    write the result into ``t`` in place on every rank (its version is bumped).

    Cancellation: ``t`` is left unchanged; the collective itself still completes in the
    background (an MPI collective cannot be withdrawn), so every rank stays in step.

    Errors: ``TypeError`` for a non-Tensor, ``ValueError`` for an unknown ``op``; both
    before any communication."""
    _check_tensor(t, "all_reduce")
    if op not in _OPS:
        raise ValueError(f"all_reduce: unknown op {op!r}; expected one of {', '.join(map(repr, _OPS))}")
    rt = runtime()
    buf = np.array(t.numpy(), copy=True, order="C")  # private: t changes only on success
    mpi_op = {"sum": rt.MPI.SUM, "mean": rt.MPI.SUM, "max": rt.MPI.MAX, "min": rt.MPI.MIN}[op]
    await wait_future(rt.comm_thread.submit(lambda: rt.comm.Iallreduce(rt.MPI.IN_PLACE, buf, op=mpi_op)))
    if op == "mean":
        buf = buf / rt.size if np.issubdtype(buf.dtype, np.floating) else buf // rt.size
    _write(t, buf)


async def broadcast(t: Tensor, src: int = 0) -> None:
    """Copy rank ``src``'s ``t`` into ``t`` on every other rank, in place.

    Cancellation: as ``all_reduce``: ``t`` is unchanged, the collective completes.

    Errors: ``TypeError`` for a non-Tensor, ``ValueError`` for a ``src`` that is not a
    rank; both before any communication."""
    _check_tensor(t, "broadcast")
    rt = runtime()
    if not isinstance(src, int) or not 0 <= src < rt.size:
        raise ValueError(f"broadcast: src={src!r} is not a rank (world size {rt.size})")
    buf = np.array(t.numpy(), copy=True, order="C")
    await wait_future(rt.comm_thread.submit(lambda: rt.comm.Ibcast(buf, root=src)))
    if rt.rank != src:
        _write(t, buf)


async def barrier() -> None:
    """Return once every rank has called ``barrier``.

    Cancellation: the wait ends; this rank's arrival still counts for the others.

    Errors: none of its own; an MPI error propagates."""
    rt = runtime()
    await wait_future(rt.comm_thread.submit(rt.comm.Ibarrier))


def _write(t: Tensor, buf: np.ndarray) -> None:
    with grad_mode.no_grad():  # a collective is not recorded, as in torch.distributed
        t.copy_(from_numpy(buf))
