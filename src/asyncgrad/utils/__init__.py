"""``asyncgrad.utils``: helpers built on the autograd engine (``utils.checkpoint``)."""

from . import checkpoint

__all__ = ["checkpoint"]
