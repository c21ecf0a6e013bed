"""``ag.optim``: ``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad`` and ``Adadelta`` with
PyTorch's update rules.

    opt = ag.optim.Adam(model.parameters(), lr=1e-3)
    opt.zero_grad()
    await ag.backward(loss)
    opt.step()
"""

from . import lr_scheduler
from .adam import Adam, AdamW
from .adaptive import Adadelta, Adagrad, RMSprop
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "RMSprop", "Adagrad", "Adadelta", "lr_scheduler"]
