"""``ag.optim``: ``SGD``, ``Adam`` and ``AdamW`` with PyTorch's update rules.

    opt = ag.optim.Adam(model.parameters(), lr=1e-3)
    opt.zero_grad()
    await ag.backward(loss)
    opt.step()
"""

from . import lr_scheduler
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "lr_scheduler"]
