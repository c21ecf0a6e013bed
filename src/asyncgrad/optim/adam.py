"""``Adam`` (L2 weight decay) and ``AdamW`` (decoupled weight decay), PyTorch's rules."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Iterable

import numpy as np

from ..ops.kernels import compiled_path as fast
from ..tensor import Tensor
from .optimizer import Optimizer, _commit


def _lerp_(a: np.ndarray, b: np.ndarray, weight: float) -> None:
    """``a = lerp(a, b, weight)`` in place, with the two formulas of PyTorch's kernel."""
    w = a.dtype.type(weight)
    if abs(w) < 0.5:
        a += w * (b - a)
    else:
        a[...] = b - (b - a) * (a.dtype.type(1) - w)


class Adam(Optimizer):
    r"""Adam, exactly PyTorch's single-tensor update (``amsgrad`` optional)::

        t += 1
        g = grad (+ weight_decay * p)                 # Adam: L2 penalty in the gradient
        p = p * (1 - lr * weight_decay)               # AdamW: decoupled decay instead
        m = lerp(m, g, 1 - beta1)
        v = beta2 * v + (1 - beta2) * g * g
        denom = sqrt(v) / sqrt(1 - beta2**t) + eps
        p = p - lr / (1 - beta1**t) * m / denom

    Parameters whose ``.grad`` is None are skipped. State per parameter: ``step``,
    ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with ``amsgrad``). ``foreach`` is
    accepted for PyTorch compatibility and ignored.
    """

    _decoupled = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize}
        super().__init__(params, defaults)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        self._warn_if_no_grads()
        for group in self.param_groups:
            lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            beta1, beta2 = (float(b) for b in group["betas"])
            amsgrad, maximize = bool(group["amsgrad"]), bool(group["maximize"])
            for p, g in self._params_with_grad(group):
                x = p.data
                state = self.state.get(p)
                if not state:
                    state = self.state[p] = {
                        "step": 0,
                        "exp_avg": Tensor._wrap(np.zeros_like(x)),
                        "exp_avg_sq": Tensor._wrap(np.zeros_like(x)),
                    }
                    if amsgrad:
                        state["max_exp_avg_sq"] = Tensor._wrap(np.zeros_like(x))
                state["step"] += 1
                m, v = state["exp_avg"].data, state["exp_avg_sq"].data
                step = state["step"]
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                if not amsgrad and fast.adam_step(  # the same update in one compiled pass
                        x, g, m, v, decoupled=self._decoupled, lr=lr, weight_decay=wd, maximize=maximize,
                        beta1=beta1, beta2=beta2, step_size=lr / bias_correction1,
                        bc2_sqrt=bias_correction2**0.5, eps=eps):
                    _commit(p)
                    continue
                g = -g if maximize else g
                if wd != 0:
                    if self._decoupled:
                        x *= 1 - lr * wd
                    else:
                        g = g + wd * x
                _lerp_(m, g, 1 - beta1)
                v *= beta2
                v += (1 - beta2) * g * g
                step_size = lr / bias_correction1
                bias_correction2_sqrt = bias_correction2**0.5
                if amsgrad:
                    vmax = state["max_exp_avg_sq"].data
                    np.maximum(vmax, v, out=vmax)
                    denom = np.sqrt(vmax) / bias_correction2_sqrt
                else:
                    denom = np.sqrt(v) / bias_correction2_sqrt
                denom += eps
                x += -step_size * m / denom
                _commit(p)
        return loss


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * weight_decay`` before the Adam
    update); ``weight_decay`` defaults to 1e-2, as PyTorch."""

    _decoupled = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)
