"""``checkpoint(..., use_reentrant=False)``: ``fn`` runs inside ``saved_tensors_hooks``
whose pack hook keeps a small handle per saved tensor; the first unpack in a backward
recomputes ``fn`` (Note [When recomputed values are dropped], Note [Early stop]).
"""

from __future__ import annotations

import threading
import traceback
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _context
from ..autograd.graph import saved_tensors_hooks
from ..grad_mode import enable_grad
from .checkpoint_rng import restored_rng

if TYPE_CHECKING:
    from ..tensor import Tensor


class CheckpointError(RuntimeError):
    """A recomputation that does not match its checkpoint's forward (PyTorch's name)."""


def _metadata(t: Tensor) -> dict[str, Any]:
    """What a recomputed saved tensor must share with the one the forward saved."""
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": t.device}


def _where_saved() -> str:
    """The user's frames that led to a save (for ``debug=True``), innermost last."""
    frames = [f for f in traceback.extract_stack()[:-3] if "/asyncgrad/" not in f.filename]
    return "".join(traceback.format_list(frames[-6:]))


_DEBUG_TIP = (
    "\nTip: To see a more detailed error message, either pass `debug=True` to\n"
    "`asyncgrad.utils.checkpoint.checkpoint(...)` or wrap the code block\n"
    "with `with asyncgrad.utils.checkpoint.set_checkpoint_debug_enabled(True):` to\n"
    "enable checkpoint-debug mode globally.\n"
)


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
                 "forward_completed", "metadata", "debug", "traces", "__weakref__")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 rng: dict[str, Any] | None, early_stop: bool = True, debug: bool = False) -> None:
        self.fn = fn
        self.metadata: list[dict[str, Any]] = []  # of each tensor the forward saved
        self.debug = debug
        self.traces: list[str] = []  # with debug: where the forward saved each
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
        self.metadata.append(_metadata(t))
        if self.debug:
            self.traces.append(_where_saved())
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
        traces: list[str] = []
        needed = self.count  # what the forward saved so far (all of it once it completed)

        def pack(t: Tensor) -> Any:
            if len(values) >= needed:
                if not self.forward_completed:
                    return t  # see Note [Early stop]
                raise CheckpointError(
                    "asyncgrad.utils.checkpoint: trying to save more tensors during recomputation "
                    "than during the original forward pass."
                )
            # detached, as PyTorch keeps it: a recomputed node that saves its own output
            # would otherwise hold it, and through its grad_fn itself (a reference cycle)
            kept = t.detach() if t.requires_grad else t
            values.append(kept)
            if self.debug:
                traces.append(_where_saved())
            if self.early_stop and len(values) == needed:
                raise _StopRecomputation
            return kept

        try:
            with restored_rng(self.rng), enable_grad(), saved_tensors_hooks(pack, _identity):
                self.fn(*self.args, **self.kwargs)
        except _StopRecomputation:
            pass
        if len(values) != needed:
            raise CheckpointError(
                "asyncgrad.utils.checkpoint: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {needed}\n"
                f"Number of tensors saved during recomputation: {len(values)}"
                + self._explain(traces)
            )
        self._check_metadata(values, traces)
        return values

    def _check_metadata(self, values: list[Any], traces: list[str]) -> None:
        """Raise CheckpointError when a recomputed tensor differs from the saved one in
        shape, dtype or device (its gradient would silently be wrong), as PyTorch."""
        wrong = ""
        for i, (v, saved) in enumerate(zip(values, self.metadata)):
            now = _metadata(v)
            if now != saved:
                wrong += f"tensor at position {i}:\nsaved metadata: {saved}\nrecomputed metadata: {now}\n"
        if wrong:
            raise CheckpointError(
                "asyncgrad.utils.checkpoint: Recomputed values for the following tensors have "
                f"different metadata than during the forward pass.\n{wrong}." + self._explain(traces)
            )

    def _explain(self, traces: list[str]) -> str:
        """With debug: where each tensor was saved, in the forward and in the recomputation."""
        if not self.debug:
            return "\n" + _DEBUG_TIP
        parts = ["\n\nThe tensors saved in the original forward (debug=True), in order:"]
        parts += [f"\n${i}:\n{tr}" for i, tr in enumerate(self.traces)]
        parts.append("\nThe tensors saved in the recomputation, in order:")
        parts += [f"\n${i}:\n{tr}" for i, tr in enumerate(traces)]
        return "".join(parts)


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
                           rng: dict[str, Any] | None, early_stop: bool, debug: bool = False) -> Any:
    frame = _Frame(fn, args, kwargs, rng, early_stop, debug)
    with saved_tensors_hooks(frame.pack, _unpack_handle):
        result = fn(*args, **kwargs)
    frame.forward_completed = True
    return result
