"""A node's numeric work as one plain function, runnable inline or on a worker thread."""

from __future__ import annotations

from typing import Any

from .. import _context
from .graph import Node
from .validation import validate_outputs

_anomaly_mode = _context.anomaly_mode


def run_kernel(node: Node, inputs: list[Any], math: Any) -> list[Any]:
    """A node's numeric work: apply, then validate. Thread-safe; touches no GraphTask.

    Anomaly mode (``autograd.anomaly_mode``) takes over the whole step when it is on:
    it tracks the running node as the parent of nodes built meanwhile and checks for NaN.
    """
    anomaly = _anomaly_mode.get()
    if anomaly is not None:
        return anomaly.run_node(node, inputs, math)  # type: ignore[no-any-return]
    return validate_outputs(node, node.apply(inputs, math))


