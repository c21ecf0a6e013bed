"""``asyncgrad.utils``: helpers built on the autograd engine (``utils.checkpoint``) and
``utils.data`` (datasets and the ``DataLoader``)."""

from . import checkpoint, data

__all__ = ["checkpoint", "data"]
