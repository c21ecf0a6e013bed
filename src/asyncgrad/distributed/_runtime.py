"""The process's MPI runtime, started on first use: mpi4py, the communication thread,
and the communicator the user-facing collectives run on."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ._comm import CommThread

DEFAULT_TIMEOUT = 1800.0  # seconds, PyTorch's default process-group timeout


@dataclass(frozen=True)
class Runtime:
    MPI: Any  # the mpi4py.MPI module
    comm_thread: CommThread
    comm: Any  # a duplicate of COMM_WORLD: user collectives never match DDP's
    rank: int
    size: int


_runtime: Runtime | None = None
_lock = threading.Lock()


def runtime() -> Runtime:
    """Start MPI (if needed) and the communication thread, once per process."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                from mpi4py import MPI

                thread = CommThread(MPI.Request)
                comm = thread.call(MPI.COMM_WORLD.Dup, DEFAULT_TIMEOUT)
                rank, size = thread.call(lambda: (comm.Get_rank(), comm.Get_size()), DEFAULT_TIMEOUT)
                _runtime = Runtime(MPI, thread, comm, rank, size)
    return _runtime
