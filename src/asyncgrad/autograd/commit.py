"""Committing a backward: staged gradients into ``.grad``, then hooks, then freeing.

Note [Commit on success]: leaf gradients (and retain_grad gradients) are *staged* on the
GraphTask while it runs and written into ``.grad`` only after every node finished
without error, so a backward that fails or is cancelled leaves every ``.grad`` exactly
as it was. Saved tensors are released at the same point, so a failed or cancelled
backward can be retried.

Note [Atomic commits]: a commit is all or nothing for every observer.

* Other tasks on the loop: the gradients are published on the loop thread without an
  await in between, so a task never runs while half of them are written. A small
  commit adds in place right there. A large one would stall the loop, so its sums are
  computed on a worker thread into *fresh* arrays, not into ``.grad``, and then
  published in one step on the loop: each ``.grad`` Tensor gets its new array (the
  Tensor object is kept, as PyTorch's in-place accumulation keeps it). A ``.grad``
  changed meanwhile (another commit, ``zero_grad()``, an in-place op: its array or
  version differs from the one summed) is accumulated again at publication instead.
* Other threads: publication, and every in-place accumulation, happen under
  ``COMMIT_LOCK``, which is held only for those reference swaps and small additions;
  a worker thread never holds it, so the loop thread never waits on a worker.
  ``optimizer.step()`` and ``zero_grad()`` take it (``grad_lock()``) to see each
  commit whole.

Note [Pre-commit]: ``queue_pre_commit(fn)`` adds a step between "every node finished"
and the commit. The functions see each tensor whose ``.grad`` will change with its
staged gradient, may replace those gradients (same shape), and may raise or be
cancelled: the commit has not started, so nothing is written and nothing freed.
Distributed data parallelism averages gradients across processes here and lets every
process commit, or none.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..tensor import Tensor
from .graph_task import GraphTask
from .input_buffer import PendingSum

# Re-entrant: an optimizer step holds it and its closure may run a (synchronous) backward.
COMMIT_LOCK = threading.RLock()
RELEASE_STEP = 1024  # nodes whose saved tensors are freed between two chances to yield


def grad_lock() -> threading.RLock:
    """The lock every commit publishes under: hold it to read or change several
    ``.grad`` at once without seeing a commit half done (Note [Atomic commits])."""
    return COMMIT_LOCK


def staged_size(task: GraphTask) -> int:
    """Elements the commit will add (to decide whether it is computed on a worker): a
    leaf's first ``.grad`` is the staged array itself (stolen) and adds nothing, so a
    backward into fresh leaves never hops for its commit; deferred sums always add."""
    staged = task.staged
    return sum(getattr(g, "size", 0) for var in staged if (g := staged[var]) is not None
               and (var._grad is not None or type(g) is PendingSum))


def _stages(task: GraphTask) -> tuple[dict[Tensor, Any], dict[Tensor, Any]]:
    return task.staged, task.retained


def commit_inline(task: GraphTask) -> None:
    """Accumulate every staged gradient into ``.grad`` in place, on this thread."""
    staged = task.staged
    for var in list(staged):  # deferred sums first, outside the lock
        if type(staged[var]) is PendingSum:
            staged[var] = staged[var].total()
    g = None  # (no extra reference for _owned to count)
    with COMMIT_LOCK:
        # (keys, then a lookup: a dict items() iterator would keep one more reference
        # to the last value and defeat _owned's reference count)
        for stage in _stages(task):
            for var in list(stage):
                g = stage[var]
                if g is not None:
                    _accumulate(var, g, task.create_graph)


Prepared = list[tuple[Tensor, Any, int, Any, Any, Any]]


def sum_fresh(task: GraphTask) -> Prepared:
    """On a worker thread: each new ``.grad`` value in a fresh array, with what it was
    computed from (Note [Atomic commits]). Reads ``.grad``, writes nothing shared."""
    out: Prepared = []
    g = None
    for stage in _stages(task):
        for var in list(stage):  # (keys, then a lookup: see commit_inline)
            g = stage[var]
            if g is None:
                continue
            if type(g) is PendingSum:
                stage[var] = g = g.total()
            current = var._grad
            if current is None:
                out.append((var, None, 0, None, _take(g, var.data.dtype, 5), g))
            else:
                data = current.data
                # (asarray: np.add of 0-d arrays returns a numpy scalar, not an array)
                out.append((var, current, current._version_counter.value, data,
                            np.asarray(np.add(data, g, dtype=data.dtype, casting="unsafe")), g))
    return out


def publish(task: GraphTask, prepared: Prepared) -> None:
    """On the loop: install the fresh arrays, all in one step under the commit lock."""
    with COMMIT_LOCK:
        for var, seen, version, data, new, g in prepared:
            current = var._grad
            if current is seen and (current is None or (
                    current.data is data and current._version_counter.value == version)):
                if current is None:
                    var._grad = Tensor._wrap(new)
                else:
                    current.data = new
            else:  # changed since it was summed: add this backward's part to what is there
                _accumulate(var, g, False)


def after_commit(task: GraphTask) -> None:
    """Post-accumulate-grad hooks, in the order the leaves' gradients became ready."""
    for var in task.staged:
        hooks = var._post_acc_hooks
        if hooks:
            for hook in tuple(hooks.values()):
                if hook(var) is not None:
                    raise RuntimeError("Tensor post accumulate grad hooks should return None.")


def release_steps(task: GraphTask) -> Iterator[None]:
    """Free the saved tensors of the nodes that ran (without retain_graph); yields
    every ``RELEASE_STEP`` nodes so a driver can let the loop run."""
    executed = task.executed
    task.executed = []
    for i, node in enumerate(executed):
        node.release_variables()
        if not (i + 1) % RELEASE_STEP:
            yield


def pre_commit_view(task: GraphTask) -> dict[Tensor, Tensor]:
    """Note [Pre-commit]: every tensor whose ``.grad`` the commit will change, mapped
    to its staged gradient as a Tensor. Deferred sums are added here, so the
    functions see (and may replace) final values; ``end_pre_commit`` takes back
    what they replaced."""
    view: dict[Tensor, Tensor] = {}
    for stage in _stages(task):
        for var in stage:
            g = stage[var]
            if g is None:
                continue
            if type(g) is PendingSum:
                stage[var] = g = g.total()
            view[var] = g if isinstance(g, Tensor) else Tensor._wrap(g)
    task.pre_commit_state = (view, dict(view))
    return view


def end_pre_commit(task: GraphTask) -> None:
    """Restage the entries the pre-commit functions replaced, each checked like a
    node's output (a Tensor of its variable's shape)."""
    view, original = task.pre_commit_state
    task.pre_commit_state = None  # (drop our wrappers: _owned may then steal the arrays)
    for stage in _stages(task):
        for var in stage:
            g = view.get(var)
            if g is None or g is original.get(var):
                continue
            if not isinstance(g, Tensor):
                raise TypeError(f"a pre-commit function staged a {type(g).__name__} for a tensor of "
                                f"shape {tuple(var.shape)}; expected a Tensor")
            if tuple(g.shape) != tuple(var.shape):
                raise RuntimeError(f"a pre-commit function staged a gradient of shape {tuple(g.shape)} "
                                   f"for a tensor of shape {tuple(var.shape)}")
            stage[var] = g if task.create_graph else g.numpy()


def _owned(arr: Any, refs: int) -> bool:
    """True when nobody but the engine holds ``arr`` (PyTorch steals such gradients).
    ``refs`` counts the engine's own references at the call (see ``_take``)."""
    return (type(arr) is np.ndarray and arr.base is None and arr.flags.writeable
            and sys.getrefcount(arr) <= refs)


def _take(g: Any, dtype: Any, refs: int) -> Any:
    """A first ``.grad`` array from staged ``g``: ``g`` itself when nobody else holds
    it, else a copy. ``refs``: the engine's references to ``g`` at the call (the staged
    dict, each frame's local between it and here, ours, ``_owned``'s and getrefcount's
    own). Both outcomes, on both commit paths, are tested
    (test_fresh_leaf_gradient_is_stolen_not_copied): a change that shifts a count
    fails there."""
    return g if _owned(g, refs) and g.dtype == dtype else np.array(g, dtype=dtype)


def _accumulate(var: Tensor, g: Any, create_graph: bool) -> None:
    if create_graph:
        gt = g if isinstance(g, Tensor) else Tensor._wrap(np.asarray(g))
        # A (differentiable) clone, as PyTorch's AccumulateGrad does under grad mode: the
        # incoming grad may be a user's tensor or be routed to several leaves, and .grad
        # must alias neither (a later in-place accumulation would write through it).
        var._grad = gt.clone() if var._grad is None else var._grad + gt
        return
    if isinstance(g, Tensor):
        g = g.data
    current = var._grad
    if current is None:
        var._grad = Tensor._wrap(_take(g, var.data.dtype, 6))
    elif current.grad_fn is None and current.data.flags.writeable:
        np.add(current.data, g, out=current.data, casting="unsafe")
        current._version_counter.value += 1  # (as PyTorch's in-place add; sum_fresh checks it)
    else:
        var._grad = Tensor._wrap(current.data + g)
