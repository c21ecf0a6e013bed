"""How an operation is declared: its forward kernel and its derivative rules, side by side.

An :class:`OpSpec` is pure data about one differentiable primitive. It never touches the
graph or the engine; ``asyncgrad.autograd.recording`` turns a call into a node.

* ``forward(*arrays, **fwd_params) -> ndarray`` (or ``(ndarray, aux)`` when ``has_aux``)
  is the numpy kernel.
* ``vjps`` holds one rule per input, HIPS-autograd style, so the engine only computes
  the gradients that some edge needs. A rule is called as
  ``rule(m, g, ans, *saved, **bwd_params)`` where ``m`` is the math namespace (numpy
  functions for a plain backward, differentiable asyncgrad functions under
  ``create_graph=True``), ``g`` the gradient of the output, ``ans`` the saved output (or
  None), ``saved`` the saved inputs (None where not saved). Rules use only operators and
  ``m.<fn>``, so the same line serves both modes: grad-of-grad works for every op.
* A rule may return a gradient with the *broadcast* (larger) shape; the engine sums it
  down to the input's shape in one shared place (``sum_to``), as PyTorch's
  ``validate_outputs`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

Rule = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class OpSpec:
    node_name: str
    forward: Callable[..., Any]
    vjps: tuple[Rule | None, ...]
    save_inputs: tuple[int, ...] = ()
    save_ans: bool = False
    has_aux: bool = False
    variadic: bool = False  # one rule for any number of inputs, called with index=i

    @property
    def arity(self) -> int:
        return len(self.vjps)


def defop(
    node_name: str,
    forward: Callable[..., Any],
    *vjps: Rule | None,
    save: str = "",
    has_aux: bool = False,
    variadic: bool = False,
) -> OpSpec:
    """Declare a primitive. ``save`` lists what backward needs: ``x``, ``y``, ``z`` name
    inputs 0, 1, 2 and ``ans`` names the output, e.g. ``save="x ans"``."""
    words = save.split()
    positions = tuple("xyz".index(w) for w in words if w != "ans")
    return OpSpec(node_name, forward, tuple(vjps), positions, "ans" in words, has_aux, variadic)
