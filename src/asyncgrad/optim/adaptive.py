"""``RMSprop``, ``Adagrad`` and ``Adadelta``: PyTorch's single-tensor update rules, state
named as PyTorch names it (``square_avg``, ``sum``, ``acc_delta`` ...)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..tensor import Tensor
from .optimizer import Optimizer, _commit


def _check(name: str, value: float) -> None:
    if value < 0.0:
        raise ValueError(f"Invalid {name}: {value}")


def _zeros(x: np.ndarray) -> Tensor:
    return Tensor._wrap(np.zeros_like(x))


class RMSprop(Optimizer):
    r"""RMSprop::

        g = grad (+ weight_decay * p)
        square_avg = alpha * square_avg + (1 - alpha) * g * g
        avg = sqrt(square_avg - grad_avg ** 2) + eps   (centered; grad_avg = running mean of g)
        avg = sqrt(square_avg) + eps                   (otherwise)
        buf = momentum * buf + g / avg; p -= lr * buf   (momentum > 0)
        p -= lr * g / avg                               (otherwise)
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None) -> None:
        for name, v in (("learning rate", lr), ("epsilon value", eps), ("momentum value", momentum),
                        ("weight_decay value", weight_decay), ("alpha value", alpha)):
            _check(name, v)
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay,
                                  "momentum": momentum, "centered": centered, "maximize": maximize})

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        self._warn_if_no_grads()
        for group in self.param_groups:
            lr, alpha, eps = float(group["lr"]), float(group["alpha"]), float(group["eps"])
            wd, momentum, centered = float(group["weight_decay"]), float(group["momentum"]), bool(group["centered"])
            for p, g in self._params_with_grad(group):
                x = p.data
                g = -g if group["maximize"] else g
                if wd != 0:
                    g = g + wd * x
                state = self.state.get(p)
                if state is None:
                    state = self.state[p] = {"step": 0, "square_avg": _zeros(x)}
                    if momentum > 0:
                        state["momentum_buffer"] = _zeros(x)
                    if centered:
                        state["grad_avg"] = _zeros(x)
                state["step"] += 1
                sq = state["square_avg"].data
                sq *= alpha
                sq += (1 - alpha) * g * g
                if centered:
                    ga = state["grad_avg"].data
                    ga *= alpha
                    ga += (1 - alpha) * g
                    avg = np.sqrt(sq - ga * ga) + eps
                else:
                    avg = np.sqrt(sq) + eps
                if momentum > 0:
                    buf = state["momentum_buffer"].data
                    buf *= momentum
                    buf += g / avg
                    x -= lr * buf
                else:
                    x -= lr * (g / avg)
                _commit(p)
        return loss


class Adagrad(Optimizer):
    r"""Adagrad::

        g = grad (+ weight_decay * p)
        clr = lr / (1 + (step - 1) * lr_decay)
        sum = sum + g * g
        p -= clr * g / (sqrt(sum) + eps)
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False,
                 foreach: bool | None = None) -> None:
        for name, v in (("learning rate", lr), ("lr_decay value", lr_decay), ("weight_decay value", weight_decay),
                        ("initial_accumulator_value value", initial_accumulator_value), ("epsilon value", eps)):
            _check(name, v)
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value, "eps": eps,
                                  "maximize": maximize})
        for group in self.param_groups:  # PyTorch makes the state at construction
            for p in group["params"]:
                init = float(group["initial_accumulator_value"])
                self.state[p] = {"step": 0, "sum": Tensor._wrap(np.full_like(p.data, init))}

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        self._warn_if_no_grads()
        for group in self.param_groups:
            lr, lr_decay, wd, eps = (float(group[k]) for k in ("lr", "lr_decay", "weight_decay", "eps"))
            for p, g in self._params_with_grad(group):
                x = p.data
                g = -g if group["maximize"] else g
                state = self.state[p]
                state["step"] += 1
                if wd != 0:
                    g = g + wd * x
                clr = lr / (1 + (state["step"] - 1) * lr_decay)
                total = state["sum"].data
                total += g * g
                x -= clr * (g / (np.sqrt(total) + eps))
                _commit(p)
        return loss


class Adadelta(Optimizer):
    r"""Adadelta::

        g = grad (+ weight_decay * p)
        square_avg = rho * square_avg + (1 - rho) * g * g
        delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
        acc_delta = rho * acc_delta + (1 - rho) * delta * delta
        p -= lr * delta
    """

    def __init__(self, params: Iterable[Any], lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, *, maximize: bool = False, foreach: bool | None = None) -> None:
        for name, v in (("learning rate", lr), ("epsilon value", eps), ("weight_decay value", weight_decay)):
            _check(name, v)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        super().__init__(params, {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay,
                                  "maximize": maximize})

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        self._warn_if_no_grads()
        for group in self.param_groups:
            lr, rho, eps, wd = (float(group[k]) for k in ("lr", "rho", "eps", "weight_decay"))
            for p, g in self._params_with_grad(group):
                x = p.data
                g = -g if group["maximize"] else g
                if wd != 0:
                    g = g + wd * x
                state = self.state.get(p)
                if state is None:
                    state = self.state[p] = {"step": 0, "square_avg": _zeros(x), "acc_delta": _zeros(x)}
                state["step"] += 1
                sq, acc = state["square_avg"].data, state["acc_delta"].data
                sq *= rho
                sq += (1 - rho) * g * g
                delta = np.sqrt(acc + eps) / np.sqrt(sq + eps) * g
                acc *= rho
                acc += (1 - rho) * delta * delta
                x -= lr * delta
                _commit(p)
        return loss
