"""``ag.nn``: modules, parameters and layers with PyTorch's names and defaults.

    model = ag.nn.Sequential(ag.nn.Linear(64, 128), ag.nn.ReLU(), ag.nn.Linear(128, 10))
    loss = ag.nn.functional.cross_entropy(model(x), y)
    await ag.backward(loss)
"""

from . import functional, init, utils
from .layers import (
    GELU, CrossEntropyLoss, Dropout, Embedding, Flatten, Identity, LayerNorm, Linear, LogSoftmax,
    MSELoss, NLLLoss, ReLU, Sigmoid, Softmax, Tanh,
)
from .conv import Conv1d, Conv2d, ConvTranspose2d
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm
from .pooling import AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d
from .upsampling import Upsample
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell
from .transformer import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer
from .module import IncompatibleKeys, Module, ModuleDict, ModuleList, Parameter, Sequential
from .activations import (  # more activations and losses (issue 32)
    BCELoss, BCEWithLogitsLoss, CELU, CosineSimilarity, ELU, GLU, Hardsigmoid, Hardswish, Hardtanh,
    HuberLoss, KLDivLoss, L1Loss, LeakyReLU, LogSigmoid, Mish, ReLU6, SELU, SiLU, SmoothL1Loss,
    Softmin, Softplus, Softsign, Tanhshrink, Unflatten,
)

__all__ = [
    "GELU", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "Identity", "IncompatibleKeys",
    "LayerNorm", "Linear", "LogSoftmax", "MSELoss", "Module", "ModuleDict", "ModuleList", "NLLLoss",
    "Parameter", "ReLU", "Sequential", "Sigmoid", "Softmax", "Tanh", "functional", "init", "utils",
]
__all__ += [  # image layers (issue 32)
    "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d",
    "ConvTranspose2d", "GroupNorm", "MaxPool2d", "Upsample",
]
__all__ += ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "MultiheadAttention", "TransformerEncoder",
            "TransformerEncoderLayer"]
__all__ += [  # nn/activations.py
    "BCELoss", "BCEWithLogitsLoss", "CELU", "CosineSimilarity", "ELU", "GLU", "Hardsigmoid",
    "Hardswish", "Hardtanh", "HuberLoss", "KLDivLoss", "L1Loss", "LeakyReLU", "LogSigmoid", "Mish",
    "ReLU6", "SELU", "SiLU", "SmoothL1Loss", "Softmin", "Softplus", "Softsign", "Tanhshrink",
    "Unflatten"
]
