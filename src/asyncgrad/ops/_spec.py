"""How an operation is declared: its forward kernel and its derivative rules, side by side.

An :class:`OpSpec` is pure data about one differentiable primitive. It never touches the
graph or the engine; ``asyncgrad.autograd.graph.record`` turns a call into a node.

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
* ``joint`` (optional) computes the gradients of several inputs in one call, as
  PyTorch's fused backward kernels do (``native_layer_norm_backward`` with its output
  mask), where separate rules would each read ``g`` and the saved arrays again. It is
  called as ``joint(g, ans, *saved, mask=mask, **bwd_params)`` with ``mask[i]`` true for
  each input that needs a gradient, and returns one gradient per input (None where the
  mask is false). Note [Joint rules]: the engine uses it only in a plain backward with
  two or more needed gradients (``OpSpec.joint_for``); the per-input ``vjps`` still serve
  ``create_graph=True`` (the ``m`` namespace) and single-gradient needs, so they remain
  the definition and the joint rule must equal them (tests check both paths). A node
  with a joint rule runs as one kernel: never split into one kernel per gradient, and
  not in the engine's fused inline step (``fusable`` is False), which calls ``vjps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

Rule = Callable[..., Any]


@dataclass(frozen=True, slots=True, eq=False)
class GradFactor:
    """Note [Gradient factors]: an input's rule written as a product. In a plain backward
    (the numpy ``m``) of a node of at most ``FACTOR_MAX_ELEMENTS`` elements, the rule's
    result is ``g * factor`` bit for bit, one rounding, where ``factor`` is ``fn(m, value)``
    of the rule argument at position ``read`` (0 ``ans``, 1 ``x``, 2 ``y``), or that value
    itself when ``fn`` is None; with no ``read``, the rule returns ``g`` itself. ``fn`` is
    elementwise, so it gives each node's factor from the values of many nodes stacked:
    the flat schedule computes a run of such nodes with a few calls (Note [Fused runs] in
    autograd/sched/runs.py). tests/test_fused_runs.py checks every declared factor
    against its rule, bit for bit. ``own`` says the value read is the node's own input
    or output of a unary elementwise op, so it has the gradient's shape and dtype by
    construction (the recording checks the others)."""

    read: int | None
    fn: Callable[..., Any] | None = None
    own: bool = False


#: a rule that returns the gradient itself (``add``'s, ``clone``'s)
IDENTITY = GradFactor(None)
# the size up to which the declared factors hold: below ``compiled_path.ELEMENTWISE_MIN``,
# where no compiled kernel replaces a rule's numpy expression
FACTOR_MAX_ELEMENTS = 1024


@dataclass(frozen=True, slots=True)
class OpSpec:
    node_name: str
    forward: Callable[..., Any]
    vjps: tuple[Rule | None, ...]
    save_inputs: tuple[int, ...] = ()
    save_ans: bool = False
    # for each saved input: the inputs whose rules read it (None: always saved); an input
    # is saved only when one of those inputs needs a gradient (PyTorch saves ``self`` for
    # ``mul`` only if ``other`` requires grad), which keeps graphs small
    save_when: tuple[tuple[int, ...] | None, ...] = ()
    has_aux: bool = False
    variadic: bool = False  # one rule for any number of inputs, called with index=i
    # work per element relative to an elementwise op: 0 for rules that pass the gradient
    # on as it is (add, views), so the engine never sends them to a thread
    cost: float = 1.0
    # a BLAS kernel (matmul): the engine bounds how many run at once (Note [BLAS threads])
    blas: bool = False
    # all needed gradients in one call (Note [Joint rules]); None: the vjps one by one
    joint: Rule | None = None
    # two inputs that play the same part: input 1's rule at (x, y) is input 0's at (y, x),
    # so for one tensor twice (``x * x``) both gradients are one value (Note [A tensor
    # times itself] in autograd/task/step.py)
    symmetric: bool = False
    # Note [Mean's gradient as a view] in autograd/task/step.py: ``view_vjp`` may return a
    # read-only broadcast view (strides 0) of the gradient, for input 0; the engine calls
    # it in place of ``vjps[0]`` only for a child declared ``takes_views``, whose rules
    # read their gradient at any strides and return new arrays (never it or a view of it)
    view_vjp: Rule | None = None
    takes_views: bool = False
    # the params hold what PyTorch saves as tensors (advanced indexing's index arrays): a
    # backward without retain_graph frees them with the saved values, so a second
    # backward through the node raises as in PyTorch
    saves_params: bool = False
    # per input, its rule as a product or None (Note [Gradient factors]); (): none
    factors: tuple[GradFactor | None, ...] = ()

    #: whether the engine's fused inline step handles this op (see GraphTask.run_inline)
    fusable: bool = field(init=False, default=True)
    #: the rule arguments ``(ans, x, ...)`` of a node that saved nothing
    no_args: tuple[None, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.factors and len(self.factors) != len(self.vjps):
            raise ValueError(f"{self.node_name}: factors declares {len(self.factors)} inputs' rules as "
                             f"products, but the op has {len(self.vjps)} inputs")
        if len(self.save_when) != len(self.save_inputs):  # built directly: always save
            object.__setattr__(self, "save_when", (None,) * len(self.save_inputs))
        object.__setattr__(self, "fusable",
                           not self.variadic and not self.has_aux and self.joint is None)
        object.__setattr__(self, "no_args", (None,) * (len(self.vjps) + 1))

    @property
    def arity(self) -> int:
        return len(self.vjps)

    def joint_for(self, edges: tuple[Any, ...], tensor_mode: bool) -> tuple[bool, ...] | None:
        """The mask of needed gradients when the joint rule applies to a node with these
        ``(node, input_nr)`` edges: a plain backward, two or more needed; else None."""
        if self.joint is None or tensor_mode:
            return None
        mask = tuple(child is not None for child, _ in edges)
        return mask if sum(mask) > 1 else None



def defop(
    node_name: str,
    forward: Callable[..., Any],
    *vjps: Rule | None,
    save: str = "",
    has_aux: bool = False,
    variadic: bool = False,
    cost: float = 1.0,
    blas: bool = False,
    joint: Rule | None = None,
    symmetric: bool = False,
    view_vjp: Rule | None = None,
    takes_views: bool = False,
    factors: tuple[GradFactor | None, ...] = (),
) -> OpSpec:
    """Declare a primitive. ``save`` lists what backward needs: ``x``, ``y``, ``z`` name
    inputs 0, 1, 2 and ``ans`` names the output, e.g. ``save="x ans"``. ``x@1`` saves
    ``x`` only when input 1 needs a gradient (only input 1's rule reads it)."""
    positions: list[int] = []
    when: list[tuple[int, ...] | None] = []
    for word in save.split():
        if word == "ans":
            continue
        name, _, users = word.partition("@")
        positions.append("xyz".index(name))
        when.append(tuple(int(u) for u in users.split(",")) if users else None)
    return OpSpec(node_name, forward, tuple(vjps), save_inputs=tuple(positions),
                  save_ans="ans" in save.split(), save_when=tuple(when), has_aux=has_aux,
                  variadic=variadic, cost=cost, blas=blas, joint=joint, symmetric=symmetric,
                  view_vjp=view_vjp, takes_views=takes_views, factors=factors)
