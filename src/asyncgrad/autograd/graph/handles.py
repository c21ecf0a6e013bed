"""Hook containers: the dict a node or tensor keeps its hooks in, the handle that
removes one, and a node's hooks by kind. No engine and no Tensor here: graph/__init__.py and
tensor.py both import this module."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...tensor import Tensor


class RemovableHandle:
    """Returned by every ``register_*hook``; ``remove()`` unregisters (idempotent)."""

    __slots__ = ("_hooks_ref", "id")
    _ids = itertools.count()

    def __init__(self, hooks: HookDict) -> None:
        self.id = next(RemovableHandle._ids)
        self._hooks_ref = weakref.ref(hooks)  # a handle does not keep its hooks alive

    def remove(self) -> None:
        hooks = self._hooks_ref()
        if hooks is not None:
            hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class HookDict(dict[int, Callable[..., Any]]):
    """A dict of hooks keyed by handle id; weak-referenceable so handles don't keep it."""

    __slots__ = ("__weakref__",)

    def add(self, fn: Callable[..., Any]) -> RemovableHandle:
        handle = RemovableHandle(self)
        self[handle.id] = fn
        return handle


class NodeHooks:
    """The hooks of one node, created only when a first hook is registered.

    Order inside one node (PyTorch's NOTE [Hooks ordering]): tensor pre-hooks per slot,
    then retains-grad hooks, then node pre-hooks, the node, then post-hooks.
    """

    __slots__ = ("tensor_pre", "retains_grad", "pre", "post", "extra")

    def __init__(self) -> None:
        self.tensor_pre: dict[int, HookDict] = {}
        self.retains_grad: dict[int, weakref.ref[Tensor]] = {}
        self.pre = HookDict()
        self.post = HookDict()
        # the node's other rare data (``metadata``, the anomaly-mode trace): Note [Rare
        # per-node data] in graph/__init__.py
        self.extra: dict[str, Any] | None = None
