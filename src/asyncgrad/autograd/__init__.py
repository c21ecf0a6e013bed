"""``asyncgrad.autograd``: the engine, running backward, the graph, and the tools."""

from .api import backward, backward_sync, grad, grad_sync
from .engine import (
    Engine,
    EngineStatistics,
    GraphTaskStatistics,
    current_graph_task_id,
    get_engine,
    queue_callback,
    set_engine,
)
from . import graph
from .gradcheck import GradcheckError, gradcheck, gradgradcheck

__all__ = [
    "Engine", "EngineStatistics", "GraphTaskStatistics", "backward", "backward_sync",
    "current_graph_task_id", "get_engine", "grad", "grad_sync", "graph", "queue_callback",
    "set_engine", "GradcheckError", "gradcheck", "gradgradcheck",
]
