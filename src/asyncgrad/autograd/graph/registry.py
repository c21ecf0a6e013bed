"""What the graph layer uses of the layers above it, handed down when they are imported.

Note [The graph layer never imports Tensor]: tensor.py imports the graph layer, and
functional and ``_tensor_math`` import tensor.py, so no module of ``autograd/graph/``
imports any of them back (that ring ran half a package while tensor.py was
half-initialised, and made the whole forward layer one import cycle). Each registers
here instead, once, at its own import, as HIPS autograd's box types register with its
tracer:

* tensor.py: the Tensor class, its ``VersionCounter`` and its slot initialiser
  (``register_tensor_type``), once the class exists;
* ``_tensor_math.py``: the math namespace ``m`` on Tensors that a node called directly
  under grad mode runs its rules with (``register_tensor_math``).

Saved tensors, AccumulateGrad, validation and accumulation read them at call time, long
after every import finished. ``record.py`` binds the Tensor class into its globals at its
own import, for the forward's hot path: the package imports tensor.py before any module
that records, so the class is registered by then (``tensor_constructors`` checks).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register_tensor_math", "register_tensor_type", "tensor_constructors", "tensor_math", "tensor_type"]

tensor_cls: Any = None  # the Tensor class (a module attribute: hot paths read it directly)
_version_counter_cls: Any = None
_init: Any = None
_tensor_math: Any = None


def register_tensor_type(cls: type, version_counter: type, init: Any) -> None:
    """Called once by tensor.py: the Tensor class, its version counter class, and
    ``init(t, array, grad_fn, output_nr, version)``, which sets every slot of a new
    Tensor (the recording fast path makes its results with it)."""
    global tensor_cls, _version_counter_cls, _init
    tensor_cls, _version_counter_cls, _init = cls, version_counter, init


def tensor_type() -> Any:
    """The registered Tensor class."""
    return tensor_cls


def tensor_constructors() -> tuple[Any, Any, Any]:
    """``(Tensor, VersionCounter, init)`` as registered by tensor.py."""
    if tensor_cls is None:
        raise ImportError("asyncgrad.tensor must be imported before the graph records "
                          "(Note [The graph layer never imports Tensor])")
    return tensor_cls, _version_counter_cls, _init


def register_tensor_math(math: Any) -> None:
    """Called once by ``_tensor_math.py``: the differentiable math namespace."""
    global _tensor_math
    _tensor_math = math


def tensor_math() -> Any:
    """The registered math namespace on Tensors (``_tensor_math.TENSOR_MATH``)."""
    return _tensor_math
