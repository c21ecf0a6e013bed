"""The kernels behind the ops, and which of them run.

* :mod:`.loader`: the mode switch (``auto``, ``numpy``, ``compiled``) and the background
  loader of the compiled kernels; its public functions are re-exported here
  (``asyncgrad.ops.kernels.wait()``, ``.set_mode()``, ``.status()``, ...).
* :mod:`.compiled_path`: each op's compiled path, or None when the compiled kernels are
  not in use or do not apply (the op then runs its numpy kernel).
* :mod:`.numba_kernels`: the compiled kernels themselves (numba), imported only by the
  loader's thread.
* :mod:`.blockwise`: fused numpy kernels evaluated block by block (the numpy path).
* :mod:`.special`: special functions (``erf``) in numpy.
* :mod:`.intra_op`: the intra-op thread gate: whether a large compiled kernel may split
  itself over the cores now.
"""

from .loader import ENV_VAR, MODES, compiled, mode, ready, set_mode, start, status, wait

__all__ = ["ENV_VAR", "MODES", "compiled", "mode", "ready", "set_mode", "start", "status", "wait"]
