"""``asyncgrad.autograd``: the engine, running backward, the graph, and the tools.

The names below are loaded on first use (PEP 562), so that importing one submodule
(``tensor.py`` imports ``autograd.graph``) does not run the whole engine while the
importer is itself half-initialised: the import graph stays a tree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import function, graph
    from .tools import profiler
    from .tools.anomaly_mode import detect_anomaly, is_anomaly_check_nan_enabled, is_anomaly_enabled, set_detect_anomaly
    from .api import backward, backward_sync, grad, grad_sync
    from .engine import Engine, get_engine, set_engine
    from .errors import EngineInternalError
    from .function import Function, FunctionCtx, once_differentiable
    from .tools.gradcheck import GradcheckError, gradcheck, gradgradcheck
    from .api import queue_callback, queue_pre_commit
    from .task.lifecycle import queue_on_abort, register_backward_start_hook
    from .task.statistics import (
        EngineStatistics, GraphTaskStatistics, current_graph_task_id, current_graph_task_statistics,
    )

_WHERE = {
    "backward": "api", "backward_sync": "api", "grad": "api", "grad_sync": "api",
    "Engine": "engine", "get_engine": "engine", "set_engine": "engine",
    "EngineStatistics": "task.statistics", "GraphTaskStatistics": "task.statistics",
    "current_graph_task_id": "task.statistics", "current_graph_task_statistics": "task.statistics",
    "queue_callback": "api", "queue_pre_commit": "api",
    "queue_on_abort": "task.lifecycle", "register_backward_start_hook": "task.lifecycle",
    "EngineInternalError": "errors",
    "GradcheckError": "tools.gradcheck", "gradcheck": "tools.gradcheck", "gradgradcheck": "tools.gradcheck",
    "detect_anomaly": "tools.anomaly_mode", "is_anomaly_check_nan_enabled": "tools.anomaly_mode",
    "is_anomaly_enabled": "tools.anomaly_mode", "set_detect_anomaly": "tools.anomaly_mode",
    "Function": "function", "FunctionCtx": "function", "once_differentiable": "function",
}
# the public submodules (``profiler`` is an alias of tools/profiler.py)
_SUBMODULES = {"graph": "graph", "profiler": "profiler", "function": "function"}

__all__ = [
    "Engine", "EngineInternalError", "EngineStatistics", "Function", "FunctionCtx", "GradcheckError",
    "GraphTaskStatistics", "backward", "backward_sync", "current_graph_task_id",
    "current_graph_task_statistics", "detect_anomaly", "function", "get_engine", "grad", "grad_sync",
    "gradcheck", "gradgradcheck", "graph", "is_anomaly_check_nan_enabled", "is_anomaly_enabled",
    "once_differentiable", "profiler", "queue_callback", "queue_on_abort", "queue_pre_commit",
    "register_backward_start_hook", "set_detect_anomaly", "set_engine",
]
assert sorted(__all__) == sorted([*_WHERE, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{_SUBMODULES[name]}")
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return __all__


def load_all() -> None:
    """Bind every public name now (the top-level package calls this once ``tensor`` and
    ``functional`` are complete), so that no later import of a submodule can shadow
    one of them."""
    for name in __all__:
        __getattr__(name)
