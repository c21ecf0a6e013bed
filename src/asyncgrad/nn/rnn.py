"""Recurrent layers: ``LSTM``, ``GRU``, ``RNN``, ``LSTMCell`` and ``GRUCell``, as PyTorch's.

Parameters carry PyTorch's names (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
``bias_hh_l0``, ``..._reverse`` for the backward direction) in its order and gate layout
(LSTM: i, f, g, o; GRU: r, z, n), all drawn from U(-1/sqrt(hidden_size),
1/sqrt(hidden_size)), so a PyTorch ``state_dict`` loads as it is.

Per layer and direction, the input projection of all steps is one ``linear`` node and
the recurrence is one node (Note [One node per recurrence] in ops/rnn.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import functional as _F
from .._dtype import get_default_dtype
from ..autograd.recording import record
from ..ops import rnn as _R
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module, Parameter


def _param(*shape: int, dtype: Any) -> Tensor:
    return Parameter(np.empty(shape, dtype=dtype or get_default_dtype()))


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> Tensor:
    return Tensor._wrap(np.zeros(shape, dtype=dtype))


def lstm_layer(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
               b_hh: Tensor | None, reverse: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer in one direction over ``x`` ``(T, B, I)`` from ``h0``, ``c0``
    ``(B, H)``: the hidden states ``(T, B, H)``, the last hidden and the last cell state."""
    bias = None if b_ih is None else (b_ih if b_hh is None else _F.add(b_ih, b_hh))
    xg = F.linear(x, w_ih, bias)
    out, aux = _R._lstm(xg.data, h0.data, c0.data, w_hh.data, reverse=reverse)
    packed = record(_R.lstm, (xg, h0, c0, w_hh), out, aux=aux, params={"reverse": reverse})
    steps = x.shape[0]
    return packed[:steps], packed[0 if reverse else steps - 1], packed[steps]


def gru_layer(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None, b_hh: Tensor | None,
              reverse: bool = False) -> tuple[Tensor, Tensor]:
    """One GRU layer in one direction over ``x`` ``(T, B, I)`` from ``h0`` ``(B, H)``:
    the hidden states ``(T, B, H)`` and the last hidden state."""
    xg = F.linear(x, w_ih, b_ih)
    if b_hh is None:
        b_hh = _zeros((w_hh.shape[0],), w_hh.dtype)
    out, aux = _R._gru(xg.data, h0.data, w_hh.data, b_hh.data, reverse=reverse)
    hs = record(_R.gru, (xg, h0, w_hh, b_hh), out, aux=aux, params={"reverse": reverse})
    return hs, hs[0 if reverse else x.shape[0] - 1]


def rnn_layer(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None, b_hh: Tensor | None,
              reverse: bool = False, nonlinearity: str = "tanh") -> tuple[Tensor, Tensor]:
    """One Elman RNN layer in one direction over ``x`` ``(T, B, I)`` from ``h0`` ``(B, H)``:
    the hidden states ``(T, B, H)`` and the last hidden state."""
    bias = None if b_ih is None else (b_ih if b_hh is None else _F.add(b_ih, b_hh))
    xg = F.linear(x, w_ih, bias)
    params = {"nonlinearity": nonlinearity, "reverse": reverse}
    hs = record(_R.rnn, (xg, h0, w_hh), _R._rnn(xg.data, h0.data, w_hh.data, **params), params=params)
    return hs, hs[0 if reverse else x.shape[0] - 1]


class _RNNBase(Module):
    """What LSTM and GRU share: the parameters, the checks and the layer/direction loop."""

    _gates = 0
    _mode = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size:
            raise NotImplementedError("asyncgrad's LSTM has no proj_size (projections); use proj_size=0")
        if device is not None:
            from .._device import check_device

            check_device(device)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        directions = 2 if bidirectional else 1
        gate_size = self._gates * hidden_size
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            for direction in range(directions):
                layer_input = input_size if layer == 0 else hidden_size * directions
                suffix = "_reverse" if direction == 1 else ""
                names = [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}"]
                setattr(self, names[0], _param(gate_size, layer_input, dtype=dtype))
                setattr(self, names[1], _param(gate_size, hidden_size, dtype=dtype))
                if bias:
                    names += [f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
                    setattr(self, names[2], _param(gate_size, dtype=dtype))
                    setattr(self, names[3], _param(gate_size, dtype=dtype))
                self._flat_weights_names.extend(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """A no-op (PyTorch packs the weights for cuDNN here)."""

    @property
    def all_weights(self) -> list[list[Tensor]]:
        """The parameters grouped per layer and direction, as PyTorch's."""
        per = 4 if self.bias else 2
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[k:k + per]] for k in range(0, len(names), per)]

    def _weights(self, layer: int, direction: int) -> tuple[Any, ...]:
        suffix = "_reverse" if direction == 1 else ""
        get = lambda name: getattr(self, f"{name}_l{layer}{suffix}")  # noqa: E731
        if self.bias:
            return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh")
        return get("weight_ih"), get("weight_hh"), None, None

    def _check_input(self, input: Tensor) -> bool:
        """Whether ``input`` is batched; raises PyTorch's errors for a wrong rank or size."""
        if not isinstance(input, Tensor):
            raise TypeError(f"{type(self).__name__}: expected a Tensor input, got {type(input).__name__}")
        if input.ndim not in (2, 3):
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")
        if input.dtype != self.weight_ih_l0.dtype:
            raise RuntimeError(f"input must have the type {self.weight_ih_l0.dtype}, got type {input.dtype}")
        return input.ndim == 3

    def _check_hidden(self, hx: Any, expected: tuple[int, ...], batched: bool, what: str) -> Tensor:
        if not isinstance(hx, Tensor):
            raise TypeError(f"{type(self).__name__}: expected a Tensor {what}, got {type(hx).__name__}")
        if batched and hx.ndim != 3:
            raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got {hx.ndim}-D tensor")
        if not batched and hx.ndim != 2:
            raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but got {hx.ndim}-D tensor")
        shape = tuple(hx.shape) if batched else (hx.shape[0], 1, hx.shape[1])
        if shape != expected:
            want = list(expected) if batched else [expected[0], expected[2]]
            raise RuntimeError(f"Expected {what} size {tuple(want)}, got {list(hx.shape)}")
        return hx if batched else _F.unsqueeze(hx, 1)

    def _run(self, input: Tensor, states: list[Tensor | None]) -> tuple[Tensor, list[list[Tensor]], bool]:
        """The stacked layers: the output ``(T, B, D*H)`` (or as the input's layout) and,
        per state kind, the final state of each layer and direction."""
        batched = self._check_input(input)
        x = input if batched else _F.unsqueeze(input, 1)
        if self.batch_first and batched:
            x = _F.transpose(x, 0, 1)
        batch = x.shape[1]
        directions = 2 if self.bidirectional else 1
        expected = (self.num_layers * directions, batch, self.hidden_size)
        names = ("hidden[0]", "hidden[1]") if len(states) == 2 else ("hidden",)  # PyTorch's messages
        full: list[Tensor] = []
        for state, name in zip(states, names):
            full.append(_zeros(expected, x.dtype) if state is None
                        else self._check_hidden(state, expected, batched, name))
        finals: list[list[Tensor]] = [[] for _ in states]
        for layer in range(self.num_layers):
            outs = []
            for direction in range(directions):
                k = layer * directions + direction
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, direction)
                reverse = direction == 1
                if self._mode == "LSTM":
                    hs, h_n, c_n = lstm_layer(x, full[0][k], full[1][k], w_ih, w_hh, b_ih, b_hh, reverse)
                    finals[0].append(h_n)
                    finals[1].append(c_n)
                elif self._mode == "GRU":
                    hs, h_n = gru_layer(x, full[0][k], w_ih, w_hh, b_ih, b_hh, reverse)
                    finals[0].append(h_n)
                else:
                    hs, h_n = rnn_layer(x, full[0][k], w_ih, w_hh, b_ih, b_hh, reverse, self.nonlinearity)
                    finals[0].append(h_n)
                outs.append(hs)
            x = outs[0] if directions == 1 else _F.cat(outs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        if self.batch_first and batched:
            x = _F.transpose(x, 0, 1)
        if not batched:
            x = _F.squeeze(x, 1)
        return x, finals, batched

    @staticmethod
    def _final(states: list[Tensor], batched: bool) -> Tensor:
        out = _F.stack(states, 0)
        return out if batched else _F.squeeze(out, 1)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class LSTM(_RNNBase):
    """A multi-layer LSTM, as ``torch.nn.LSTM``:
    ``output, (h_n, c_n) = lstm(input, (h_0, c_0))``.

    ``input`` is ``(L, N, input_size)`` (``(N, L, input_size)`` with ``batch_first``, or
    ``(L, input_size)`` unbatched); ``h_0``/``c_0`` are ``(D * num_layers, N, hidden_size)``
    (zeros if not given); ``output`` is ``(L, N, D * hidden_size)``. Dropout (while
    training) applies to each layer's output but the last's.
    """

    _gates = 4
    _mode = "LSTM"

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise RuntimeError("LSTM expects hx as a tuple (h_0, c_0)")
        states: list[Tensor | None] = [None, None] if hx is None else list(hx)
        out, finals, batched = self._run(input, states)
        return out, (self._final(finals[0], batched), self._final(finals[1], batched))


class GRU(_RNNBase):
    """A multi-layer GRU, as ``torch.nn.GRU``: ``output, h_n = gru(input, h_0)``, with
    ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`` and ``h' = (1 - z) * n + z * h``.
    Shapes as :class:`LSTM`'s."""

    _gates = 3
    _mode = "GRU"

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out, finals, batched = self._run(input, [hx])
        return out, self._final(finals[0], batched)


class RNN(_RNNBase):
    """A multi-layer Elman RNN, as ``torch.nn.RNN``: ``h_t = tanh(W_ih x_t + b_ih + W_hh
    h_{t-1} + b_hh)`` (``nonlinearity="relu"`` for relu); ``output, h_n = rnn(input, h_0)``.
    Shapes as :class:`LSTM`'s."""

    _gates = 1
    _mode = "RNN"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out, finals, batched = self._run(input, [hx])
        return out, self._final(finals[0], batched)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s if self.nonlinearity == "tanh" else s + f", nonlinearity={self.nonlinearity!r}"


class _CellBase(Module):
    _gates = 0

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if device is not None:
            from .._device import check_device

            check_device(device)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = _param(self._gates * hidden_size, input_size, dtype=dtype)
        self.weight_hh = _param(self._gates * hidden_size, hidden_size, dtype=dtype)
        if bias:
            self.bias_ih = _param(self._gates * hidden_size, dtype=dtype)
            self.bias_hh = _param(self._gates * hidden_size, dtype=dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _check(self, input: Tensor) -> bool:
        if input.ndim not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.shape[-1]} expected "
                               f"{self.input_size}")
        return input.ndim == 2

    def _state(self, hx: Tensor | None, batch: int, batched: bool, dtype: np.dtype) -> Tensor:
        if hx is None:
            return _zeros((batch, self.hidden_size), dtype)
        if tuple(hx.shape) != ((batch, self.hidden_size) if batched else (self.hidden_size,)):
            raise RuntimeError(f"hidden has inconsistent hidden_size or batch: got {list(hx.shape)}, expected "
                               f"{[batch, self.hidden_size] if batched else [self.hidden_size]}")
        return hx if batched else _F.unsqueeze(hx, 0)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class LSTMCell(_CellBase):
    """One LSTM step, as ``torch.nn.LSTMCell``: ``h', c' = cell(input, (h, c))``, with
    ``input`` ``(N, input_size)`` or ``(input_size,)``."""

    _gates = 4

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        batched = self._check(input)
        x = input if batched else _F.unsqueeze(input, 0)
        batch = x.shape[0]
        h0 = self._state(None if hx is None else hx[0], batch, batched, x.dtype)
        c0 = self._state(None if hx is None else hx[1], batch, batched, x.dtype)
        _, h, c = lstm_layer(_F.unsqueeze(x, 0), h0, c0, self.weight_ih, self.weight_hh, self.bias_ih,
                             self.bias_hh)
        if not batched:
            return _F.squeeze(h, 0), _F.squeeze(c, 0)
        return h, c


class GRUCell(_CellBase):
    """One GRU step, as ``torch.nn.GRUCell``: ``h' = cell(input, h)``."""

    _gates = 3

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        batched = self._check(input)
        x = input if batched else _F.unsqueeze(input, 0)
        h0 = self._state(hx, x.shape[0], batched, x.dtype)
        _, h = gru_layer(_F.unsqueeze(x, 0), h0, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return h if batched else _F.squeeze(h, 0)


__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell"]
