"""``checkpoint(..., use_reentrant=False)``: ``fn`` runs inside ``saved_tensors_hooks``
whose pack hook keeps a small handle per saved tensor; the first unpack in a backward
recomputes ``fn`` (Note [When recomputed values are dropped], Note [Early stop]).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _context
from ..autograd.graph import saved_tensors_hooks
from ..grad_mode import enable_grad
from .checkpoint_rng import restored_rng

if TYPE_CHECKING:
    from ..tensor import Tensor


class _Recomputed:
    """The values a frame's recomputation saved, for one backward, and which of them
    that backward has unpacked so far."""

    __slots__ = ("values", "unseen")

    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self.unseen = set(range(len(values)))


# Per running backward, the frame whose recomputed values have all been unpacked at least
# once; see Note [When recomputed values are dropped].
_complete: weakref.WeakKeyDictionary[Any, _Frame] = weakref.WeakKeyDictionary()
_complete_lock = threading.Lock()


class _Frame:
    """One call of a non-reentrant checkpoint: what is needed to recompute it, and the
    recomputed values per running backward (GraphTask).

    Note [When recomputed values are dropped]: a node may unpack its saved tensors more
    than once in one backward (the engine computes the input gradients of a large node
    as parallel kernels, each unpacking), so a value cannot be dropped at its first
    unpack as PyTorch does. A frame's recomputed values are kept until every one of them
    has been unpacked and another frame starts unpacking in the same backward (or the
    backward ends): in a sequential model, one segment's activations at a time. Should a
    dropped frame be unpacked again (interleaved branches), it is recomputed again.
    """

    __slots__ = ("fn", "args", "kwargs", "rng", "count", "lock", "by_task", "early_stop",
                 "forward_completed", "__weakref__")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 rng: dict[str, Any] | None, early_stop: bool = True) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rng = rng
        self.early_stop = early_stop
        self.forward_completed = False
        self.count = 0
        self.lock = threading.Lock()
        self.by_task: weakref.WeakKeyDictionary[Any, _Recomputed] = weakref.WeakKeyDictionary()

    def pack(self, t: Tensor) -> _Handle:
        handle = _Handle(self, self.count)
        self.count += 1
        return handle

    def unpack(self, index: int) -> Any:
        task = _context.current_graph_task.get()
        if task is None:  # e.g. ctx.saved_tensors read outside backward
            return self._recompute()[index]
        with _complete_lock:
            done = _complete.get(task)
            if done is not None and done is not self:
                done.by_task.pop(task, None)
                del _complete[task]
        with self.lock:  # kernels of one backward may unpack from several threads at once
            rec = self.by_task.get(task)
            if rec is None:
                rec = self.by_task[task] = _Recomputed(self._recompute())
            value = rec.values[index]
            rec.unseen.discard(index)
            complete = not rec.unseen
        if complete:
            with _complete_lock:
                _complete[task] = self
        return value

    # Note [Early stop]: the recomputation needs the tensors the forward saved, in order,
    # and nothing after the last of them, so with ``early_stop`` it is cut short (by an
    # exception from the pack hook) as soon as it saved that many: trailing work that
    # saves nothing is not redone. The same bound makes a backward *inside* the forward
    # work (``fn`` calls ``ag.grad`` on what it computed so far): that backward unpacks
    # while the forward has saved only ``count`` tensors yet, and the recomputation must
    # stop there too, before it reaches the inner backward again. Without early stop,
    # tensors saved past ``count`` before the forward completed are not needed and are
    # passed through, as in PyTorch.
    def _recompute(self) -> list[Any]:
        values: list[Any] = []
        needed = self.count  # what the forward saved so far (all of it once it completed)

        def pack(t: Tensor) -> Any:
            if len(values) >= needed:
                if not self.forward_completed:
                    return t  # see Note [Early stop]
                raise RuntimeError(
                    "asyncgrad.utils.checkpoint: trying to save more tensors during recomputation "
                    "than during the original forward pass."
                )
            # detached, as PyTorch keeps it: a recomputed node that saves its own output
            # would otherwise hold it, and through its grad_fn itself (a reference cycle)
            kept = t.detach() if t.requires_grad else t
            values.append(kept)
            if self.early_stop and len(values) == needed:
                raise _StopRecomputation
            return kept

        try:
            with restored_rng(self.rng), enable_grad(), saved_tensors_hooks(pack, _identity):
                self.fn(*self.args, **self.kwargs)
        except _StopRecomputation:
            pass
        if len(values) != needed:
            raise RuntimeError(
                "asyncgrad.utils.checkpoint: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {needed}\n"
                f"Number of tensors saved during recomputation: {len(values)}"
            )
        return values


class _StopRecomputation(BaseException):
    """Ends a recomputation once it saved every tensor needed (Note [Early stop]). A
    BaseException, so that an ``except Exception`` in the user's function lets it pass."""


def _identity(packed: Any) -> Any:
    return packed


class _Handle:
    __slots__ = ("frame", "index")

    def __init__(self, frame: _Frame, index: int) -> None:
        self.frame = frame
        self.index = index


def _unpack_handle(handle: _Handle) -> Any:
    return handle.frame.unpack(handle.index)


def checkpoint_with_hooks(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                           rng: dict[str, Any] | None, early_stop: bool) -> Any:
    frame = _Frame(fn, args, kwargs, rng, early_stop)
    with saved_tensors_hooks(frame.pack, _unpack_handle):
        result = fn(*args, **kwargs)
    frame.forward_completed = True
    return result
