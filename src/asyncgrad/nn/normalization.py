"""``BatchNorm1d``, ``BatchNorm2d`` and ``GroupNorm`` with PyTorch's arguments, state
(``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``) and
running-statistics rules: momentum, or with ``momentum=None`` the cumulative average
``1 / num_batches_tracked``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtype import get_default_dtype
from ..grad_mode import no_grad
from ..tensor import Tensor
from . import _functional_norm as FN
from .module import Module, Parameter


def _affine_parameters(module: Module, n: int, dtype: Any, affine: bool, bias: bool) -> None:
    """A normalisation's per-channel ``weight`` (ones) and ``bias`` (zeros), registered
    as None where ``affine`` or ``bias`` leaves them out, as PyTorch does."""
    if affine:
        module.weight = Parameter(np.ones(n, dtype=dtype))
        if bias:
            module.bias = Parameter(np.zeros(n, dtype=dtype))
        else:
            module.register_parameter("bias", None)
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)
    module._has_bias = affine and bias


class _BatchNorm(Module):
    _ndims: tuple[int, ...] = ()
    _expected = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: Any = None, dtype: Any = None, *,
                 bias: bool = True) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        dt = dtype or get_default_dtype()
        _affine_parameters(self, num_features, dt, affine, bias)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(num_features, dtype=dt)))
            self.register_buffer("running_var", Tensor(np.ones(num_features, dtype=dt)))
            self.register_buffer("num_batches_tracked", Tensor(np.array(0, dtype=np.int64)))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with no_grad():
                self.running_mean.copy_(Tensor(np.zeros(self.num_features, dtype=self.running_mean.dtype)))
                self.running_var.copy_(Tensor(np.ones(self.num_features, dtype=self.running_var.dtype)))
                self.num_batches_tracked.copy_(Tensor(np.array(0, dtype=np.int64)))

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            with no_grad():
                self.weight.copy_(Tensor(np.ones(self.num_features, dtype=self.weight.dtype)))
                if self.bias is not None:
                    self.bias.copy_(Tensor(np.zeros(self.num_features, dtype=self.bias.dtype)))

    def forward(self, input: Tensor) -> Tensor:
        if input.ndim not in self._ndims:
            raise ValueError(f"expected {self._expected} input (got {input.ndim}D input)")
        factor = 0.0 if self.momentum is None else self.momentum
        counting = self.training and self.track_running_stats and self.num_batches_tracked is not None
        if counting and self.momentum is None:  # the cumulative average over the batches so far
            factor = 1.0 / (int(self.num_batches_tracked.data) + 1)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        out = FN.batch_norm(input, self.running_mean if track else None, self.running_var if track else None,
                            self.weight, self.bias, use_batch, factor, self.eps)
        if counting:  # (after the call: bad input raises there and changes nothing)
            with no_grad():
                self.num_batches_tracked.copy_(Tensor(np.asarray(self.num_batches_tracked.data + 1)))
        return out

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self._has_bias}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over (N, C) or (N, C, L), as ``torch.nn.BatchNorm1d``: batch
    statistics in training (running statistics updated), running ones in eval."""

    _ndims = (2, 3)
    _expected = "2D or 3D"


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over (N, C, H, W), as ``torch.nn.BatchNorm2d``."""

    _ndims = (4,)
    _expected = "4D"


class GroupNorm(Module):
    """Group normalisation, as ``torch.nn.GroupNorm``: ``num_channels`` split into
    ``num_groups`` groups, each normalised over its channels and positions; per-channel
    ``weight`` (ones) and ``bias`` (zeros) with ``affine``."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device: Any = None, dtype: Any = None, *, bias: bool = True) -> None:
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        _affine_parameters(self, num_channels, dtype or get_default_dtype(), affine, bias)

    def forward(self, input: Tensor) -> Tensor:
        return FN.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, bias={self._has_bias}"
