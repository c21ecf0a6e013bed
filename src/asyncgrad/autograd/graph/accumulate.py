"""A leaf's ``.grad``: how a gradient is added into it, and the lock every addition and
commit holds (Note [Atomic commits] in task/commit.py). The graph's AccumulateGrad (called
directly) and the commit both add through ``_accumulate``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ...backend import xp
from . import registry

if TYPE_CHECKING:
    from ...tensor import Tensor

# Re-entrant: an optimizer step holds it and its closure may run a (synchronous) backward.
COMMIT_LOCK = threading.RLock()
def grad_lock() -> threading.RLock:
    """The lock every commit publishes under: hold it to read or change several
    ``.grad`` at once without seeing a commit half done (Note [Atomic commits])."""
    return COMMIT_LOCK


def _take(g: Any, dtype: Any, owned: bool) -> Any:
    """A first ``.grad`` array from staged ``g``: ``g`` itself when the engine owns it
    (Note [Owned gradients] in task/step.py: it made the array and nobody else holds it;
    PyTorch steals such gradients too), else a copy, so that a later commit's in-place
    addition never writes into an array a user, a hook or another leaf holds."""
    if owned and type(g) is xp.array_type and g.dtype == dtype and xp.owns_memory(g):
        return g
    return xp.astype(g, dtype)


def _accumulate(var: Tensor, g: Any, create_graph: bool, owned: bool = False) -> None:
    """Add ``g`` into ``var.grad`` (under the commit lock); ``owned``: the engine's own
    array, which may become ``.grad`` itself."""
    tensor_cls = registry.tensor_cls  # (Note [The graph layer never imports Tensor])
    if create_graph:
        gt = g if isinstance(g, tensor_cls) else tensor_cls._wrap(g)
        # A (differentiable) clone, as PyTorch's AccumulateGrad does under grad mode: the
        # incoming grad may be a user's tensor or be routed to several leaves, and .grad
        # must alias neither (a later in-place accumulation would write through it).
        var._grad = gt.clone() if var._grad is None else var._grad + gt
        return
    if isinstance(g, tensor_cls):
        g = g.data
    current = var._grad
    if current is None:
        var._grad = tensor_cls._wrap(_take(g, var.data.dtype, owned))
    elif current.grad_fn is None and xp.writeable(current.data):
        xp.add_into(current.data, g)
        current._version_counter.value += 1  # (as PyTorch's in-place add; sum_fresh checks it)
    else:
        var._grad = tensor_cls._wrap(current.data + g)
