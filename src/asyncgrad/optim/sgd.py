"""``SGD`` with momentum, dampening, Nesterov momentum and L2 weight decay (PyTorch's rule)."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Iterable

import numpy as np

from ..tensor import Tensor
from .optimizer import Optimizer, _commit


class SGD(Optimizer):
    r"""Stochastic gradient descent, exactly PyTorch's single-tensor update::

        g = grad (+ weight_decay * p)
        buf = g                                   (first step)
        buf = momentum * buf + (1 - dampening) * g (later steps)
        g = g + momentum * buf if nesterov else buf      (when momentum != 0)
        p = p - lr * g

    Parameters whose ``.grad`` is None are skipped. State: ``momentum_buffer`` per
    parameter when ``momentum != 0``. ``foreach`` is accepted for PyTorch compatibility
    and ignored (there is one implementation).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": nesterov, "maximize": maximize}
        super().__init__(params, defaults)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given
        (called first, under grad mode; it must not be a coroutine function)."""
        loss = closure() if closure is not None else None
        self._warn_if_no_grads()
        for group in self.param_groups:
            lr, momentum = float(group["lr"]), float(group["momentum"])
            dampening, wd = float(group["dampening"]), float(group["weight_decay"])
            nesterov, maximize = bool(group["nesterov"]), bool(group["maximize"])
            for p, g in self._params_with_grad(group):
                x = p.data
                d = -g if maximize else g
                if wd != 0:
                    d = d + wd * x
                if momentum != 0:
                    state = self.state.setdefault(p, {})
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = Tensor._wrap(np.array(d, copy=True))
                    else:
                        b = buf.data
                        b *= momentum
                        b += (1 - dampening) * d
                    d = d + momentum * buf.data if nesterov else buf.data
                x += -lr * d
                _commit(p)
        return loss
