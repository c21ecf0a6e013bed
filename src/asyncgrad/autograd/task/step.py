"""Running a node: the one sequence of steps every node goes through.

``prepare`` (PyTorch's ``call_pre_hooks``: tensor pre-hooks, retain_grad, captures, node
pre-hooks; an AccumulateGrad is staged here), ``run_kernel`` (``call_function`` then
``validate_outputs``), and ``finish`` (post-hooks, then route each gradient onward).
The reference executor (tools/reference.py) runs those three in order for every node; the
drivers do too for every node that is not a plain built-in. Tools wrap the kernel, they
do not fork the path: anomaly mode runs ``run_kernel``'s two steps marking the node as
running, the profiler times ``run_kernel`` (``kernel_for``).

The core loop (sched/inline.py) runs a ready node inline with the step ``step_for``
picks once per slice: ``run_node`` (the three steps), or for a plain backward
``plain_step``, whose *fused step* for a plain built-in node is a kernel choice (a view
rule, a doubled gradient), routed through the one router like any other (Note [One
router] in task/graph_task.py).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from ...backend import Array, xp
from ... import _context
from ..graph import ACCUMULATE_GRAD_SEQUENCE_NR, AccumulateGrad, Node
from .graph_task import GraphTask, is_plain_node, is_quiet_leaf
from ..graph.hooks import run_leaf_tensor_hooks, run_post_hooks, run_pre_hooks, run_tensor_pre_hooks
from .input_buffer import InputBuffer, PendingSum, ReadyInputs, combine, inputs_of, slots_of
from ..graph.record import OpNode
from ..graph.saved import SavedTensor
from ..graph.validate import fix_gradient, validate_outputs

Kernel = Callable[[Node, list[Any], Any], list[Any]]
Step = Callable[[GraphTask, Node, ReadyInputs], bool]
AsyncKernel = Callable[[Node, list[Any], Any], Coroutine[Any, Any, list[Any]]]
_anomaly_mode = _context.anomaly_mode


# --- the kernel: apply, then validate ---------------------------------------------------
def run_kernel(node: Node, inputs: list[Any], math: Any) -> list[Any]:
    """A node's numeric work: apply, then validate. Thread-safe; touches no GraphTask.
    Under anomaly mode the same two steps run with the node marked as running (the
    parent of nodes built meanwhile), then a NaN check."""
    anomaly = _anomaly_mode.get()
    if anomaly is not None:
        return anomaly.run_node(node, inputs, math)
    return validate_outputs(node, node.apply(inputs, math))


async def run_async_kernel(node: Node, inputs: list[Any], math: Any) -> list[Any]:
    """``run_kernel`` for a node whose backward is ``async def``, awaited on the loop."""
    anomaly = _anomaly_mode.get()
    if anomaly is not None:
        return await anomaly.run_node_async(node, inputs, math)
    return validate_outputs(node, await node.apply_async(inputs, math))


def kernel_for(task: GraphTask, offloaded: bool) -> Kernel:
    """``run_kernel``, or the profiler's timed wrapper of it while a profile records."""
    if task.profiler is None:
        return run_kernel
    wrapped: Kernel = task.profiler.wrap_kernel(run_kernel, task, offloaded)
    return wrapped


def async_kernel_for(task: GraphTask) -> AsyncKernel:
    """``run_async_kernel``, or the profiler's timed wrapper of it."""
    if task.profiler is None:
        return run_async_kernel
    wrapped: AsyncKernel = task.profiler.wrap_async_kernel(run_async_kernel, task)
    return wrapped


def needed_edges(task: GraphTask, node: Node) -> frozenset[int] | None:
    """In a pruned backward (``grad()``, ``inputs=``), the edges of ``node`` that lead to a
    node it still needs (PyTorch's ``task_should_compute_output``); None in any other
    backward. On the loop: the task's dependencies are read here."""
    if task.exec_info is None:
        return None
    deps = task.dependencies
    return frozenset(i for i, (child, _) in enumerate(node.next_edges) if child is not None and child in deps)


def pruned(task: GraphTask, node: Node, kernel: Kernel) -> Kernel:
    """``kernel``, or in a pruned backward for a built-in node the kernel that computes
    only the gradients of its ``needed_edges`` (``OpNode.apply_needed``)."""
    if task.exec_info is None or type(node) is not OpNode or kernel is not run_kernel \
            or _anomaly_mode.get() is not None:
        return kernel
    needed = needed_edges(task, node)
    return lambda n, inputs, m: validate_outputs(n, n.apply_needed(inputs, m, needed))  # type: ignore[attr-defined]


def resolved_kernel(kernel: Kernel, node: Node, inputs: ReadyInputs, math: Any) -> list[Any]:
    """``kernel`` after adding up the deferred sums of ready inputs (on the worker)."""
    return kernel(node, inputs_of(inputs), math)


# --- before and after the kernel --------------------------------------------------------
def prepare(task: GraphTask, node: Node, ready: ReadyInputs) -> list[Any] | None:
    """Given a ready node's inputs (task/input_buffer.py), run what comes before its kernel:
    captures, tensor pre-hooks, retain_grad, node pre-hooks. Returns the kernel's
    inputs, or None when the node does not run (pruned, captured only, or an
    AccumulateGrad, which is staged right here)."""
    info = task.exec_info
    entry = None if info is None else info.get(node)
    if entry is not None and entry.raw:  # the capture seam: before any hook, never run
        grads = inputs_of(ready)
        for nr, i in entry.captures:
            task.captured[i] = grads[nr] if nr < len(grads) else None
        return None
    if type(node) is AccumulateGrad:
        stage_leaf(task, node, slots_of(ready))  # (a deferred sum may wait for the commit)
        return None
    buf = inputs_of(ready)
    hooks = node._hooks
    if hooks is not None and (hooks.tensor_pre or hooks.retains_grad):
        buf = run_tensor_pre_hooks(task, node, hooks, buf)
    if info is not None:
        if entry is None:
            return None
        for nr, i in entry.captures:
            task.captured[i] = buf[nr]
        if not entry.needed:
            return None
    if hooks is not None and hooks.pre:
        buf = run_pre_hooks(task, node, hooks.pre, buf)
    return buf


# Note [Owned gradients]: the commit makes a leaf's first ``.grad`` from its staged array
# without a copy only when the engine owns that array: it made it, and nobody else holds
# it, so a later commit may add into ``.grad`` in place (PyTorch's AccumulateGrad steals
# such gradients; it decides by reference count, which a refactor silently breaks, so
# here ownership is recorded where arrays are made). Owned: a deferred sum's total (a
# ``PendingSum``, always fresh), a sum of two staged gradients, and a new array that a
# built-in kernel returned for the leaf (``own_if_fresh``: not a view, unless of all of
# new memory nothing else holds, Note [A whole view of new memory] in backend.py; not
# one of the kernel's inputs or saved values, not returned for a second edge too), noted in
# ``task.fresh`` as it is routed and claimed by ``stage_leaf`` if that very array
# arrives. Anything a user's code produced or saw is not owned, and is copied: a custom
# Function's result, the caller's ``gradient=``, an array a hook or a pre-commit
# function saw, a retained non-leaf gradient. (A small leaf's eager sum of several
# gradients is not recorded either: copying it is cheap.) Only a leaf without a
# ``.grad`` can take its staged array as ``.grad``; one that has a ``.grad`` is added
# into, whoever owns the array, so ``own_if_fresh`` skips the test for it (should it lose
# its ``.grad`` before the commit, its first ``.grad`` is then a copy).
# Note [Plain leaves]: in a plain backward, a quiet leaf (Note [Plain backwards and quiet
# nodes] in task/graph_task.py) has nothing that could observe its staging. So the fused
# step stages it right where its producer routes its one gradient (``stage_plain``,
# ``stage_leaf``'s last steps), skipping the ready queue, unless a leaf made ready
# earlier still waits there: leaves are still staged in the order they became ready (the
# commit and post-accumulate-grad hooks follow that order); any other leaf is staged
# when it leaves the queue, by ``plain_step`` or ``stage_leaf``. Staging outside the
# queue means a GraphTask can run out of ready nodes in the middle of its slice, so two
# rules keep the runner's queue to GraphTasks with ready nodes (a finished call left in
# it was the hang once seen here): the core loop reports "more" at the slice's end only
# when a node is still ready (else the runner drops the task and completes the call),
# and a driver whose call has nothing left leaves the queue before it returns.
def stage_leaf(task: GraphTask, node: AccumulateGrad, buf: list[Any]) -> None:
    """AccumulateGrad's step: tensor hooks, captures, pre-hooks, stage for the commit
    (Note [Commit on success] in task/commit.py), post-hooks. Records whether the engine
    owns the staged array (Note [Owned gradients])."""
    var = node.variable
    g = buf[0]
    info = task.exec_info
    fresh = task.fresh.pop(node, None)
    owned = type(g) is PendingSum or fresh is g
    seen = bool(var._hooks) or info is not None or node._hooks is not None
    if type(g) is PendingSum and seen:
        g = g.total()  # hooks and captures see the sum (else the commit adds it)
    if var._hooks:
        g = run_leaf_tensor_hooks(task, node, var._hooks, g)
    if info is not None:
        entry = info.get(node)
        if entry is not None:
            for _nr, i in entry.captures:
                task.captured[i] = g
        if not task.accumulate or entry is None or not entry.needed:
            return
    hooks = node._hooks
    if hooks is not None and hooks.pre:
        g = run_pre_hooks(task, node, hooks.pre, [g])[0]
    stage_plain(task, var, g, owned and not seen)  # (an array a hook saw is not the engine's)
    if hooks is not None and hooks.post:
        run_post_hooks(task, node, hooks.post, [], [g])


def own_fresh_outputs(task: GraphTask, node: Node, inputs: list[Any], outputs: list[Any]) -> None:
    """Note [Owned gradients]: record which of a built-in node's ``outputs`` for leaves
    the engine owns. ``inputs``: every array the kernel was handed."""
    own_leaf_edges(task, node, outputs, fresh_leaf_edges(node, inputs, outputs))


def fresh_leaf_edges(node: Node, inputs: list[Any], outputs: list[Any]) -> tuple[int, ...]:
    """The edges to leaves of a built-in node whose gradient is a new array (``is_fresh``
    against the inputs the node was given; Note [Owned gradients]). Thread-safe: a worker
    chain judges it where it runs, before it drops the gradients that stay in the chain
    from ``outputs`` (a pass-through sends one array on two edges)."""
    if type(node) is not OpNode:
        return ()
    acc_nr = ACCUMULATE_GRAD_SEQUENCE_NR
    saved = node.saved
    edges = node._edges
    if type(edges) is not tuple:  # (one edge, input 0's: Note [An OpNode's one edge in its slot])
        gi = outputs[0]
        fresh = edges.sequence_nr == acc_nr and type(gi) is xp.array_type and is_fresh(gi, inputs, outputs, saved)
        return (0,) if fresh else ()
    return tuple(i for i, ((child, _), gi) in enumerate(zip(edges, outputs))
                 if child is not None and child.sequence_nr == acc_nr and type(gi) is xp.array_type
                 and is_fresh(gi, inputs, outputs, saved))


def own_leaf_edges(task: GraphTask, node: Node, outputs: list[Any], edges: tuple[int, ...]) -> None:
    """On the loop: the engine owns the gradients ``node`` sent along ``edges`` (found by
    ``fresh_leaf_edges``) to their leaves (Note [Owned gradients])."""
    for i in edges:
        leaf = node.next_edges[i][0]
        assert leaf is not None  # (fresh_leaf_edges names edges to leaves only)
        task.fresh[leaf] = outputs[i]


def own_if_fresh(task: GraphTask, leaf: Node, gi: Array, inputs: Any, outputs: Any,
                 saved: Any) -> None:
    """Note [Owned gradients]: ``gi``, a built-in kernel's output for ``leaf``, is the
    engine's own when it is a new array: not a view, not one of the kernel's inputs or
    saved values, and not another of its outputs too; not tested for a leaf that has a
    ``.grad`` (it is added into)."""
    if leaf.variable._grad is None and is_fresh(gi, inputs, outputs, saved):  # type: ignore[attr-defined]
        task.fresh[leaf] = gi


def is_fresh(gi: Array, inputs: Any, outputs: Any, saved: Any) -> bool:
    """``own_if_fresh``'s test: ``gi`` is a new array the kernel made."""
    if not xp.owns_memory(gi):  # a view, or read-only (Note [One array backend] in backend.py)
        return False
    for a in inputs:
        if a is gi:
            return False
    for a in saved or ():
        if a is gi:
            return False
    return outputs is None or sum(1 for o in outputs if o is gi) <= 1


def stage_plain(task: GraphTask, var: Any, g: Any, owned: bool) -> None:
    """Stage ``g`` for ``var``'s commit: ``stage_leaf``'s last step, and all of it for a
    leaf nothing sees (Note [Plain leaves]). ``owned``: ``g`` is the engine's own (Note
    [Owned gradients]); so is a sum the engine makes here."""
    staged = task.staged
    old = staged.get(var)
    if old is None:
        staged[var] = g
        if owned:
            task.owned.add(var)
        elif g is not None:
            task.owned.discard(var)
        return
    staged[var] = total = combine(old, g)
    if total is not old and total is not g:
        task.owned.add(var)  # a sum the engine made
    elif total is not old:
        task.owned.discard(var)


def finish(task: GraphTask, node: Node, inputs: ReadyInputs, outputs: list[Any]) -> None:
    """After the kernel: post-hooks, then route each gradient to its next node. (Only
    a node without hooks may still have its inputs in an InputBuffer here.)"""
    hooks = node._hooks
    if hooks is not None and hooks.post:
        if task.exec_info is not None:
            # PyTorch computes no gradient for an edge pruned by inputs=/grad(), so
            # post-hooks see None there (the value would be dropped anyway).
            deps = task.dependencies
            outputs = [g if child is not None and child in deps else None
                       for (child, _), g in zip(node.next_edges, outputs)]
        outputs = run_post_hooks(task, node, hooks.post, outputs, inputs_of(inputs))
    elif not task.create_graph:
        own_fresh_outputs(task, node, slots_of(inputs), outputs)
    task.route(node, outputs)


# Note [A tensor times itself]: ``x * x`` (a square written as a product, as in
# ``(h * h).mean()``) has two edges to the same input slot, and its two rules give one
# value (``g * x`` both, an op declared ``symmetric`` with its two saved inputs one
# array). The engine's fused inline step then computes it once and adds it to itself in
# place: ``t + t`` is bit for bit the ``g * y + g * x`` the buffer would have added, and
# the second product, a second fresh array and a deferred sum on the consumer's worker
# (Note [Deferred sums] in task/input_buffer.py) are saved (docs/benchmarks.md, "Figures
# behind the Notes").
# The second edge then routes nothing: the first settles both dependencies (the slot
# already has the sum), so the child needs no InputBuffer for it. Only the fused step
# does it (a plain backward, no hooks on the node), so hooks and
# ``create_graph`` see PyTorch's two gradients.
# Note [Mean's gradient as a view]: mean's gradient is ``g / n`` at every position, and
# writing it out over the input's shape (Note [Mean's gradient in one pass] in
# ops/reductions.py) is the MLP benchmark's largest single step outside the kernels, and
# the multiplication that reads it is faster from a view too. A read-only broadcast view
# (strides 0) costs no write pass,
# but it must never reach code that may write into it or keep it: a ``.grad`` (the
# commit adopts fresh arrays, Note [Owned gradients]), a hook's argument (tensor hooks,
# retain_grad, node pre- and post-hooks), an ``inputs=``/``grad()`` capture, a custom
# Function's backward (users write in place), a graph under ``create_graph``. So only
# the fused inline step (a plain backward without tools, the mean's node without hooks)
# calls the op's ``view_vjp``, and only for an edge to a built-in node without hooks
# whose op is declared ``takes_views``: its rules read the gradient at any strides and
# return new arrays, never the gradient or a view of it (``mul``: ``g * y``), so the view
# goes no further; an InputBuffer's sum of it is a new array too. Every other route
# (hooks, a leaf, a custom Function, ``add``'s pass-through, a worker-run mean, tools,
# ``create_graph``) gets ``vjps[0]``'s fresh writeable array, as before. (A hook that a
# hook registers on the child in the middle of the backward, after the view was routed,
# would see the view; PyTorch's expand backward hands such views around anyway.)


# --- the step the core loop takes for one node ------------------------------------------
def step_for(task: GraphTask) -> Step:
    """The step ``task``'s nodes take inline (sched/inline.py), chosen once per slice:
    the tool's wrapped kernel, the plain backward's ``plain_step``, or ``run_node``. Each
    returns whether a kernel ran."""
    if task.tools:
        kernel = kernel_for(task, False)
        return lambda t, node, ready: run_node(t, node, ready, kernel)
    if task.is_plain():
        return plain_step
    return run_node


def run_node(task: GraphTask, node: Node, ready: ReadyInputs, kernel: Kernel = run_kernel) -> bool:
    """The three steps for one node, inline: ``prepare``, the kernel, ``finish``."""
    inputs = prepare(task, node, ready)
    if inputs is None:
        return False
    if task.exec_info is not None:  # (a pruned backward: ``pruned``)
        kernel = pruned(task, node, kernel)
    finish(task, node, inputs, kernel(node, inputs, task.math))
    return True


def prepare_elsewhere(task: GraphTask, node: Node, ready: ReadyInputs) -> ReadyInputs | None:
    """What a node that runs elsewhere takes (``placement.decide``): a plain node of an
    unpruned backward its ready inputs as they are (deferred sums are added where it
    runs), any other node ``prepare``'s, on the loop."""
    if task.exec_info is None and is_plain_node(node):
        return ready
    return prepare(task, node, ready)


def plain_step(task: GraphTask, node: Node, ready: ReadyInputs) -> bool:
    """A plain backward's step (Note [Plain backwards and quiet nodes] in
    task/graph_task.py): a quiet leaf is staged at once (Note [Plain leaves]), a plain
    built-in node takes the *fused step* when its op has one, anything else ``run_node``.

    The fused step is ``run_kernel`` and ``finish`` in one pass over the edges, for a
    plain built-in node whose one incoming gradient is ``g``: each edge's gradient is
    computed only if the edge leads somewhere needed, by the op's rule, its view rule
    (Note [Mean's gradient as a view]) or once for both edges of ``x * x`` (Note [A
    tensor times itself]), and routed at once (Note [One router] in
    task/graph_task.py). It is written inline here, not called: this is the per-node
    path of every small backward."""
    if type(node) is not OpNode or node._hooks is not None:  # (not is_plain_node)
        if is_quiet_leaf(node):
            g = slots_of(ready)[0]
            stage_plain(task, node.variable, g, task.fresh.pop(node, None) is g or type(g) is PendingSum)  # type: ignore[attr-defined]
            return False
        return run_node(task, node, ready)
    buf: list[Any] = ready.resolve() if type(ready) is InputBuffer else ready  # type: ignore[assignment]
    g = buf[0]
    checks = node._checks  # (one bare: Note [Shared one-entry checks] in graph/saved.py)
    spec = node.spec
    t = type(checks)
    if g is None or node.saved is None or not spec.fusable \
            or not (t is SavedTensor or not checks or t is tuple and type(checks[0]) is SavedTensor):
        finish(task, node, buf, run_kernel(node, buf, task.math))
        return True
    # --- the fused step ---------------------------------------------------------------
    if t is SavedTensor:  # (OpNode.plain_args, inlined: per node of every small backward)
        if checks.version.value != checks.saved_version:
            checks.unpack_array(node)  # raises PyTorch's in-place modification error
    else:
        for e in checks:
            if e.version.value != e.saved_version:
                e.unpack_array(node)
    args = node.saved or spec.no_args
    params = node.params
    vjps: tuple[Any, ...] = spec.vjps  # (a needed edge has a rule)
    edges = node._edges
    if type(edges) is not tuple:  # (one edge, input 0's: Note [An OpNode's one edge in its slot])
        edges = ((edges, 0),)
        twice = False
    else:
        twice = spec.symmetric and edges[0] == edges[1] and args[1] is args[2]
    view = spec.view_vjp
    deps = task.dependencies
    math = task.math
    add = task.add_gradient
    acc_nr = ACCUMULATE_GRAD_SEQUENCE_NR
    array = xp.array_type  # (read once per node: Note [One array backend])
    i = -1
    for child, nr in edges:
        i += 1
        if child is None:
            continue
        d = deps.get(child)
        if d is None:  # pruned: nothing needed lies behind this edge
            continue
        if twice:
            if i:
                continue  # (edge 0 carried both, and settled both dependencies)
            d -= 1  # edge 1's, settled here: one gradient for the slot (Note [A tensor times itself])
        rule = vjps[i]
        if view is not None and not i and type(child) is OpNode and child._hooks is None \
                and child.spec.takes_views:
            rule = view  # a read-only view, to a child that only reads it
        gi = rule(math, g, *args, **params) if params else rule(math, g, *args)
        if gi is not None:
            if type(gi) is not array or gi.shape != node.input_shapes[i] or gi.dtype != node.input_dtypes[i]:
                gi = fix_gradient(node, i, gi)
            if twice:
                gi = doubled(task, child, gi, buf, args)
            if child.sequence_nr == acc_nr and type(gi) is array:
                if d == 1 and not task.leaf_waits() and child not in task.buffers and is_quiet_leaf(child):
                    del deps[child]
                    var = child.variable  # type: ignore[attr-defined]
                    stage_plain(task, var, gi, var._grad is None and is_fresh(gi, buf, None, args))
                    continue
                own_if_fresh(task, child, gi, buf, None, args)
        add(child, nr, gi, d)
    if (node.saved or spec.saves_params) and not task.keep_graph:
        task.executed.append(node)
    return True


def doubled(task: GraphTask, child: Node, gi: Any, inputs: Any, saved: Any) -> Any:
    """``gi + gi`` for a symmetric node's two edges to one slot (Note [A tensor times
    itself]): in place when ``gi`` is the kernel's fresh array, and then the engine's
    own for a leaf (Note [Owned gradients])."""
    if type(gi) is xp.array_type and is_fresh(gi, inputs, None, saved):
        xp.add_into(gi, gi)
        if child.sequence_nr == ACCUMULATE_GRAD_SEQUENCE_NR:
            task.fresh[child] = gi
        return gi
    return gi + gi
