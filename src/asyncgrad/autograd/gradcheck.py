"""``gradcheck`` / ``gradgradcheck``: analytical gradients against central finite
differences, in float64. The error names the output and input index and shows both
Jacobians where they differ."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from ..grad_mode import enable_grad, no_grad
from ..tensor import Tensor
from .engine import _run_on_fresh_thread, in_event_loop_thread


class GradcheckError(RuntimeError):
    """Raised by gradcheck when analytical and numerical gradients disagree."""


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _outputs(fn: Callable[..., Any], inputs: tuple[Any, ...]) -> tuple[Tensor, ...]:
    return tuple(o for o in _as_tuple(fn(*inputs)) if isinstance(o, Tensor))


def _numerical(fn: Callable[..., Any], inputs: tuple[Any, ...], i: int, eps: float) -> list[np.ndarray]:
    """d outputs / d inputs[i] as one (out.size, in.size) matrix per output."""
    x = inputs[i].data
    flat = x.reshape(-1)
    cols: list[list[np.ndarray]] = []
    for j in range(flat.size):
        orig = flat[j]
        flat[j] = orig + eps
        with no_grad():
            plus = [o.data.astype(np.float64).ravel().copy() for o in _outputs(fn, inputs)]
        flat[j] = orig - eps
        with no_grad():
            minus = [o.data.astype(np.float64).ravel().copy() for o in _outputs(fn, inputs)]
        flat[j] = orig
        cols.append([(p - m) / (2 * eps) for p, m in zip(plus, minus)])
    n_out = len(_outputs(fn, inputs))
    return [np.stack([c[k] for c in cols], axis=1) if cols else np.zeros((0, 0)) for k in range(n_out)]


def _analytical(fn: Callable[..., Any], inputs: tuple[Any, ...], diff: list[int]) -> list[list[np.ndarray]]:
    """[output k][input i] Jacobian blocks, one vector-Jacobian product per output element."""
    from .api import grad_sync

    outs = _outputs(fn, inputs)
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


def _check(fn: Callable[..., Any], inputs: tuple[Any, ...], eps: float, atol: float, rtol: float,
           raise_exception: bool) -> bool:
    diff = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    for i in diff:
        if inputs[i].dtype != np.float64:
            import warnings

            warnings.warn(f"Input #{i} requires gradient and is not a double precision floating "
                          "point. gradcheck is only reliable in float64.", UserWarning, stacklevel=3)
    analytical = _analytical(fn, inputs, diff)
    for r, i in enumerate(diff):
        numerical = _numerical(fn, inputs, i, eps)
        for k, (num, blocks) in enumerate(zip(numerical, analytical)):
            ana = blocks[r]
            if not np.allclose(ana, num, rtol=rtol, atol=atol):
                if not raise_exception:
                    return False
                raise GradcheckError(_mismatch_message(k, i, num, ana, atol, rtol))
    return True


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
              rtol: float = 1e-3, raise_exception: bool = True) -> bool:
    """Check the gradients of ``fn`` at ``inputs`` against finite differences.

    Returns True, or raises :class:`GradcheckError` (False with ``raise_exception=False``).
    Works from synchronous code and from inside a running event loop.
    """
    ins = _as_tuple(inputs)
    if in_event_loop_thread():
        return bool(_run_on_fresh_thread(_check, fn, ins, eps, atol, rtol, raise_exception))
    return _check(fn, ins, eps, atol, rtol, raise_exception)


def gradgradcheck(fn: Callable[..., Any], inputs: Any, grad_outputs: Sequence[Tensor] | None = None, *,
                  eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  raise_exception: bool = True, seed: int = 0) -> bool:
    """Check second derivatives: gradcheck of the vector-Jacobian product of ``fn``."""
    from .api import grad_sync

    ins = _as_tuple(inputs)
    diff = [i for i, t in enumerate(ins) if isinstance(t, Tensor) and t.requires_grad]
    if grad_outputs is None:
        rng = np.random.default_rng(seed)
        with no_grad():
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

    args = ins + gos
    if in_event_loop_thread():
        return bool(_run_on_fresh_thread(_check, vjp, args, eps, atol, rtol, raise_exception))
    return _check(vjp, args, eps, atol, rtol, raise_exception)
