"""The parts of ``asyncgrad.distributed`` that need no MPI job: the bucket layout, the
communication thread (with a stand-in request type) and awaiting its futures from
asyncio and trio. Skipped only when mpi4py (the ``mpi`` extra) is not installed."""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest

pytest.importorskip("mpi4py", reason='needs the "mpi" extra: pip install "asyncgrad[mpi]"')

import asyncgrad as ag  # noqa: E402
from asyncgrad.distributed._comm import CommThread  # noqa: E402
from asyncgrad.distributed._wakeup import wait_future  # noqa: E402
from asyncgrad.distributed.buckets import Layout  # noqa: E402


class FakeRequest:
    """Completes after ``polls`` calls of Testsome, like an MPI request being progressed."""

    def __init__(self, polls: int, log: list[str], name: str) -> None:
        self.polls, self.log, self.name = polls, log, name

    @staticmethod
    def Testsome(requests):  # noqa: N802  (MPI's name)
        done = []
        for i, r in enumerate(requests):
            r.polls -= 1
            if r.polls <= 0:
                r.log.append("done " + r.name)
                done.append(i)
        return done


def test_layout_reverse_order_small_first_bucket_and_one_dtype_per_bucket():
    ps = [ag.zeros(100, dtype=ag.float32, requires_grad=True),   # 400 B
          ag.zeros(100, dtype=ag.float64, requires_grad=True),   # 800 B
          ag.zeros(300, dtype=ag.float32, requires_grad=True),   # 1200 B
          ag.zeros(10, dtype=ag.float32, requires_grad=True)]    # 40 B
    layout = Layout(ps, cap_bytes=1300, first_bytes=100)
    # reversed: p3 (40 B) alone in the small first bucket, then p2; p1 (float64) gets its
    # own bucket; p0 does not fit beside p2 (1600 B > 1300 B), so it opens a new one.
    assert [b.params for b in layout.buckets] == [[3], [2], [1], [0]]
    assert [b.dtype for b in layout.buckets] == [np.float32, np.float32, np.float64, np.float32]
    layout2 = Layout(ps, cap_bytes=2000, first_bytes=100)
    assert [b.params for b in layout2.buckets] == [[3], [2, 0], [1]]
    v = layout2.view(0)
    assert v.shape == (100,) and np.shares_memory(v, layout2.buckets[1].buffer)


def test_comm_thread_starts_work_in_submission_order_and_completes_futures():
    log: list[str] = []
    thread = CommThread(FakeRequest)
    try:
        names = ["a", "b", "c"]
        futures = [thread.submit(lambda n=n, k=k: (log.append("start " + n), FakeRequest(3 - k, log, n))[1],
                                 lambda n=n: n.upper()) for k, n in enumerate(names)]
        assert [f.result(5) for f in futures] == ["A", "B", "C"]
        assert [e for e in log if e.startswith("start")] == ["start a", "start b", "start c"]
        assert log.index("done c") < log.index("done a")  # completion order is MPI's, start order is ours
        assert thread.submit(lambda: 42).result(5) == 42  # a start that completes at once
        with pytest.raises(ValueError, match="bad start"):
            thread.submit(lambda: (_ for _ in ()).throw(ValueError("bad start"))).result(5)
        assert thread.submit(lambda: "still serving").result(5) == "still serving"
    finally:
        thread.stop()
    with pytest.raises(RuntimeError, match="communication thread has stopped"):
        thread.submit(lambda: None)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_wait_future_wakes_the_loop_from_another_thread_and_cancellation_leaves_it(backend):
    import concurrent.futures

    async def main():
        f: concurrent.futures.Future[int] = concurrent.futures.Future()
        threading.Timer(0.05, f.set_result, (7,)).start()
        assert await wait_future(f) == 7
        g: concurrent.futures.Future[int] = concurrent.futures.Future()
        with anyio.move_on_after(0.05) as scope:
            await wait_future(g)
        assert scope.cancelled_caught and not g.done()
        g.set_result(1)  # resolving it later, after the waiter left, is harmless
        h: concurrent.futures.Future[int] = concurrent.futures.Future()
        h.set_exception(KeyError("x"))
        with pytest.raises(KeyError):
            await wait_future(h)

    anyio.run(main, backend=backend)
