"""All ambient (context-local) state of asyncgrad, in one place.

Every piece of "current" state lives in a :class:`contextvars.ContextVar`, never in a
module global or a thread-local: two asyncio tasks interleaving on one loop each see
their own values, and work sent to a worker thread runs in a copy of the offloading
task's context, so it sees the same grad mode, graph task and hooks.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

if TYPE_CHECKING:
    from .autograd.anomaly_mode import AnomalyMode
    from .autograd.graph_task import GraphTask

#: Whether operations are recorded into the autograd graph.
grad_enabled: ContextVar[bool] = ContextVar("asyncgrad_grad_enabled", default=True)

#: Whether tensors created now are inference tensors (``inference_mode``).
inference_enabled: ContextVar[bool] = ContextVar("asyncgrad_inference", default=False)

#: The GraphTask whose node (or hook, or callback) is running in this context, if any.
current_graph_task: ContextVar[GraphTask | None] = ContextVar(
    "asyncgrad_current_graph_task", default=None
)

#: The stack of ``saved_tensors_hooks(pack, unpack)`` pairs active in this context.
saved_tensors_hooks: ContextVar[tuple[tuple[Callable[[Any], Any], Callable[[Any], Any]], ...]] = (
    ContextVar("asyncgrad_saved_tensors_hooks", default=())
)

#: Anomaly mode settings, or None when anomaly mode is off (the common, free case).
anomaly_mode: ContextVar[AnomalyMode | None] = ContextVar("asyncgrad_anomaly", default=None)

#: The active ``autograd.profiler.profile`` recorder, or None (the common, free case).
#: A GraphTask reads it once when it starts; kernels are wrapped only when it is set.
profiler: ContextVar[Any | None] = ContextVar("asyncgrad_profiler", default=None)

#: ``utils.checkpoint.set_checkpoint_early_stop``'s setting (None: each checkpoint's own
#: ``early_stop`` argument decides), read when a non-reentrant checkpoint's forward runs.
checkpoint_early_stop: ContextVar[bool | None] = ContextVar("asyncgrad_checkpoint_early_stop", default=None)

#: ``utils.checkpoint.set_checkpoint_debug_enabled``'s setting (None: each checkpoint's own
#: ``debug`` argument decides), read when a non-reentrant checkpoint's forward runs.
checkpoint_debug: ContextVar[bool | None] = ContextVar("asyncgrad_checkpoint_debug", default=None)

#: Who runs the current node: the asyncio/trio task or the worker thread's id (set by
#: the engine around the nodes it runs). A backward started elsewhere, e.g. in a task
#: created from a hook, is not nested (Note [Explicit nesting] in autograd/threads.py).
node_owner: ContextVar[object | None] = ContextVar("asyncgrad_node_owner", default=None)
