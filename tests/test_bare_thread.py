"""Bare background threads at exit (Note [A bare thread is never half-started at exit] in
asyncgrad/_bare_thread.py): exit waits for a thread started but not yet run, and once the
process is exiting nothing starts: each engine thread's owner says what happens instead."""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from asyncgrad import _bare_thread
from asyncgrad.autograd.runtime.cpu_load import Sampler
from asyncgrad.autograd.runtime.workers import WorkerPool
from asyncgrad.autograd.sched.placement import Policy

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def exiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as ``atexit`` leaves it: no bare thread starts any more."""
    monkeypatch.setattr(_bare_thread, "_exiting", True)


def test_exit_waits_for_a_thread_started_but_not_yet_run(monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = _thread.start_new_thread
    launched: list[bool] = []

    def late_start(fn, args):  # the OS schedules the new thread only 0.3 s later
        def later():
            time.sleep(0.3)
            launched.append(True)
            fn(*args)
        return real_start(later, ())

    ran = threading.Event()
    monkeypatch.setattr(_bare_thread._thread, "start_new_thread", late_start)
    monkeypatch.setattr(_bare_thread, "_exiting", False)
    assert _bare_thread.start(ran.set)
    assert _bare_thread._unstarted  # started, not yet running
    _bare_thread._wait_at_exit()
    assert launched  # the delayed thread was launched before the wait returned
    assert not _bare_thread._unstarted  # it ran its first line before exit went on
    assert ran.wait(5)
    assert _bare_thread.start(ran.set) is False  # and from then on nothing starts


def test_a_thread_started_normally_runs_its_target() -> None:
    got: Future[int] = Future()
    assert _bare_thread.start(got.set_result, 7)
    assert got.result(5) == 7
    deadline = time.monotonic() + 5
    while _bare_thread._unstarted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _bare_thread._unstarted


def test_no_worker_starts_while_exiting_and_its_job_fails(exiting: None) -> None:
    pool = WorkerPool(2, name="exit-test")
    future = pool.submit(lambda: 1)
    with pytest.raises(RuntimeError, match="no new worker thread: the process is exiting"):
        future.result(5)
    assert pool.threads == 0


def test_no_sampler_starts_while_exiting(exiting: None) -> None:
    sampler = Sampler()
    ran: list[int] = []
    sampler(lambda: ran.append(1))
    time.sleep(0.1)
    assert ran == [] and not sampler._started


def test_no_setup_thread_while_exiting_and_nothing_waits_for_it(exiting: None) -> None:
    policy = Policy(2, 1_000_000, None, False)
    warmed: list[int] = []
    policy.start_setup(lambda: warmed.append(1))
    assert policy.ready.is_set() and warmed == []


def test_the_kernel_loader_does_not_start_while_exiting() -> None:
    code = ("from asyncgrad import _bare_thread\n"
            "_bare_thread._wait_at_exit()\n"
            "from asyncgrad.ops.kernels import loader\n"
            "loader.start()\n"
            "print(loader.wait(5), loader.status())\n")
    env = {**os.environ, "PYTHONPATH": SRC, "ASYNCGRAD_KERNELS": "auto"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False ASYNCGRAD_KERNELS=auto: numpy kernels"
