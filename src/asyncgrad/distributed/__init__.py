"""``asyncgrad.distributed``: data-parallel training over MPI (API.md §9).

Needs the ``mpi`` extra (``pip install "asyncgrad[mpi]"``: mpi4py and the MPICH
wheel); run with ``mpiexec -n N python -m mpi4py train.py``. MPI itself starts on
first use (``rank()``, a collective, or wrapping a model), not at import.
"""

try:
    import mpi4py  # noqa: F401  (mpi4py.MPI, which starts MPI, is imported on first use)
except ImportError as e:  # pragma: no cover - exercised in a venv without the extra
    raise ImportError('asyncgrad.distributed needs mpi4py: install the "mpi" extra, '
                      'pip install "asyncgrad[mpi]"') from e

from .collectives import all_reduce, barrier, broadcast, rank, world_size
from .ddp import DistributedDataParallel
from .errors import DistributedTimeout, RemoteBackwardError

__all__ = [
    "DistributedDataParallel", "DistributedTimeout", "RemoteBackwardError",
    "all_reduce", "barrier", "broadcast", "rank", "world_size",
]
