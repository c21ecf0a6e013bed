"""One backward call: its dependencies, input buffers, ready queue, staged gradients.

Note [GraphTask bookkeeping lives on one thread]: every field here is read and written
by the thread that drives the GraphTask (the event loop's thread, or the caller's thread
for a synchronous drain). Kernels that run on worker threads get their inputs and
return their outputs; they never touch these dicts (a worker chain only reads the
``stopping`` flag). That is what lets the per-node path run without locks.

Note [Ready-queue order]: ready nodes run in order of ``sequence_nr``, highest first (the
node created last in forward), as in PyTorch. AccumulateGrad nodes are kept in their own
FIFO and always run before any other ready node, which is what PyTorch's
``sequence_nr == UINT64_MAX`` achieves. Reentrant depth is handled one level up: a
GraphTask starts no new node while one of its nested (reentrant) GraphTasks is running,
so the deeper task's work always goes first (PyTorch's depth-then-sequence order).

Note [Commit on success]: leaf gradients (and retain_grad gradients) are *staged* here
and written into ``.grad`` only after every node finished without error, under one
process-wide lock, so a backward that fails or is cancelled leaves every ``.grad``
exactly as it was, and concurrent backward calls each commit atomically. Saved tensors
are released at the same point, so a failed or cancelled backward can be retried.

Note [Pre-commit]: ``queue_pre_commit(fn)`` adds a step between "every node finished"
and the commit. The functions see each tensor whose ``.grad`` will change with its
staged gradient, may replace those gradients (same shape), and may raise or be
cancelled: the commit has not started, so nothing is written and nothing freed.
Distributed data parallelism averages gradients across processes here and lets every
process commit, or none.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import deque
from heapq import heappop, heappush
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _context
from .._tensor_math import TENSOR_MATH
from ..ops._array_math import ARRAY_MATH
from .graph import ACCUMULATE_GRAD_SEQUENCE_NR, AccumulateGrad, Edge, GraphRoot, Node, SavedTensor
from .recording import OpNode
from .input_buffer import LazyBuffer, PendingSum, combine, resolve
from .kernel import run_kernel
from .validation import _fix_gradient, validate_one, validate_outputs  # noqa: F401  (re-exported)

from ..tensor import Tensor

if TYPE_CHECKING:
    from .engine import Engine

_graph_task_ids = itertools.count(1)
_COMMIT_LOCK = threading.Lock()
RELEASE_STEP = 1024  # nodes whose saved tensors are freed between two chances to yield
MAX_LIGHT_RUN = 4  # light nodes in a row inside a worker chain (Note [Worker chains])


class GraphTask:
    """The state of one ``backward``/``grad`` call (see the notes above)."""

    def __init__(self, engine: Engine, *, keep_graph: bool, create_graph: bool,
                 accumulate: bool) -> None:
        self.id = next(_graph_task_ids)
        self.engine = engine
        self.keep_graph = keep_graph
        self.create_graph = create_graph
        self.accumulate = accumulate  # backward() writes .grad; grad() only captures
        self.math: Any = TENSOR_MATH if create_graph else ARRAY_MATH
        self.depth = 0
        self.parent: GraphTask | None = None
        self.active_children = 0
        self.dependencies: dict[Node, int] = {}
        # input buffers of nodes still waiting for gradients; a node that becomes ready
        # takes its buffer into its ready-queue entry (see _make_ready)
        self.buffers: dict[Node, list[Any]] = {}
        self.heap: list[tuple[int, Node, list[Any]]] = []
        self.ready_leaves: deque[tuple[Node, list[Any]]] = deque()
        self.needed: set[Node] | None = None  # None: every reachable node runs
        self.targets: set[Node] = set()
        self.captures: dict[Node, list[tuple[int, int]]] | None = None
        self.captured: list[Any] = []
        self.staged: dict[Tensor, Any] = {}
        self.retained: dict[Tensor, Any] = {}
        self.executed: list[Node] = []
        self.callbacks: list[Callable[[], Any]] = []
        self.pre_commits: list[Callable[[dict[Tensor, Tensor]], Any]] = []  # queue_pre_commit
        self._pre_commit: tuple[dict[Tensor, Tensor], dict[Tensor, Tensor]] | None = None
        self.error: BaseException | None = None
        self.stopping = False  # set on error or cancellation: worker chains stop early
        self.in_flight = 0
        self.nodes_inline = 0
        self.nodes_offloaded = 0
        self.thread_hops = 0
        self.wakeup: Any = None  # an anyio.Event while the driver waits for kernels
        self.profiler: Any = _context.profiler.get()
        self._root: tuple[Node, list[Any]] | None = None  # set by set_roots

    # ------------------------------------------------------------------------------------
    # Setup: roots, pruning, dependencies. Iterative walks only (no recursion anywhere).
    # ------------------------------------------------------------------------------------
    def set_roots(self, roots: list[Edge], grads: list[Any],
                  targets: list[Edge] | None = None) -> None:
        buf: list[Any] = []
        if len(roots) == 1:
            root, nr = roots[0]
            assert root is not None
            buf = [None] * max(root.num_outputs, nr + 1)
            buf[nr] = grads[0]
        else:
            root = GraphRoot(tuple(roots), grads)
        if targets is not None:
            self._plan_pruning(root, targets)
        self._root = (root, buf)

    def setup_steps(self) -> Iterator[None]:
        """Count dependencies and queue the root. A generator that yields every
        thousand nodes, so the async driver can let the loop run during the walk of a
        huge graph (the sync driver just exhausts it)."""
        assert self._root is not None, "set_roots() first"
        root, buf = self._root
        yield from self._count_dependencies(root)
        self._make_ready(root, buf)

    def _plan_pruning(self, root: Node, targets: list[Edge]) -> None:
        """Mark the nodes that lead to a target (``inputs=`` / ``grad()``); only they run.

        ``backward(inputs=)`` runs the target nodes themselves (AccumulateGrad, or the
        grad_fn of a non-leaf input); ``grad()`` captures their input instead and runs
        a target only when it leads to another target (PyTorch's exec_info).
        """
        self.captures = {}
        for i, (node, nr) in enumerate(targets):
            if node is not None:
                self.targets.add(node)
                if not self.accumulate:
                    self.captures.setdefault(node, []).append((nr, i))
        self.captured = [None] * len(targets)
        run_targets = self.accumulate
        post_order: list[Node] = []
        visited: set[Node] = set()
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                post_order.append(node)
                continue
            if node in visited:
                continue
            visited.add(node)
            stack.append((node, True))
            for child, _ in node.next_edges:
                if child is not None and child not in visited:
                    stack.append((child, False))
        targets_set = self.targets
        needed: set[Node] = set()
        for node in post_order:  # children come before their parents
            if run_targets and node in targets_set:
                needed.add(node)
                continue
            for child, _ in node.next_edges:
                if child is not None and (child in needed or child in targets_set):
                    needed.add(node)
                    break
        self.needed = needed

    def _count_dependencies(self, root: Node) -> Iterator[None]:
        deps = self.dependencies
        needed = self.needed
        targets = self.targets
        stack = [root]
        walked = 0
        while stack:
            node = stack.pop()
            walked += 1
            if not walked & 1023:
                yield
            if needed is not None and node is not root and node not in needed:
                continue  # a target reached only to capture its gradient
            for child, _ in node.next_edges:
                if child is None or (needed is not None and child not in needed and child not in targets):
                    continue
                if child in deps:
                    deps[child] += 1
                else:
                    deps[child] = 1
                    stack.append(child)

    def _make_ready(self, node: Node, buf: list[Any]) -> None:
        """Queue a node whose every incoming gradient has arrived, with its buffer."""
        if node.sequence_nr == ACCUMULATE_GRAD_SEQUENCE_NR:
            self.ready_leaves.append((node, buf))
        else:
            heappush(self.heap, (-node.sequence_nr, node, buf))

    def _add_gradient(self, child: Node, nr: int, g: Any, d: int) -> None:
        """Route ``g`` (or None) to input ``nr`` of ``child``, which had ``d`` edges
        left to hear from: sum it into the child's buffer (large sums deferred, Note
        [Deferred sums] in input_buffer.py), and queue the child when this was its last
        one. (run_inline inlines this for speed.)"""
        buffers = self.buffers
        if d == 1:
            del self.dependencies[child]
            buf = buffers.pop(child, None)
            if buf is None:
                buf = [None] * child.num_outputs
                buf[nr] = g
            elif g is not None:
                buf = _add_to_buffer(buf, nr, g)
            self._make_ready(child, buf)
            return
        self.dependencies[child] = d - 1
        if g is not None:
            buf = buffers.get(child)
            if buf is None:
                buf = buffers[child] = [None] * child.num_outputs
                buf[nr] = g
            else:
                buffers[child] = _add_to_buffer(buf, nr, g)

    # ------------------------------------------------------------------------------------
    # The per-node steps, shared by the async and the synchronous drivers.
    # ------------------------------------------------------------------------------------
    def prepare(self, node: Node, buf: list[Any]) -> list[Any] | None:
        """Given a ready node's summed input buffer, run what comes before its kernel:
        tensor pre-hooks, retain_grad, captures, node pre-hooks. Returns the kernel's
        inputs, or None when the node does not run (pruned, or an AccumulateGrad,
        which is staged right here)."""
        if type(node) is AccumulateGrad:
            self._stage_leaf(node, buf)
            return None
        hooks = node._hooks
        if hooks is not None and (hooks.tensor_pre or hooks.retains_grad):
            from .hooks import run_tensor_pre_hooks

            buf = run_tensor_pre_hooks(self, node, hooks, buf)
        if self.captures is not None:
            caps = self.captures.get(node)
            if caps is not None:
                for nr, i in caps:
                    self.captured[i] = buf[nr]
            if node not in self.needed:  # type: ignore[operator]
                return None
        if hooks is not None and hooks.pre:
            from .hooks import run_pre_hooks

            buf = run_pre_hooks(self, node, hooks.pre, buf)
        return buf

    def _stage_leaf(self, node: AccumulateGrad, buf: list[Any]) -> None:
        var = node.variable
        g = buf[0]
        if type(g) is PendingSum and (var._hooks or self.captures is not None or node._hooks is not None):
            g = g.total()  # hooks and captures see the sum (else write_grads adds it)
        if var._hooks:
            from .hooks import run_leaf_tensor_hooks

            g = run_leaf_tensor_hooks(self, node, var._hooks, g)
        if self.captures is not None:
            for _nr, i in self.captures.get(node, ()):
                self.captured[i] = g
            if not self.accumulate or node not in self.needed:  # type: ignore[operator]
                return
        hooks = node._hooks
        if hooks is not None and hooks.pre:
            from .hooks import run_pre_hooks

            g = run_pre_hooks(self, node, hooks.pre, [g])[0]
        staged = self.staged
        prev = staged.get(var)
        staged[var] = combine(prev, g)
        if hooks is not None and hooks.post:
            from .hooks import run_post_hooks

            run_post_hooks(self, node, hooks.post, [], [g])

    def finish(self, node: Node, inputs: list[Any], outputs: list[Any]) -> None:
        """After the kernel: post-hooks, then route each gradient to its next node."""
        hooks = node._hooks
        deps = self.dependencies
        if hooks is not None and hooks.post:
            from .hooks import run_post_hooks

            if self.needed is not None:
                # PyTorch computes no gradient for an edge pruned by inputs=/grad(), so
                # post-hooks see None there (the value would be dropped anyway).
                outputs = [g if child is not None and child in deps else None
                           for (child, _), g in zip(node.next_edges, outputs)]
            outputs = run_post_hooks(self, node, hooks.post, outputs, inputs)
        if not self.keep_graph:
            self.executed.append(node)
        add = self._add_gradient
        for (child, nr), g in zip(node.next_edges, outputs):
            if child is None:
                continue
            d = deps.get(child)
            if d is not None:  # (None: pruned, nothing needed lies behind this edge)
                add(child, nr, g, d)

    def plan_chain(self, head: Node, threshold: float,
                   blas_ok: bool) -> tuple[list[Node], list[int], list[Any]]:
        """Note [Worker chains]: the nodes that may run on the worker thread right after
        ``head``, without a hop back to the loop. A thread hop costs ~100 us, as much as
        a heavy elementwise kernel, so a branch of heavy nodes offloaded one by one spends
        half its time hopping. A node C can follow its predecessor P on the same worker
        when nothing but P can make C ready (P's edge is the last one C waits for:
        ``dependencies[C] == 1``, read before P runs, and only P can change it; what
        C's other inputs sent earlier is in its buffer, final, and is added to P's
        gradient on the worker, in the order the loop would add it), when C
        is a built-in node without hooks (hooks run on the loop), and when P makes no
        other node ready (a fork goes back to the loop, so both branches can run at
        once). Light nodes (an add's pass-through gradient) may sit between heavy ones,
        at most ``MAX_LIGHT_RUN`` in a row: a long run of light nodes is Python holding
        the GIL against the loop, so the chain ends at its last heavy node. Returns the
        chained nodes, for each node before them the edge that leads to the next, and
        each chained node's buffered gradient (or None). Bookkeeping stays on the loop:
        ``finish_chained`` routes the rest afterwards."""
        deps = self.dependencies
        buffers = self.buffers
        nodes: list[Node] = []
        edges: list[int] = []
        partials: list[Any] = []
        heavy = 0  # the chain up to its last heavy node
        node = head
        while len(nodes) - heavy < MAX_LIGHT_RUN and (node._hooks is None or not node._hooks.post):
            nxt = -1
            for i, (child, _nr) in enumerate(node.next_edges):
                if child is not None and deps.get(child) == 1:
                    if nxt >= 0:
                        nxt = -1  # a fork
                        break
                    nxt = i
            if nxt < 0:
                break
            child, nr = node.next_edges[nxt]
            if (type(child) is not OpNode or child._hooks is not None or nr != 0
                    or child.num_outputs != 1 or (child.spec.blas and not blas_ok)):
                break
            edges.append(nxt)
            nodes.append(child)
            buf = buffers.get(child)
            partials.append(None if buf is None else buf[0])
            if child.work >= threshold:
                heavy = len(nodes)
            node = child
        return nodes[:heavy], edges[:heavy], partials[:heavy]

    def finish_chained(self, node: Node, skip: int, outputs: list[Any]) -> None:
        """``finish`` for a node (without post-hooks) that ran in a worker chain: the
        gradient of edge ``skip`` (-1: none, the chain's last node) already fed the next
        node of the chain, so that dependency is settled instead of routed."""
        deps = self.dependencies
        if not self.keep_graph:
            self.executed.append(node)
        add = self._add_gradient
        for i, ((child, nr), g) in enumerate(zip(node.next_edges, outputs)):
            if child is None:
                continue
            if i == skip:
                del deps[child]
                self.buffers.pop(child, None)
                continue
            d = deps.get(child)
            if d is not None:
                add(child, nr, g, d)

    def run_inline(self, kernel: Callable[[Node, list[Any], Any], list[Any]] | None,
                   threshold: float, deadline: float) -> tuple[Node, list[Any]] | bool | None:
        """Run ready nodes inline, in ready-queue order, until one of:

        * nothing is ready: returns None;
        * a node must run elsewhere (``work >= threshold``, or an async backward):
          returns ``(node, inputs)``, already prepared, for the caller to start;
        * ``time.perf_counter()`` passed ``deadline``: returns True (time to yield).

        ``kernel`` is ``kernel.run_kernel`` or a tool's wrapper of it; None selects the
        fused path below for built-in nodes. This loop is most of a small backward's
        cost, so it keeps everything in locals, and for the hot case (a built-in node
        without hooks, in a plain backward, with a defined gradient) it does the work of
        ``apply`` → ``validate_outputs`` → ``finish`` in place, computing no gradient for
        an edge that leads nowhere needed. Errors are recorded with ``fail`` and raised.
        """
        heap = self.heap
        leaves = self.ready_leaves
        buffers = self.buffers
        deps = self.dependencies
        math = self.math
        fused = kernel is None and not self.create_graph
        run = kernel or run_kernel
        plain = self.captures is None
        keep = self.keep_graph
        executed = self.executed
        clock = time.perf_counter
        push = heappush
        acc_nr = ACCUMULATE_GRAD_SEQUENCE_NR
        count = 0
        node: Node | None = None
        try:
            while True:
                if leaves:
                    node, buf = leaves.popleft()
                elif heap:
                    _, node, buf = heappop(heap)
                else:
                    return None
                if not (plain and type(node) is OpNode and node._hooks is None):
                    if type(buf) is LazyBuffer and (type(node) is not AccumulateGrad or not plain):
                        buf = resolve(buf)  # (in a plain backward a leaf's sum waits for the commit)
                    inputs = self.prepare(node, buf)
                    if inputs is None:
                        continue
                    if node.work >= threshold or (node.maybe_async and node.is_async()):
                        return node, inputs
                    self.finish(node, inputs, run(node, inputs, math))
                else:
                    if node.work >= threshold:
                        return node, buf  # (a LazyBuffer is added up on the worker)
                    if type(buf) is LazyBuffer:
                        buf = resolve(buf)
                    g = buf[0]
                    spec = node.spec
                    saved = node.saved
                    checks = node.checks
                    if not fused or g is None or saved is None or not spec.fusable or (
                            checks and type(checks[0]) is not SavedTensor):
                        self.finish(node, buf, run(node, buf, math))
                    else:
                        # --- the fused step: apply, validate and route, in place -----
                        for e in checks:
                            if e.version.value != e.saved_version:
                                e.unpack_array(node)  # raises the in-place modification error
                        args = saved or spec.no_args
                        params = node.params
                        vjps = spec.vjps
                        i = -1
                        for child, nr in node.next_edges:
                            i += 1
                            if child is None:
                                continue
                            d = deps.get(child)
                            if d is None:  # pruned: nothing needed lies behind this edge
                                continue
                            gi = vjps[i](math, g, *args, **params) if params else vjps[i](math, g, *args)  # type: ignore[misc]
                            if gi is not None:
                                if type(gi) is not np.ndarray or gi.shape != node.input_shapes[i] \
                                        or gi.dtype != node.input_dtypes[i]:
                                    gi = _fix_gradient(node, i, gi, node.input_shapes[i],  # type: ignore[arg-type]
                                                       node.input_dtypes[i])
                            if d == 1 and nr == 0 and child.num_outputs == 1:
                                # the child's last gradient (in a chain, its only one):
                                # queue it with its buffer, no dict round-trip
                                del deps[child]
                                old = buffers.pop(child, None)
                                if old is None:
                                    old = [gi]
                                elif gi is not None:
                                    old = _add_to_buffer(old, 0, gi)
                                seq = child.sequence_nr
                                if seq == acc_nr:
                                    leaves.append((child, old))
                                else:
                                    push(heap, (-seq, child, old))
                            else:
                                self._add_gradient(child, nr, gi, d)
                        if saved and not keep:
                            executed.append(node)
                count += 1
                if not count & 7 and clock() >= deadline:  # (the clock every 8 nodes)
                    return True
        except Exception as e:
            self.fail(e, node)
            raise
        finally:
            self.nodes_inline += count

    def fail(self, error: BaseException, node: Node | None) -> None:
        """Record the first error (first error wins) with a note naming the node."""
        if node is not None and hasattr(error, "add_note"):
            error.add_note(f"asyncgrad: raised while running {node.name()} "
                           f"(sequence_nr={node.sequence_nr}) in graph task {self.id}")
            anomaly = _context.anomaly_mode.get()
            if anomaly is not None:
                anomaly.annotate_error(error, node)
        if self.error is None:
            self.error = error
        self.stopping = True

    # ------------------------------------------------------------------------------------
    # Commit (see Note [Commit on success]).
    # ------------------------------------------------------------------------------------
    def commit(self) -> None:
        """Write the staged gradients, then run post-accumulate-grad hooks and release."""
        self.write_grads()
        try:
            self.after_commit()
        finally:
            for _ in self.release_steps():
                pass

    def staged_size(self) -> int:
        """Elements the commit will add (to decide whether it runs on a worker thread)."""
        return sum(getattr(g, "size", 0) for g in self.staged.values() if g is not None)  # (PendingSum too)

    def write_grads(self) -> None:
        """Accumulate every staged gradient into ``.grad``, all under the one commit lock
        (thread-safe: may run on a worker thread)."""
        if self.staged or self.retained:
            staged = self.staged
            for var in list(staged):  # deferred sums first, outside the lock
                g = staged[var]
                if type(g) is PendingSum:
                    staged[var] = g.total()
            g = None  # (no extra reference for _owned to count)
            with _COMMIT_LOCK:
                # (keys, then a lookup: a dict items() iterator would keep one more
                # reference to the last value and defeat _owned's reference count)
                for stage in (staged, self.retained):
                    for var in list(stage):
                        g = stage[var]
                        if g is not None:
                            _accumulate(var, g, self.create_graph)

    def after_commit(self) -> None:
        """Post-accumulate-grad hooks, in the order the leaves' gradients became ready."""
        for var in self.staged:
            hooks = var._post_acc_hooks
            if hooks:
                for hook in tuple(hooks.values()):
                    if hook(var) is not None:
                        raise RuntimeError("Tensor post accumulate grad hooks should return None.")

    def release_steps(self) -> Iterator[None]:
        """Free the saved tensors of the nodes that ran (without retain_graph); yields
        every thousand nodes, like ``setup_steps``."""
        executed = self.executed
        self.executed = []
        for i, node in enumerate(executed):
            node.release_variables()
            if not (i + 1) % RELEASE_STEP:
                yield

    def queue_callback(self, fn: Callable[[], Any]) -> None:
        self.callbacks.append(fn)

    def pre_commit_view(self) -> dict[Tensor, Tensor]:
        """Note [Pre-commit]: every tensor whose ``.grad`` the commit will change, mapped
        to its staged gradient as a Tensor. Deferred sums are added here, so the
        functions see (and may replace) final values; ``end_pre_commit`` takes back
        what they replaced."""
        view: dict[Tensor, Tensor] = {}
        for stage in (self.staged, self.retained):
            for var in stage:
                g = stage[var]
                if g is None:
                    continue
                if type(g) is PendingSum:
                    stage[var] = g = g.total()
                view[var] = g if isinstance(g, Tensor) else Tensor._wrap(g)
        self._pre_commit = (view, dict(view))
        return view

    def end_pre_commit(self) -> None:
        """Restage the entries the pre-commit functions replaced, each checked like a
        node's output (a Tensor of its variable's shape)."""
        assert self._pre_commit is not None
        view, original = self._pre_commit
        self._pre_commit = None  # (drop our wrappers: _owned may then steal the arrays)
        for stage in (self.staged, self.retained):
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
                stage[var] = g if self.create_graph else g.numpy()

    def statistics(self) -> Any:
        """A frozen snapshot (``GraphTaskStatistics``) of this backward's progress."""
        from .engine import graph_task_statistics

        return graph_task_statistics(self)


def _add_to_buffer(buf: list[Any], nr: int, g: Any) -> list[Any]:
    """Add ``g`` into slot ``nr`` of ``buf``; returns the buffer, re-typed LazyBuffer
    when the sum was deferred (Note [Deferred sums])."""
    total = combine(buf[nr], g)
    buf[nr] = total
    if type(total) is PendingSum and type(buf) is not LazyBuffer:
        return LazyBuffer(buf)
    return buf


def _owned(arr: Any, refs: int) -> bool:
    """True when nobody but the engine holds ``arr`` (PyTorch steals such gradients)."""
    return (type(arr) is np.ndarray and arr.base is None and arr.flags.writeable
            and sys.getrefcount(arr) <= refs)


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
        # refs: the staged dict, write_grads' local, our parameter, _owned's, getrefcount's
        arr = g if _owned(g, 5) and g.dtype == var.data.dtype else np.array(g, dtype=var.data.dtype)
        var._grad = Tensor._wrap(arr)
    elif current.grad_fn is None and current.data.flags.writeable:
        np.add(current.data, g, out=current.data, casting="unsafe")
    else:
        var._grad = Tensor._wrap(current.data + g)
