"""``asyncgrad.autograd.profiler``, the public path of tools/profiler.py (as
``torch.autograd.profiler``): a thin alias, since users import it by this name."""

from .tools.profiler import *  # noqa: F403
from .tools.profiler import __all__  # noqa: F401
