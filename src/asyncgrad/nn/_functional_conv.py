"""``conv1d``, ``conv2d`` and ``conv_transpose2d``: PyTorch's arguments checked with its
messages, then one node each (ops/conv.py); 1-D convolutions run as 2-D ones over a
height of one."""

from __future__ import annotations

from typing import Any

from .. import functional as _F
from .._dtype import scalar_type_name
from ..autograd.graph.record import record
from ..ops import _windows as W
from ..ops import conv as _C
from ..tensor import Tensor


def _pair(value: Any, name: str, dims: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * dims
    out = tuple(int(v) for v in value)
    if len(out) == 1:
        return out * dims
    if len(out) != dims:
        raise RuntimeError(f"expected {name} to be a single integer value or a list of {dims} values to match "
                           f"the convolution dimensions, but got {name}={list(out)}")
    return out


def _batched(x: Tensor, dims: int, op: str) -> tuple[Tensor, bool]:
    """``x`` with a batch dim, and whether one was added (unbatched input)."""
    if x.ndim == dims + 1:
        return _F.unsqueeze(x, 0), True
    if x.ndim != dims + 2:
        raise RuntimeError(f"Expected {dims + 1}D (unbatched) or {dims + 2}D (batched) input to {op}, but got "
                           f"input of size: {list(x.shape)}")
    return x, False


def _check_types(x: Tensor, w: Tensor, b: Tensor | None) -> None:
    if x.dtype != w.dtype:
        if x.dtype.itemsize > w.dtype.itemsize:
            raise RuntimeError(f"expected scalar type {scalar_type_name(x.dtype)} but found "
                               f"{scalar_type_name(w.dtype)}")
        raise RuntimeError(f"Input type (torch.{scalar_type_name(x.dtype)}Tensor) and weight type "
                           f"(torch.{scalar_type_name(w.dtype)}Tensor) should be the same or input should be a "
                           f"MKLDNN tensor and weight is a dense tensor")
    if b is not None and b.dtype != x.dtype:
        raise RuntimeError(f"Input type ({scalar_type_name(x.dtype, c_name=True)}) and bias type "
                           f"({scalar_type_name(b.dtype, c_name=True)}) should be the same")


def _check_channels(x: Tensor, w: Tensor, b: Tensor | None, groups: int, transposed: bool) -> None:
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if w.ndim != x.ndim:
        raise RuntimeError("weight should have at least three dimensions" if w.ndim < 3 else
                           f"Expected {w.ndim}-dimensional input for {w.ndim}-dimensional weight {list(w.shape)}, "
                           f"but got {x.ndim}-dimensional input of size {list(x.shape)} instead")
    if not transposed and w.shape[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size [{list(w.shape)}] instead")
    want = w.shape[0] if transposed else w.shape[1] * groups
    if x.shape[1] != want:
        kind = "transposed=1" if transposed else f"groups={groups}"
        raise RuntimeError(f"Given {kind}, weight of size {list(w.shape)}, expected input{list(x.shape)} to have "
                           f"{want} channels, but got {x.shape[1]} channels instead")
    out_channels = w.shape[1] * groups if transposed else w.shape[0]
    if b is not None and (b.ndim != 1 or b.shape[0] != out_channels):
        raise RuntimeError(f"Given weight of size {list(w.shape)}, expected bias to be 1-dimensional with "
                           f"{out_channels} elements, but got bias of size {list(b.shape)} instead")


def _check_positive(stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...]) -> None:
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("dilation should be greater than zero")


def _conv_window(size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int], padding: Any,
                 dilation: tuple[int, int]) -> W.Window:
    if isinstance(padding, str):
        if padding == "valid":
            pad = ((0, 0), (0, 0))
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            pad = ((total[0] // 2, total[0] - total[0] // 2), (total[1] // 2, total[1] - total[1] // 2))
        else:
            raise RuntimeError(f"Invalid padding string: '{padding}'")
    else:
        pad = ((padding[0], padding[0]), (padding[1], padding[1]))
    padded = [s + sum(p) for s, p in zip(size, pad)]
    span = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    if any(p < s for p, s in zip(padded, span)):
        raise RuntimeError(f"Calculated padded input size per channel: ({padded[0]} x {padded[1]}). Kernel size: "
                           f"({span[0]} x {span[1]}). Kernel size can't be greater than actual input size")
    out = tuple(W.out_length(s, k, st, d, *p) for s, k, st, d, p in zip(size, kernel, stride, dilation, pad))
    return W.Window(kernel, stride, dilation, pad, size, out)  # type: ignore[arg-type]


def _conv_nd(input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any,
             groups: int, dims: int, op: str) -> Tensor:
    x, unbatched = _batched(input if type(input) is Tensor else Tensor(input), dims, op)
    _check_channels(x, weight, bias, groups, transposed=False)
    _check_types(x, weight, bias)
    st, dl = _pair(stride, "stride", dims), _pair(dilation, "dilation", dims)
    pd = padding if isinstance(padding, str) else _pair(padding, "padding", dims)
    _check_positive(st, () if isinstance(pd, str) else pd, dl)
    w = weight
    if dims == 1:  # as 2-D over a height of one
        x, w = _F.unsqueeze(x, 2), _F.unsqueeze(weight, 2)
        st, dl = (1, *st), (1, *dl)
        pd = pd if isinstance(pd, str) else (0, *pd)
    win = _conv_window(x.shape[2:], w.shape[2:], st, pd, dl)  # type: ignore[arg-type]
    geo = _C.ConvGeometry(win, groups)
    if bias is None:
        out = record(_C.conv2d_nobias, (x, w), _C._conv_forward(x.data, w.data, geo=geo), params={"geo": geo})
    else:
        out = record(_C.conv2d, (x, w, bias), _C._conv_forward(x.data, w.data, bias.data, geo=geo),
                     params={"geo": geo})
    if dims == 1:
        out = _F.squeeze(out, 2)
    return _F.squeeze(out, 0) if unbatched else out


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation) of ``input`` (N, C, H, W) or (C, H, W) with
    ``weight`` (O, C/groups, kh, kw), as ``torch.nn.functional.conv2d``; ``padding`` is an
    int, a pair, ``"valid"`` or ``"same"`` (extra padding on the right/bottom, as PyTorch)."""
    return _conv_nd(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """1-D convolution of ``input`` (N, C, L) or (C, L) with ``weight`` (O, C/groups, k), as
    ``torch.nn.functional.conv1d``."""
    return _conv_nd(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """The adjoint of ``conv2d`` in its input ("deconvolution"): ``input`` (N, C_in, H, W),
    ``weight`` (C_in, C_out/groups, kh, kw), output side ``(H - 1) * stride - 2 * padding +
    dilation * (k - 1) + output_padding + 1``, as ``torch.nn.functional.conv_transpose2d``."""
    x, unbatched = _batched(input if type(input) is Tensor else Tensor(input), 2, "conv_transpose2d")
    _check_channels(x, weight, bias, groups, transposed=True)
    _check_types(x, weight, bias)
    st, pd, dl = _pair(stride, "stride", 2), _pair(padding, "padding", 2), _pair(dilation, "dilation", 2)
    op = _pair(output_padding, "output_padding", 2)
    _check_positive(st, pd, dl)
    if any(o >= s and o >= d for o, s, d in zip(op, st, dl)):
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got "
                           f"output_padding_height: {op[0]} output_padding_width: {op[1]} stride_height: {st[0]} "
                           f"stride_width: {st[1]} dilation_height: {dl[0]} dilation_width: {dl[1]}")
    kernel = weight.shape[2:]
    size = tuple((h - 1) * s - 2 * p + d * (k - 1) + o + 1
                 for h, s, p, d, k, o in zip(x.shape[2:], st, pd, dl, kernel, op))
    if any(s <= 0 for s in size):
        raise RuntimeError(f"Given input size per channel: ({x.shape[2]} x {x.shape[3]}). Calculated output size "
                           f"per channel: ({size[0]} x {size[1]}). Output size is too small")
    pad = ((pd[0], pd[0]), (pd[1], pd[1]))
    win = W.Window(kernel, st, dl, pad, size, x.shape[2:])  # type: ignore[arg-type]
    geo = _C.ConvGeometry(win, groups)
    if bias is None:
        out = record(_C.conv_transpose2d_nobias, (x, weight), _C._conv_transpose_forward(x.data, weight.data, geo=geo),
                     params={"geo": geo})
    else:
        out = record(_C.conv_transpose2d, (x, weight, bias),
                     _C._conv_transpose_forward(x.data, weight.data, bias.data, geo=geo), params={"geo": geo})
    return _F.squeeze(out, 0) if unbatched else out
