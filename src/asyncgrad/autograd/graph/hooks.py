"""Running user hooks inside a backward, with PyTorch's checks on what they return.

Hooks see Tensors; in a plain backward the engine's gradients are ndarrays, so they are
wrapped on the way in and unwrapped on the way out. Hooks run on the thread that drives
the GraphTask (the event loop), with grad mode equal to ``create_graph``.
Removing a hook while its node runs does not stop it this pass: we iterate a snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from ...tensor import Tensor

if TYPE_CHECKING:
    from . import HookDict, Node, NodeHooks
    from ..task.graph_task import GraphTask


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", repr(fn))


def _to_tensor(g: Any) -> Tensor | None:
    if g is None or isinstance(g, Tensor):
        return g
    return Tensor._wrap(g)  # (as an array of the backend: Note [One array backend] in backend.py)


def _from_tensor(task: GraphTask, t: Any) -> Any:
    if t is None:
        return None
    return t if task.create_graph else t.data


def _check_value(fn: Callable[..., Any], old: Any, new: Any) -> None:
    if not isinstance(new, Tensor):
        raise TypeError(f"expected Variable, but hook returned '{type(new).__name__}'")
    if old is None:
        raise RuntimeError("can't replace a None gradient with a non-None value")
    if new.shape != tuple(old.shape):
        raise RuntimeError(f"hook '{_name(fn)}' has changed the size of value")
    if new.dtype != old.dtype:
        raise RuntimeError(
            f"hook '{_name(fn)}' has changed the type of value (was {old.dtype} got {new.dtype})"
        )


def _run_tensor_hooks(task: GraphTask, hooks: HookDict, g: Any) -> Any:
    for fn in tuple(hooks.values()):
        result = fn(_to_tensor(g))
        if result is not None:
            _check_value(fn, g, result)
            g = _from_tensor(task, result)
    return g


def run_tensor_pre_hooks(task: GraphTask, node: Node, hooks: NodeHooks, buf: list[Any]) -> list[Any]:
    """Tensor hooks per slot (registration order, chained), then retain_grad."""
    for nr, slot_hooks in hooks.tensor_pre.items():
        if slot_hooks and nr < len(buf):
            buf[nr] = _run_tensor_hooks(task, slot_hooks, buf[nr])
    if task.accumulate:
        for nr, ref in hooks.retains_grad.items():
            t = ref()
            if t is not None and nr < len(buf) and buf[nr] is not None:
                prev = task.retained.get(t)
                task.retained[t] = buf[nr] if prev is None else prev + buf[nr]
    return buf


def run_leaf_tensor_hooks(task: GraphTask, node: Node, hooks: HookDict, g: Any) -> Any:
    return _run_tensor_hooks(task, hooks, g)


def _check_tuple(fn: Callable[..., Any], old: list[Any], new: Any) -> list[Any]:
    if not isinstance(new, (tuple, list)):
        new = (new,)
    if len(new) != len(old):
        raise RuntimeError(
            f"hook '{_name(fn)}' has returned an incorrect number of values "
            f"(got {len(new)}, but expected {len(old)})"
        )
    for o, n in zip(old, new):
        if n is not None:
            _check_value(fn, o, n)
    return list(new)


def run_pre_hooks(task: GraphTask, node: Node, hooks: HookDict, buf: list[Any]) -> list[Any]:
    """Node pre-hooks: ``fn(grad_outputs) -> replacement tuple or None``, chained."""
    for fn in tuple(hooks.values()):
        result = fn(tuple(_to_tensor(g) for g in buf))
        if result is not None:
            new = _check_tuple(fn, buf, result)
            buf = [_from_tensor(task, n) for n in new]
    return buf


def run_post_hooks(task: GraphTask, node: Node, hooks: HookDict, outputs: list[Any],
                   inputs: list[Any]) -> list[Any]:
    """Node post-hooks: ``fn(grad_inputs, grad_outputs) -> replacement or None``."""
    grad_outputs = tuple(_to_tensor(g) for g in inputs)
    for fn in tuple(hooks.values()):
        result = fn(tuple(_to_tensor(g) for g in outputs), grad_outputs)
        if result is not None:
            new = _check_tuple(fn, outputs, result)
            outputs = [_from_tensor(task, n) for n in new]
    return outputs
