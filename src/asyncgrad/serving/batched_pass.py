"""One forward and one backward for a batch of requests, answering each as if alone.

The batch's loss is the sum over requests of each request's mean row loss. Rows of
different requests do not interact (the contract of ``loss_fn``), so the gradient of
that sum with respect to a request's rows is the gradient of its own loss, and with
respect to a parameter it is the sum of every request's own gradient: exactly what one
backward per request would add to ``.grad``.

Note [One commit per batch]: with ``accumulate=True`` the pass is one backward (an
``await ag.backward`` on the loop, or a blocking one on a worker thread: Note [Off-loop
backward]) whose pre-commit function (``queue_pre_commit``, registered when the
backward starts) sees every staged gradient before anything is written. There the
answers are checked and the per-request parameter gradients computed; a request that
is at fault, or was withdrawn, makes it raise, so the commit does not happen and the
isolation layer reruns the others. The pre-commit function ends without an await after
its last check, so once it returns the batch commits as a whole.

The pass raises only the exceptions below (or the pass's own), each saying what the
isolation layer should do next."""

from __future__ import annotations

import contextvars
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from .. import autograd
from ..autograd import api
from ..autograd.engine import get_engine
from ..autograd.runtime.threads import run_in_executor
from ..creation import from_numpy
from ..grad_mode import enable_grad
from ..tensor import Tensor
from .capture import RECORDING, GraphWalk, LayerHooks, Recording, covered
from .requests import GradientResult, Request, Signature
from .rules import FRESH_RULES, rule_for
from .segments import Segments
from .statistics import Counters

OFFLOAD_FORWARD_ABOVE = 1 << 16  # elements of a batch's arguments above which its sync forward (and the
# backward of a plain graph: Note [Off-loop backward]) runs on a thread
OFFLOAD_CHECKS_ABOVE = 1 << 19  # gradient elements whose rules and checks run on a thread
KNOWN_SEGMENTS = 8  # the batch layouts (requests' row counts) a pass keeps for reuse



class Culprits(Exception):
    """These requests fail with these errors; rerun the others."""

    def __init__(self, errors: dict[Request, BaseException]) -> None:
        super().__init__(f"{len(errors)} request(s) at fault")
        self.errors = errors


class Withdrawn(Exception):
    """A request of the batch was withdrawn before the commit: rerun the others."""


class SplitNeeded(Exception):
    """Some request made a summed gradient non-finite: split the batch to find it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class FailAll(Exception):
    """``loss_fn`` broke its contract for any batch: every request fails with ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class BatchGraph:
    """One batch's graph, ready for its backward, and the answers as they are made."""

    def __init__(self, batch: list[Request], seg: Segments, row_losses: Tensor, losses: np.ndarray, root: Tensor,
                 seed: Tensor | None, inputs: list[Tensor], params: list[Tensor], walk: GraphWalk) -> None:
        self.batch, self.seg, self.row_losses, self.losses = batch, seg, row_losses, losses
        self.root, self.seed = root, seed  # what the backward starts from (Note [Seeded backward])
        self.inputs, self.params, self.walk = inputs, params, walk
        self.rule_calls: dict[int, list[Any]] = {}  # per_request_param_grads: the rules' layer calls
        self.fallback: dict[int, np.ndarray] = {}  # and the parameters no rule covers
        self.answers: list[GradientResult | None] = []


def _priority(batch: list[Request]) -> int:
    """The engine's priority is an int (API.md §3): the most urgent request's, rounded down."""
    return math.floor(max(r.priority for r in batch))


def _large(tensors: list[Tensor]) -> bool:
    """A batch whose sync forward runs on a thread (and a plain graph's backward too)."""
    return sum(t.numel() for t in tensors) > OFFLOAD_FORWARD_ABOVE


def _or_zeros(g: np.ndarray | None, t: Tensor) -> np.ndarray:
    return np.zeros_like(t.data) if g is None else g


class BatchedPass:
    """Runs batches for one batcher (configuration in ``GradientBatcher``)."""

    def __init__(self, loss_fn: Callable[..., Any], signature: Signature, params: Sequence[Tensor] | None,
                 accumulate: bool, per_request: bool, check_finite: bool, counters: Counters) -> None:
        self.loss_fn = loss_fn
        self.signature = signature
        self.fixed_params = params is not None
        self.params: list[Tensor] = list(params or ())
        self.accumulate = accumulate
        self.per_request = per_request
        self.check_finite = check_finite
        self.counters = counters
        self.layers: LayerHooks | None = None
        self.scope: anyio.CancelScope | None = None  # the running backward's, until its commit
        self.running: list[Request] = []  # the requests of the pass that runs
        self._known_segments: dict[tuple[int, ...], Segments] = {}
        self.is_async = inspect.iscoroutinefunction(loss_fn) or inspect.iscoroutinefunction(
            type(loss_fn).__call__)

    def close(self) -> None:
        if self.layers is not None:
            self.layers.remove()
            self.layers = None

    def withdraw(self, r: Request) -> None:
        """``r`` was withdrawn: if its pass runs, stop that pass's backward before the commit."""
        if self.scope is not None and r in self.running:
            self.scope.cancel()

    # --- the pass ---------------------------------------------------------------------------
    async def run(self, batch: list[Request]) -> list[GradientResult | None]:
        """Answers for ``batch`` (None for a request withdrawn meanwhile)."""
        self.running = batch
        recording = Recording() if self.per_request else None
        try:
            with enable_grad():  # (whatever the mode of the task that opened the batcher)
                return await self._run(batch, recording)
        finally:
            self.running = []
            if recording is not None:
                recording.close()

    def _segments(self, batch: list[Request]) -> Segments:
        """The batch's Segments, reused for a batch of the same sizes (under a steady load
        every batch has the sizes of the one before)."""
        sizes = tuple([r.rows for r in batch])
        seg = self._known_segments.get(sizes)
        if seg is None:
            if len(self._known_segments) >= KNOWN_SEGMENTS:
                del self._known_segments[next(iter(self._known_segments))]  # (the oldest)
            seg = self._known_segments[sizes] = Segments(sizes)
        return seg

    async def _run(self, batch: list[Request], recording: Recording | None) -> list[GradientResult | None]:
        seg = self._segments(batch)
        grad_inputs = self.signature.grad_inputs
        tensors = []
        for i in range(len(batch[0].arrays)):
            arr = batch[0].arrays[i] if len(batch) == 1 else np.concatenate([r.arrays[i] for r in batch])
            t = from_numpy(arr)
            if i in grad_inputs:
                t.requires_grad_(True)
            tensors.append(t)
        if self.layers is None:
            self.layers = LayerHooks(self.loss_fn, record=self.per_request)
        large = _large(tensors)
        if large and not self.is_async and not self.per_request:
            return await self._run_off_loop(batch, seg, tensors)
        row_losses = await self._forward(tensors, seg.rows, recording)
        graph = self._graph(batch, seg, tensors, row_losses, recording)
        del tensors, row_losses
        if isinstance(graph, list):
            return graph
        if self.per_request:
            assert recording is not None
            graph.rule_calls = covered(graph.walk, recording.calls)
            uncovered = [p for p in graph.params if id(p) not in graph.rule_calls]
            if uncovered:
                graph.fallback = await self._one_backward_each(graph.row_losses, seg, uncovered, batch)
            recording.armed = True
        try:
            if large and graph.walk.plain:
                job = [graph]  # (handed over, as in _run_off_loop)
                await self._on_worker(lambda closing: self._backward_here(job.pop(), closing), _priority(batch))
                return graph.answers
            return await self._backward_on_loop(graph)
        finally:
            if recording is not None:
                recording.armed = False

    async def _run_off_loop(self, batch: list[Request], seg: Segments,
                            tensors: list[Tensor]) -> list[GradientResult | None]:
        """A large batch of a sync ``loss_fn``: its forward, and its backward too if the
        graph is plain (Note [Off-loop backward]), in one call on a worker thread. The
        thread keeps its last call's function and result until its next call, so what
        the call makes is handed back in ``box``, which holds nothing afterwards."""
        box: list[Any] = [tensors]
        del tensors

        def forward_and_backward(closing: list[bool]) -> None:
            tensors = box.pop()
            graph = self._graph(batch, seg, tensors, self._checked_losses(self.loss_fn(*tensors), seg.rows))
            if isinstance(graph, BatchGraph) and graph.walk.plain:
                self._backward_here(graph, closing)
                box.append(graph.answers)
            else:
                box.append(graph)

        await self._on_worker(forward_and_backward, _priority(batch))
        out = box.pop()
        return out if isinstance(out, list) else await self._backward_on_loop(out)

    @staticmethod
    async def _on_worker(fn: Callable[[list[bool]], None], priority: int) -> None:
        """Note [One hop per batch]: ``fn(closing)`` on one of the engine's worker
        threads, queued at the batch's priority among the engine's kernels, in a copy of
        this context (grad mode, the recording). The engine's hop (threads.run_in_executor:
        a bare future on asyncio, the thread that went idle last) costs the batch less
        than anyio's (its checkpoint and limiter before the call, its queue and
        thread-local state on the way); the batch makes one such hop each way, on its
        critical path while every waiting client's loop is idle. ``closing`` gets an item
        when the batcher's task is cancelled while ``fn`` runs (the batcher is closing):
        ``fn`` reads it before its commit and commits nothing then; the cancellation goes
        on once ``fn`` has returned."""
        closing: list[bool] = []
        engine = get_engine()
        await run_in_executor(engine.worker_executor(), fn, (closing,), priority,
                              on_cancel=lambda: closing.append(True))

    def _graph(self, batch: list[Request], seg: Segments, tensors: list[Tensor], row_losses: Tensor,
               recording: Recording | None = None) -> BatchGraph | list[GradientResult | None]:
        """What the backward needs, or the answers when no gradient is wanted. Raises
        Culprits for requests whose loss is not finite (before the backward)."""
        losses = seg.sum(row_losses.detach().numpy()) / seg.sizes
        if self.check_finite:
            bad = ~np.isfinite(losses)
            if bad.any():
                raise Culprits({batch[r]: FloatingPointError(f"loss is not finite ({losses[r]})")
                                for r in np.flatnonzero(bad)})
        # Note [Seeded backward]: the backward of the requests' summed mean losses is the
        # backward of the row losses seeded with each row's weight (1 / its request's rows);
        # the same gradients as that of ``(row_losses * weights).sum()``, without its two ops
        weights = from_numpy(seg.weights(row_losses.dtype))
        if row_losses.grad_fn is None:  # (a leaf: loss_fn returned a tensor it was given)
            root, seed = (row_losses * weights).sum(), None
        else:
            root, seed = row_losses, weights
        inputs = [tensors[i] for i in self.signature.grad_inputs]
        if root.grad_fn is None or not (inputs or not self.fixed_params or self.params):
            # nothing requires grad, or no gradient was asked for: losses only
            zeros = tuple(np.zeros((seg.count, *p.shape), p.dtype) for p in self.params) if self.per_request else None
            return [GradientResult(float(losses[r]), tuple(np.zeros_like(t.data[a:a + n]) for t in inputs),
                                   None if zeros is None else tuple(z[r] for z in zeros), int(n))
                    for r, (a, n) in enumerate(zip(seg.starts, seg.sizes))]
        walk = GraphWalk(root.grad_fn, own_hooks=None if recording is None else recording.keepers)
        self._learn_params(walk, inputs)
        params = [p for p in self.params if walk.edges[id(p)]]  # (the others get no gradient)
        return BatchGraph(batch, seg, row_losses, losses, root, seed, inputs, params, walk)

    # --- the backward, its checks and its answers ---------------------------------------------
    def _checked(self, g: BatchGraph, grads: dict[int, np.ndarray | None]) -> tuple[list[np.ndarray],
                                                                                   list[np.ndarray] | None]:
        """The input gradients and the per-request parameter gradients; raises if not finite."""
        input_grads = [_or_zeros(grads.get(id(t)), t) for t in g.inputs]
        per_request = self._per_request_grads(g.seg, g.rule_calls, g.fallback) if self.per_request else None
        if self.check_finite:
            self._check(g.batch, g.seg, g.inputs, input_grads, per_request, g.params, grads)
        return input_grads, per_request

    def _answer(self, g: BatchGraph, input_grads: list[np.ndarray], per_request: list[np.ndarray] | None) -> None:
        if self.accumulate and any(r.withdrawn for r in g.batch):
            raise Withdrawn
        pieces = [g.seg.split(x) for x in input_grads]
        for r, (loss, (a, e)) in enumerate(zip(g.losses.tolist(), g.seg.cuts)):
            g.answers.append(None if g.batch[r].withdrawn else GradientResult(
                loss, tuple([p[r] for p in pieces]),
                None if per_request is None else tuple([x[r] for x in per_request]), e - a))

    async def _finish(self, g: BatchGraph, grads: dict[int, np.ndarray | None]) -> None:
        """The checks and the answers, on the loop; raises instead of answering when
        something is wrong (Note [One commit per batch])."""
        if self.accumulate and any(r.withdrawn for r in g.batch):
            raise Withdrawn
        size = sum(t.numel() for t in g.inputs) + sum(p.numel() for p in g.params) * (
            g.seg.count if self.per_request else 1)
        if size > OFFLOAD_CHECKS_ABOVE:  # (numpy releases the GIL: the loop stays free)
            done = await anyio.to_thread.run_sync(contextvars.copy_context().run, self._checked, g, grads)
        else:
            done = self._checked(g, grads)
        self._answer(g, *done)

    async def _backward_on_loop(self, g: BatchGraph) -> list[GradientResult | None]:
        """``await`` the batch's backward on the loop; a withdrawn request cancels it
        before its commit (``withdraw``)."""
        targets = g.inputs + g.params
        priority = _priority(g.batch)
        root, seed, node = g.root, g.seed, g.root.grad_fn
        assert node is not None  # (_graph answers a batch without one)
        try:
            with anyio.CancelScope() as scope:
                self.scope = scope if self.accumulate else None
                if self.accumulate:
                    async def pre_commit(staged: dict[Tensor, Tensor]) -> None:
                        await self._finish(g, {id(t): x.numpy() for t, x in staged.items()})
                        self.scope = None  # (from here the batch commits whole: Note [One commit per batch])

                    handle = autograd.register_backward_start_hook(
                        node, lambda: autograd.queue_pre_commit(pre_commit))
                    try:
                        await api.backward(root, seed, inputs=targets, priority=priority)
                    finally:
                        handle.remove()
                else:
                    grads = await api.grad(root, targets, seed, allow_unused=True, priority=priority)
                    await self._finish(g, {id(t): None if x is None else x.numpy() for t, x in zip(targets, grads)})
        finally:
            self.scope = None
        if scope.cancel_called:
            raise Withdrawn
        return g.answers

    def _backward_here(self, g: BatchGraph, closing: list[bool]) -> None:
        """Note [Off-loop backward]: the backward of a batch large enough that its forward
        runs on a thread (``_large``; its backward costs more) over a plain graph
        (built-in nodes, no hook but the per-sample rules' own: no code of the user's runs
        in it, GraphWalk.plain) runs
        whole on one worker thread, as a blocking backward, its checks and answers in its
        pre-commit function there: one thread hop per batch (with the forward's, for a
        sync ``loss_fn``) instead of one per heavy node, and the loop stays free
        throughout. (A small batch's nodes run inline on the loop, no hop at all, as they
        would on the engine's own.) The same commit on success: a request withdrawn
        meanwhile (its flag, read before the commit) or the batcher's task cancelled
        (``closing``: Note [One hop per batch]) makes the pre-commit raise, so nothing is
        committed and the others are rerun."""
        targets = g.inputs + g.params
        priority = _priority(g.batch)
        node = g.root.grad_fn
        assert node is not None  # (_graph answers a batch without one)

        def finish(grads: dict[int, np.ndarray | None]) -> None:
            if self.accumulate and any(r.withdrawn for r in g.batch):
                raise Withdrawn
            done = self._checked(g, grads)
            if closing:  # (the batcher is closing: commit nothing)
                raise Withdrawn
            self._answer(g, *done)  # (raises Withdrawn if a request was withdrawn meanwhile)

        if self.accumulate:
            def pre_commit(staged: dict[Tensor, Tensor]) -> None:
                finish({id(t): x.numpy() for t, x in staged.items()})

            handle = autograd.register_backward_start_hook(node, lambda: autograd.queue_pre_commit(pre_commit))
            try:
                api.backward_sync(g.root, g.seed, inputs=targets, priority=priority)
            finally:
                handle.remove()
        else:
            grads = api.grad_sync(g.root, targets, g.seed, allow_unused=True, priority=priority)
            finish({id(t): None if x is None else x.numpy() for t, x in zip(targets, grads)})

    async def _forward(self, tensors: list[Tensor], rows: int, recording: Recording | None) -> Tensor:
        """``loss_fn`` on the batch, grad mode on; a large sync forward on a worker thread
        (numpy releases the GIL), in a copy of this context (grad mode, the recording)."""
        token = RECORDING.set(recording)
        try:
            if self.is_async:
                out = await self.loss_fn(*tensors)
            elif _large(tensors):
                out = await anyio.to_thread.run_sync(contextvars.copy_context().run, self.loss_fn, *tensors)
            else:
                out = self.loss_fn(*tensors)
            if inspect.isawaitable(out):
                out = await out
        finally:
            RECORDING.reset(token)
        return self._checked_losses(out, rows)

    @staticmethod
    def _checked_losses(out: Any, rows: int) -> Tensor:
        if not isinstance(out, Tensor) or out.shape != (rows,) or out.dtype.kind != "f":
            what = f"{out.dtype} {out.shape}" if isinstance(out, Tensor) else type(out).__name__
            raise FailAll(ValueError(f"loss_fn must return a Tensor of {rows} per-row float losses (one per row of "
                                     f"the batch), got {what}"))
        return out

    def _learn_params(self, walk: GraphWalk, inputs: list[Tensor]) -> None:
        """``params=None``: every leaf the losses reach, the layers' in their order first."""
        if self.fixed_params:
            return
        known = {id(p) for p in self.params} | {id(t) for t in inputs}
        new = [leaf for leaf in walk.leaves if id(leaf) not in known]
        if new:
            order = self.layers.order if self.layers is not None else {}
            new.sort(key=lambda p: order.get(id(p), math.inf))
            self.params.extend(new)

    async def _one_backward_each(self, row_losses: Tensor, seg: Segments, params: list[Tensor],
                                 batch: list[Request]) -> dict[int, np.ndarray]:
        """The fallback: each request's gradient of ``params`` by a backward of its own
        loss through the batch's graph (kept for the batch's backward)."""
        out = {id(p): np.zeros((seg.count, *p.shape), dtype=p.dtype) for p in params}
        for r, (a, n) in enumerate(zip(seg.starts, seg.sizes)):
            loss = row_losses[int(a):int(a + n)].sum() / float(n)
            grads = await api.grad(loss, params, retain_graph=True, allow_unused=True)
            self.counters.per_request_backwards += 1
            for p, g in zip(params, grads):
                if g is not None:
                    out[id(p)][r] = g.numpy()
        return out

    def _per_request_grads(self, seg: Segments, rule_calls: dict[int, list[Any]],
                           fallback: dict[int, np.ndarray]) -> list[np.ndarray]:
        """``(requests, *shape)`` per parameter, in ``self.params`` order."""
        by_call: dict[int, dict[str, np.ndarray]] = {}
        out = []
        for p in self.params:
            if id(p) in fallback:
                out.append(fallback[id(p)])
                continue
            calls = rule_calls.get(id(p), ())
            terms = []
            for call in calls:
                if id(call) not in by_call:
                    g = call.grad if call.grad is not None else np.zeros(call.output.shape, call.output.dtype)
                    rule = rule_for(call.layer)
                    assert rule is not None
                    by_call[id(call)] = rule(call.layer, call.x, g, seg)
                name = next(n for n, q in call.layer.named_parameters(recurse=False) if q is p)
                terms.append((by_call[id(call)][name], rule_for(call.layer) in FRESH_RULES))
            shape = (seg.count, *p.shape)
            if len(terms) == 1 and terms[0][1] and terms[0][0].shape == shape and terms[0][0].dtype == p.dtype:
                out.append(terms[0][0])  # (a built-in rule's new array: nobody else holds it)
                continue
            total = np.zeros(shape, dtype=p.dtype)
            for term, _ in terms:
                total += term
            out.append(total)
        return out

    def _name(self, p: Tensor) -> str:
        names = self.layers.names if self.layers is not None else {}
        return names.get(id(p)) or f"params[{next(i for i, q in enumerate(self.params) if q is p)}]"

    def _check(self, batch: list[Request], seg: Segments, inputs: list[Tensor], input_grads: list[np.ndarray],
               per_request: list[np.ndarray] | None, params: list[Tensor],
               grads: dict[int, np.ndarray | None]) -> None:
        """Non-finite gradients: a request's own ones fail it; a non-finite sum whose
        request cannot be told needs a split."""
        errors: dict[Request, BaseException] = {}
        for i, g in zip(self.signature.grad_inputs, input_grads):
            if np.isfinite(g).all():  # (the common case, at a fraction of the rows' test)
                continue
            bad = seg.rows_with(~np.isfinite(g.reshape(seg.rows, -1)).all(1))
            for r in np.flatnonzero(bad):
                errors.setdefault(batch[r], FloatingPointError(
                    f"the gradient with respect to {self.signature.name(i)} is not finite"))
        if per_request is not None:
            for p, g in zip(self.params, per_request):
                if np.isfinite(g).all():
                    continue
                bad = ~np.isfinite(g.reshape(seg.count, -1)).all(1)
                for r in np.flatnonzero(bad):
                    errors.setdefault(batch[r], FloatingPointError(
                        f"the gradient with respect to parameter {self._name(p)} is not finite"))
        if errors:
            raise Culprits(errors)
        for p in params:
            summed = grads.get(id(p))
            if summed is not None and not np.isfinite(summed).all():
                raise SplitNeeded(FloatingPointError(f"the gradient with respect to parameter {self._name(p)} "
                                                     f"is not finite"))
