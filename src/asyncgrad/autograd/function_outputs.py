"""The forward side of ``Function.apply``: the outputs of a custom Function's ``forward``
become outputs of its node (or stay plain when nothing requires grad), with PyTorch's
rules for inputs returned as-is, dirty (in-place modified) tensors and views, and
non-differentiable outputs; then what ``ctx.save_for_backward`` named is saved.
"""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _context
from ..tensor import VIEW_IN_CUSTOM_FUNCTION, Tensor
from .function_node import FunctionCtx
from .graph import Edge, Node
from .saved import SavedTensor
from .saved import save_for_backward as _save

if TYPE_CHECKING:
    from .function import Function

_DIRTY_NOT_RETURNED = (
    "Some elements marked as dirty during the forward method were not returned as output. "
    "The inputs that are modified inplace must all be outputs of the Function."
)
_DIRTY_NOT_INPUT = (
    "ctx.mark_dirty() received a tensor that was not an input. Only input Tensors that have "
    "been mutated should be passed to ctx.mark_dirty()."
)

# PyTorch's text: its engine cannot record a dirty view on its base for a node with more
# outputs (asyncgrad's could, but refuses as PyTorch does, so code behaves the same in both)
_DIRTY_VIEW_OF_MANY = (
    "If your Function modifies inplace an input that is a view of another Tensor, your Function cannot "
    "return more than one Tensor. This is not supported by the current autograd engine. You should either "
    "make sure the input is not a view (using .clone() for example) or make your Function only return one "
    "Tensor (potentially splitting it into two Functions: one doing the inplace that returns a single "
    "Tensor and a second one that does the other operations). You can ask on the forum "
    "https://discuss.pytorch.org/ if you need help to do this change."
)


def wrap_outputs(cls: type[Function], ctx: FunctionCtx, args: tuple[Any, ...],
                  requires: tuple[bool, ...], edges: tuple[Edge, ...], output: Any,
                  executable: bool) -> Any:
    is_tuple = isinstance(output, tuple)
    outputs = output if is_tuple else (output,)
    dirty_ids = {id(t) for t in ctx._dirty}
    returned_ids = {id(o) for o in outputs}
    if not dirty_ids <= returned_ids:
        raise RuntimeError(_DIRTY_NOT_RETURNED)
    input_ids = {id(a) for a in args if isinstance(a, Tensor)}
    for t in ctx._dirty:
        if id(t) not in input_ids:
            if t._base is not None:  # a view of an intermediate: PyTorch raises
                raise RuntimeError(_DIRTY_NOT_INPUT)
            warnings.warn(_DIRTY_NOT_INPUT, UserWarning, stacklevel=3)
    for t in ctx._dirty:
        t._version_counter.value += 1  # PyTorch's _mark_dirty bumps the version
    # ctx must not keep the tensors it was told about: a dirty tensor's grad_fn becomes
    # the node, which holds ctx (a reference cycle that only gc.collect() would free)
    ctx._dirty = ()
    non_differentiable, ctx._non_differentiable = ctx._non_differentiable, ()
    if not executable:
        for t in non_differentiable:
            if isinstance(t, Tensor) and t.grad_fn is None and id(t) not in input_ids:
                t._requires_grad = False
        return output

    if len(outputs) > 1 and any(o._base is not None for o in outputs
                                if isinstance(o, Tensor) and id(o) in dirty_ids):
        raise RuntimeError(_DIRTY_VIEW_OF_MANY)
    node = cls._backward_cls(edges, ctx)
    non_diff_ids = {id(t) for t in non_differentiable}
    dirty_views: list[Tensor] = []
    new_outputs: list[Any] = []
    meta: list[tuple[tuple[int, ...], np.dtype] | None] = []
    non_diff: set[int] = set()
    done: dict[int, Tensor] = {}
    output_nr: dict[int, int] = {}  # id of an output (before and after wrapping) -> slot
    for i, o in enumerate(outputs):
        if not isinstance(o, Tensor):
            new_outputs.append(o)
            meta.append(None)
            continue
        meta.append((o.data.shape, o.data.dtype))
        if id(o) in done:  # the same tensor returned twice: the same object twice
            new_outputs.append(done[id(o)])
            continue
        if id(o) in non_diff_ids:
            non_diff.add(i)
            new = o if (o.grad_fn is None and not o._requires_grad) else _alias(o, None, 0)
        elif id(o) in dirty_ids:
            _rebase_dirty(o, node, i)
            if o._base is not None:
                dirty_views.append(o)
            new = o
        elif id(o) in input_ids or o.grad_fn is not None or o._requires_grad:
            new = _alias(o, node, i)  # an input returned as-is: a new view with our grad_fn
        else:
            o.grad_fn = node
            o.output_nr = i
            o._requires_grad = True
            if o._base is not None:  # a view made in forward (Note [View creation meta])
                o._creation_meta = VIEW_IN_CUSTOM_FUNCTION
            new = o
        done[id(o)] = new
        output_nr[id(o)] = output_nr[id(new)] = i
        new_outputs.append(new)

    node.num_outputs = len(outputs)
    node.output_meta = meta
    node.non_diff = frozenset(non_diff)
    node.tensor_inputs = tuple(isinstance(a, Tensor) for a in args)
    node.input_shapes = tuple(a.data.shape if r else None for a, r in zip(args, requires))
    node.input_dtypes = tuple(a.data.dtype if r else None for a, r in zip(args, requires))
    saved: list[Any] = []
    originals: list[Tensor | None] = []
    work = sum(a.data.size for a in args if isinstance(a, Tensor))
    work += sum(int(np.prod(m[0])) for m in meta if m is not None)
    for value in ctx._to_save:
        if value is None:
            saved.append(None)
            originals.append(None)
            continue
        nr = output_nr.get(id(value))
        if nr is not None and new_outputs[nr].grad_fn is node:
            saved.append(_save(new_outputs[nr], True))  # no output -> node -> output cycle
            originals.append(None)
        else:
            entry = _save(value)
            saved.append(entry)
            originals.append(value if type(entry) is SavedTensor else None)
        work += value.data.size
    ctx._saved = saved
    ctx._originals = originals
    ctx._to_save = ()
    ctx._node_ref = weakref.ref(node)
    node.work = work
    if _context.anomaly_mode.get() is not None:
        from .anomaly_mode import record_forward_trace

        record_forward_trace(node)
    for view in dirty_views:  # (after saving: a saved dirty view is saved as an output)
        _record_on_base(view)
    return tuple(new_outputs) if is_tuple else new_outputs[0]


def _alias(t: Tensor, node: Node | None, output_nr: int) -> Tensor:
    """A new tensor sharing ``t``'s memory and version counter (a view of it)."""
    out = Tensor._nonleaf(t.data, node, output_nr, t._version_counter)
    out._base = t._base if t._base is not None else t
    if node is not None:  # returned by a custom Function (Note [View creation meta])
        out._creation_meta = VIEW_IN_CUSTOM_FUNCTION
    return out


def _rebase_dirty(t: Tensor, node: Node, output_nr: int) -> None:
    """An input modified in place by forward: the same object, now an output of ``node``."""
    if t.grad_fn is None and t._requires_grad:
        raise RuntimeError("a leaf Variable that requires grad has been used in an in-place operation.")
    base = t._base
    if base is not None and base.grad_fn is None and (base._requires_grad or t._requires_grad):
        raise RuntimeError(
            "a view of a leaf Variable that requires grad is being used in an in-place operation."
        )
    old_node, old_nr = t.grad_fn, t.output_nr
    t.grad_fn = node
    t.output_nr = output_nr
    t._requires_grad = True
    if t._retains_grad and old_node is not None and old_node._hooks is not None:
        old_node._hooks.retains_grad.pop(old_nr, None)  # retain_grad follows the tensor
        t._retains_grad = False
        t.retain_grad()


def _record_on_base(view: Tensor) -> None:
    """A view that ``forward`` modified in place (marked dirty; its grad_fn is now the
    Function's node): record the change on its base too, as PyTorch does. The base
    becomes ``CopySlices(old base, the node's output)`` and the view a fresh view of the
    new base, so gradients reaching the base (or other views of it) flow through the
    Function's backward."""
    from .. import functional as F
    from ..grad_mode import enable_grad
    from ..tensor import _recordable_view_index

    base = view._base
    assert base is not None
    where = _recordable_view_index(view, base)
    out = Tensor._nonleaf(view.data, view.grad_fn, view.output_nr, None)
    with enable_grad():
        new_base = F.index_put(base._snapshot(), where, out, copy_slices=True)
        base._rebase(new_base.grad_fn)
        view._rebase(F.getitem(base, where).grad_fn)
    base._register_view(view)
    base._regenerate_views(skip=view)
