"""Recording: turning a call of a primitive (an :class:`OpSpec`) into a Tensor and a node.

This is the forward hot path: run the numpy kernel, and only when grad mode is on and
some input requires grad, build one :class:`OpNode` that saves what the rule needs.

Note [The recording fast path]: ``record`` runs once per op of every forward, and its
Python bookkeeping (not the kernel) was most of a small op's cost. So it inlines what it
used to call: ``OpNode.__init__`` and
``Node.__init__`` (the node's slots are set directly), ``Tensor._init`` for the result,
``VersionCounter()``, the hit of ``AccumulateGrad.for_leaf`` (the leaf's live weak
reference) and of ``_meta``'s interning dict, ``SavedTensor(result, is_output=True)``
for a saved output, and ``save_for_backward`` for a saved input, its cache hit and its
miss (``SavedTensor(v)`` and the cache store: a weight, a leaf, misses on every forward);
Tensor's
hottest methods call ``functional._binary``/``_unary`` directly. What keeps it correct:

* the checks are the ones of the code it inlines, only without the calls: grad mode is
  read on every call; ``saved_tensors_hooks`` are read once per node and, when any is
  active, every saved value goes through ``save_for_backward`` (HookedSavedTensor);
  anomaly mode is read after the node is built, as before;
* a cached SavedTensor is reused only if its array, place and version still match the
  tensor's and the tensor is not a leaf that requires grad (the cases
  ``save_for_backward`` reuses it: a SavedTensor whose ``place`` is the tensor's grad_fn
  has the kind that grad_fn implies, Note [One slot for a saved tensor's place]); a
  tensor that is not output 0 of its grad_fn, and anything else, takes
  ``save_for_backward``. The version counter check at backward (``OpNode.plain_args``)
  is untouched, so an in-place change of a saved tensor still raises;
* a node that saves one tensor holds its entry bare as ``_checks`` (Note [Shared
  one-entry checks]); it shares the tensor's cached rule arguments as its ``saved`` only
  when that tensor is all it saves (one position of ``saved`` filled, no output saved,
  no hooks, the entry the one cached on the tensor) and the cached tuple has its length
  and holds the array at that position;
* a node whose one edge that needs a gradient is output 0 of its first input holds that
  input's node bare as ``_edges`` (Note [An OpNode's one edge in its slot] in
  op_node.py);
* the inlined constructors set every slot their classes declare (tests compare them with
  the constructors'), so a slot added to Tensor, Node, OpNode or SavedTensor must be
  added here too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _context
from ...backend import xp
from ...ops._spec import FACTOR_MAX_ELEMENTS, OpSpec
from . import NO_EDGE, AccumulateGrad, HookedSavedTensor, SavedTensor, next_sequence_nr, save_for_backward
from .op_node import MultiViewNode, OpNode
from .registry import tensor_constructors

__all__ = ["MULTIPLY_ADDS_PER_ELEMENT", "MultiViewNode", "OpNode", "interned_params", "record", "record_views"]

# The Tensor class and its constructors, bound here once for the hot path: registered by
# tensor.py (Note [The graph layer never imports Tensor] in graph/registry.py)
Tensor, VersionCounter, _init = tensor_constructors()
_grad_enabled = _context.grad_enabled
# A BLAS multiply-add costs about this fraction of an elementwise pass over one element
# (Note [Inline or offload] in sched/placement.py): a matrix product's backward counts as
# (output elements x inner dimension) / this many elements of work.
MULTIPLY_ADDS_PER_ELEMENT = 4
_wrap = Tensor._wrap
_nonleaf = Tensor._nonleaf
_for_leaf = AccumulateGrad.for_leaf
_new_tensor = object.__new__
_new_node = object.__new__
_new_saved = object.__new__
_new_counter = object.__new__
_next_sequence_nr = next_sequence_nr
_anomaly = _context.anomaly_mode
_saved_hooks = _context.saved_tensors_hooks


def record_views(node_name: str, rule: Any, x: Any, outs: list[np.ndarray], params: dict[str, Any]) -> list[Any]:
    """Wrap the arrays ``outs`` (views of ``x``) as Tensors that share one
    :class:`MultiViewNode` when grad mode is on and ``x`` requires grad."""
    if not _grad_enabled.get() or not x._requires_grad:
        return [_wrap(o) for o in outs]
    node = MultiViewNode(node_name, rule, x._gradient_edge(), params, len(outs), x.data.shape, x.data.dtype)
    if _anomaly.get() is not None:
        from ..tools.anomaly_mode import record_forward_trace

        record_forward_trace(node)
    return [_nonleaf(o, node, i, None) for i, o in enumerate(outs)]


# Input shapes/dtypes tuples are interned: nodes with the same input signature share one
# pair of tuples instead of allocating their own (graph memory per node matters for deep
# graphs). The cache is bounded so that ever-changing shapes cannot grow it without limit.
_META_CACHE: dict[tuple[Any, ...], tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
_META_CACHE_MAX = 4096


def _meta(key: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    meta = _META_CACHE.get(key)
    if meta is None:
        meta = (key[0::2], key[1::2])
        if len(_META_CACHE) < _META_CACHE_MAX:
            _META_CACHE[key] = meta
    return meta


# Note [Interned node constants]: a node's ``params`` (a reduction's dims and shape, a
# view's shape...) and its ``work`` are the same for every node of one op on one input
# signature, yet each call makes its own dict and (above 256) its own int: per node of a
# graph, as many bytes as a SavedTensor. They are interned: nodes built with equal
# values share one object. Sound because no one changes a node's ``params`` (the rules
# receive them as keywords, a copy) and an int is immutable; only values compared
# exactly are interned: ``params`` whose values are ints, bools, strings, None or tuples
# of ints, keyed with each value's type (``True == 1`` and ``1.0 == 1``, yet a rule may
# tell them apart), anything else (arrays, slices, floats) stays the node's own. Both
# caches are bounded, so ever-changing shapes cannot grow them without limit. A dict
# that is already the shared one is known by its id (``_PARAMS_IDS``: the cache's dicts
# are never dropped, so no other dict can take one of their ids), and a caller that keeps
# the shared dict of its common case (a whole-array sum's or mean's, functional/
# reductions.py) hands it over without a key to build: ``interned_params`` gives it one.
_PARAMS_CACHE: dict[tuple[Any, ...], dict[str, Any]] = {}
_PARAMS_IDS: set[int] = set()  # the ids of the dicts in _PARAMS_CACHE
_WORK_CACHE: dict[int, int] = {}
_CONSTANTS_MAX = 4096
_EXACT = frozenset({int, bool, str, type(None)})


def _interned_params(params: dict[str, Any]) -> dict[str, Any]:
    """The shared dict equal to ``params``, or ``params`` itself (Note [Interned node
    constants])."""
    if id(params) in _PARAMS_IDS:  # (the shared one itself)
        return params
    key: list[Any] = []
    for k, v in params.items():
        t = type(v)
        if t is tuple:
            for e in v:
                if type(e) is not int:
                    return params
        elif t not in _EXACT:
            return params
        key.append(k)
        key.append(t)
        key.append(v)
    k2 = tuple(key)
    hit = _PARAMS_CACHE.get(k2)
    if hit is not None:
        return hit
    if len(_PARAMS_CACHE) < _CONSTANTS_MAX:
        _PARAMS_CACHE[k2] = params
        _PARAMS_IDS.add(id(params))
    return params


interned_params = _interned_params  # (for callers that keep a shared dict: the Note)


def _interned_work(work: int) -> int:
    """The shared int equal to ``work`` (Note [Interned node constants])."""
    hit = _WORK_CACHE.get(work)
    if hit is not None:
        return hit
    if len(_WORK_CACHE) < _CONSTANTS_MAX:
        _WORK_CACHE[work] = work
    return work


def record(spec: OpSpec, inputs: tuple[Any, ...], out: np.ndarray, aux: Any = None,
           params: dict[str, Any] | None = None) -> Any:
    """Wrap ``out`` (already computed from ``inputs``) as a Tensor, recording a node when
    grad mode is on and some input requires grad. Non-Tensor inputs are constants.

    The forward's hot path (every op of every forward): see Note [The recording fast
    path]."""
    if type(out) is not xp.array_type:  # (Note [One array backend] in backend.py)
        out = xp.asarray(out)
    if not _grad_enabled.get():
        result = _new_tensor(Tensor)
        _init(result, out, None, 0, None)
        return result
    # the edges (Tensor._gradient_edge and AccumulateGrad.for_leaf's hit, inlined) and the
    # input metadata the engine validates gradients against
    if len(inputs) == 1:
        t = inputs[0]
        if type(t) is not Tensor or not t._requires_grad:
            result = _new_tensor(Tensor)
            _init(result, out, None, 0, None)
            return result
        # the edges: the producer alone when it is output 0 (Note [An OpNode's one edge
        # in its slot] in op_node.py)
        edges: Any = t.grad_fn
        if edges is None:  # a leaf: its AccumulateGrad, made on first use
            ref = t._acc_ref
            edges = (ref is not None and ref()) or _for_leaf(t)
        elif t.output_nr:
            edges = ((edges, t.output_nr),)
        d = t._data
        key1 = (d.shape, d.dtype)
        meta = _META_CACHE.get(key1) or _meta(key1)
        live = 0  # (the input that needs a gradient, if only one does)
    else:
        edge_list: list[Any] = []
        key: list[Any] = []
        requires = False
        live = -1
        i = -1
        for t in inputs:
            i += 1
            if type(t) is Tensor and t._requires_grad:
                live = -1 if requires else i
                requires = True
                fn = t.grad_fn
                if fn is None:  # (as above)
                    ref = t._acc_ref
                    edge_list.append(((ref is not None and ref()) or _for_leaf(t), 0))
                else:
                    edge_list.append((fn, t.output_nr))
                d = t._data
                key.append(d.shape)
                key.append(d.dtype)
            else:
                edge_list.append(NO_EDGE)
                key.append(None)
                key.append(None)
        if not requires:
            result = _new_tensor(Tensor)
            _init(result, out, None, 0, None)
            return result
        edges = edge_list[0][0] if live == 0 and not edge_list[0][1] else tuple(edge_list)
        key2 = tuple(key)
        meta = _META_CACHE.get(key2) or _meta(key2)
    # OpNode.__init__ (and Node.__init__), inlined
    node = _new_node(OpNode)
    node.sequence_nr = _next_sequence_nr()
    node._edges = edges
    node._hooks = None
    node.spec = spec
    if aux is not None:
        node.params = {**(params or {}), "aux": aux}
    else:
        node.params = params and _interned_params(params)
    node.input_shapes, node.input_dtypes = meta
    # _init(result, out, node, 0, None), inlined
    result = _new_tensor(Tensor)
    result._data = out
    result._requires_grad = True
    result.grad_fn = node
    result.output_nr = 0
    result._grad = None
    version = _new_counter(VersionCounter)
    version.value = 0
    result._version_counter = version
    result._base = None
    result._hooks = None
    result._post_acc_hooks = None
    result._retains_grad = False
    result._acc_ref = None
    result._saved = None
    result._saved_args = None
    result._views = None
    result._creation_meta = 0
    # elements the kernel reads: the incoming gradient and every saved array, scaled by
    # the op's cost factor; a matrix product's by its multiply-adds (Note [Inline or
    # offload] in sched/placement.py)
    work = out.size
    if spec.save_inputs or spec.save_ans:
        hooked = bool(_saved_hooks.get())
        # laid out as the rules' arguments: (ans, input 0, input 1, ...)
        saved: list[Any] = list(spec.no_args)
        checks: list[Any] = []
        one = None  # checks[0], while it is the only check and the one cached on its tensor
        alone = True  # whether ``saved`` holds nothing but checks[0]'s array, once
        bare = type(edges) is not tuple  # (only input 0 needs a gradient)
        for pos, users in zip(spec.save_inputs, spec.save_when):
            if users is not None:
                for u in users:
                    if (not u) if bare else (edges[u] is not NO_EDGE):
                        break
                else:
                    continue  # no rule that would read it will run
            v = inputs[pos]
            if type(v) is not Tensor:
                saved[pos + 1] = v
                alone = False
                continue
            if hooked:
                entry: Any = save_for_backward(v)
                if type(entry) is HookedSavedTensor:
                    entry.pos = pos + 1
                held = None
            else:
                # save_for_backward's cache hit, inlined (its other checks follow
                # from these: Note [The recording fast path])
                held = entry = v._saved
                if entry is None or entry.data is not v._data or entry.place is not v.grad_fn \
                        or entry.saved_version != v._version_counter.value \
                        or (entry.place is None and v._requires_grad):
                    if v.output_nr:  # (a place that is a tuple: Note [One slot for a saved tensor's place])
                        entry = save_for_backward(v)
                        held = v._saved
                        if held is not entry:
                            held = None
                    else:
                        # save_for_backward's miss, inlined: SavedTensor(v), cached
                        # on v unless v is a leaf that requires grad
                        entry = _new_saved(SavedTensor)
                        entry.data = v._data
                        vc = v._version_counter
                        entry.version = vc
                        entry.saved_version = vc.value
                        vfn = v.grad_fn
                        if vfn is not None:
                            entry.place = vfn
                            held = v._saved = entry
                        elif v._requires_grad:
                            entry.place = v
                            held = None
                        else:
                            entry.place = None
                            held = v._saved = entry
            if entry not in checks:
                if checks:
                    one = None
                else:
                    one = held
                    lone = v
                    at = pos + 1
                checks.append(entry)
                if type(entry) is SavedTensor:
                    work += entry.data.size
            else:
                alone = False  # (x * x: one entry, two positions)
            saved[pos + 1] = entry.data
        if spec.save_ans:
            if hooked:
                entry = save_for_backward(result, is_output=True)
                if type(entry) is HookedSavedTensor:
                    entry.pos = 0
                else:
                    work += out.size
            else:
                # SavedTensor(result, is_output=True), inlined: result is new (version 0)
                entry = _new_saved(SavedTensor)
                entry.data = out
                entry.version = result._version_counter
                entry.saved_version = 0
                entry.place = 0  # (output 0: Note [One slot for a saved tensor's place])
                work += out.size  # (its array is ``out``)
            checks.append(entry)
            one = None
            saved[0] = entry.data
        if one is not None:
            # a node that saves one cached tensor alone holds its entry bare, and shares
            # its rule arguments when laid out alike (Note [Shared one-entry checks])
            node._checks = one
            if alone:
                args = lone._saved_args
                if args is None or len(args) != len(saved) or args[at] is not saved[at]:
                    args = lone._saved_args = tuple(saved)
                node.saved = args
            else:
                node.saved = tuple(saved)
        else:
            node.saved = tuple(saved)
            node._checks = checks[0] if len(checks) == 1 else tuple(checks)
    else:
        node.saved = ()
        node._checks = ()
    if spec.blas:
        first = inputs[0]._data if type(inputs[0]) is Tensor else np.asarray(inputs[0])
        work += out.size * (first.shape[-1] if first.ndim else 1) // MULTIPLY_ADDS_PER_ELEMENT
    if spec.cost != 1.0:
        work = int(work * spec.cost)
    # (CPython shares the small ints; the cache's hit without a call)
    node.work = work if work < 257 else (_WORK_CACHE.get(work) or _interned_work(work))
    # the factor of the one input that needs a gradient, if the node can be in a fused run
    # (Note [Fused runs] in sched/runs.py): a numpy array of at most FACTOR_MAX_ELEMENTS,
    # that input of the output's shape and dtype (by construction for an ``own`` factor),
    # and so is the value the factor reads, or it is 0-d (a Python number as the
    # tensor's dtype, functional._binary's)
    factors = spec.factors
    factor = factors[live] if factors and live >= 0 and type(out) is np.ndarray \
        and out.size <= FACTOR_MAX_ELEMENTS else None
    if factor is not None and not factor.own:
        shape = out.shape
        dtype = out.dtype
        if meta[0][live] != shape or meta[1][live] != dtype:
            factor = None
        elif factor.read is not None:
            a = node.saved[factor.read]
            if type(a) is not np.ndarray or (a.ndim and a.shape != shape) or a.dtype != dtype:
                factor = None
    node.factor = factor
    if _anomaly.get() is not None:
        from ..tools.anomaly_mode import record_forward_trace

        record_forward_trace(node)
    return result
