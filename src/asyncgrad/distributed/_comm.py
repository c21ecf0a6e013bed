"""The one thread that owns every MPI call of the process.

Note [One communication thread]: MPI makes no progress in the background: a nonblocking
``Iallreduce`` moves only while some thread calls ``Test``/``Wait``, each call may copy
for milliseconds, and a blocking ``Wait`` spins a core. Calling MPI from the event loop
stalled it 5-22 ms per call here, and ``to_thread(req.Wait)`` worse. So every MPI call
of asyncgrad runs on this single thread (which also makes a THREAD_SERIALIZED MPI
enough): callers ``submit`` a start function and get a ``concurrent.futures.Future``.
The thread starts submitted work in submission order (so every rank posts its
collectives in the same order when its callers submit in the same order), then, while
requests are in flight, polls ``Testsome`` with ~50 us sleeps; when idle it blocks on
its queue and costs nothing.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL_SLEEP = 50e-6  # between two Testsome calls while work is in flight


@dataclass
class _Work:
    start: Callable[[], Any]  # returns an MPI.Request, or a result when already complete
    finish: Callable[[], Any] | None  # after the request completed: the future's result
    future: concurrent.futures.Future[Any]


class CommThread:
    """Runs submitted MPI work in order and completes its futures."""

    def __init__(self, request_type: Any) -> None:
        self._request_type = request_type  # MPI.Request (passed in: mpi4py imports lazily)
        self._queue: deque[_Work] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="asyncgrad-mpi", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # before mpi4py's MPI_Finalize (atexit runs in reverse)

    def submit(self, start: Callable[[], Any], finish: Callable[[], Any] | None = None
               ) -> concurrent.futures.Future[Any]:
        """Queue ``start`` (run on the communication thread, in submission order)."""
        work = _Work(start, finish, concurrent.futures.Future())
        with self._cv:
            if self._stopping:
                raise RuntimeError("asyncgrad.distributed: the communication thread has stopped")
            self._queue.append(work)
            self._cv.notify()
        return work.future

    def call(self, start: Callable[[], Any], timeout: float) -> Any:
        """Blocking form of ``submit`` for setup outside the loop (wrapping a model)."""
        return result(self.submit(start), timeout)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        requests: list[Any] = []
        pending: list[_Work] = []
        while True:
            with self._cv:
                while not self._queue and not requests and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return  # in-flight requests are abandoned: the process is exiting
                new = list(self._queue)
                self._queue.clear()
            for work in new:
                self._start(work, requests, pending)
            if requests:
                self._poll(requests, pending)

    def _start(self, work: _Work, requests: list[Any], pending: list[_Work]) -> None:
        try:
            result = work.start()
        except BaseException as e:  # an MPI error: the caller sees it
            work.future.set_exception(e)
            return
        if isinstance(result, self._request_type):
            requests.append(result)
            pending.append(work)
        else:
            work.future.set_result(result)

    def _poll(self, requests: list[Any], pending: list[_Work]) -> None:
        try:
            done = self._request_type.Testsome(requests)
        except BaseException as e:
            for work in pending:
                work.future.set_exception(e)
            requests.clear()
            pending.clear()
            return
        if not done:
            time.sleep(POLL_SLEEP)
            return
        finished = set(done)
        for i in sorted(finished):
            work = pending[i]
            try:
                work.future.set_result(work.finish() if work.finish is not None else None)
            except BaseException as e:
                work.future.set_exception(e)
        requests[:] = [r for i, r in enumerate(requests) if i not in finished]
        pending[:] = [w for i, w in enumerate(pending) if i not in finished]


def result(future: concurrent.futures.Future[Any], timeout: float) -> Any:
    """Block for ``future`` (outside the loop only), raising DistributedTimeout."""
    from .errors import DistributedTimeout

    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        raise DistributedTimeout(f"an MPI call made no progress for {timeout:g} s") from None
