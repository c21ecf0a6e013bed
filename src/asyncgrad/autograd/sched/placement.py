"""Scheduling policy: pure decisions about where a node's kernel runs, kept in one place.

Note [Inline or offload]: a node whose ``work`` is below ``inline_threshold`` runs
inline on the event loop; larger kernels run on the engine's worker threads (numpy
releases the GIL), at most ``max_workers`` of them (runtime/workers.py), so independent branches
overlap and the loop stays free. ``work`` (graph/record.py) counts the elements the kernel
reads (the incoming gradient and the saved arrays) times the op's cost factor, plus, for
a matrix product, its multiply-adds over ``MULTIPLY_ADDS_PER_ELEMENT``: a product's
backward is two GEMMs, tens of elementwise passes' worth, so it is weighed by what it
computes, not by what it reads. The default threshold (1.5 M elements) is where a hop repays
itself: a hop costs the engine a submit, two thread wake-ups, the kernel on a core whose
caches do not hold its inputs, and the route back on the loop, about what an
elementwise pass over that many elements takes (docs/benchmarks.md, the op table's
"bwd" and "bwd inline" columns). Below it an
elementwise node finishes on the loop sooner than a hop would, in about one of the loop's
time slices; a transformer's per-token nodes (layer norm, softmax, GELU at GPT-small
sizes) then run inline and only its matrix products and the very large nodes hop.

Note [A lone kernel on an idle loop]: a hop buys two things, kernels that overlap (the
loop's nodes, another worker's, a split node's parts) and a loop free for everything
else while the kernel runs. A large built-in node that would run as one kernel while
nothing else of its backward is ready or on a worker, no other backward call is in
flight in the process, and nothing else wants the loop (no ready callback or task, no
timer, no watched file descriptor but the loop's own wake-up pipe:
runtime/loop_idle.py) gets neither: the loop would sleep until the worker's result
wakes it. It then pays the hop's whole fixed cost for nothing: the dynamic engine's
submit and route on the loop, two thread wake-ups (a woken thread on a core another
process holds waits for that process's time slice), and the kernel on a core whose
caches do not hold its inputs; a lone conv2d or LSTM layer's backward took longer
than inline (docs/benchmarks.md, the op table's "bwd" and "bwd inline"). So it
runs inline, on an engine left at its default threshold (an explicit one is a hard
rule). The decision is per node, as it becomes ready: a timer or a second backward
that appears meanwhile sends the next large node to a worker again; an I/O event that
arrives during an inline kernel waits for it, as it would behind any inline node. A
custom Function's backward still hops: its code is the user's, and may hold the GIL or
take a lock the loop needs. So does a node that heads a worker chain (Note [Worker
chains]) taking light nodes along (a layer norm, a softmax between a GPT's products): the
chain runs them back to back without the loop's per-node bookkeeping and turns, and a
GPT's backward took more CPU time with them inline, so the one hop is spread over the
chain. A chain of heavy nodes and free ones only (an MLP's products and ReLUs, an LSTM
layer's recurrence and input product) costs the same on the loop, and runs there.

Note [Mid-size nodes hop beside another]: a node below ``inline_threshold`` but of at
least ``MID_WORK`` elements of work (an elementwise pass of a few hundred thousand
floats, a fraction of a millisecond) still goes to a worker when another node of its
backward is ready at that moment, or runs elsewhere (``in_flight``: on a worker, or
queued for one): the two can run at once, and the worker chain (below) takes the nodes
that only it feeds along on the same hop, so a branch of such nodes pays the hop's
fixed cost once (in a chain a mid-size node counts as heavy). A node in flight counts
for a fork's last branch: its siblings' chains are on workers or queued for them, and
inline it held the loop for the whole branch, a mid-size node at a time (issue 33's
wide workload: 16 branches, the last one's six mid-size nodes on the loop beside two busy
workers, a third thread on two cores). On a worker it queues behind its siblings, so
the workers take whole branches one after another, as the hand-written 2-thread floor
does, and the loop only routes (``python -m bench.wide_trace``). Alone (nothing else
ready, nothing in flight) the node runs inline, where it finishes sooner than a hop
would. Only on an engine left at its default threshold
(``inline_threshold=None``: an explicit one is a hard rule, every node below it inline,
as API.md section 5 words it), with two workers or more, while other processes leave
two cores (``BLAS.free_cores``); a graph with such a node is never run as a flat
schedule (Note [The flat schedule] in task/schedule.py), which runs every node inline.

Note [Worker chains]: a large node takes the nodes that only it feeds along on the same
worker hop, since a hop costs as much as a heavy elementwise kernel. ``plan_chain``
walks the graph from the head as the loop's ready queue would run it (highest
``sequence_nr`` first), counting for each node it reaches the gradients the chain
itself sends it: a node C follows when every edge it still waits for
(``dependencies[C]``, read before the head runs, and only the chain can change it) comes
from a node of the chain. What C's other inputs sent earlier is in its buffer, final;
the chain's gradients are held on the worker and added to it in the order the loop
would add them (by producer, in the chain's order, then by edge), so sums are the
loop's bit for bit. That covers a residual join: in a transformer block the add
``x1 = x + attn(..)`` gets the residual gradient from the block's second add and ln_2's,
both earlier in the same chain. C must be a built-in node without hooks (hooks run on
the loop; a node with hooks ends the chain there). A fork, when a node makes several
nodes ready, runs whole on the worker only while every branch node is light: the chain
goes on once the branches have joined again (the walk is down to one ready node, e.g.
the q, k, v views of a block joining in the 3-slot SplitBackward0 of ``c_attn``'s
output); a heavy node while other branches are ready ends the chain before the fork, so
heavy branches still run at once on separate workers. A heavy node that would split
(``splits``) ends the chain before it; a light one never would, it runs whole (the
adds between a block's layers have two edges each). A leaf's gradient (its
AccumulateGrad, when no hook watches it) is no fork: it is staged on the loop when the
chain comes back, so a linear layer chains into the ReLU and the layer below (an MLP's
backward is one hop, its ReLUs on the worker, not the loop), and a GPT's backward is
one hop from the head's product to the first block's ln_1, not three per block with
the views and splits between them on the loop (docs/benchmarks.md, "Figures behind the
Notes"). A chain with a BLAS
node holds BLAS slots (``run_blas``) while it runs. Light nodes may sit between heavy
ones, at most ``MAX_LIGHT_RUN`` in a row: a long run of light nodes is Python holding
the GIL against the loop, so the chain ends at its last heavy node. A node whose rule
costs nothing (``work == 0``: a view's, a transpose's, an add's pass-through)
counts a quarter of a light node, so a block's six q, k,
v views and its split are less than two. Whether a leaf's gradient is a fresh array
(Note [Owned gradients] in task/step.py) is judged on the worker against the inputs each
node was given: an add passes one array on two edges, to a leaf and to the next node of
the chain, which may pass it to another leaf. Bookkeeping stays on the loop:
``GraphTask.route`` routes the rest afterwards, skipping the edges that stayed in the
chain.

Note [No one-time stall]: inspecting BLAS (threadpoolctl loads and queries every
library), applying ``blas_threads``, tuning malloc and starting the first worker thread
take tens of milliseconds once. They run on a background thread started with the
engine's first backward, never on the loop. Until they are done the policy assumes BLAS
uses every core (one BLAS kernel at a time, no split BLAS nodes); a BLAS kernel waits
for them on its worker thread, never on the loop.

Note [Each call runs by its engine's policy]: the loop's scheduler is shared by every
engine on the loop, and its runner (the driver of one engine's backward) runs the queued
nodes of all of them. So each GraphTask takes a snapshot of its engine's settings when
it is created (``GraphTask.policy``, a ``TaskPolicy``), and every decision about one of
its nodes or its completion reads that snapshot, never the runner's engine: which nodes
run inline, whether the runner may complete it, and how long its nodes may keep the loop
(a slice ends at the earliest ``yield_interval`` of the calls it ran). Changing an
engine's ``inline_threshold`` applies to its later calls.

Note [Niced kernels on the cores others leave]: with the loop's thread at the same
priority as the kernels (a worker and BLAS's helper threads on every core), a woken loop
waits behind them for a time slice. A worker thread at a lowered priority (niceness)
gives a waking loop its core at once, at the same speed, while the cores it runs on are
this process's alone; but a niced kernel on a core another busy process also wants gets
a small share of it, and the backward takes several times as long. So by default
(``Engine(worker_nice=None)``) ``worker_niceness`` runs a backward call's kernels on the
engine's ``max_workers`` threads niced by ``QUIET_NICE`` while other processes were last
seen leaving at least that many cores wholly free (``BLAS.spare_cores``: Note [Other
processes' load] in runtime/cpu_load.py), and at the process's priority otherwise, and
while nothing is known (before the first sample, sampling off). The invariant: niced
kernels never run on more threads than there are cores no other process wants, so
niceness moves CPU time between this process's own threads (toward the loop) and never
hands a core to another process. Running fewer, niced threads beside a busy process
would keep that invariant too, and shortens the loop's lag there, but a graph with
parallel branches then loses the share of the busy core it gets at equal priority
(docs/benchmarks.md, "Figures behind the Notes"), so the number of threads never
depends on the niceness. BLAS's own helper threads (OpenBLAS starts them when it loads)
keep the process's priority; they work only while BLAS is multi-threaded, and the
worker beside them is then niced on a quiet machine, so the loop still finds a core it
may take. A thread's niceness cannot be raised back without privileges, so each
niceness is a pool of its own (``shared_pool``), chosen as each call starts
(``WorkerKernels``' executor, the commit's offload), when the load is sampled. An
explicit ``worker_nice=n`` runs every kernel at niceness ``n`` (0: never niced).
``python -m bench.worker_nice [--busy]`` measures the settings side by side.

BLAS's threads per call and the slots BLAS kernels share are runtime/blas.py's (Note
[BLAS threads] there).
"""

from __future__ import annotations

import enum
import math
import threading
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from ... import _bare_thread
from ..runtime.blas import BLAS, keep_large_allocations
from ..runtime.loop_idle import loop_is_idle
from ..graph.record import MultiViewNode, OpNode
from ..task.graph_task import is_quiet_leaf

if TYPE_CHECKING:
    from ..graph import Node
    from ..task.graph_task import GraphTask


class Place(enum.Enum):
    """Where a ready node runs (``decide``)."""

    INLINE = "inline"  # on the calling thread, in the core loop (sched/inline.py)
    WORKER = "worker"  # on worker threads (sched/offload.py's WorkerKernels)
    ASYNC = "async"  # as a task of its own on the loop: an ``async def`` backward


INLINE, WORKER, ASYNC = Place.INLINE, Place.WORKER, Place.ASYNC


def decide(task: GraphTask, node: Node, queued: int = 0) -> Place:
    """THE decision of where a ready node runs (Note [Inline or offload]): a node with an
    ``async def`` backward as its own task, a node whose ``work`` reaches the task's
    threshold on workers (how is the Policy's: a chain, parts, one kernel), a mid-size
    node there too while another node is ready or in flight (Note [Mid-size nodes hop
    beside another]), any other inline. ``queued``: 1 when ``node`` is still in the ready
    queue. The blocking driver runs every node inline (its thresholds are infinite)."""
    if node.maybe_async and node.is_async():
        return ASYNC
    work = node.work
    if work >= task.inline_threshold:
        return INLINE if alone_on_idle_loop(task, node, queued) else WORKER
    if work >= task.mid_work and (len(task.ready) > queued or task.in_flight) and BLAS.free_cores >= 2:
        return WORKER
    return INLINE


def alone_on_idle_loop(task: GraphTask, node: Node, queued: int = 0) -> bool:
    """Whether a large built-in node's hop would buy nothing (Note [A lone kernel on an
    idle loop]): on an engine left at its default threshold, nothing else of its backward is
    ready or running elsewhere, no other backward call is in flight in the process, the
    node would run as one kernel (not split into parallel parts, not heading a worker
    chain that takes light nodes along), and nothing else wants the event loop
    (``loop_is_idle``)."""
    if type(node) is not OpNode or task.mid_work == math.inf or len(task.ready) > queued or task.to_start \
            or task.in_flight:
        return False
    policy: Policy | None = getattr(task.engine, "policy", None)  # (the Engine's; a Driver names none)
    if policy is None or BLAS.backwards > 1 or policy.splits(task, node):
        return False
    if policy.chains(task, node):
        plan = policy.plan_chain(task, node)
        heavy = min(task.inline_threshold, task.mid_work)
        if plan is not None and any(0 < n.work < heavy for n in plan.nodes):
            return False  # a worker chain that takes light nodes along: cheaper there (see the note)
    return loop_is_idle()


def worker_niceness(max_workers: int, worker_nice: int | None) -> int:
    """THE decision of the niceness a backward call's kernels run at on the engine's
    ``max_workers`` threads (Note [Niced kernels on the cores others leave]):
    ``worker_nice`` when the engine fixed it; else ``QUIET_NICE`` while other processes
    leave at least ``max_workers`` cores wholly free, and 0 otherwise or while nothing
    is known."""
    if worker_nice is not None:
        return worker_nice
    return QUIET_NICE if BLAS.spare_cores >= max_workers else 0


QUIET_NICE = 10  # kernels' niceness on cores no other process wants (Note [Niced kernels on the cores others leave])
MID_WORK = 262_144  # elements of work: a mid-size node (Note [Mid-size nodes hop beside another])
MAX_LIGHT_RUN = 4  # light nodes in a row inside a worker chain (Note [Worker chains])
LIGHT_UNITS = 4  # what a light node counts in that run; a node whose rule costs nothing counts 1


class Policy:
    """Where each node runs, for one engine's settings. Read-only once set up, so the
    loop and worker threads read it without a lock."""

    def __init__(self, max_workers: int, inline_threshold: int, blas_threads: int | None,
                 tune_malloc: bool) -> None:
        self.max_workers = max_workers
        self.inline_threshold = inline_threshold
        self.blas_threads = blas_threads
        self.tune_malloc = tune_malloc
        self.ready = threading.Event()  # set once the one-time set-up finished
        self._setup_lock = threading.Lock()
        self.setup_started = False
        self._blas_limits: Any = None  # threadpoolctl's limiter, kept alive

    @property
    def blas_threads_per_call(self) -> int:
        """BLAS's threads per call now (Note [BLAS threads])."""
        return BLAS.per_call

    # --- decisions --------------------------------------------------------------------
    def splits(self, task: GraphTask, node: Node) -> bool:
        """Whether to compute a node's input gradients as separate parallel kernels: a
        large built-in node with several needed gradients, and no tool wrapping kernels.
        Not for a joint rule, nor for BLAS kernels while BLAS runs threads of its own (it
        parallelises them)."""
        if self.max_workers < 2 or type(node) is not OpNode or task.tools:
            return False
        if (node.spec.blas and self.blas_threads_per_call > 1) or node.spec.variadic:
            return False
        if BLAS.free_cores < 2:
            # other processes leave one core (Note [Other processes' load] in
            # runtime/cpu_load.py): the parts would take turns on it, and a split node ends its
            # worker chain (Note [Worker chains]), so the node runs whole, in the chain
            return False
        if node.spec.joint is not None:  # one kernel for all (ops/_spec.py, Note [Joint rules])
            return False
        return sum(1 for child, _ in node.next_edges if child is not None) > 1

    def first_part_here(self, task: GraphTask, node: Node, groups: int) -> bool:
        """Whether the loop computes a split node's first group of gradients itself, its
        other groups on workers meanwhile (Note [The loop takes a small split's first
        part] in task/split_node.py): each part is below ``inline_threshold`` (the heaviest
        two of the node's gradients share its work), and nothing else is ready or in
        flight in the GraphTask."""
        if groups < 2 or node.work // 2 >= task.inline_threshold:
            return False
        return not (task.ready or task.to_start) and task.in_flight == 1

    def chains(self, task: GraphTask, node: Node) -> bool:
        """Whether ``node`` may head a worker chain: a plain backward of built-in nodes,
        no tool wrapping kernels, and a node that is not split."""
        return type(node) is OpNode and task.is_plain() and not self.splits(task, node)

    def plan_chain(self, task: GraphTask, head: Node) -> ChainPlan | None:
        """The nodes that may run on the worker right after ``head`` (Note [Worker
        chains]), or None when none may. Walks the graph as the loop's ready queue would
        run it, counting the gradients the chain itself sends each node."""
        if head._hooks is not None and head._hooks.post:
            return None
        deps = task.dependencies
        threshold = min(task.inline_threshold, task.mid_work)  # heavy: worth the hop (a mid-size node too)
        nodes: list[Node] = [head]
        feeds: dict[Node, list[tuple[int, int, int]]] = {}  # reached node -> (slot, producer, edge)
        waiting: dict[Node, int] = {}  # reached node -> edges it has yet to hear from
        ready: list[tuple[int, int, Node]] = []  # made ready by the chain, by -sequence_nr
        pushed = 0  # (ties: leaves share one sequence_nr)
        heavy = 1  # the chain up to its last heavy node
        run = 0  # light units since it (Note [Worker chains]: a view's node is a quarter)
        node = head
        while True:
            k = len(nodes) - 1
            for i, (child, nr) in enumerate(node.next_edges):
                if child is None or is_quiet_leaf(child):
                    continue
                d = waiting.get(child)
                if d is None:
                    d = deps.get(child)
                    if d is None:  # (pruned)
                        continue
                    feeds[child] = []
                waiting[child] = d - 1
                feeds[child].append((nr, k, i))
                if d == 1:
                    pushed += 1
                    heappush(ready, (-child.sequence_nr, pushed, child))
            if not ready:
                break
            child = heappop(ready)[2]
            if type(child) not in _FOLLOWERS or child._hooks is not None:  # (a built-in node without hooks)
                break
            if child.work >= threshold:
                if ready or self.splits(task, child):  # a fork with a heavy branch; a split node
                    break
                heavy = len(nodes) + 1
                run = 0
            else:
                run += LIGHT_UNITS if child.work else 1
                if run >= MAX_LIGHT_RUN * LIGHT_UNITS:
                    break
            nodes.append(child)
            node = child
        if heavy == 1:
            return None
        del nodes[heavy:]
        buffers = task.buffers
        plan = ChainPlan(nodes)
        for n in nodes[1:]:
            fed = feeds[n]
            plan.feeds.append(fed)
            for _slot, k, i in fed:
                plan.internal[k] += (i,)
            buf = buffers.get(n)
            plan.buffered.append(None if buf is None else buf.grads)
        return plan

    # --- the one-time set-up (Note [No one-time stall]) -------------------------------
    def start_setup(self, warm: Any) -> None:
        """Start the one-time set-up on a background thread (idempotent); ``warm`` is
        called there too (it starts a first worker thread)."""
        if self.setup_started:
            return
        with self._setup_lock:
            if self.setup_started:
                return
            self.setup_started = True
        # bare: ``Thread.start()`` waits until the new thread runs (Note [Starting the
        # loader does not wait] in ops/kernels/loader.py); the loop must not. Not started
        # once the process is exiting (Note [A bare thread is never half-started at exit]):
        # then nothing waits for it
        if not _bare_thread.start(self._setup, warm):
            self.ready.set()

    def _setup(self, warm: Any) -> None:
        threading.current_thread().name = "asyncgrad-setup"
        try:
            self._setup_blas()
            if self.tune_malloc:
                keep_large_allocations()
        finally:
            self.ready.set()  # before warm: BLAS kernels on workers wait for it
        warm()

    def _setup_blas(self) -> None:
        if not self.blas_threads:
            BLAS.configure()
            return
        try:
            from threadpoolctl import threadpool_limits  # (here: on the set-up thread, Note [No one-time stall])
        except ImportError:
            return
        self._blas_limits = threadpool_limits(limits=self.blas_threads, user_api="blas")
        BLAS.fix(self.blas_threads)

    def run_blas(self, fn: Any, *args: Any) -> Any:
        """On a worker thread: ``fn(*args)`` holding BLAS slots shared by every loop
        (Note [BLAS threads]), after the set-up inspected or fixed BLAS."""
        self.ready.wait()
        return BLAS.run(fn, *args)


class ChainPlan:
    """A worker chain (Note [Worker chains]), in the order it runs: ``nodes[0]`` is its
    head. For each later node ``nodes[j]``: ``buffered[j - 1]``, its InputBuffer's
    gradients when the chain was planned (None: no buffer), and ``feeds[j - 1]``, the
    gradients the chain sends it, ``(slot, k, edge)`` for edge ``edge`` of ``nodes[k]``,
    in the order the loop would add them. ``internal[k]``: the edges of ``nodes[k]``
    whose gradient stays in the chain (the loop routes the others afterwards)."""

    __slots__ = ("nodes", "buffered", "feeds", "internal")

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.buffered: list[list[Any] | None] = []
        self.feeds: list[list[tuple[int, int, int]]] = []
        self.internal: list[tuple[int, ...]] = [()] * len(nodes)


_FOLLOWERS = (OpNode, MultiViewNode)  # built-in nodes (a custom Function's backward runs on the loop)
