"""``asyncgrad.autograd``: the engine, running backward, the graph, and the tools."""

from .api import backward, backward_sync, grad, grad_sync
from .engine import (
    Engine,
    EngineStatistics,
    GraphTaskStatistics,
    current_graph_task_id,
    current_graph_task_statistics,
    get_engine,
    queue_callback,
    queue_pre_commit,
    set_engine,
)
from . import graph
from .gradcheck import GradcheckError, gradcheck, gradgradcheck
from .anomaly_mode import detect_anomaly, is_anomaly_check_nan_enabled, is_anomaly_enabled, set_detect_anomaly
from . import profiler
from . import function
from .function import Function, FunctionCtx, once_differentiable

__all__ = [
    "Engine", "EngineStatistics", "GraphTaskStatistics", "backward", "backward_sync",
    "current_graph_task_id", "current_graph_task_statistics", "get_engine", "grad", "grad_sync",
    "graph", "queue_callback", "queue_pre_commit",
    "set_engine", "GradcheckError", "gradcheck", "gradgradcheck",
    "Function", "FunctionCtx", "function", "once_differentiable",
    "detect_anomaly", "is_anomaly_check_nan_enabled", "is_anomaly_enabled", "profiler", "set_detect_anomaly",
]
