"""``DistributedDataParallel``: gradients averaged over MPI ranks during backward, and
committed on every rank or on none.

Note [Round protocol]: one DDP backward is a *round*. Every rank runs the same steps:

1. ``ddp(x)`` adds a zero from a ``_RoundMarker`` node to its output (``out + 0``: same
   values). That node sits on a branch of its own (to a private anchor leaf), so only a
   backward that accumulates through this DDP's forward executes it: ``ag.grad`` and
   ``inputs=`` prune it. It carries a backward start hook
   (``ag.autograd.register_backward_start_hook``).
2. The engine calls that hook when the backward starts, before any of its nodes runs,
   under every form (``await ag.backward``, ``backward_sync``, ``loss.backward()``).
   It opens the round for this GraphTask id and registers the rest of the round with
   the backward: the pre-commit (``queue_pre_commit``) and the abort function
   (``queue_on_abort``).
3. Each parameter's tensor hook records its gradient in the round if the current
   GraphTask is the round's; a full bucket is launched at once, in bucket order, and
   packed, all-reduced and averaged on the communication thread (Note [Buckets], Note
   [One communication thread]). Hooks of other backward calls (a request's own
   ``ag.grad``) find another id and do nothing.
4. If the backward ends without committing (a node raised, the loss's included; a
   pre-commit raised; it was cancelled), the engine runs the abort function, shielded,
   after every node finished: it completes the round's collectives with a "failed"
   vote (step 6), so the other ranks learn about it instead of waiting.
5. The pre-commit fills the slots of parameters that got no gradient with zeros,
   launches the remaining buckets and waits for all of them (``timeout`` per wait).
6. The vote: one tiny all-reduce of a failure flag per rank and a "used" flag per
   parameter. It is shielded from cancellation: once this rank has voted "ok" it commits
   whenever every rank did. If any rank failed, every other rank raises
   ``RemoteBackwardError`` naming them and nothing is committed; otherwise each staged
   gradient is replaced by the average, and a parameter this rank did not use but
   another did gets its average added to the mapping: every average is written by the
   one commit.

A failed or timed-out rank still posts every collective of the round, so all ranks stay
in step and the next round works. Rounds of one DDP never overlap; several forwards
through the DDP in one backward share its round.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import Any

import anyio
import numpy as np

from .. import grad_mode
from ..autograd import (
    current_graph_task_id,
    queue_on_abort,
    queue_pre_commit,
    register_backward_start_hook,
)
from ..autograd.function import Function
from ..creation import from_numpy, zeros, zeros_like
from ..nn import Module
from ..tensor import Tensor
from ._comm import result
from ._runtime import DEFAULT_TIMEOUT, runtime
from ._wakeup import wait_future
from .buckets import Layout
from .errors import DistributedTimeout, RemoteBackwardError
from .rounds import Round

DEFAULT_BUCKET_CAP_MB = 8.0  # 4-8 MB buckets beat PyTorch's 25 MB on the measured machine


class DistributedDataParallel(Module):
    """Wrap ``module`` so that each backward through ``ddp(x)`` averages the gradients of
    its parameters over the ranks of ``comm`` (default ``COMM_WORLD``).

    Wrapping broadcasts rank 0's parameters and buffers (this blocks until every rank
    wrapped, at most ``timeout`` seconds). ``bucket_cap_mb`` bounds the buckets
    (default 8); ``timeout`` (seconds, default 1800) bounds every wait on the other
    ranks during backward: past it, ``DistributedTimeout`` is raised."""

    def __init__(self, module: Module, *, comm: Any = None, bucket_cap_mb: float | None = None,
                 timeout: float | None = None) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps an ag.nn.Module, got {type(module).__name__}")
        cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise ValueError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        wait = DEFAULT_TIMEOUT if timeout is None else timeout
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        rt = runtime()
        if comm is not None and not isinstance(comm, rt.MPI.Intracomm):
            raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
        self.module = module
        self._rt = rt
        self._timeout = float(wait)
        self._comm = rt.comm_thread.call((comm if comm is not None else rt.MPI.COMM_WORLD).Dup, wait)
        self._rank, self._size = rt.comm_thread.call(lambda: (self._comm.Get_rank(), self._comm.Get_size()), wait)
        self._broadcast_state()
        params: list[Tensor] = []
        for p in module.parameters():
            if p.requires_grad and not any(p is q for q in params):
                params.append(p)
        self._layout = Layout(params, int(cap * 2**20))
        self._grad_hooks = [p.register_hook(partial(self._on_grad, i)) for i, p in enumerate(params)]
        self._round: Round | None = None
        self._require_sync = True
        self._unsynced = False  # a backward may have accumulated locally under no_sync
        self._anchors: dict[Any, Tensor] = {}

    # --- public -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; a backward through the result is averaged over ranks."""
        out = self.module(*args, **kwargs)
        if not grad_mode.is_grad_enabled():
            return out
        if not self._require_sync:
            self._unsynced = True
            return out
        return self._attach_marker(out)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward calls through forwards run inside this block accumulate into
        ``.grad`` locally, with no communication; the first synchronised backward after
        it averages the accumulated gradients (PyTorch's ``no_sync``)."""
        previous = self._require_sync
        self._require_sync = False
        try:
            yield
        finally:
            self._require_sync = previous

    @property
    def bucket_sizes(self) -> list[int]:
        """The number of parameters in each bucket, in all-reduce order."""
        return [len(b.params) for b in self._layout.buckets]

    # --- wrapping ------------------------------------------------------------------------
    def _broadcast_state(self) -> None:
        """Rank 0's parameters and buffers, everywhere (one Ibcast each, all in flight)."""
        tensors = list(self.module.parameters()) + [b for b in self.module.buffers() if b is not None]
        bufs = [np.array(t.numpy(), copy=True, order="C") for t in tensors]
        thread = self._rt.comm_thread
        futures = [thread.submit(partial(self._comm.Ibcast, buf, root=0)) for buf in bufs]
        for f in futures:
            result(f, self._timeout)
        if self._rank != 0:
            with grad_mode.no_grad():
                for t, buf in zip(tensors, bufs):
                    t.copy_(from_numpy(buf))

    def _attach_marker(self, out: Any) -> Any:
        """``out`` with ``+ 0`` from a round marker added to its first differentiable tensor."""
        if isinstance(out, Tensor):
            if not out.requires_grad or not np.issubdtype(out.dtype, np.floating):
                return out
            anchor = self._anchors.get(out.dtype)
            if anchor is None:
                anchor = self._anchors[out.dtype] = zeros((), dtype=out.dtype, requires_grad=True)
            zero = _RoundMarker.apply(anchor)
            register_backward_start_hook(zero.grad_fn, self._begin_round)
            return out + zero
        if isinstance(out, (tuple, list)):
            items = list(out)
            for i, item in enumerate(items):
                attached = self._attach_marker(item)
                if attached is not item:
                    items[i] = attached
                    return type(out)(items) if isinstance(out, list) else _same_tuple(out, items)
            return out
        if isinstance(out, dict):
            for key, item in out.items():
                attached = self._attach_marker(item)
                if attached is not item:
                    return {**out, key: attached}
        return out

    # --- the round (Note [Round protocol]) ------------------------------------------------
    def _begin_round(self) -> None:
        """The marker's start hook (step 2)."""
        task_id = current_graph_task_id()
        if self._round is not None and self._round.task_id == task_id:
            return  # several forwards through this DDP in one backward: one round
        if self._round is not None:
            raise RuntimeError("DistributedDataParallel runs one backward at a time; another backward "
                               "through this DDP is still running (rank "
                               f"{self._rank}, graph task {self._round.task_id})")
        rnd = self._round = Round(task_id, self._layout, self._launch_bucket)
        queue_pre_commit(partial(self._pre_commit, rnd))
        queue_on_abort(partial(self._abort, rnd))

    def _on_grad(self, i: int, grad: Tensor) -> None:
        rnd = self._round
        if rnd is None or rnd.task_id != current_graph_task_id():
            return  # not a backward of this DDP (Note [Round protocol], step 3)
        rnd.fill(i, grad.numpy(), self._old_grad(i))

    def _old_grad(self, i: int) -> np.ndarray | None:
        """After ``no_sync``, the local ``.grad`` joins the average."""
        g = self._layout.params[i].grad
        return g.numpy() if self._unsynced and g is not None else None

    def _launch_bucket(self, rnd: Round, b: int) -> Any:
        """Pack, all-reduce and average bucket ``b`` on the communication thread; a
        future of ``{parameter index: average}``."""
        MPI, comm, size = self._rt.MPI, self._comm, self._size
        buf = self._layout.buckets[b].buffer

        def start() -> Any:
            rnd.pack(b)
            return comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        return self._rt.comm_thread.submit(start, lambda: rnd.averages(b, size))

    async def _wait(self, future: Any) -> Any:
        with anyio.move_on_after(self._timeout):
            return await wait_future(future)
        raise DistributedTimeout(f"rank {self._rank}: the other ranks made no progress for {self._timeout:g} s "
                                 "(a rank stopped or is far behind); nothing was committed")

    async def _abort(self, rnd: Round, error: BaseException) -> None:
        """The abort function (step 4): complete the round's collectives with a "failed"
        vote. After a timeout the collectives are posted but not awaited (the peers
        are not answering)."""
        if self._round is not rnd:
            return  # the round already voted (its pre-commit raised after the vote)
        try:
            rnd.fill_rest(self._old_grad)
            futures = [*rnd.futures, self._submit_vote(rnd, failed=True)]
            if rnd.timed_out:
                self._layout.reallocate()  # MPI may still write into the old buffers
                return
            for f in futures:
                await self._wait(f)
        except DistributedTimeout:
            self._layout.reallocate()
        finally:
            self._round = None

    def _submit_vote(self, rnd: Round, *, failed: bool) -> Any:
        votes = np.zeros(self._size + len(self._layout.params), dtype=np.int64)
        votes[self._rank] = int(failed)
        votes[self._size:] = rnd.used
        MPI, comm = self._rt.MPI, self._comm
        return self._rt.comm_thread.submit(lambda: comm.Iallreduce(MPI.IN_PLACE, votes, op=MPI.SUM),
                                           lambda: votes)

    async def _pre_commit(self, rnd: Round, staged: dict[Tensor, Tensor]) -> None:
        """Note [Round protocol], steps 5 and 6. Raising here makes the engine abort the
        backward, which runs ``_abort`` (a no-op once this rank has voted)."""
        averages: dict[int, np.ndarray] = {}
        rnd.fill_rest(self._old_grad)
        try:
            for f in rnd.futures:
                averages.update(await self._wait(f))
        except DistributedTimeout:
            rnd.timed_out = True
            raise
        with anyio.CancelScope(shield=True):  # voted "ok": commit if every rank did
            try:
                votes = await self._wait(self._submit_vote(rnd, failed=False))
            except DistributedTimeout:
                self._layout.reallocate()
                raise
            finally:
                self._round = None
            failed = [r for r in range(self._size) if votes[r]]
            if failed:
                raise RemoteBackwardError(failed)
            self._stage_averages(rnd, staged, averages, votes[self._size:] > 0)

    def _stage_averages(self, rnd: Round, staged: dict[Tensor, Tensor], averages: dict[int, np.ndarray],
                        used: np.ndarray) -> None:
        """Each used parameter's staged gradient becomes its average (less the local
        ``.grad`` already folded in after no_sync); a parameter with no gradient here
        but one on another rank gets an entry of its own (Note [Pre-commit])."""
        for i, p in enumerate(self._layout.params):
            if not used[i]:
                continue  # no rank produced a gradient: .grad stays as it is
            avg, old = averages[i], rnd.old[i]
            staged[p] = from_numpy(avg - old if old is not None else avg)
        self._unsynced = False


class _RoundMarker(Function):
    """A zero that carries the round's start hook (Note [Round protocol], step 1)."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor) -> Tensor:
        return zeros_like(anchor)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return zeros_like(grad)


def _same_tuple(original: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    if hasattr(original, "_fields"):  # a named tuple
        return type(original)(*items)
    return tuple(items)
