"""What the four methods share: checking their arguments, and running a batch of
perturbed copies through the model as one forward and one backward per chunk."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from anyio.lowlevel import checkpoint

from .. import grad_mode
from ..autograd import grad
from ..creation import tensor
from ..tensor import Tensor

Model = Callable[..., Tensor]
Target = int | Sequence[int] | np.ndarray | Tensor | None


def check_inputs(inputs: Any) -> np.ndarray:
    """``inputs`` as a floating numpy array of shape (N, ...), a copy detached from any graph."""
    if not isinstance(inputs, Tensor):
        raise ValueError(f"inputs must be an asyncgrad Tensor of shape (N, ...), got {type(inputs).__name__}")
    if inputs.ndim < 1 or inputs.shape[0] == 0:
        raise ValueError(f"inputs must have a batch dimension with at least one example, got shape {inputs.shape}")
    x = np.array(inputs.detach().numpy())
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"inputs must be floating point, got dtype {x.dtype}")
    return x


def check_positive_int(name: str, value: Any, *, minimum: int = 1, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{' or None' if optional else ''}, got {value!r}")
    return int(value)


def example_targets(target: Target, n: int) -> np.ndarray | None:
    """``target`` as one class index per example (None stays None)."""
    if target is None:
        return None
    if isinstance(target, bool):
        raise ValueError(f"target must be an int, a sequence of ints (one per example) or None, got {target!r}")
    raw = target.detach().numpy() if isinstance(target, Tensor) else target
    arr = np.asarray(raw)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"target must be an int, a sequence of ints (one per example) or None, got {target!r}")
    if arr.ndim == 0:
        arr = np.full(n, int(arr))
    if arr.shape != (n,):
        raise ValueError(f"target must give one class index per example: {n} expected, got shape {arr.shape}")
    if (arr < 0).any():
        raise ValueError(f"target must hold class indices >= 0, got {arr.tolist()}")
    return arr.astype(np.intp)


def forward_args(additional_forward_args: Any) -> tuple[Any, ...]:
    if additional_forward_args is None:
        return ()
    return tuple(additional_forward_args) if isinstance(additional_forward_args, tuple) else (additional_forward_args,)


def rows_of_args(args: tuple[Any, ...], examples: np.ndarray, n: int) -> tuple[Any, ...]:
    """Each Tensor or array argument whose first dimension is the batch's (``n``) repeated as
    the rows ``examples`` are; any other argument is passed as it is."""
    def rows(a: Any) -> Any:
        if isinstance(a, Tensor) and a.ndim >= 1 and a.shape[0] == n:
            return tensor(a.detach().numpy()[examples])
        if isinstance(a, np.ndarray) and a.ndim >= 1 and a.shape[0] == n:
            return a[examples]
        return a
    return tuple(rows(a) for a in args)


def run_model(model: Model, x: Tensor, args: tuple[Any, ...], *, record: bool = True) -> Tensor:
    """``model(x, *args)``, recorded for backward if ``record`` (also when the caller runs
    under ``no_grad``), else not."""
    with grad_mode.set_grad_enabled(record):
        out = model(x, *args)
    if not isinstance(out, Tensor):
        raise ValueError(f"model must return a Tensor, got {type(out).__name__}")
    if out.ndim not in (1, 2) or out.shape[0] != x.shape[0]:
        raise ValueError(f"model must return a Tensor of shape (N, classes) or (N,) for its {x.shape[0]} "
                         f"rows, got shape {out.shape}")
    return out


def check_targets_against(out_shape: tuple[int, ...], targets: np.ndarray | None) -> None:
    if len(out_shape) == 1 or out_shape[1] == 1:
        if targets is not None and (len(out_shape) == 1 or (targets != 0).any()):
            raise ValueError(f"target must be None for a model with one output per example (shape {out_shape})")
        return
    if targets is None:
        raise ValueError(f"target is None but the model returns {out_shape[1]} classes per example: "
                         "pass target= a class index, or one per example")
    if (targets >= out_shape[1]).any():
        raise ValueError(f"target must hold class indices < {out_shape[1]} (the model's classes), "
                         f"got {sorted(set(targets.tolist()))}")


def target_score(out: Tensor, targets: np.ndarray | None) -> Tensor:
    """The sum over rows of each row's target output: its gradient with respect to the rows
    is each row's own gradient, as long as the model treats rows independently. Recorded
    also when the caller runs under ``no_grad``."""
    check_targets_against(tuple(out.shape), targets)
    with grad_mode.enable_grad():
        if out.ndim == 1 or targets is None:
            return out.sum()
        one_hot = np.zeros(out.shape, dtype=out.dtype)
        one_hot[np.arange(out.shape[0]), targets] = 1
        return (out * tensor(one_hot)).sum()


def selected_outputs(out: np.ndarray, targets: np.ndarray | None) -> np.ndarray:
    """Each row's target output (as ``target_score`` selects it), as numbers."""
    if out.ndim == 1:
        return out
    if targets is None:
        return out[:, 0]
    return out[np.arange(out.shape[0]), targets]


async def between_chunks() -> None:
    """A checkpoint before each chunk's forward: the forward runs on the event loop, and a
    backward small enough to run inline need not yield, so without it a long call could
    hold the loop for many chunks: other tasks wait, and so does a timeout's deadline
    (the loop delivers it)."""
    await checkpoint()


def chunks(n_rows: int, internal_batch_size: int | None) -> list[np.ndarray]:
    size = n_rows if internal_batch_size is None else internal_batch_size
    return [np.arange(start, min(n_rows, start + size)) for start in range(0, n_rows, size)]


async def input_gradients(model: Model, n_rows: int, example_of_row: np.ndarray,
                          make_rows: Callable[[np.ndarray], np.ndarray], targets: np.ndarray | None,
                          args: tuple[Any, ...], n_examples: int, internal_batch_size: int | None,
                          consume: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """The gradient of each row's target output with respect to that row, for ``n_rows``
    rows built by ``make_rows(row_indices)``: one forward and one ``ag.grad`` per chunk of
    at most ``internal_batch_size`` rows, handed to ``consume(row_indices, gradients)``.
    The rows are fresh leaves, so no ``.grad`` anywhere is read or written."""
    for rows in chunks(n_rows, internal_batch_size):
        await between_chunks()
        examples = example_of_row[rows]
        x = tensor(make_rows(rows), requires_grad=True)
        out = run_model(model, x, rows_of_args(args, examples, n_examples))
        score = target_score(out, None if targets is None else targets[examples])
        (g,) = await grad(score, [x], allow_unused=True, materialize_grads=True)
        assert g is not None  # (materialize_grads)
        consume(rows, g.numpy())
