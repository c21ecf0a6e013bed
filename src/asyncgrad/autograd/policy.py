"""Scheduling policy: pure decisions about where a node's kernel runs, kept in one place.

Note [Inline or offload]: a node whose ``work`` is below ``inline_threshold`` runs
inline on the event loop; larger kernels run on the engine's worker threads (numpy
releases the GIL), at most ``max_workers`` of them (workers.py), so independent branches
overlap and the loop stays free. ``work`` (recording.py) counts the elements the kernel
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
backward is one hop: 1.30x -> 1.07x the numpy floor on the MLP benchmark, hop per layer
vs chain in one run; the ReLUs run on the worker, not the loop), and a GPT's backward
is one hop from the head's product to the first block's ln_1 (was three per block,
~0.3 ms each, and the views and splits between them on the loop). A chain with a BLAS
node holds BLAS slots (``run_blas``) while it runs. Light nodes may sit between heavy
ones, at most ``MAX_LIGHT_RUN`` in a row: a long run of light nodes is Python holding
the GIL against the loop, so the chain ends at its last heavy node. A node whose rule
costs nothing (``work == 0``: a view's, a transpose's, an add's pass-through; 5-10 us
each in ``bench.step_trace``) counts a quarter of a light node, so a block's six q, k,
v views and its split are less than two. Whether a leaf's gradient is a fresh array
(Note [Owned gradients] in execute.py) is judged on the worker against the inputs each
node was given: an add passes one array on two edges, to a leaf and to the next node of
the chain, which may pass it to another leaf. Bookkeeping stays on the loop:
``GraphTask.route`` routes the rest afterwards, skipping the edges that stayed in the
chain.

Note [BLAS threads]: BLAS runs threads of its own inside each call. Several BLAS kernels
at once multiply those threads and oversubscribe the cores, and with other work on the
cores (other kernels, other backward calls' forward passes on the loop) a multi-threaded
BLAS call waits for its helper threads, many times longer than a single-threaded one
takes (docs/benchmarks.md). So BLAS's threads adapt (``BLAS``):
numpy's BLAS is single-threaded while more than one backward call is in flight in the
process, and uses its own default threads while one backward runs alone (one large
product on all cores beats two single-threaded ones). A nested backward (a reentrant
checkpoint's, started by a node of a running backward) is not a second call: its
parent's node waits for it, so a training step with reentrant checkpoints alone keeps
BLAS's threads (counted as a second call, it made every such step single-threaded:
``python -m bench.blas_spin --checkpoint``). Going back to BLAS's own threads waits
until no second backward has been in flight for ``RELAX_SECONDS`` (Note [BLAS
hysteresis]). The switch is made only while no
engine BLAS kernel runs (OpenBLAS's pthreads build just stores the count; a call in
progress keeps the count it started with). On worker threads, BLAS kernels take
``threads-per-call`` of ``cores`` shared slots, over every loop and engine, and a BLAS
node's input gradients are split into parallel kernels only while BLAS is
single-threaded. Other processes' load counts too: BLAS gets at most the cores
they leave free (Note [Other processes' load] in cpu_load.py). ``Engine(blas_threads=n)``
fixes BLAS at ``n`` threads per call process-wide through threadpoolctl instead;
``BLAS.pinned(n)`` does so for a block (the benchmarks' one-thread rows).

Note [No one-time stall]: inspecting BLAS (threadpoolctl loads and queries every
library), applying ``blas_threads``, tuning malloc and starting the first worker thread
take tens of milliseconds once. They run on a background thread started with the
engine's first backward, never on the loop. Until they are done the policy assumes BLAS
uses every core (one BLAS kernel at a time, no split BLAS nodes); a BLAS kernel waits
for them on its worker thread, never on the loop.

Note [BLAS hysteresis]: flipping BLAS's threads per backward call made two tasks that
alternate (one's forward pass while the other's backward is in flight, then one alone)
call ``set_num_threads`` about twice per pass, and gave their forward passes' small
products BLAS's helper threads part of the time, the case where a busy core makes a
two-threaded call many times slower (``python -m bench.blas_flips 2`` measures both).
So BLAS goes single-threaded at once when a second backward starts, but gets its own
threads back only once no second backward has been in flight for ``RELAX_SECONDS``.
Seconds, not calls, because the cost being avoided is measured in seconds: after a
product that used them, OpenBLAS's helper threads spin for work for ~0.1 s
(``OPENBLAS_THREAD_TIMEOUT``'s default, 2^28 cycles; the count BLAS is set to does not
stop them, and only the environment before numpy loads can shorten it). When backward
calls overlap again within that time, the spinning helper takes a core from them: a
service whose requests came one by one, then together, in rounds of ~60 ms ran its
concurrent rounds 1.17-1.39x slower than with BLAS pinned at one thread, its helper
thread burning 50-69 ms of CPU per round (``python -m bench.blas_spin`` measures it; with
this rule the helper's CPU there is 0). Half a second without overlap is
several such spins: a service with requests in flight now and then stays
single-threaded between them, and one caller running backward after backward alone (a
training loop), or one long backward alone, gets BLAS's threads half a second after the
last overlap, even in the middle of a backward (the decision is revisited as each call
starts and ends and after each BLAS kernel on a worker). Tests replace ``BLAS.clock``
to decide by the order of events alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from ..ops.kernels import intra_op
from .cpu_load import OtherLoad
from .graph import AccumulateGrad
from .recording import MultiViewNode, OpNode

if TYPE_CHECKING:
    from .graph import Node
    from .graph_task import GraphTask

MAX_LIGHT_RUN = 4  # light nodes in a row inside a worker chain (Note [Worker chains])
LIGHT_UNITS = 4  # what a light node counts in that run; a node whose rule costs nothing counts 1
RELAX_SECONDS = 0.5  # no second backward in flight for this long: BLAS gets its threads back (Note [BLAS hysteresis])
CORES = os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class TaskPolicy:
    """The settings one backward call runs by, taken from its engine when the call's
    GraphTask is created (Note [Each call runs by its engine's policy]): whoever runs
    its nodes (its own driver, or the loop's runner, the driver of a call on another
    engine) decides by these."""

    inline_threshold: int  # nodes whose work is below it run inline (Note [Inline or offload])
    yield_interval: float  # the longest its nodes keep the loop from a turn (scheduler.py)


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
        if self.max_workers < 2 or type(node) is not OpNode or not task.plain_kernels():
            return False
        if (node.spec.blas and self.blas_threads_per_call > 1) or node.spec.variadic:
            return False
        if BLAS.free_cores < 2:
            # other processes leave one core (Note [Other processes' load] in
            # cpu_load.py): the parts would take turns on it, and a split node ends its
            # worker chain (Note [Worker chains]), so the node runs whole, in the chain
            return False
        if node.spec.joint is not None:  # one kernel for all (ops/_spec.py, Note [Joint rules])
            return False
        return sum(1 for child, _ in node.next_edges if child is not None) > 1

    def first_part_here(self, task: GraphTask, node: Node, groups: int) -> bool:
        """Whether the loop computes a split node's first group of gradients itself, its
        other groups on workers meanwhile (Note [The loop takes a small split's first
        part] in split_node.py): each part is below ``inline_threshold`` (the heaviest
        two of the node's gradients share its work), and nothing else is ready or in
        flight in the GraphTask."""
        if groups < 2 or node.work // 2 >= task.policy.inline_threshold:
            return False
        return not (task.heap or task.ready_leaves or task.to_start) and task.in_flight == 1

    def chains(self, task: GraphTask, node: Node) -> bool:
        """Whether ``node`` may head a worker chain: a plain backward of built-in nodes,
        no tool wrapping kernels, and a node that is not split."""
        return (type(node) is OpNode and task.exec_info is None and not task.create_graph
                and task.plain_kernels() and not self.splits(task, node))

    def plan_chain(self, task: GraphTask, head: Node) -> ChainPlan | None:
        """The nodes that may run on the worker right after ``head`` (Note [Worker
        chains]), or None when none may. Walks the graph as the loop's ready queue would
        run it, counting the gradients the chain itself sends each node."""
        if head._hooks is not None and head._hooks.post:
            return None
        deps = task.dependencies
        threshold = task.policy.inline_threshold
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
                if child is None or _quiet_leaf(child):
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
            if type(child) not in _FOLLOWERS or child._hooks is not None:
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
        threading.Thread(target=self._setup, args=(warm,), name="asyncgrad-setup", daemon=True).start()

    def _setup(self, warm: Any) -> None:
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
            from threadpoolctl import threadpool_limits
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


def _quiet_leaf(node: Node) -> bool:
    """A leaf's AccumulateGrad that no hook watches: staging its gradient is bookkeeping
    on the loop after the chain, so it does not end a chain (Note [Worker chains])."""
    return type(node) is AccumulateGrad and node._hooks is None and not node.variable._hooks


class BlasThreads:
    """Process-wide: how many threads numpy's BLAS uses per call, adapted to the number
    of backward calls in flight, and the slots BLAS kernels on worker threads share
    (Note [BLAS threads]). All state under ``_cond``."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        # ``with self._mutex`` is ``with self._cond`` without the Condition's Python-level
        # __enter__/__exit__: the per-call counters below take it twice per backward
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._free = cores  # BLAS threads not taken by a running engine BLAS kernel
        self._backwards = 0  # backward calls in flight, process-wide
        self._libs: list[Any] = []  # threadpoolctl controllers of numpy's BLAS
        self._default = cores  # BLAS's own threads per call
        self._fixed = False  # Engine(blas_threads=n) or inside pinned(): never adapt
        # the states pinned() blocks resume at their end (mutable: ``configure`` fills in
        # the default it finds when it runs inside a block)
        self._resumes: list[list[Any]] = []
        self._single = False
        self.clock = time.monotonic  # (tests replace it: Note [BLAS hysteresis])
        self._overlap_at = float("-inf")  # when a second backward was last in flight (self.clock)
        # the cores other processes leave free (Note [Other processes' load] in cpu_load.py)
        self.load = OtherLoad()
        self._cap = cores
        self._applied: int | None = None  # the count last given to BLAS, if any

    @property
    def free_cores(self) -> int:
        """The cores other processes leave free, as last sampled (Note [Other
        processes' load] in cpu_load.py; all of them while that is off)."""
        return self._cap

    @property
    def per_call(self) -> int:
        return 1 if self._single else min(self._default, self._cap)

    @property
    def chosen(self) -> int | None:
        """The thread count the policy last gave numpy's BLAS (``per_call``), or None
        while it has not inspected BLAS yet (and so has not set it). A program that
        changes BLAS's threads behind the engine's back (a benchmark measuring other
        libraries in the same process) restores this before the engine runs again:
        the engine sets BLAS only when its decision changes."""
        with self._cond:
            return self.per_call if (self._libs or self._fixed) else None

    def configure(self) -> None:
        """On the set-up thread: find numpy's BLAS and its default thread count."""
        libs, default = _inspect_blas()
        with self._cond:
            self._install(libs, default)

    def _install(self, libs: list[Any], default: int) -> None:
        """Keep what the inspection found (the first time; under ``_cond``). While the
        count is fixed (``Engine(blas_threads=n)``, a ``pinned`` block) BLAS is set to
        it and the default found is what a pinned block resumes with: before, an
        inspection inside a block was dropped, so the block's count never reached BLAS
        and the process never adapted again."""
        if self._libs or not libs:
            return
        self._libs = libs
        for state in self._resumes:
            if not state[0]:  # an adaptive state, resumed when its block ends
                state[1] = default
        if self._fixed:
            for lib in libs:
                lib.set_num_threads(self._default)
            self._applied = self._default
            return
        self._default = default
        self._adapt()

    def fix(self, n: int) -> None:
        with self._cond:
            self._fixed, self._default, self._single = True, n, False

    @contextmanager
    def pinned(self, n: int) -> Iterator[None]:
        """numpy's BLAS at ``n`` threads per call inside the block, without adapting (as
        ``Engine(blas_threads=n)``, undone at the block's end, when the adaptive state
        resumes): for a program that measures at a set thread count, such as the
        benchmarks' one-thread rows, where a limit set from outside would be undone by
        the engine's next change of mind (Note [BLAS hysteresis]). Before the engine's
        first backward, the block inspects BLAS itself (a one-time cost on this thread)."""
        if not self._libs:  # not inspected yet: the block's count must reach BLAS now
            libs, default = _inspect_blas()
            with self._cond:
                self._install(libs, default)
        with self._cond:
            saved = [self._fixed, self._default, self._single]
            self._resumes.append(saved)
            self._fixed, self._default, self._single = True, n, False
            for lib in self._libs:
                lib.set_num_threads(n)
            self._applied = n
        try:
            yield
        finally:
            with self._cond:
                self._resumes = [s for s in self._resumes if s is not saved]
                self._fixed, self._default, self._single = bool(saved[0]), int(saved[1]), bool(saved[2])
                for lib in self._libs:
                    lib.set_num_threads(self.per_call)
                self._applied = self.per_call

    def intra_op_ok(self, one_pool: bool = False) -> bool:
        """Whether a compiled kernel may split itself over the cores now (Note [Intra-op
        threads] in ops/_intra.py): at most one backward call in flight, BLAS has threads
        of its own (Note [BLAS hysteresis]; not pinned at one) and no engine BLAS kernel
        is running. Read without the lock: a hint, as a kernel may start just after."""
        threads_ok = self.per_call == 1 if one_pool else self.per_call > 1  # (Note [One pool] there)
        return self._backwards <= 1 and threads_ok and self._free == self.cores

    def backward_started(self) -> None:
        with self._mutex:
            self._backwards += 1
            if self._backwards > 1:
                self._overlap_at = self.clock()
            if self._libs and not self._fixed:  # (else nothing to adapt)
                if self.load.sample():  # (at most every cpu_load.INTERVAL: ~20 us then)
                    self._cap = self.load.free_cores()
                self._adapt()

    def backward_ended(self) -> None:
        with self._mutex:
            if self._backwards > 1:  # the overlap lasted until now
                self._overlap_at = self.clock()
            self._backwards -= 1
            if self._libs and not self._fixed:
                self._adapt()

    def _adapt(self) -> None:
        if self._fixed or not self._libs or self._free != self.cores:
            return  # (a BLAS kernel running: the next start or end adapts)
        single = self._backwards > 1 or (self._single and self.clock() - self._overlap_at < RELAX_SECONDS)
        threads = 1 if single else min(self._default, self._cap)
        self._single = single
        if threads == (self._default if self._applied is None else self._applied):
            return  # (before any change BLAS runs the default the inspection found)
        for lib in self._libs:
            lib.set_num_threads(threads)
        self._applied = threads

    def run(self, fn: Any, *args: Any) -> Any:
        with self._cond:
            need = min(self.per_call, self.cores)
            while self._free < need:
                self._cond.wait()
            self._free -= need
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._free += need
                self._adapt()
                self._cond.notify_all()


def _inspect_blas() -> tuple[list[Any], int]:
    """numpy's BLAS libraries (threadpoolctl controllers) and their thread count: a
    one-time cost of a few to tens of ms, so the engine runs it on its set-up thread."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return [], CORES
    libs = [lib for lib in ThreadpoolController().select(user_api="blas").lib_controllers
            if "numpy" in lib.filepath or "scipy_openblas" in lib.filepath]
    return libs, max((lib.num_threads for lib in libs), default=1)


BLAS = BlasThreads(CORES)
intra_op.use_gate(BLAS)  # the intra-op switch asks BLAS whether the process is idle (ops never import autograd)


_malloc_tuned = False
TRIM_THRESHOLD = 256 * 1024 * 1024  # bytes of freed memory glibc keeps (Note [Page faults])


def keep_large_allocations() -> None:
    """Note [Page faults]: numpy allocates every result afresh. glibc serves large blocks
    with mmap and returns them to the OS on free, so each new large array is faulted in
    page by page again, and arrays made on worker threads and freed on the loop thread
    fault every time; that cost ate the gain of running branches in parallel. So the
    engine raises glibc's mmap and trim thresholds (mallopt, process-wide, once), and
    freed blocks are reused: the process keeps up to ``TRIM_THRESHOLD`` of freed memory
    per arena. The trim threshold is above what one large backward frees at its end:
    freeing the saved tensors of the wide benchmark (~190 MB) took 4-12 ms on the loop
    with a 128 MB threshold (glibc handed the pages back to the OS, and the next forward
    faulted them in again) and 0.1 ms with 256 MB.
    ``Engine(tune_malloc=False)`` leaves malloc alone; a no-op off glibc."""
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)  # glibc's maximum on 64-bit
        libc.mallopt(m_trim_threshold, TRIM_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        return
