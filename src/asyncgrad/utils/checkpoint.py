"""Activation checkpointing: trade compute for memory.

``checkpoint(fn, *args)`` runs ``fn`` without keeping the tensors its backward would need,
and recomputes them during backward. ``checkpoint_sequential(functions, segments, x)``
checkpoints each of ``segments`` chunks of a sequential model except the last one.

Two forms, as in PyTorch:

* ``use_reentrant=True`` (used when ``use_reentrant`` is not passed, with PyTorch's
  warning). Forward keeps only ``fn``'s inputs (and the RNG
  state). The ``CheckpointFunctionBackward`` node recomputes ``fn`` under ``enable_grad``
  and runs a nested (reentrant) backward through the recomputed graph (see Note
  [Checkpoint backward is async]). Like PyTorch it refuses ``grad()`` and
  ``backward(inputs=...)``.
* ``use_reentrant=False``. ``fn`` runs with grad mode on inside ``saved_tensors_hooks``
  whose pack hook keeps a tiny handle instead of each saved tensor. The first unpack in a
  backward recomputes ``fn`` once (under that backward's GraphTask) and hands out the
  recomputed tensors (see Note [When recomputed values are dropped]), stopping the
  recomputation once every saved tensor is back (Note [Early stop]). The graph is an
  ordinary graph, so ``grad()``, ``inputs=`` and ``create_graph`` work, and ``fn`` may
  itself call ``ag.grad`` on what it computed.

Note [Checkpoint hooks fire once]: both forms recompute ``fn`` once per backward and fire
each parameter's hooks (tensor hooks, post-accumulate-grad hooks, AccumulateGrad node
hooks) exactly once per backward, with the full gradient, and commit ``.grad`` atomically
with the rest of the backward (so a failed or cancelled backward leaves ``.grad`` alone).

* Non-reentrant: the recomputation's graph is never differentiated; it only supplies
  saved values. Gradients flow through the original graph, whose edges lead to the
  parameters' own AccumulateGrad nodes, as without checkpointing.
* Reentrant: PyTorch's nested backward accumulates into the parameters used inside ``fn``
  by itself, so a parameter used in two checkpointed segments, or inside and outside
  one, is accumulated (and its hooks fired) once per use. asyncgrad avoids that: in
  forward, ``fn`` runs once with grad mode on under a pack hook that *discards* every
  saved tensor (so it keeps no more memory than a ``no_grad`` forward), only to find
  the tensors from outside ``fn`` that its result depends on: parameters, closure
  tensors, tensors in ``kwargs``. The checkpoint node gets one edge per input and per
  such outside tensor. Its backward recomputes ``fn`` from the inputs themselves (not
  detached copies), and its nested GraphTask (built with ``exec_info.plan_capture``) runs the recomputed
  nodes only, *capturing* the gradient that reaches each of the node's edges without
  running hooks or accumulating. The node returns those as its own gradients, so the
  outer backward's AccumulateGrad sums every use and fires the hooks once. Under
  ``create_graph`` the captured gradients are differentiable back to the inputs and
  parameters, so double backward works (PyTorch's reentrant form does not support it).

Differences from PyTorch's reentrant form, all consequences of the above: hooks fire
once per backward (not once per use); ``.grad`` is committed with the outer backward
(PyTorch's nested backward writes it before the outer one finishes); parameters used by
``fn`` get gradients even when no input requires grad (PyTorch warns "None of the inputs
have requires_grad=True. Gradients will be None" and drops them); double backward works;
and hooks registered inside ``fn`` are allowed (they fire in the recomputation's
backward). The cost: ``fn`` records a graph (without saved tensors) in forward.

RNG: with ``preserve_rng_state=True`` the state of asyncgrad's default generator is
saved when ``checkpoint`` is called and restored around the recomputation (then set back),
so random ops in ``fn`` (dropout masks) repeat exactly. Recomputations that restore the
state are serialised by a lock; random numbers drawn by *other* threads while one runs
would see the swapped state, as with PyTorch's ``fork_rng``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .. import _context
from ..random import get_rng_state
from .checkpoint_hooks import CheckpointError, checkpoint_with_hooks
from .checkpoint_reentrant import checkpoint_reentrant

__all__ = ["CheckpointError", "checkpoint", "checkpoint_sequential", "set_checkpoint_debug_enabled",
           "set_checkpoint_early_stop"]

# PyTorch's texts (torch 2.13), with asyncgrad's module name
USE_REENTRANT_WARNING = (
    "asyncgrad.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
    "Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an exception. "
    "use_reentrant=False is recommended, but if you need to preserve the current default "
    "behavior, you can pass use_reentrant=True. Refer to docs for more details on the "
    "differences between the two variants."
)
SEQUENTIAL_USE_REENTRANT_WARNING = (
    "asyncgrad.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be "
    "passed explicitly. In version 2.9 we will raise an exception if use_reentrant is not "
    "passed. use_reentrant=False is recommended, but if you need to preserve the current "
    "default behavior, you can pass use_reentrant=True. Refer to docs for more details on the "
    "differences between the two variants."
)


def checkpoint(fn: Callable[..., Any], *args: Any, use_reentrant: bool | None = None,
               preserve_rng_state: bool = True, early_stop: bool = True, debug: bool = False,
               **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, keeping only the inputs for backward, which recomputes
    ``fn`` (see the module docstring for the two forms). Non-tensor arguments and
    results pass through unchanged. Under ``no_grad`` this is just ``fn(*args)``.

    ``use_reentrant`` should be passed: without it, PyTorch's warning, and the
    reentrant form. ``early_stop`` (non-reentrant form; overridden by
    :func:`set_checkpoint_early_stop`) stops each recomputation as soon as every tensor
    the forward saved is back (Note [Early stop]). A recomputation that saves tensors
    of another number, shape, dtype or device than the forward raises
    :class:`CheckpointError`; with ``debug=True`` (or inside
    :func:`set_checkpoint_debug_enabled`) its message shows where each was saved."""
    if use_reentrant is None:
        warnings.warn(USE_REENTRANT_WARNING, UserWarning, stacklevel=2)
        use_reentrant = True
    if not _context.grad_enabled.get():
        return fn(*args, **kwargs)
    rng = get_rng_state() if preserve_rng_state else None
    if use_reentrant:
        return checkpoint_reentrant(fn, args, kwargs, rng)
    override = _context.checkpoint_early_stop.get()
    debug_override = _context.checkpoint_debug.get()
    return checkpoint_with_hooks(fn, args, kwargs, rng, early_stop if override is None else override,
                                 debug if debug_override is None else debug_override)


@contextmanager
def set_checkpoint_early_stop(enable: bool) -> Iterator[None]:
    """Whether non-reentrant checkpoints whose forward runs inside this block stop their
    recomputation early (the default) or run the whole function again. Only the forward
    needs to be inside; the setting is context-local (a ContextVar), like grad mode."""
    token = _context.checkpoint_early_stop.set(bool(enable))
    try:
        yield
    finally:
        _context.checkpoint_early_stop.reset(token)


@contextmanager
def set_checkpoint_debug_enabled(enabled: bool | None) -> Iterator[None]:
    """Whether non-reentrant checkpoints whose forward runs inside this block explain a
    mismatched recomputation in detail (``debug=True``), overriding each checkpoint's
    ``debug`` argument; None leaves it to the argument. Context-local, like grad mode."""
    token = _context.checkpoint_debug.set(None if enabled is None else bool(enabled))
    try:
        yield
    finally:
        _context.checkpoint_debug.reset(token)


def checkpoint_sequential(functions: Any, segments: int, input: Any, use_reentrant: bool | None = None,
                          **kwargs: Any) -> Any:
    """Run ``functions`` (callables, or a module with ``children()``) in sequence on
    ``input``, checkpointing each of the first ``segments - 1`` chunks; the last chunk
    runs normally, as in PyTorch. ``preserve_rng_state`` may be passed as a keyword."""
    if use_reentrant is None:
        warnings.warn(SEQUENTIAL_USE_REENTRANT_WARNING, UserWarning, stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if hasattr(functions, "children") and callable(functions.children):
        functions = functions.children()
    functions = list(functions)
    if segments < 1:
        raise ValueError(f"segments must be at least 1, got {segments}")
    segments = min(segments, len(functions)) or 1
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(_segment(functions, start, end), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return _segment(functions, end + 1, len(functions) - 1)(input)


def _segment(functions: list[Any], start: int, end: int) -> Callable[[Any], Any]:
    def forward(x: Any) -> Any:
        for j in range(start, end + 1):
            x = functions[j](x)
        return x
    return forward
