"""Anomaly mode: ``detect_anomaly`` / ``set_detect_anomaly``.

While anomaly mode is on (in the current context):

* every node built records the stack of the forward call that created it, and, when it
  is built while another node runs (a ``create_graph`` backward), that running node as
  its *parent* (``node.anomaly_trace``, a :class:`ForwardTrace`);
* every gradient a node returns is checked for NaN (unless ``check_nan=False``):
  ``RuntimeError("Function 'MulBackward0' returned nan values in its 1th output.")``;
* an exception raised while a node runs carries, as a PEP 678 note, the forward stack of
  that node and of its parents, and the same text is issued as a ``UserWarning``, as
  PyTorch does.

The mode is a ContextVar (``_context.anomaly_mode``, like grad mode), not process-global
as in PyTorch: two asyncio tasks on one loop each keep their own setting, and kernels
offloaded to worker threads see the setting of the task that offloaded them.

Note [Anomaly mode costs nothing when off]: the ContextVar holds ``None`` when the mode
is off. The recorder (``record.record``) and the engine (``step.run_kernel``) test
it once per node and only then call into this module, so with the mode off no stack is
walked and no gradient is scanned.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, TypeVar
from collections.abc import Callable

import numpy as np

from ... import _context
from ..._decorate import decorate
from ..graph import AccumulateGrad, Node

F = TypeVar("F", bound=Callable[..., Any])

ENABLED_WARNING = (
    "Anomaly Detection has been enabled. This mode will increase the runtime and should only "
    "be enabled for debugging."
)

#: The node whose kernel is running in this context under anomaly mode; nodes built
#: meanwhile (create_graph backward) record it as their parent.
_running_node: ContextVar[Node | None] = ContextVar("asyncgrad_anomaly_running_node", default=None)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # asyncgrad/


@dataclass(frozen=True, eq=False)
class ForwardTrace:
    """What anomaly mode remembers about a node: where it was built, and by which node."""

    stack: traceback.StackSummary
    parent: Node | None

    def format(self) -> str:
        return "".join(self.stack.format())


class AnomalyMode:
    """The settings of an active anomaly mode (the value of ``_context.anomaly_mode``)."""

    __slots__ = ("check_nan",)

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan

    def __repr__(self) -> str:
        return f"AnomalyMode(check_nan={self.check_nan})"

    def run_node(self, node: Node, inputs: list[Any], math: Any) -> list[Any]:
        """``step.run_kernel`` under anomaly mode: apply and validate the node with it
        marked as running (the parent of nodes built meanwhile), then check for NaN."""
        from ..graph.validate import validate_outputs

        token = _running_node.set(node)
        try:
            outputs = validate_outputs(node, node.apply(inputs, math))
        finally:
            _running_node.reset(token)
        if self.check_nan:
            raise_on_nan(node, outputs)
        return outputs

    async def run_node_async(self, node: Node, inputs: list[Any], math: Any) -> list[Any]:
        """The same for a node whose backward is ``async def`` (``node.apply_async``)."""
        from ..graph.validate import validate_outputs

        token = _running_node.set(node)
        try:
            outputs = validate_outputs(node, await node.apply_async(inputs, math))
        finally:
            _running_node.reset(token)
        if self.check_nan:
            raise_on_nan(node, outputs)
        return outputs

    def annotate_error(self, error: BaseException, node: Node) -> None:
        """Attach the forward stack of ``node`` (and of its parents) to ``error`` as a note,
        and warn with the same text (PyTorch's "Error detected in ..." warnings)."""
        parts = anomaly_report(node)
        note = "".join(parts)
        if note in getattr(error, "__notes__", ()):
            return  # already annotated (e.g. re-raised through a reentrant backward)
        error.add_note(note)
        level = _caller_stacklevel()
        for part in parts:
            try:
                warnings.warn(part, UserWarning, stacklevel=level)
            except Warning:
                # Warnings are turned into errors: the original error must still be the
                # one raised, so the report goes to stderr instead (as PyTorch does).
                sys.stderr.write(f"UserWarning: {part}\n")


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning issued by our caller to the first
    frame outside asyncgrad (the user's ``await ag.backward(...)`` line)."""
    frame: Any = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 2


def raise_on_nan(node: Node, outputs: list[Any]) -> None:
    """Raise if any gradient ``node`` returned holds a NaN (the first one found)."""
    if type(node) is AccumulateGrad:
        return
    for i, g in enumerate(outputs):
        if g is not None and _has_nan(g):
            raise RuntimeError(f"Function '{node.name()}' returned nan values in its {i}th output.")


def _has_nan(g: Any) -> bool:
    if not isinstance(g, np.ndarray):
        g = getattr(g, "data", g)  # a Tensor (create_graph), or a numpy scalar
    arr = np.asarray(g)
    if arr.dtype.kind not in "fc":
        return False
    return bool(np.isnan(arr).any())


def anomaly_report(node: Node) -> list[str]:
    """PyTorch's texts: the failing node's forward stack, then one part per ancestor."""
    trace: ForwardTrace | None = node.anomaly_trace
    if trace is None:
        return [f"Error detected in {node.name()}. No forward pass information available. "
                "Enable detect anomaly during forward pass for more information."]
    parts = [f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n"
             f"{trace.format()}"]
    seen = {node}
    parent = trace.parent
    while parent is not None and parent not in seen:
        seen.add(parent)
        ptrace: ForwardTrace | None = parent.anomaly_trace
        if ptrace is None:
            parts.append(f"\n\nPrevious calculation was induced by {parent.name()}. No forward pass "
                         "information available. Enable detect anomaly during forward pass for more "
                         "information.")
            break
        parts.append(f"\n\nPrevious calculation was induced by {parent.name()}. Traceback of forward "
                     f"call that induced the previous calculation:\n{ptrace.format()}")
        parent = ptrace.parent
    return parts


def record_forward_trace(node: Node) -> None:
    """Remember where ``node`` was built (called by the recorder, only in anomaly mode).

    The innermost frames inside asyncgrad itself are dropped, so the last frame shown is
    the user's line that called the operation."""
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    stack = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
    stack.reverse()
    node.anomaly_trace = ForwardTrace(stack, _running_node.get())


# --------------------------------------------------------------------------------------
# Switching the mode on and off
# --------------------------------------------------------------------------------------

class _AnomalyModeBase:
    """Sets anomaly mode for the duration of a block or a call (sync or ``async def``)."""

    def __init__(self, enabled: bool, check_nan: bool) -> None:
        self.enabled = bool(enabled)
        self.check_nan = bool(check_nan)
        self._tokens: list[Token[AnomalyMode | None]] = []

    def _value(self) -> AnomalyMode | None:
        return AnomalyMode(self.check_nan) if self.enabled else None

    def __enter__(self) -> None:
        self._tokens.append(_context.anomaly_mode.set(self._value()))

    def __exit__(self, *exc: object) -> None:
        _context.anomaly_mode.reset(self._tokens.pop())

    def _clone(self) -> _AnomalyModeBase:
        return _AnomalyModeBase(self.enabled, self.check_nan)

    def __call__(self, fn: F) -> F:
        return decorate(fn, self._clone)


class detect_anomaly(_AnomalyModeBase):
    """Context manager and decorator (also on ``async def``) that turns anomaly mode on
    for its block: nodes remember their forward stack, NaN gradients raise (unless
    ``check_nan=False``), and backward errors carry the forward stack as a note.

        with ag.autograd.detect_anomaly():
            loss = model(x)
            await ag.backward(loss)
    """

    def __init__(self, check_nan: bool = True) -> None:
        super().__init__(True, check_nan)
        warnings.warn(ENABLED_WARNING, UserWarning, stacklevel=2)


class set_detect_anomaly(_AnomalyModeBase):
    """Turn anomaly mode on or off. As a plain call it sets the mode of the current
    context at once (like ``set_grad_enabled``); as a context manager or decorator it
    restores the previous mode afterwards."""

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        super().__init__(mode, check_nan)
        self._prev = _context.anomaly_mode.get()
        _context.anomaly_mode.set(self._value())
        if self.enabled:
            warnings.warn(ENABLED_WARNING, UserWarning, stacklevel=2)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        _context.anomaly_mode.set(self._prev)

    def __call__(self, fn: F) -> F:
        _context.anomaly_mode.set(self._prev)  # decorating must not change the mode now
        return super().__call__(fn)


def is_anomaly_enabled() -> bool:
    """Whether anomaly mode is on in the current context."""
    return _context.anomaly_mode.get() is not None


def is_anomaly_check_nan_enabled() -> bool:
    """Whether anomaly mode is on and checks gradients for NaN."""
    mode = _context.anomaly_mode.get()
    return mode is not None and mode.check_nan
