"""More of ``torch.nn``'s activations and losses (issue 32), functional forms and modules,
with PyTorch's names, arguments, defaults and numerics. Each is built from
differentiable primitives, so gradients (and gradients of gradients) are theirs; at a kink
the gradient is that of the branch PyTorch takes (``leaky_relu'(0)`` is the slope).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import functional as F
from .. import torch_ops as T
from ..tensor import Tensor
from .module import Module

_ELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _t(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return F.mean(loss)
    if reduction == "sum":
        return F.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _inplace(input: Tensor, out: Tensor, inplace: bool) -> Tensor:
    return input.copy_(out) if inplace else out


# --- activations ---------------------------------------------------------------------------
def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * sigmoid(x)``."""
    return _inplace(input, F.mul(input, F.sigmoid(input)), inplace)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """``x`` where positive, else ``negative_slope * x``."""
    return _inplace(input, F.where(input.data > 0, input, F.mul(input, negative_slope)), inplace)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""
    return _inplace(input, F.where(input.data > 0, input, F.mul(T.expm1(input), alpha)), inplace)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """``scale * elu(x, alpha)`` with the self-normalising constants."""
    return _inplace(input, F.mul(elu(input, _ELU_ALPHA), _SELU_SCALE), inplace)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    out = F.where(input.data > 0, input, F.mul(T.expm1(F.div(input, alpha)), alpha))
    return _inplace(input, out, inplace)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` itself where ``beta * x > threshold``."""
    bx = F.mul(input, beta)
    safe = F.where(bx.data > threshold, 0.0, bx)  # exp never overflows on the kept branch
    soft = F.div(T.log1p(F.exp(safe)), beta)
    return F.where(bx.data > threshold, input, soft)


def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x))`` without overflow: ``min(x, 0) - log1p(exp(-|x|))``."""
    return F.sub(F.minimum(input, 0.0), T.log1p(F.exp(F.neg(F.abs(input)))))


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` limited to ``[min_val, max_val]``."""
    return _inplace(input, F.clamp(input, min_val, max_val), inplace)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """``x`` limited to ``[0, 6]``."""
    return hardtanh(input, 0.0, 6.0, inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """``relu6(x + 3) / 6``."""
    return _inplace(input, F.div(F.clamp(F.add(input, 3.0), 0.0, 6.0), 6.0), inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * relu6(x + 3) / 6``."""
    return _inplace(input, F.mul(input, hardsigmoid(input)), inplace)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * tanh(softplus(x))``."""
    return _inplace(input, F.mul(input, F.tanh(softplus(input))), inplace)


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    return F.div(input, F.add(F.abs(input), 1.0))


def tanhshrink(input: Tensor) -> Tensor:
    """``x - tanh(x)``."""
    return F.sub(input, F.tanh(input))


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """The first half of ``dim`` gated by the sigmoid of the second half."""
    a, b = F.chunk(input, 2, dim)
    return F.mul(a, F.sigmoid(b))


def softmin(input: Tensor, dim: int) -> Tensor:
    """``softmax(-x, dim)``."""
    return F.softmax(F.neg(input), dim)


# --- vectors -------------------------------------------------------------------------------
def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """Each vector along ``dim`` divided by its ``p``-norm (at least ``eps``)."""
    norm = F.norm(input, p, dim, keepdim=True)
    return F.div(input, F.clamp(norm, min=eps))


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """The cosine of the angle between ``x1`` and ``x2`` along ``dim`` (norms at least ``eps``)."""
    dot = F.sum(F.mul(x1, x2), dim)
    n1 = F.clamp(F.norm(x1, 2, dim), min=eps)
    n2 = F.clamp(F.norm(x2, 2, dim), min=eps)
    return F.div(dot, F.mul(n1, n2))


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """The ``p``-norm of ``x1 - x2 + eps`` along the last dim."""
    return F.norm(F.add(F.sub(x1, x2), eps), p, -1, keepdim=keepdim)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """Class indices as int64 one-hot vectors (``num_classes`` from the data when -1)."""
    idx = np.asarray(tensor.data if isinstance(tensor, Tensor) else tensor)
    if idx.dtype.kind not in "iu":
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    n = int(idx.max()) + 1 if num_classes == -1 else num_classes
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise RuntimeError("Class values must be smaller than num_classes." if idx.size and idx.max() >= n
                           else "Class values must be non-negative.")
    return Tensor._wrap(np.eye(n, dtype=np.int64)[idx])


# --- losses --------------------------------------------------------------------------------
def l1_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """The mean (or sum) absolute difference."""
    return _reduce(F.abs(F.sub(input, target)), reduction)


def smooth_l1_loss(input: Tensor, target: Any, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """Quadratic below ``beta``, linear above (``0.5 d**2 / beta`` or ``|d| - 0.5 beta``)."""
    d = F.abs(F.sub(input, target))
    if beta == 0:
        return _reduce(d, reduction)
    quad = F.div(F.mul(F.mul(d, d), 0.5), beta)
    return _reduce(F.where(d.data < beta, quad, F.sub(d, 0.5 * beta)), reduction)


def huber_loss(input: Tensor, target: Any, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """``delta * smooth_l1_loss(beta=delta)``: quadratic below ``delta``, linear above."""
    d = F.abs(F.sub(input, target))
    quad = F.mul(F.mul(d, d), 0.5)
    return _reduce(F.where(d.data < delta, quad, F.mul(F.sub(d, 0.5 * delta), delta)), reduction)


def binary_cross_entropy(input: Tensor, target: Any, weight: Any = None, reduction: str = "mean") -> Tensor:
    """``-(y log p + (1 - y) log(1 - p))`` with each log at least -100, as PyTorch."""
    y = _t(target)
    logp = F.clamp(F.log(input), min=-100.0)
    log1mp = F.clamp(T.log1p(F.neg(input)), min=-100.0)
    loss = F.neg(F.add(F.mul(y, logp), F.mul(F.sub(1.0, y), log1mp)))
    if weight is not None:
        loss = F.mul(loss, weight)
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input: Tensor, target: Any, weight: Any = None, reduction: str = "mean",
                                     pos_weight: Any = None) -> Tensor:
    """``binary_cross_entropy(sigmoid(x), y)`` computed stably from the logits ``x``."""
    y = _t(target)
    log_sig_neg = logsigmoid(F.neg(input))  # log(1 - sigmoid(x))
    if pos_weight is None:
        loss = F.sub(F.mul(F.sub(1.0, y), input), logsigmoid(input))
    else:
        loss = F.sub(F.neg(F.mul(F.mul(y, pos_weight), logsigmoid(input))), F.mul(F.sub(1.0, y), log_sig_neg))
    if weight is not None:
        loss = F.mul(loss, weight)
    return _reduce(loss, reduction)


def kl_div(input: Tensor, target: Any, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """``target * (log(target) - input)`` with ``input`` log-probabilities (0 where target is 0)."""
    y = _t(target)
    if log_target:
        loss = F.mul(F.exp(y), F.sub(y, input))
    else:
        loss = F.sub(T.xlogy(y, y), F.mul(y, input))
    if reduction == "batchmean":
        return F.div(F.sum(loss), input.shape[0] if input.ndim else 1)
    return _reduce(loss, reduction)


def _set_arguments(module: Module, name: str, names: tuple[str, ...], defaults: dict[str, Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A generated module's ``__init__``: its arguments, by position or keyword, over the
    defaults, as attributes (PyTorch's ``TypeError`` for an unknown keyword)."""
    Module.__init__(module)
    values = dict(defaults)
    values.update(zip(names, args))
    for k, v in kwargs.items():
        if k not in defaults:
            raise TypeError(f"{name}() got an unexpected keyword argument '{k}'")
        values[k] = v
    for k, v in values.items():
        setattr(module, k, v)


def _module(name: str, fn: Any, doc: str, params: tuple[tuple[str, Any], ...] = (), *,
            has_inplace: bool = False) -> type[Module]:
    """A module whose forward is ``fn(input, **its arguments)`` (PyTorch's activation modules)."""
    names = tuple(p for p, _ in params) + (("inplace",) if has_inplace else ())
    defaults = dict(params, **({"inplace": False} if has_inplace else {}))

    def __init__(self: Module, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{name}() takes at most {len(names)} arguments ({len(args)} given)")
        _set_arguments(self, name, names, defaults, args, kwargs)

    def forward(self: Module, input: Tensor) -> Tensor:
        return fn(input, **{k: getattr(self, k) for k in names})

    def extra_repr(self: Module) -> str:  # as PyTorch's: ``inplace`` shown only when set
        shown = [f"{k}={getattr(self, k)}" for k, _ in params]
        return ", ".join(shown + (["inplace=True"] if getattr(self, "inplace", False) else []))

    return type(name, (Module,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr,
                                  "__doc__": doc, "__module__": __name__})


SiLU = _module("SiLU", silu, "``x * sigmoid(x)``.", has_inplace=True)
LeakyReLU = _module("LeakyReLU", leaky_relu, "``leaky_relu``.", (("negative_slope", 0.01),), has_inplace=True)
ELU = _module("ELU", elu, "``elu``.", (("alpha", 1.0),), has_inplace=True)
SELU = _module("SELU", selu, "``selu``.", has_inplace=True)
CELU = _module("CELU", celu, "``celu``.", (("alpha", 1.0),), has_inplace=True)
Softplus = _module("Softplus", softplus, "``softplus``.", (("beta", 1.0), ("threshold", 20.0)))
LogSigmoid = _module("LogSigmoid", logsigmoid, "``log(sigmoid(x))``.")
Hardtanh = _module("Hardtanh", hardtanh, "``hardtanh``.", (("min_val", -1.0), ("max_val", 1.0)), has_inplace=True)
ReLU6 = _module("ReLU6", relu6, "``relu6``.", has_inplace=True)
Hardsigmoid = _module("Hardsigmoid", hardsigmoid, "``hardsigmoid``.", has_inplace=True)
Hardswish = _module("Hardswish", hardswish, "``hardswish``.", has_inplace=True)
Mish = _module("Mish", mish, "``mish``.", has_inplace=True)
Softsign = _module("Softsign", softsign, "``softsign``.")
Tanhshrink = _module("Tanhshrink", tanhshrink, "``tanhshrink``.")
GLU = _module("GLU", glu, "``glu``.", (("dim", -1),))
Softmin = _module("Softmin", softmin, "``softmin``.", (("dim", None),))


def _loss_module(name: str, fn: Any, doc: str, params: tuple[tuple[str, Any], ...] = ()) -> type[Module]:
    names = tuple(p for p, _ in params) + ("reduction",)
    defaults = dict(params, reduction="mean")

    def __init__(self: Module, *args: Any, **kwargs: Any) -> None:
        _set_arguments(self, name, names, defaults, args, kwargs)

    def forward(self: Module, input: Tensor, target: Any) -> Tensor:
        return fn(input, target, **{k: getattr(self, k) for k in names})

    return type(name, (Module,), {"__init__": __init__, "forward": forward, "__doc__": doc, "__module__": __name__})


L1Loss = _loss_module("L1Loss", l1_loss, "``l1_loss``.")
SmoothL1Loss = _loss_module("SmoothL1Loss", smooth_l1_loss, "``smooth_l1_loss``.", (("beta", 1.0),))
HuberLoss = _loss_module("HuberLoss", huber_loss, "``huber_loss``.", (("delta", 1.0),))
BCELoss = _loss_module("BCELoss", binary_cross_entropy, "``binary_cross_entropy``.", (("weight", None),))
BCEWithLogitsLoss = _loss_module("BCEWithLogitsLoss", binary_cross_entropy_with_logits,
                                 "``binary_cross_entropy_with_logits``.", (("weight", None), ("pos_weight", None)))
KLDivLoss = _loss_module("KLDivLoss", kl_div, "``kl_div``.", (("log_target", False),))


class CosineSimilarity(Module):
    """``cosine_similarity(x1, x2, dim, eps)``."""

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return cosine_similarity(x1, x2, self.dim, self.eps)


class Unflatten(Module):
    """``x.unflatten(dim, unflattened_size)``."""

    def __init__(self, dim: int, unflattened_size: Any) -> None:
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input: Tensor) -> Tensor:
        return T.unflatten(input, self.dim, self.unflattened_size)


__all__ = [
    "BCELoss", "BCEWithLogitsLoss", "CELU", "CosineSimilarity", "ELU", "GLU", "Hardsigmoid", "Hardswish",
    "Hardtanh", "HuberLoss", "KLDivLoss", "L1Loss", "LeakyReLU", "LogSigmoid", "Mish", "ReLU6", "SELU",
    "SiLU", "SmoothL1Loss", "Softmin", "Softplus", "Softsign", "Tanhshrink", "Unflatten",
]
