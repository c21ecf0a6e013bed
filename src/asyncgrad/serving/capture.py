"""What the per-sample rules need from a batch's pass: each rule-owned layer's input
and the gradient at its output, and which parameters the rules cover.

Layers are found by following ``loss_fn``'s references (itself if a Module, a bound
method's object, a closure's cells, the globals its code names, a partial's arguments,
an object's attributes), then every submodule of what was found. A forward hook on each
layer that has a rule records its calls, but only inside a batch's forward (a
ContextVar names the recording; the hooks do nothing for anyone else's forward).

Note [Covered parameters]: a rule computes a parameter's per-request gradient from its
layer's calls only, so it is right only if every use of the parameter in the graph is
inside such a call. ``covered`` checks that on the graph itself: the edges into the
parameter's AccumulateGrad counted over the whole graph equal those counted inside the
recorded calls (walked from the call's output down to its inputs). Anything else (a
parameter used by an op outside its layer, tied to another layer, or owned by a layer
without a rule) is left to one backward per request."""

from __future__ import annotations

import contextvars
import functools
import types
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..autograd.graph import AccumulateGrad, Node
from ..autograd.graph.record import OpNode
from ..autograd.task.graph_task import is_plain_node, is_quiet_leaf
from ..autograd.task.lifecycle import START_HOOKS
from ..nn import Module
from ..tensor import Tensor
from .rules import rule_for

MAX_DEPTH = 4  # how far references are followed from loss_fn to find its layers


class LayerCall:
    """One call of a rule-owned layer in a batch's forward."""

    __slots__ = ("layer", "x", "inputs", "output", "grad", "handle")

    def __init__(self, layer: Module, args: tuple[Any, ...], output: Tensor) -> None:
        self.layer = layer
        first = args[0]
        self.x = np.asarray(first.data if isinstance(first, Tensor) else first)
        self.inputs = [a for a in args if isinstance(a, Tensor)]
        self.output = output
        self.grad: np.ndarray | None = None
        self.handle: Any = None  # the hook on ``output`` that keeps its gradient


class Recording:
    """The layer calls of one batch's forward; gradients are kept while ``armed`` (the
    batch's own backward, not the per-request fallback ones)."""

    def __init__(self) -> None:
        self.calls: list[LayerCall] = []
        self.armed = False
        self.keepers: set[int] = set()  # id() of each hook made by ``keeper`` (alive while registered)

    def close(self) -> None:
        """The pass is over: the hooks go. (Each holds its call, which holds the output
        whose node holds the hook: a cycle with the batch's arrays in it, freed only by
        the cyclic GC, and not at all while it is off.)"""
        self.armed = False
        for call in self.calls:
            if call.handle is not None:
                call.handle.remove()
                call.handle = None
        self.calls = []
        self.keepers = set()

    def keeper(self, call: LayerCall) -> Callable[[Tensor], None]:
        def keep(g: Tensor) -> None:
            if self.armed:  # (a copy: the engine may reuse its buffer afterwards)
                call.grad = np.array(g.numpy(), copy=True)
        self.keepers.add(id(keep))
        return keep


RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("asyncgrad_serving_recording",
                                                                             default=None)


def _on_forward(layer: Module, args: tuple[Any, ...], output: Any) -> None:
    recording = RECORDING.get()
    if recording is None or not args or not isinstance(output, Tensor) or not output.requires_grad:
        return
    call = LayerCall(layer, args, output)
    call.handle = output.register_hook(recording.keeper(call))
    recording.calls.append(call)


def find_modules(root: Any) -> list[Module]:
    """The Modules ``root`` refers to (see the module's docstring), outermost first."""
    found: list[Module] = []
    seen: set[int] = set()
    frontier = [(root, 0)]
    while frontier:
        obj, depth = frontier.pop(0)
        if id(obj) in seen or depth > MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, Module):
            found.append(obj)
            continue
        frontier.extend((o, depth + 1) for o in _references(obj))
    out: list[Module] = []
    ids: set[int] = set()
    for m in found:
        for sub in m.modules():
            if id(sub) not in ids:
                ids.add(id(sub))
                out.append(sub)
    return out


def _references(obj: Any) -> Iterable[Any]:
    if isinstance(obj, (str, bytes, int, float, bool, np.ndarray, Tensor, type(None), type, types.ModuleType)):
        return ()
    if isinstance(obj, functools.partial):
        return (obj.func, *obj.args, *obj.keywords.values())
    if isinstance(obj, types.MethodType):
        return (obj.__self__, obj.__func__)
    if isinstance(obj, types.FunctionType):
        refs: list[Any] = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        refs += [obj.__globals__[n] for n in _names(obj.__code__) if n in obj.__globals__]
        refs += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
        return refs
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    refs = list(getattr(obj, "__dict__", {}).values())
    if callable(obj) and isinstance(type(obj).__call__, types.FunctionType):
        refs.append(type(obj).__call__)
    return refs


def _filled(cell: Any) -> bool:
    try:
        return cell.cell_contents is not cell  # (an empty cell raises)
    except ValueError:
        return False


def _names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _names(const)
    return names


class LayerHooks:
    """The modules of a batcher's ``loss_fn`` (their parameters' names and order) and,
    with ``record``, the forward hooks on those that have a rule."""

    def __init__(self, loss_fn: Any, record: bool) -> None:
        self.modules = find_modules(loss_fn)
        self.handles = [m.register_forward_hook(_on_forward) for m in self.modules
                        if record and rule_for(m) is not None]
        self.names: dict[int, str] = {}  # id(parameter) -> its name, for messages
        self.order: dict[int, int] = {}  # id(parameter) -> its place in the modules' parameters()
        for m in self.modules:  # (outermost first: names as the outermost module calls them)
            for name, p in m.named_parameters():
                self.names.setdefault(id(p), name)
                self.order.setdefault(id(p), len(self.order))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class GraphWalk:
    """One walk of a graph from ``root``: the edges into each leaf's AccumulateGrad, the
    nodes reached, the leaves in the order first reached, and whether the graph is
    ``plain``: built-in nodes and leaves that no hook watches (the engine's Note [Plain
    backwards and quiet nodes]) but those in ``own_hooks`` (a Recording's keepers), so no
    code of the user's runs in its backward."""

    def __init__(self, root: Node, stop: frozenset[int] = frozenset(), own_hooks: set[int] | None = None) -> None:
        self.edges: Counter[int] = Counter()
        self.leaves: list[Tensor] = []
        self.reached: set[int] = {id(root)}
        own = own_hooks or set()
        plain = _plain(root, own)
        stack = [root]
        while stack:
            node = stack.pop()
            for nxt, _ in node.next_functions:
                if nxt is None:
                    continue
                if type(nxt) is AccumulateGrad:
                    var = nxt.variable
                    if not self.edges[id(var)]:
                        self.leaves.append(var)
                        plain = plain and is_quiet_leaf(nxt)
                    self.edges[id(var)] += 1
                elif id(nxt) not in self.reached and id(nxt) not in stop:
                    self.reached.add(id(nxt))
                    plain = plain and _plain(nxt, own)
                    stack.append(nxt)
        self.plain = plain and not (START_HOOKS and any(key in START_HOOKS for key in self.reached))


def _plain(node: Node, own: set[int]) -> bool:
    """A built-in node whose only hooks, if any, are tensor hooks in ``own``."""
    if is_plain_node(node):
        return True
    hooks = node._hooks
    return (type(node) is OpNode and hooks is not None and not (hooks.pre or hooks.post or hooks.retains_grad)
            and all(id(fn) in own for slot in hooks.tensor_pre.values() for fn in slot.values()))


def covered(walk: GraphWalk, calls: list[LayerCall]) -> dict[int, list[LayerCall]]:
    """Note [Covered parameters]: ``id(parameter) -> the calls whose rule gives its
    per-request gradient``, for each parameter every use of which is inside them."""
    inside: Counter[int] = Counter()
    calls_of: dict[int, list[LayerCall]] = {}
    for call in calls:
        node = call.output.grad_fn
        if node is None or id(node) not in walk.reached:
            continue  # (its output does not reach the loss: it adds nothing)
        stop = frozenset(id(t.grad_fn) for t in call.inputs if t.grad_fn is not None)
        local = GraphWalk(node, stop)
        own = {id(p) for p in call.layer.parameters(recurse=False)}
        for key, n in local.edges.items():
            inside[key] += n
            if key in own:
                calls_of.setdefault(key, []).append(call)
    return {key: cs for key, cs in calls_of.items() if inside[key] == walk.edges[key]}
