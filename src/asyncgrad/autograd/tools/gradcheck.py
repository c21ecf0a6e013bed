"""``gradcheck`` / ``gradgradcheck``: analytical gradients against central finite
differences, in float64. The error names the output and input index and shows both
Jacobians where they differ."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from ...grad_mode import enable_grad
from ...tensor import Tensor
from ..runtime.threads import in_event_loop_thread, run_on_fresh_thread as _run_on_fresh_thread
from ..graph import Node


class GradcheckError(RuntimeError):
    """Raised by gradcheck when analytical and numerical gradients disagree."""


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _outputs(fn: Callable[..., Any], inputs: tuple[Any, ...]) -> tuple[Tensor, ...]:
    return tuple(o for o in _as_tuple(fn(*inputs)) if isinstance(o, Tensor))


def _numerical(fn: Callable[..., Any], inputs: tuple[Any, ...], i: int, eps: float,
               reference: tuple[Tensor, ...]) -> list[np.ndarray]:
    """d outputs / d inputs[i] as one (out.size, in.size) matrix per output.

    ``fn`` runs with the caller's grad mode (on, normally), as in PyTorch, so a function
    that registers hooks on its intermediates works. Every perturbed evaluation must give
    outputs of the same shapes and dtypes as ``reference`` (else the differences mean
    nothing)."""
    x = inputs[i].data
    flat = x.reshape(-1)
    cols: list[list[np.ndarray]] = []
    for j in range(flat.size):
        orig = flat[j]
        flat[j] = orig + eps
        try:
            plus = _perturbed(fn, inputs, reference, i, eps)
            flat[j] = orig - eps
            minus = _perturbed(fn, inputs, reference, i, -eps)
        finally:
            flat[j] = orig
        cols.append([(p - m) / (2 * eps) for p, m in zip(plus, minus)])
    return [np.stack([c[k] for c in cols], axis=1) if cols else np.zeros((reference[k].data.size, 0))
            for k in range(len(reference))]


def _perturbed(fn: Callable[..., Any], inputs: tuple[Any, ...], reference: tuple[Tensor, ...],
               i: int, eps: float) -> list[np.ndarray]:
    outs = _outputs(fn, inputs)
    if len(outs) != len(reference):
        raise GradcheckError(
            f"Expected `func` to return the same number of outputs when inputs are perturbed on "
            f"index {i} by {eps}, but got {len(outs)} and {len(reference)}."
        )
    for o, ref in zip(outs, reference):
        if o.shape != ref.shape:
            raise GradcheckError(
                "Expected `func` to return outputs with the same shape when inputs are perturbed "
                f"on index {i} by {eps}, but got: shapes {list(ref.shape)} and {list(o.shape)}."
            )
        if o.dtype != ref.dtype:
            raise GradcheckError(
                "Expected `func` to return outputs with the same dtype when inputs are perturbed "
                f"on index {i} by {eps}, but got: dtypes {ref.dtype} and {o.dtype}."
            )
    return [o.data.astype(np.float64).ravel().copy() for o in outs]


def _analytical(outs: tuple[Tensor, ...], inputs: tuple[Any, ...], diff: list[int]) -> list[list[np.ndarray]]:
    """[output k][input i] Jacobian blocks, one vector-Jacobian product per output element."""
    from ..api import grad_sync

    blocks: list[list[np.ndarray]] = []
    for o in outs:
        rows: list[list[np.ndarray]] = [[] for _ in diff]
        for k in range(o.data.size):
            onehot = np.zeros(o.data.size, dtype=o.data.dtype)
            onehot[k] = 1
            if not o.requires_grad:
                grads: tuple[Any, ...] = (None,) * len(diff)
            else:
                grads = grad_sync(o, [inputs[i] for i in diff], Tensor._wrap(onehot.reshape(o.shape)),
                                  retain_graph=True, allow_unused=True)
            for r, (i, g) in enumerate(zip(diff, grads)):
                size = inputs[i].data.size
                rows[r].append(np.zeros(size) if g is None else g.data.astype(np.float64).ravel())
        blocks.append([np.stack(r, axis=0) if r else np.zeros((0, inputs[i].data.size))
                       for r, i in zip(rows, diff)])
    return blocks


_NONDET_MESSAGE = (
    "Backward is not reentrant, i.e., running backward with same input and grad_output "
    "multiple times gives different values, although analytical gradient matches numerical "
    "gradient. The tolerance for nondeterminism was {tol}."
)


def _check(fn: Callable[..., Any], inputs: tuple[Any, ...], eps: float, atol: float, rtol: float,
           raise_exception: bool, nondet_tol: float = 0.0, check_undefined_grad: bool = True) -> bool:
    diff = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    for i in diff:
        if inputs[i].dtype != np.float64:
            import warnings

            warnings.warn(f"Input #{i} requires gradient and is not a double precision floating "
                          "point. gradcheck is only reliable in float64.", UserWarning, stacklevel=3)
    outs = _outputs(fn, inputs)
    if diff and not any(o.requires_grad for o in outs):
        return _check_no_differentiable_outputs(fn, inputs, diff, eps, outs, raise_exception)
    analytical = _analytical(outs, inputs, diff)
    # PyTorch computes every vector-Jacobian product twice: a backward that gives different
    # values for the same input and grad_output is reported even when it matches
    again = _analytical(outs, inputs, diff)
    for blocks, blocks2 in zip(analytical, again):
        for a, b in zip(blocks, blocks2):
            if a.size and np.abs(a - b).max() > nondet_tol:
                if not raise_exception:
                    return False
                raise GradcheckError(_NONDET_MESSAGE.format(tol=nondet_tol))
    for r, i in enumerate(diff):
        numerical = _numerical(fn, inputs, i, eps, outs)
        for k, (num, blocks) in enumerate(zip(numerical, analytical)):
            ana = blocks[r]
            if not np.allclose(ana, num, rtol=rtol, atol=atol):
                if not raise_exception:
                    return False
                raise GradcheckError(_mismatch_message(k, i, num, ana, atol, rtol))
    if check_undefined_grad and diff:
        return _check_undefined_grad(fn, inputs, diff, raise_exception)
    return True


def _check_no_differentiable_outputs(fn: Callable[..., Any], inputs: tuple[Any, ...], diff: list[int],
                                     eps: float, outs: tuple[Tensor, ...], raise_exception: bool) -> bool:
    """No output requires grad: the numerical gradient must be zero everywhere (PyTorch)."""
    for i in diff:
        if any(np.any(j != 0) for j in _numerical(fn, inputs, i, eps, outs)):
            if not raise_exception:
                return False
            raise GradcheckError("Numerical gradient for function expected to be zero")
    return True


class UndefinedGradBackward(Node):
    """PyTorch's ``UndefinedGrad``: an identity in forward whose backward hands an
    undefined (None) gradient on, to check that backward functions accept one."""

    __slots__ = ("input_shapes", "input_dtypes")

    def __init__(self, t: Tensor) -> None:
        super().__init__((t._gradient_edge(),))
        self.input_shapes = (t.shape,)
        self.input_dtypes = (t.dtype,)

    def apply(self, grads: list[Any], m: Any) -> list[Any]:
        return [None]


def _undefined_grad(t: Tensor) -> Tensor:
    return Tensor._nonleaf(t.data, UndefinedGradBackward(t), 0, None)


def _check_undefined_grad(fn: Callable[..., Any], inputs: tuple[Any, ...], diff: list[int],
                          raise_exception: bool) -> bool:
    """``check_undefined_grad``: with undefined gradients for every output (then for one
    at a time), backward must run, and give None or zeros for every input."""
    from ..api import grad_sync

    def differentiable() -> list[Tensor]:
        return [o for o in _outputs(fn, inputs) if o.requires_grad]

    cases = [[_undefined_grad(o) for o in differentiable()]]
    if len(cases[0]) > 1:
        for k in range(len(cases[0])):
            cases.append([_undefined_grad(o) if j == k else o for j, o in enumerate(differentiable())])
    for outs in cases:
        if not outs:
            continue
        zeros = [Tensor._wrap(np.zeros_like(o.data)) for o in outs]
        try:
            grads = grad_sync(outs, [inputs[i] for i in diff], zeros, allow_unused=True)
        except RuntimeError as e:
            if not raise_exception:
                return False
            _warn_undefined_grad_check()
            raise GradcheckError(
                "Expected backward function to handle undefined output grads. Please look at "
                '"Notes about undefined output gradients" in "tools/autograd/derivatives.yaml"'
            ) from e
        if any(g is not None and np.any(g.data != 0) for g in grads):
            if not raise_exception:
                return False
            _warn_undefined_grad_check()
            raise GradcheckError(
                "Expected all input grads to be undefined or zero when all output grads are "
                'undefined or zero. Please look at "Notes about undefined output gradients" in '
                '"tools/autograd/derivatives.yaml"'
            )
    return True


def _warn_undefined_grad_check() -> None:
    """PyTorch's warning before an undefined-gradient check fails."""
    import warnings

    warnings.warn(
        "Backwards compatibility: New undefined gradient support checking feature is enabled by default, "
        "but it may break existing callers of this function. If this is true for you, you can call this "
        'function with "check_undefined_grad=False" to disable the feature', UserWarning, stacklevel=4)


def _mismatch_message(k: int, i: int, num: np.ndarray, ana: np.ndarray, atol: float, rtol: float,
                      max_entries: int = 10) -> str:
    """PyTorch's "Jacobian mismatch" text, then the entries where the two differ."""
    bad = np.argwhere(~np.isclose(ana, num, rtol=rtol, atol=atol))
    lines = [
        f"Jacobian mismatch for output {k} with respect to input {i},",
        f"numerical:{num}",
        f"analytical:{ana}",
        f"They differ at {len(bad)} of {num.size} entries (atol={atol}, rtol={rtol}); "
        "[output element, input element]: numerical vs analytical:",
    ]
    for r, c in bad[:max_entries]:
        lines.append(f"  [{r}, {c}]: {num[r, c]:.6g} vs {ana[r, c]:.6g}")
    if len(bad) > max_entries:
        lines.append(f"  ... and {len(bad) - max_entries} more")
    return "\n".join(lines) + "\n"


def gradcheck(fn: Callable[..., Any], inputs: Any, *, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, raise_exception: bool = True, nondet_tol: float = 0.0,
              check_undefined_grad: bool = True) -> bool:
    """Check the gradients of ``fn`` at ``inputs`` against finite differences.

    Returns True, or raises :class:`GradcheckError` (False with ``raise_exception=False``).
    As in PyTorch, every vector-Jacobian product is computed twice and may differ by at
    most ``nondet_tol``; with ``check_undefined_grad``, backward must also accept
    undefined (None) output gradients and give None or zeros for them. ``fn`` must return
    outputs of the same shapes and dtypes when its inputs are perturbed (else
    :class:`GradcheckError`, whatever ``raise_exception``). Works from synchronous code
    and from inside a running event loop.
    """
    ins = _as_tuple(inputs)
    args = (fn, ins, eps, atol, rtol, raise_exception, nondet_tol, check_undefined_grad)
    if in_event_loop_thread():
        return bool(_run_on_fresh_thread(_check, *args))
    return _check(*args)


def gradgradcheck(fn: Callable[..., Any], inputs: Any, grad_outputs: Sequence[Tensor] | None = None, *,
                  eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  raise_exception: bool = True, seed: int = 0, nondet_tol: float = 0.0,
                  check_undefined_grad: bool = True) -> bool:
    """Check second derivatives: gradcheck of the vector-Jacobian product of ``fn``."""
    from ..api import grad_sync

    ins = _as_tuple(inputs)
    diff = [i for i, t in enumerate(ins) if isinstance(t, Tensor) and t.requires_grad]
    if grad_outputs is None:
        rng = np.random.default_rng(seed)
        with enable_grad():  # as PyTorch: fn always runs with grad mode on
            outs = _outputs(fn, ins)
        grad_outputs = [Tensor(rng.standard_normal(o.shape), dtype=o.dtype, requires_grad=True)
                        for o in outs]
    gos = tuple(grad_outputs)
    n = len(ins)

    def vjp(*args: Any) -> tuple[Tensor, ...]:
        xs, gs = args[:n], args[n:]
        with enable_grad():  # finite differences call us under no_grad; we need a graph
            outs = [o for o in _outputs(fn, xs) if o.requires_grad]
            grads = grad_sync(outs, [xs[i] for i in diff], gs[:len(outs)], create_graph=True,
                              allow_unused=True, materialize_grads=True)
        return tuple(g for g in grads if g is not None)

    checked = (vjp, ins + gos, eps, atol, rtol, raise_exception, nondet_tol, check_undefined_grad)
    if in_event_loop_thread():
        return bool(_run_on_fresh_thread(_check, *checked))
    return _check(*checked)
