"""``Conv1d``, ``Conv2d`` and ``ConvTranspose2d``: PyTorch's arguments, attributes,
initialisation (``kaiming_uniform_(a=sqrt(5))``, bias from U(-1/sqrt(fan_in), ...)),
state_dict keys (``weight``, ``bias``) and repr."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._dtype import get_default_dtype
from ..tensor import Tensor
from . import _functional_conv as FC
from . import init
from ._functional_resample import pad as _pad
from .module import Module, Parameter

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _ntuple(value: Any, n: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    out = tuple(value)
    return out * n if len(out) == 1 else out


class _ConvNd(Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any, padding: Any,
                 dilation: Any, transposed: bool, output_padding: Any, groups: int, bias: bool, padding_mode: str,
                 dims: int, dtype: Any = None) -> None:
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in _ntuple(stride, dims)):
                raise ValueError("padding='same' is not supported for strided convolutions")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {{'zeros', 'reflect', 'circular', 'replicate'}}, but got "
                             f"padding_mode={padding_mode!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, dims)
        self.stride = _ntuple(stride, dims)
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, dims)
        self.dilation = _ntuple(dilation, dims)
        self.transposed = transposed
        self.output_padding = _ntuple(output_padding, dims)
        self.groups = groups
        self.padding_mode = padding_mode
        # F.pad's widths (last dim first) for a padding mode other than zeros
        widths: list[int] = []
        if padding == "same":
            for d, k in zip(self.dilation[::-1], self.kernel_size[::-1]):
                total = d * (k - 1)
                widths += [total // 2, total - total // 2]
        elif isinstance(self.padding, tuple):
            for p in self.padding[::-1]:
                widths += [p, p]
        else:
            widths = [0, 0] * dims
        self._reversed_padding_repeated_twice = widths
        shape = ((in_channels, out_channels // groups) if transposed else (out_channels, in_channels // groups))
        dt = dtype or get_default_dtype()
        self.weight = Parameter(np.empty((*shape, *self.kernel_size), dtype=dt))
        if bias:
            self.bias = Parameter(np.empty(out_channels, dtype=dt))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * len(self.kernel_size):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s

    def _conv_forward(self, input: Tensor, conv: Any) -> Tensor:
        if self.padding_mode != "zeros":
            padded = _pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv(padded, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)  # type: ignore[no-any-return]
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation,  # type: ignore[no-any-return]
                    self.groups)


class Conv1d(_ConvNd):
    """1-D convolution over (N, C_in, L) or (C_in, L), as ``torch.nn.Conv1d``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, False, 0, groups, bias,
                         padding_mode, 1, dtype)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, FC.conv1d)


class Conv2d(_ConvNd):
    """2-D convolution over (N, C_in, H, W) or (C_in, H, W), as ``torch.nn.Conv2d``:
    ``weight`` is (out_channels, in_channels / groups, kh, kw); ``padding`` an int, a pair,
    ``"valid"`` or ``"same"``; ``padding_mode`` zeros, reflect, replicate or circular."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, False, 0, groups, bias,
                         padding_mode, 2, dtype)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, FC.conv2d)


class ConvTranspose2d(_ConvNd):
    """The transposed 2-D convolution, as ``torch.nn.ConvTranspose2d``: ``weight`` is
    (in_channels, out_channels / groups, kh, kw); ``forward(input, output_size)`` may ask
    for one of the output sizes the stride leaves ambiguous."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, True, output_padding,
                         groups, bias, padding_mode, 2, dtype)

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple[int, ...]:
        if output_size is None:
            return self.output_padding
        sizes = list(output_size)[-2:]
        out = []
        for d in range(2):
            least = ((input.shape[-2 + d] - 1) * self.stride[d] - 2 * self.padding[d]  # type: ignore[operator]
                     + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            extra = sizes[d] - least
            if not 0 <= extra < max(self.stride[d], self.dilation[d]):
                raise ValueError(f"requested an output size of {sizes}, but valid sizes range from {least} to "
                                 f"{least + max(self.stride[d], self.dilation[d]) - 1} (for an input of "
                                 f"{list(input.shape[-2:])})")
            out.append(extra)
        return tuple(out)

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:
        op = self._output_padding(input, output_size)
        return FC.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, op, self.groups,
                                   self.dilation)
