"""One fair scheduler per event loop, shared by every GraphTask on it.

Note [One runner per loop]: all backward calls on a loop share one queue of GraphTasks
with nodes ready to run inline, and one *runner* drains it: whichever driver finds no
runner takes the role (the others wait on their own wake-up). The runner runs the queued
GraphTasks' nodes in turn until the current slice of the loop's time ends
(``yield_interval`` after the loop's last turn), then lets the loop run once, and goes
on. So the loop gets a turn at least every
``yield_interval`` whatever the number of backward calls in flight, and a waiting
GraphTask costs the loop nothing (PyTorch likewise shares one ready queue per device
among all GraphTasks). The queue is a ``TaskOrder`` (Note [Task order] in
runtime/task_order.py): higher-priority calls first, and a GraphTask whose time slice ran out
goes to the back of its priority. The runner runs another GraphTask's nodes in that GraphTask's own context, marked
as their owner (Note [Explicit nesting] in runtime/threads.py). When its own GraphTask needs its
driver (nothing left to run inline, a node to start elsewhere, an error) the runner
hands the role to the next queued GraphTask's driver.

Note [The runner completes small backward calls]: when the runner finds that every node
of another GraphTask ran, and its driver is waiting, it also completes that backward
right there, inside its slice: the commit (when it is small enough to add up inline and
no pre-commit function is queued), post-accumulate-grad hooks, freeing the saved
tensors, and the final callbacks, each in that GraphTask's own context; then it wakes
the driver once, to return. So a small backward call costs its caller two steps (start,
return), not a wake-up per hand-over, and the loop time of the completion is counted in
the runner's slice. An async final callback is handed to the driver, with the ones
after it. The runner commits only for a caller not yet cancelled (Note [Per-driver
wake-ups] in sched/wakeup.py); a cancellation that arrives after the commit is delivered at the
caller's next await instead, as when a backward has returned. Errors raised by the
completion are raised by the driver, as if it had completed the backward itself.

Note [Wake-ups cost the loop]: every driver the runner wakes runs on the loop in the next
turn (its return, the caller's code, its next call), before the loop's timers. Without
counting that, a slice that finished hundreds of small calls made the next turn hundreds
of times longer than a slice. So each wake-up moves the end of the runner's slice
earlier by ``wake_cost``, a running estimate of the loop time spent per driver woken
(measured at each turn the runner gives the loop: the time until it runs again, per
driver it woke). Slice and wake-ups together then fit in about one ``yield_interval``.
The moved end is the slice's own (``slice_end``), not a local of one pass over the
queue: the runner goes on after a pass that stopped at it (a hand-over, a requeue), and
a pass started again from the slice's first end would forget every wake-up charged
before it, so no wake-up would ever shorten a slice.

Note [Handing on]: the runner role must never be free while work waits for it. The
role is taken synchronously (``run`` sets ``runner``), so one driver holds it; it is
handed on by waking a driver, and a woken driver can be cancelled before it takes over
(on asyncio the cancellation arrives after the wake-up, before the task resumes). So
every way out hands on: the runner's ``run`` on return or cancellation, a driver leaving
``Engine._serve`` for any reason (after it left the queue), a caller leaving the line
when it was chosen, and a caller leaving its admission. ``hand_on`` wakes the first
queued GraphTask's waiting driver, else the first caller in line that still waits;
calling it when the role is taken, or waking one driver too many, is harmless.

Note [A turn after the timers]: on asyncio, ``sleep(0)`` re-queues a task behind the
callbacks already ready, but *before* the timers that fall due meanwhile, and a task
woken by a timer (``asyncio.sleep(t)``) runs one iteration later still. So a runner
yielding with ``sleep(0)`` ran two more slices before a sleeping task got the loop. The
runner instead resumes from a timer due now: the loop runs the timers due before it,
then the tasks they woke, then the runner. Trio runs I/O and timers between its batches
of tasks, so a plain checkpoint is its turn.

Note [A turn the loop just had]: a driver that waited for a worker kernel (a large
backward's single hop) resumes long after the slice it last ran in ended, and
gave the loop a turn (``loop_turn``: a timer, a future, one more pass of the loop) before
running again, though the loop had just had one: the kernel's arrival is a callback the
loop runs right after its ``select``, in the batch with the timers that fell due there
(``turn_at``, recorded by sched/offload.py). So the runner renews the slice at that moment
instead: ``slice_end = turn_at + interval``, when the arrival came after the slice ended
and that end is still ahead. The renewed slice ends no later than one interval after the
loop's turn, as if the runner had yielded right then, and the loop's timers wait no
longer than the yield interval allows; it happens at most once per turn (the renewed
slice ends after ``turn_at``, so only a later arrival renews it again): one loop pass
fewer after each hop.

Note [Start the hop before the turn]: when the slice ends and the runner's own GraphTask
has next in its ready queue a node that goes to a worker as it is (a large built-in
node without hooks, in a plain backward, no leaf ahead of it), the runner hands it to
its driver before the loop's turn instead of after: ``run_inline`` queues it on
``to_start`` without computing anything, the driver submits it and waits, and that wait
is the loop's turn. The kernel then starts one loop pass earlier, and its worker wakes
while the loop runs its timers. The loop's time between two turns grows by the
submission only, no kernel. A driver
that started its kernels and has nothing else ready leaves the queue (``Engine._serve``)
rather than taking the runner's role for one more turn only to find nothing to run.

Note [A lone call runs its own nodes]: a driver whose GraphTask runs a flat schedule
(Note [The flat schedule] in task/schedule.py) and finds the loop's scheduler idle (no
runner, nothing queued, no caller in line) and time left in the current slice runs its
nodes right there (``run_alone``), as the runner would with it the only GraphTask queued:
the same deadline, the same context and owner, errors recorded the same way. It skips
taking the role, the queue and handing on, which cost a lone small call as much as its
set-up. When the slice ran out with nodes left, the driver goes on as any other: it
queues its GraphTask and becomes the runner, whose first act is the loop's turn.

Everything here runs on the loop's thread: no locks.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel

from ... import _context
from ..task.call import Raised, advance, completes_at_once
from .inline import run_inline
from ..task.graph_task import GraphTask, is_plain_node
from ..runtime.blas import BLAS
from .placement import WORKER, decide
from ..runtime.task_order import TaskOrder
from .wakeup import Wakeup

WAKE_COST = 20e-6  # the first estimate of one woken driver's loop time (seconds)
WAKE_COST_WEIGHT = 0.25  # the weight of each new measurement in the running estimate

_scheduler: anyio.lowlevel.RunVar[LoopScheduler] = anyio.lowlevel.RunVar("asyncgrad_loop_scheduler")
_last = threading.local()  # (loop, its scheduler): a thread runs one loop at a time


def _running_loop() -> object:
    loop = asyncio._get_running_loop()  # (None off asyncio: no exception to raise and catch)
    if loop is not None:
        return loop
    trio = sys.modules.get("trio")
    if trio is None:
        raise RuntimeError("no running event loop")
    return trio.lowlevel.current_trio_token()


def _back_end_checkpoints() -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """The running back end's ``checkpoint_if_cancelled`` and ``checkpoint``, looked up
    once per loop: ``anyio.lowlevel``'s find the back end (sniffio) on every call, which
    cost each backward call as much as the check itself."""
    try:
        from anyio._core._eventloop import get_async_backend  # (here: anyio's private path may move)

        backend = get_async_backend()
        return backend.checkpoint_if_cancelled, backend.checkpoint
    except (ImportError, AttributeError, RuntimeError):  # (a future anyio may move it)
        return anyio.lowlevel.checkpoint_if_cancelled, anyio.lowlevel.checkpoint


def loop_scheduler() -> LoopScheduler:
    """The scheduler of the running event loop (created on first use; kept in a RunVar
    so it lives as long as the loop, and cached per thread for the per-call lookup)."""
    loop = asyncio._get_running_loop() or _running_loop()  # (asyncio's without a call of ours)
    last = getattr(_last, "pair", None)
    if last is not None and last[0] is loop:
        cached: LoopScheduler = last[1]
        return cached
    try:
        scheduler = _scheduler.get()
    except LookupError:
        scheduler = LoopScheduler(loop if isinstance(loop, asyncio.AbstractEventLoop) else None)
        _scheduler.set(scheduler)
    _last.pair = (loop, scheduler)
    return scheduler


def wake(task: GraphTask) -> None:
    """Wake ``task``'s driver if it waits (it re-checks its state before waiting)."""
    if task.wakeup is not None:
        task.wakeup.set()


def node_done(task: GraphTask) -> None:
    """A node run elsewhere finished (on the loop): queue what it made ready, and wake
    the driver (it re-checks its state)."""
    if task.has_ready() and not task.stopping:
        loop_scheduler().add(task)
    wake(task)


def _run_as(owner: object, task: GraphTask, deadline: float) -> bool:
    _context.node_owner.set(owner)
    return run_inline(task, deadline)


def _hop_next(task: GraphTask) -> bool:
    """Whether ``run_inline`` would hand ``task``'s next ready node to its driver at
    once, computing nothing (Note [Start the hop before the turn])."""
    if not task.ready or task.leaf_waits() or task.to_start or task.error is not None or task.stopping \
            or task.active_children or task.context is None or task.exec_info is not None:
        return False
    node = task.ready[0][2]
    return is_plain_node(node) and decide(task, node, queued=1) is WORKER


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # (not if the waiting task was cancelled meanwhile)
        future.set_result(None)


def _complete_as(owner: object, task: GraphTask) -> None:
    """Take ``task``'s sequence on from ``DRAIN`` (Note [One driver skeleton] in
    task/call.py): to its end, or to an async final callback's awaitable, left to the
    driver with the rest; what it raises is raised by the driver."""
    _context.node_owner.set(owner)  # (its callbacks run in the runner's task)
    try:
        task.request = advance(task.steps)
    except Exception as e:
        task.request = Raised(e)


class LoopScheduler:
    """The queue of GraphTasks with inline work, and who runs it (see the notes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop  # None on trio (Wakeup picks its primitive by it)
        # GraphTasks with nodes to run inline, in the order the runner serves them
        self.queue: TaskOrder[GraphTask] = TaskOrder()
        self.runner: GraphTask | None = None  # the GraphTask whose driver runs the queue
        self.slice_start = 0.0  # perf_counter() when the current slice began
        self.slice_end = 0.0  # perf_counter() when the current slice of the loop's time ends
        self.woken = 0  # drivers the runner woke since it last let the loop run
        self.wake_cost = WAKE_COST  # estimated loop time one woken driver takes (Note [Wake-ups cost the loop])
        self.half_interval = 0.0
        # perf_counter() when the loop last ran a kernel's arrival, right after a turn
        # (Note [A turn the loop just had])
        self.turn_at = 0.0
        # callers waiting to start a backward (Note [Admission] in admission.py)
        self.admission: TaskOrder[Wakeup] = TaskOrder()
        # ``await check_cancelled()``: a checkpoint only if the caller's cancel scope was
        # cancelled; ``await checkpoint()``: the back end's plain checkpoint
        self.check_cancelled, self.checkpoint = _back_end_checkpoints()

    def wakeup(self) -> Wakeup:
        """A fresh wake-up for a driver about to wait on this loop."""
        return Wakeup(self.loop)

    def add(self, task: GraphTask) -> None:
        """Queue ``task`` (it has ready nodes); without a runner, wake its driver."""
        self.queue.push(task, task.priority)
        if self.runner is None and task.wakeup is not None:  # (``wake`` inlined)
            task.wakeup.set()

    def discard(self, task: GraphTask) -> None:
        self.queue.remove(task)

    async def wait_in_line(self, priority: int = 0) -> None:
        """Wait until the runner admits this caller (Note [Admission] in admission.py).
        While it waits it counts as a backward call in flight for BLAS; admitted, it
        stops counting here, and the engine counts the call it starts
        (``Engine._begin``), so a call is counted once at any moment."""
        waiting = self.wakeup()
        self.admission.push(waiting, priority)
        BLAS.backward_started()
        try:
            await waiting.wait()
        except BaseException:
            if not self.admission.remove(waiting):  # chosen, then cancelled before it took over: choose another
                self.hand_on()
            raise
        finally:
            BLAS.backward_ended()  # (synchronously before the engine counts the call)

    def hand_on(self) -> None:
        """Without a runner, wake the driver that takes the role next (Note [Handing
        on]): the first queued GraphTask's waiting driver, else the first caller in line.
        Waking one too many is harmless (the role is taken synchronously, by one)."""
        if self.runner is not None:
            return
        first = self.queue.first()
        if first is not None and first.wakeup is not None and first.wakeup.waiting:
            first.wakeup.set()  # (the common case, without walking the order)
            return
        for task in self.queue.in_order():
            waiting = task.wakeup
            if waiting is not None and waiting.waiting:
                waiting.set()
                return
        self.admit_next()

    def admit_next(self) -> bool:
        """Wake the first caller in line that still waits (a cancelled one leaves the
        line by itself, in ``wait_in_line``). False when there is none."""
        admission = self.admission
        while (waiting := admission.take_first()) is not None:
            if waiting.waiting:
                waiting.set()
                return True
        return False

    async def loop_turn(self) -> None:
        """Let the loop run its due timers and I/O, and the tasks they wake, before this
        task goes on (Note [A turn after the timers])."""
        loop = self.loop
        if loop is None:
            await self.checkpoint()  # (trio: I/O and timers run between batches)
            return
        turn = loop.create_future()
        loop.call_at(loop.time(), _resolve, turn)
        await turn

    def run_alone(self, task: GraphTask) -> bool:
        """Run ``task``'s nodes on its own driver when the scheduler is idle and the
        slice has time left (Note [A lone call runs its own nodes]); False when it did
        not (nothing ran). An error is recorded on ``task`` (``run_inline``), for its
        driver to raise."""
        if self.runner is not None or self.queue or self.admission or task.schedule is None \
                or task.stopping or task.active_children or task.context is None:
            return False
        deadline = self.slice_end
        end = self.slice_start + task.policy.yield_interval
        if end < deadline:  # (as ``_run_slice``: Note [Each call runs by its engine's policy])
            deadline = self.slice_end = end
        if time.perf_counter() >= deadline:
            return False
        try:
            task.context.run(_run_as, _context.node_owner.get(), task, deadline)
        except Exception:  # recorded on the task by run_inline; its driver raises it
            pass
        return True

    def _drop(self, task: GraphTask, owner: object) -> float:
        """Take ``task`` off the queue and wake its driver; when every node ran, first
        complete the backward for the waiting caller (Note [The runner completes small
        backward calls]). Returns the loop time to charge for the wake-up."""
        self.queue.drop_first(task)  # (it is the first: ``_run_slice`` just took it)
        waiting = task.wakeup
        if task is self.runner or waiting is None or not waiting.waiting:
            return 0.0  # (this driver, or one that runs anyway)
        if (task.error is None and not task.stopping and not task.nodes_left()
                and task.context is not None and task.steps is not None and completes_at_once(task)):
            task.context.run(_complete_as, owner, task)
        waiting.set()
        self.woken += 1
        return self.wake_cost

    async def run(self, me: GraphTask) -> None:
        """Be the runner until ``me`` needs its driver; then hand over.

        The slice is the loop's, not the runner's: ``slice_end`` carries over from one
        runner (and one backward call) to the next, and is renewed only after the loop
        had a turn. So a task awaiting many small backward calls in a row, each done
        within a slice, still lets the loop run every ``interval``. The slice is as long
        as ``me``'s engine's ``yield_interval``, and ends earlier when it runs a call
        whose engine's is shorter (Note [Each call runs by its engine's policy] in
        sched/placement.py)."""
        interval = me.policy.yield_interval
        self.runner = me
        self.half_interval = interval / 2
        owner = _context.node_owner.get()  # this driver's task (blocking.enter_task set it)
        clock = time.perf_counter
        try:
            while True:
                if clock() >= self.slice_end:
                    turn = self.turn_at
                    if turn >= self.slice_end and clock() < turn + interval:
                        self.slice_start = turn
                        self.slice_end = turn + interval  # (Note [A turn the loop just had])
                        self.woken = 0  # (they ran in that turn)
                        continue
                    if _hop_next(me):  # (Note [Start the hop before the turn])
                        assert me.context is not None
                        me.context.run(_run_as, owner, me, 0.0)
                        if me.to_start:
                            return
                    woken, left = self.woken, clock()
                    await self.loop_turn()  # the loop's turn, then a new slice
                    now = clock()
                    if woken:  # what the woken drivers (and the rest of the loop) took
                        sample = min((now - left) / woken, interval)
                        self.wake_cost += (sample - self.wake_cost) * WAKE_COST_WEIGHT
                    self.woken = 0
                    self.slice_start = now
                    self.slice_end = now + interval
                self._run_slice(owner, self.slice_end)
                if me not in self.queue or me.to_start or me.error is not None or not self.queue:
                    return
        finally:
            self.runner = None
            self.hand_on()  # (if ``me`` is leaving, its driver hands on again once it left)

    def _run_slice(self, owner: object, deadline: float) -> None:
        """Run queued GraphTasks' nodes until ``deadline``, which each driver woken
        moves earlier by its estimated cost (Note [Wake-ups cost the loop]), and a call
        with a shorter ``yield_interval`` than the slice's moves to its own end. Called
        with the slice's end (``slice_end``), which moves with it."""
        queue = self.queue
        clock = time.perf_counter
        admission = self.admission
        # newcomers first: one, then more while half of the slice is left (Note [Admission] in admission.py)
        while admission and self.admit_next():
            self.woken += 1
            deadline = self.slice_end = deadline - self.wake_cost
            if deadline - clock() - self.wake_cost <= self.half_interval:
                break
        while (task := queue.first()) is not None:
            if task.stopping or task.active_children or task.context is None:
                # its driver handles it (a nested task wakes it at its end)
                deadline = self.slice_end = deadline - self._drop(task, owner)
                continue
            end = self.slice_start + task.policy.yield_interval
            if end < deadline:  # (Note [Each call runs by its engine's policy] in sched/placement.py)
                deadline = self.slice_end = end
            try:
                more = task.context.run(_run_as, owner, task, deadline)
            except Exception:  # recorded on the task by run_inline; its driver raises it
                deadline = self.slice_end = deadline - self._drop(task, owner)
                continue
            if task.to_start and task is not self.runner:
                wake(task)
            if not more:
                deadline = self.slice_end = deadline - self._drop(task, owner)
                if clock() >= deadline:
                    return
            elif clock() >= deadline:
                queue.requeue_first(task.priority)  # its slice ran out: to the back
                return
            elif task.to_start and task is self.runner:
                return
