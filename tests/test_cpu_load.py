"""Note [Other processes' load] (autograd/runtime/cpu_load.py): BLAS gets the cores other
processes leave free. Samples are injected (a fake /proc/stat, process CPU time and
clock), so these tests check the order of events and the decisions, not timings. Most run
a requested sample at once on the caller's thread (``run``); the last ones check Note
[Sampling off the caller's path] with a sampler thread."""

from __future__ import annotations

import os
import threading

import pytest

from asyncgrad.autograd.runtime import cpu_load
from asyncgrad.autograd.runtime.cpu_load import INTERVAL, OtherLoad, Sampler, read_busy_seconds
from asyncgrad.autograd.runtime.blas import BlasThreads


class FakeMachine:
    """Busy seconds of the cores, this process's CPU seconds and a clock, moved by hand."""

    def __init__(self) -> None:
        self.busy = 100.0
        self.own = 5.0
        self.now = 1000.0

    def advance(self, seconds: float, others_cores: float, own_cores: float = 0.0) -> None:
        self.now += seconds
        self.own += own_cores * seconds
        self.busy += (others_cores + own_cores) * seconds

    def load(self, cpus: int = 2, read=None, run=lambda job: job()) -> OtherLoad:
        return OtherLoad(read=read or (lambda _: self.busy), own=lambda: self.own, clock=lambda: self.now,
                         cpus=set(range(cpus)), enabled=True, run=run)


def test_the_first_sample_is_a_baseline_and_samples_come_at_most_every_interval() -> None:
    m = FakeMachine()
    load = m.load()
    assert not load.sample() and load.free_cores() == 2  # a baseline only
    m.advance(INTERVAL / 2, others_cores=1.0)
    assert not load.sample()  # too soon
    m.advance(INTERVAL, others_cores=1.0)
    assert load.sample() and load.free_cores() == 1


def test_own_cpu_time_is_not_others_load() -> None:
    m = FakeMachine()
    load = m.load()
    load.sample()
    m.advance(0.2, others_cores=0.0, own_cores=2.0)  # this process keeps both cores busy
    assert load.sample() and load.free_cores() == 2


def test_cores_come_back_after_two_quiet_samples_in_a_row() -> None:
    m = FakeMachine()
    load = m.load()
    load.sample()
    frees = []
    for others in (1.0, 0.0, 0.0, 0.2, 1.5, 0.0, 0.0):
        m.advance(0.15, others_cores=others)
        load.sample()
        frees.append(load.free_cores())
    # a third of a core's worth or less counts as free; 1.5 cores of others' work take both,
    # but BLAS keeps one thread
    assert frees == [1, 1, 2, 2, 1, 1, 2]


def test_many_cores_lose_only_the_cores_taken() -> None:
    m = FakeMachine()
    load = m.load(cpus=16)
    load.sample()
    m.advance(0.2, others_cores=3.0)
    load.sample()
    assert load.free_cores() == 13


def test_off_without_proc_stat_and_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    m = FakeMachine()
    load = OtherLoad(read=lambda _: None, own=lambda: m.own, clock=lambda: m.now, cpus={0, 1}, enabled=True)
    assert not load.sample() and not load.enabled
    monkeypatch.setenv(cpu_load.ENV_VAR, "0")
    assert not OtherLoad().enabled
    monkeypatch.setenv(cpu_load.ENV_VAR, "1")
    assert OtherLoad().enabled


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc/stat only")
def test_reads_this_machines_busy_time() -> None:
    cpus = set(os.sched_getaffinity(0))
    first = read_busy_seconds(cpus)
    sum(i * i for i in range(300_000))  # some CPU time
    second = read_busy_seconds(cpus)
    assert first is not None and second is not None and second >= first > 0
    assert read_busy_seconds({10_000}) is None  # no such CPU
    # the same sum as the whole file's lines of those CPUs (the file is kept open and read
    # again: what it reads is printed afresh each time, as a fresh open's)
    with open("/proc/stat", "rb") as f:
        lines = [line.split() for line in f.read().splitlines() if line[:3] == b"cpu" and line[3:4] != b" "]
    again = read_busy_seconds(cpus)
    ticks = sum(int(fields[i]) for fields in lines if int(fields[0][3:]) in cpus for i in (1, 2, 3, 6, 7, 8))
    assert again is not None and second <= again and abs(again - ticks * cpu_load._TICK) < 0.5


class FakeLib:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def set_num_threads(self, n: int) -> None:
        self.calls.append(n)


def _blas(m: FakeMachine) -> tuple[BlasThreads, FakeLib]:
    blas = BlasThreads(2)
    blas.load = m.load()
    lib = FakeLib()
    blas._install([lib], 2)
    return blas, lib


def test_blas_threads_follow_the_free_cores_between_backward_calls() -> None:
    m = FakeMachine()
    blas, lib = _blas(m)
    per_call = []
    for others in (0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0):
        m.advance(0.15, others_cores=others)
        blas.backward_started()
        per_call.append(blas.per_call)
        blas.backward_ended()
    # each call ends with a sample of the time before it, which the next call starts with
    assert per_call == [2, 2, 2, 1, 1, 1, 2]
    assert lib.calls == [1, 2]  # only on each change


def test_a_fixed_count_ignores_the_load() -> None:
    m = FakeMachine()
    blas, lib = _blas(m)
    blas.backward_started()
    blas.backward_ended()
    with blas.pinned(2):
        m.advance(0.15, others_cores=1.0)
        blas.backward_started()
        assert blas.per_call == 2
        blas.backward_ended()
    assert lib.calls[-1] == 2


def test_the_free_cores_are_sampled_with_blas_pinned_too() -> None:
    """A pinned count (the benchmarks' one-thread rows) keeps BLAS's threads, but the
    cores other processes take are still seen: a split node's parts would take turns on
    the one core left (Policy.splits reads ``free_cores``)."""
    m = FakeMachine()
    blas, lib = _blas(m)
    blas.backward_started()
    blas.backward_ended()
    with blas.pinned(1):
        m.advance(0.15, others_cores=1.0)
        blas.backward_started()
        blas.backward_ended()
        assert blas.free_cores == 1 and blas.per_call == 1
        m.advance(0.15, others_cores=0.0)
        blas.backward_started()
        blas.backward_ended()
        m.advance(0.15, others_cores=0.0)
        blas.backward_started()
        blas.backward_ended()
        assert blas.free_cores == 2


def test_a_concurrent_backward_still_makes_blas_single_threaded() -> None:
    m = FakeMachine()
    blas, _ = _blas(m)
    m.advance(0.15, others_cores=0.0)
    blas.backward_started()
    blas.backward_started()
    assert blas.per_call == 1
    blas.backward_ended()
    blas.backward_ended()


def _flush(sampler: Sampler) -> None:
    """Until the jobs given to ``sampler`` so far have run (it runs them in order)."""
    done = threading.Event()
    sampler(done.set)
    assert done.wait(10)


def test_the_caller_does_not_wait_for_a_sample_and_blas_follows_it_when_it_lands() -> None:
    """Note [Sampling off the caller's path]: a backward call only asks for a sample, as
    it ends; it is read on the sampler thread, and BLAS's threads follow it when it
    lands. A BLAS kernel on a worker asks too, so a long call adapts before its end."""
    m = FakeMachine()
    gate, entered = threading.Event(), threading.Event()
    readers: list[int] = []

    def read(_: set[int]) -> float:
        readers.append(threading.get_ident())
        entered.set()
        assert gate.wait(10)
        return m.busy

    sampler = Sampler()
    blas = BlasThreads(2)
    blas.load = m.load(read=read, run=sampler)
    lib = FakeLib()
    blas._install([lib], 2)
    blas.backward_started()
    assert readers == []  # not as a call starts
    blas.backward_ended()  # the baseline, read while the caller goes on
    assert entered.wait(10) and readers[0] != threading.get_ident()
    blas.backward_started()
    blas.backward_ended()  # asked again while that sample is read: no second read
    gate.set()
    _flush(sampler)
    assert len(readers) == 1
    gate.clear()
    entered.clear()
    m.advance(0.15, others_cores=1.0)
    blas.backward_started()
    assert blas.per_call == 2
    blas.run(lambda: None)  # a BLAS kernel on a worker: a sample due, asked for, not waited for
    assert entered.wait(10)
    assert blas.per_call == 2 and blas.free_cores == 2 and lib.calls == []  # the cores last seen
    gate.set()
    _flush(sampler)
    assert len(readers) == 2 and blas.free_cores == 1 and lib.calls == [1]  # at once, mid-call
    blas.backward_ended()
    assert blas.per_call == 1 and lib.calls == [1]


def test_a_failing_sample_is_reported_and_sampling_goes_on() -> None:
    m = FakeMachine()
    reads = [1]
    errors: list[BaseException | None] = []

    def read(_: set[int]) -> float:
        if reads.pop() == 1:
            raise ValueError("unreadable")
        return m.busy

    sampler = Sampler()
    load = m.load(read=read, run=sampler)
    saved = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        load.request(lambda: None)
        _flush(sampler)
    finally:
        threading.excepthook = saved
    assert [type(e) for e in errors] == [ValueError]
    reads.append(0)
    load.request(lambda: None)  # not left pending: asked for again, and taken
    _flush(sampler)
    assert load._last is not None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_samples_on_its_own_thread() -> None:
    """A sample pending when the process forks never runs in the child (its thread is
    the parent's): the child asks again, and its own sampler thread takes it."""
    from asyncgrad.autograd.runtime.cpu_load import SAMPLER

    m = FakeMachine()
    gate = threading.Event()

    def read(_: set[int]) -> float:
        assert gate.wait(10)
        return m.busy

    load = m.load(read=read, run=SAMPLER)
    load.request(lambda: None)  # pending in the parent: its read waits for the gate
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its gate opens at once
        ok = b"0"
        try:
            gate.set()
            load.request(lambda: None)  # the child's baseline
            done = threading.Event()
            SAMPLER(done.set)
            ok = b"1" if done.wait(10) and load._last is not None else b"0"
        finally:
            os.write(write_fd, ok)
            os._exit(0)
    os.close(write_fd)
    try:
        assert os.read(read_fd, 1) == b"1"
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
        gate.set()
        _flush(SAMPLER)
