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
staged gradient, may replace those gradients (same shape and dtype), may add entries
for leaves this backward did not reach (a leaf that requires grad; ``backward()``
only), and may raise or be cancelled: the commit has not started, so nothing is written
and nothing freed. Added entries go into the same commit as the others, so they are
as atomic. Distributed data parallelism averages gradients across processes here (a
parameter unused on this process but used on another gets its average too) and lets
every process commit, or none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...backend import xp

from ...tensor import Tensor
from ..graph.accumulate import COMMIT_LOCK, _accumulate, _take, grad_lock  # noqa: F401  (grad_lock: the old path)
from .graph_task import GraphTask
from .input_buffer import PendingSum

RELEASE_STEP = 1024  # nodes whose saved tensors are freed between two chances to yield


def releases_in_one_step(task: GraphTask) -> bool:
    """Whether freeing the saved tensors of ``task``'s nodes is one step (no chance to
    yield needed: ``release_all``), else ``release_steps``."""
    return len(task.executed) <= RELEASE_STEP


def commit_on_loop(task: GraphTask) -> bool:
    """THE decision of how to commit (Note [Atomic commits]): add the staged gradients up
    in place on the loop (a recorded backward, or fewer elements to add than the task's
    inline threshold; every commit of the blocking driver), else sum them on a worker
    thread and publish them. Decided once per call (the runner asks before it takes the
    call's sequence on, which asks again): nothing is staged after the drain but by
    pre-commit functions, which run before either asks."""
    decided = task.commit_on_loop
    if decided is None:
        decided = task.commit_on_loop = task.create_graph or staged_size(task) < task.inline_threshold
    return decided


def staged_size(task: GraphTask) -> int:
    """Elements the commit will add (to decide whether it is computed on a worker): a
    leaf's first ``.grad`` is the staged array itself (stolen) and adds nothing, so a
    backward into fresh leaves never hops for its commit; deferred sums always add."""
    size = 0
    for var, g in task.staged.items():
        if g is not None and (var._grad is not None or type(g) is PendingSum):
            size += getattr(g, "size", 0)
    return size


def _stages(task: GraphTask) -> tuple[dict[Tensor, Any], dict[Tensor, Any]]:
    return task.staged, task.retained


def commit_inline(task: GraphTask) -> None:
    """Accumulate every staged gradient into ``.grad`` in place, on this thread."""
    staged = task.staged
    for var, g in staged.items():  # deferred sums first, outside the lock
        if type(g) is PendingSum:
            staged[var] = g.total()  # (a value replaced: the dict's size is unchanged)
    owned = task.owned
    create_graph = task.create_graph
    with COMMIT_LOCK:
        for stage in _stages(task):
            for var, g in stage.items():
                if g is not None:
                    _accumulate(var, g, create_graph, var in owned)


Prepared = list[tuple[Tensor, Any, int, Any, Any, Any]]


def sum_fresh(task: GraphTask) -> Prepared:
    """On a worker thread: each new ``.grad`` value in a fresh array, with what it was
    computed from (Note [Atomic commits]). Reads ``.grad``, writes nothing shared."""
    out: Prepared = []
    for stage in _stages(task):
        for var in list(stage):
            g = stage[var]
            if g is None:
                continue
            if type(g) is PendingSum:
                stage[var] = g = g.total()
            current = var._grad
            if current is None:
                out.append((var, None, 0, None, _take(g, var.data.dtype, var in task.owned), g))
            else:
                data = current.data
                out.append((var, current, current._version_counter.value, data,
                            xp.sum_as(data, g), g))
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


def release_all(task: GraphTask) -> None:
    """``release_steps`` in one go (a few nodes: nothing to yield for)."""
    executed = task.executed
    task.executed = []
    for node in executed:
        node.release_variables()


def release_steps(task: GraphTask) -> Iterator[None]:
    """Free the saved tensors of the nodes that ran (without retain_graph); yields
    every ``RELEASE_STEP`` nodes so a driver can let the loop run."""
    executed = task.executed
    task.executed = []
    for start in range(0, len(executed), RELEASE_STEP):
        for node in executed[start:start + RELEASE_STEP]:
            node.release_variables()
        if start + RELEASE_STEP < len(executed):
            yield


def pre_commit_view(task: GraphTask) -> dict[Tensor, Tensor]:
    """Note [Pre-commit]: every tensor whose ``.grad`` the commit will change, mapped
    to its staged gradient as a Tensor. Deferred sums are added here, so the
    functions see (and may replace) final values; ``end_pre_commit`` takes back
    what they replaced."""
    view: dict[Tensor, Tensor] = {}
    task.owned.clear()  # the functions see every array and may keep it (Note [Owned gradients])
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
    """Restage the entries the pre-commit functions replaced or added, each checked like
    a node's output (a Tensor of its variable's shape and dtype); an added key must be
    a leaf that requires grad, and only a backward that writes ``.grad`` takes one.
    Everything is checked before anything is staged: a refusal stages nothing."""
    view, original = task.pre_commit_state
    task.pre_commit_state = None
    changed: list[tuple[dict[Tensor, Any], Tensor, Tensor]] = []
    for stage in _stages(task):
        for var in stage:
            g = view.get(var)
            if g is None or g is original.get(var):
                continue
            changed.append((stage, var, _checked(var, g)))
    for var in view:
        if var not in original and var not in task.staged and var not in task.retained:
            changed.append((task.staged, _checked_new_leaf(task, var), _checked(var, view[var])))
    for stage, var, g in changed:
        stage[var] = g if task.create_graph else g.numpy()


def _checked(var: Tensor, g: Any) -> Tensor:
    if not isinstance(g, Tensor):
        raise TypeError(f"a pre-commit function staged a {type(g).__name__} for a tensor of "
                        f"shape {tuple(var.shape)}; expected a Tensor")
    if tuple(g.shape) != tuple(var.shape):
        raise RuntimeError(f"a pre-commit function staged a gradient of shape {tuple(g.shape)} "
                           f"for a tensor of shape {tuple(var.shape)}")
    if g.dtype != var.dtype:
        raise RuntimeError(f"a pre-commit function staged a gradient of dtype {g.dtype} "
                           f"for a tensor of dtype {var.dtype}")
    return g


def _checked_new_leaf(task: GraphTask, var: Any) -> Tensor:
    """Note [Pre-commit]: a key the backward did not stage must be a leaf it may write."""
    if not isinstance(var, Tensor):
        raise TypeError(f"a pre-commit function added a key of type {type(var).__name__}; "
                        "expected a Tensor (a leaf that requires grad)")
    if not task.accumulate:
        raise RuntimeError("a pre-commit function added an entry to a grad() call, which "
                           "commits nothing; only backward() commits into .grad")
    if var.grad_fn is not None or not var.requires_grad:
        what = "not a leaf" if var.grad_fn is not None else "a leaf that does not require grad"
        raise RuntimeError(f"a pre-commit function added a tensor of shape {tuple(var.shape)} that is "
                           f"{what}; only leaves that require grad can be committed")
    return var
