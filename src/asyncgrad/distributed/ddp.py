"""``DistributedDataParallel``: gradients averaged over MPI ranks during backward, and
committed on every rank or on none.

Note [Round protocol]: one DDP backward is a *round*. Every rank runs the same steps:

1. ``ddp(x)`` adds a zero from a ``_RoundWatch`` node to its output (``out + 0``: same
   values). That node sits on a branch of its own, so a backward reaches it only when
   it accumulates through this DDP's forward: ``ag.grad`` / ``inputs=`` prune it.
2. Its pre-hook, run by the engine before any node of the model (the watch node was
   recorded last, so it has the highest ``sequence_nr``), opens the round for this
   GraphTask id and queues the pre-commit (``ag.autograd.queue_pre_commit``).
3. Each parameter's tensor hook records its gradient in the round if the current
   GraphTask is the round's; a full bucket is launched at once, in bucket order, and
   packed, all-reduced and averaged on the communication thread (Note [Buckets], Note
   [One communication thread]). Hooks of other backward calls (a request's own
   ``ag.grad``) find another id and do nothing.
4. The watch node's ``async`` backward stays in flight until every other node of the
   backward has finished. Its only job is to be cancelled if the backward fails (the
   engine cancels in-flight nodes when a node raises) or is cancelled: then, shielded,
   it completes the round's collectives with a "failed" vote (step 6), so the other
   ranks learn about it instead of waiting.
5. The pre-commit fills the slots of parameters that got no gradient with zeros,
   launches the remaining buckets and waits for all of them (``timeout`` per wait).
6. The vote: one tiny all-reduce of a failure flag per rank and a "used" flag per
   parameter. It is shielded from cancellation: once this rank has voted "ok" it commits
   whenever every rank did. If any rank failed, every other rank raises
   ``RemoteBackwardError`` naming them and nothing is committed; otherwise each staged
   gradient is replaced by the average.

A failed or timed-out rank still posts every collective of the round, so all ranks stay
in step and the next round works. Rounds of one DDP never overlap; several forwards
through the DDP in one backward share its round. Why a watch node at all: the engine
has no public hook for "this backward failed or was cancelled before its commit"
(docs/guides/distributed.md, "Limits of the current design").
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
    current_graph_task_statistics,
    queue_callback,
    queue_pre_commit,
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
WATCH_INTERVAL = 0.0005  # seconds between two looks at the backward's progress


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
        return self._attach_watch(out)

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

    def _attach_watch(self, out: Any) -> Any:
        """``out`` with ``+ 0`` from a watch node added to its first differentiable tensor."""
        if isinstance(out, Tensor):
            if not out.requires_grad or not np.issubdtype(out.dtype, np.floating):
                return out
            anchor = self._anchors.get(out.dtype)
            if anchor is None:
                anchor = self._anchors[out.dtype] = zeros((), dtype=out.dtype, requires_grad=True)
            zero = _RoundWatch.apply(anchor, self)
            zero.grad_fn.register_prehook(self._begin_round)
            return out + zero
        if isinstance(out, (tuple, list)):
            items = list(out)
            for i, item in enumerate(items):
                attached = self._attach_watch(item)
                if attached is not item:
                    items[i] = attached
                    return type(out)(items) if isinstance(out, list) else _same_tuple(out, items)
            return out
        if isinstance(out, dict):
            for key, item in out.items():
                attached = self._attach_watch(item)
                if attached is not item:
                    return {**out, key: attached}
        return out

    # --- the round (Note [Round protocol]) ------------------------------------------------
    def _begin_round(self, grad_outputs: Any) -> None:
        task_id = current_graph_task_id()
        if self._round is not None and self._round.task_id == task_id:
            return  # several forwards through this DDP in one backward: one round
        if self._round is not None:
            raise RuntimeError("DistributedDataParallel runs one backward at a time; another backward "
                               "through this DDP is still running (rank "
                               f"{self._rank}, graph task {self._round.task_id})")
        self._round = Round(task_id, self._layout, self._launch_bucket)
        queue_pre_commit(self._pre_commit)

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

    async def _watch(self) -> None:
        """The watch node's backward (Note [Round protocol], step 4)."""
        rnd = self._round
        stats = current_graph_task_statistics()
        if rnd is None or stats is None or stats.in_flight == 0:
            return  # the synchronous driver runs one node at a time: nothing to watch
        if rnd.watched:
            return  # another forward's watch node of the same backward already watches
        rnd.watched = True
        try:
            while not _only_the_watch_left(current_graph_task_statistics()):
                await anyio.sleep(WATCH_INTERVAL)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._abort(rnd)
            raise

    async def _abort(self, rnd: Round, *, timed_out: bool = False) -> None:
        """Complete the round's collectives with a "failed" vote. After a timeout the
        collectives are posted but not awaited (the peers are not answering)."""
        if self._round is not rnd:
            return
        try:
            rnd.fill_rest(self._old_grad)
            futures = [*rnd.futures, self._submit_vote(rnd, failed=True)]
            if timed_out:
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

    async def _pre_commit(self, staged: dict[Tensor, Tensor]) -> None:
        """Note [Round protocol], steps 5 and 6."""
        rnd = self._round
        if rnd is None or rnd.task_id != current_graph_task_id():
            return
        averages: dict[int, np.ndarray] = {}
        try:
            rnd.fill_rest(self._old_grad)
            for f in rnd.futures:
                averages.update(await self._wait(f))
        except BaseException as e:
            with anyio.CancelScope(shield=True):
                await self._abort(rnd, timed_out=isinstance(e, DistributedTimeout))
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
        by_id = {id(t): t for t in staged}
        late: list[tuple[Tensor, np.ndarray, bool]] = []
        for i, p in enumerate(self._layout.params):
            if not used[i]:
                continue  # no rank produced a gradient: .grad stays as it is
            avg, old = averages[i], rnd.old[i]
            key = by_id.get(id(p))
            if key is not None:
                staged[key] = from_numpy(avg - old if old is not None else avg)
            else:  # no gradient here, but on another rank: the engine has no entry to replace
                late.append((p, avg, old is not None))
        self._unsynced = False
        if late:
            queue_callback(partial(_write_late, late))


class _RoundWatch(Function):
    """A zero whose backward watches the round (Note [Round protocol], steps 1 and 4)."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, ddp: DistributedDataParallel) -> Tensor:
        ctx.ddp = ddp
        return zeros_like(anchor)

    @staticmethod
    async def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        await ctx.ddp._watch()
        return zeros_like(grad), None


def _only_the_watch_left(stats: Any) -> bool:
    """Nothing but the watch node in flight, nothing ready, and at most its own
    successor (the anchor's AccumulateGrad) waiting: every other node has finished."""
    return bool(stats.in_flight <= 1 and stats.ready == 0 and stats.pending <= 1)


def _write_late(late: list[tuple[Tensor, np.ndarray, bool]]) -> None:
    """Averages of parameters this rank did not use (a final callback, after the commit)."""
    for p, avg, includes_old in late:
        if includes_old or p.grad is None:
            p.grad = from_numpy(avg)
        else:
            p.grad = from_numpy(p.grad.numpy() + avg)


def _same_tuple(original: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    if hasattr(original, "_fields"):  # a named tuple
        return type(original)(*items)
    return tuple(items)
