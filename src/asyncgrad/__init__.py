"""asyncgrad: a reverse-mode autograd engine over numpy whose backward is a coroutine.

    import asyncgrad as ag
    x = ag.randn(3, requires_grad=True)
    loss = (x * x).sum()
    await ag.backward(loss)      # the event loop keeps serving meanwhile
"""

from ._dtype import bool_, float16, float32, float64, get_default_dtype, int32, int64, set_default_dtype
from .tensor import Tensor
from .creation import (
    arange, empty, eye, from_numpy, full, full_like, linspace, ones, ones_like, rand, randint,
    randn, randperm, tensor, zeros, zeros_like,
)
from .creation import rand_like, randn_like
from .sampling import bernoulli, multinomial
from ._device import device
from .functional import (
    abs, add, broadcast_to, cat, clamp, clip, clone, concat, cos, div, erf, exp, flatten, isfinite, isinf,
    log, log_softmax, matmul, max, maximum, mean, min, minimum, mm, mul, neg, permute, pow,
    relu, reshape, sigmoid, sin, softmax, sqrt, squeeze, stack, sub, sum, swapaxes, tanh,
    transpose, unsqueeze, var, where,
)
from .functional import (  # added for PyTorch parity (issue 13)
    chunk, diagonal, eq, ge, gt, le, lt, masked_fill, median, nanmedian, narrow, ne, norm, prod,
    relu_, select, split, std, std_mean, topk, tril, triu, unbind, var_mean,
)
from . import functional as _functional
from .tensor import bind_functional as _bind_functional
from .grad_mode import (
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad, set_grad_enabled,
)
from .random import Generator, get_rng_state, manual_seed, set_rng_state
from . import autograd
from . import utils
from .autograd import backward, backward_sync, grad, grad_sync
from . import nn, optim
from .nn._functional_conv import conv1d, conv2d, conv_transpose2d  # image layers (issue 32)
from .nn._functional_norm import batch_norm, group_norm
from .nn._functional_pooling import avg_pool2d, max_pool2d
from . import attribution as attribution  # (saliency methods; the alias exports it)
from . import return_types
from . import viz
from . import cuda
from .serialization import load, save

# Registration instead of a ring of imports (Note [The graph layer never imports Tensor]):
# Tensor's methods delegate to ``functional``, ``torch_ops``, ``creation`` and
# ``sampling``, which import ``tensor``, so they are handed to it here; ``_tensor_math``
# registers the create_graph math with the graph layer as it is imported; the autograd
# package's names are bound once everything they import is complete.
from . import creation as _creation, sampling as _sampling, torch_ops as _torch_ops
from . import _tensor_math  # noqa: F401  (imported for its registration)
_bind_functional(_functional, _torch_ops, _creation, _sampling)
autograd.load_all()

__version__ = "0.1.0"

# PyTorch's names (issue 32): dtype aliases, dtype queries, and what model code reaches for
from ._dtype import (  # noqa: E402
    complex64, complex128, finfo, iinfo, int8, int16, is_complex, is_floating_point, uint8,
)
from .functional import (  # noqa: E402
    amax, amin, einsum, gather, index_select, scatter, scatter_add, split_with_sizes, tensordot,
)
from .torch_ops import (  # noqa: E402
    acos, addcdiv, addcmul, addmm, addmv, allclose, argmax, argmin, argsort, argwhere, as_tensor, asin,
    atan, atan2, baddbmm, bmm, broadcast_tensors, bucketize, cdist, ceil, clamp_max, clamp_min,
    column_stack, cosh, count_nonzero, cumsum, diag, diag_embed, diff, dot, dstack, empty_like, equal,
    erfc, exp2, expm1, fix, flip, fliplr, flipud, floor, floor_divide, fmod, frac, ger, histc, hstack,
    hypot, inner, isclose, isnan, isneginf, isposinf, lerp, log10, log1p, log2, logaddexp, logical_and,
    logical_not, logical_or, logical_xor, logspace, logsumexp, masked_select, meshgrid, moveaxis,
    movedim, mv, nan_to_num, nonzero, normal, outer, randint_like, reciprocal, remainder,
    repeat_interleave, roll, rsqrt, searchsorted, sign, sinh, sort, square, t, take_along_dim, tile,
    trace, tril_indices, triu_indices, true_divide, trunc, unflatten, unique, vstack, xlogy,
)
from .torch_ops import (  # noqa: E402
    divide, index_add, index_fill, multiply, nanmean, nansum, ravel, subtract, tan, tensor_split,
)
from .torch_ops import all as all, any as any, round as round  # noqa: E402,A004  (not in __all__)
from ._torch_names import (  # noqa: E402
    Size, backends, compile as compile, dtype, get_num_threads, is_nonzero, is_tensor, numel,
    set_num_threads, typename, use_deterministic_algorithms,
)

# ``ag.long``, ``ag.float``, ``ag.bool`` ...: last, as they hide builtins in this namespace
long = int64
int = int32  # noqa: A001
short = int16
float = float32  # noqa: A001
double = float64
half = float16
bool = bool_  # noqa: A001
cfloat = complex64
cdouble = complex128


def __getattr__(name: str) -> object:
    # ag.distributed imports mpi4py (the "mpi" extra), so it loads on first use only;
    # ag.serving (batched gradients for services) is loaded on first use too
    if name in ("distributed", "serving"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Generator", "Tensor", "abs", "add", "arange", "autograd", "backward", "backward_sync",
    "bool_", "broadcast_to", "cat", "clamp", "clip", "clone", "concat", "cos", "div", "empty",
    "enable_grad", "erf", "exp", "eye", "flatten", "float16", "float32", "float64",
    "from_numpy", "full", "full_like", "get_default_dtype", "get_rng_state", "grad",
    "grad_sync", "inference_mode", "int32", "int64", "is_grad_enabled", "isfinite", "isinf",
    "is_inference_mode_enabled", "linspace", "log", "log_softmax", "manual_seed", "matmul",
    "max", "maximum", "mean", "min", "minimum", "mm", "mul", "neg", "nn", "no_grad", "ones",
    "ones_like", "optim", "permute", "pow", "rand", "randint", "randn", "randperm", "relu", "reshape",
    "set_default_dtype", "set_grad_enabled", "set_rng_state", "sigmoid", "sin", "softmax",
    "sqrt", "squeeze", "stack", "sub", "sum", "swapaxes", "tanh", "tensor", "transpose",
    "unsqueeze", "utils", "var", "viz", "where", "zeros", "zeros_like",
]
__all__ += [
    "chunk", "diagonal", "eq", "ge", "gt", "le", "lt", "masked_fill", "median", "nanmedian", "narrow",
    "ne", "norm", "prod", "relu_", "return_types", "select", "split", "std", "std_mean", "topk", "tril",
    "triu", "unbind", "var_mean", "bernoulli", "multinomial", "rand_like", "randn_like", "device",
]
__all__ += ["avg_pool2d", "batch_norm", "conv1d", "conv2d", "conv_transpose2d", "group_norm", "max_pool2d"]
__all__ += ["load", "save"]
# (not ``int``, ``float``, ``bool``, ``compile``: ``from asyncgrad import *`` must not hide builtins)
__all__ += [
    "Size", "backends", "cdouble", "cfloat", "complex64", "complex128", "cuda", "double", "dtype", "finfo",
    "get_num_threads", "half", "iinfo", "int8", "int16", "is_complex", "is_floating_point", "is_nonzero",
    "is_tensor", "long", "numel", "set_num_threads", "short", "typename", "uint8",
    "use_deterministic_algorithms", "split_with_sizes", "amax", "amin", "einsum", "gather", "index_select",
    "scatter", "scatter_add", "tensordot",
]
__all__ += [  # torch_ops
    "acos", "addcdiv", "addcmul", "addmm", "addmv", "allclose", "argmax", "argmin", "argsort",
    "argwhere", "as_tensor", "asin", "atan", "atan2", "baddbmm", "bmm", "broadcast_tensors",
    "bucketize", "cdist", "ceil", "clamp_max", "clamp_min", "column_stack", "cosh", "count_nonzero",
    "cumsum", "diag", "diag_embed", "diff", "dot", "dstack", "empty_like", "equal", "erfc", "exp2",
    "expm1", "fix", "flip", "fliplr", "flipud", "floor", "floor_divide", "fmod", "frac", "ger", "histc",
    "hstack", "hypot", "inner", "isclose", "isnan", "isneginf", "isposinf", "lerp", "log10", "log1p",
    "log2", "logaddexp", "logical_and", "logical_not", "logical_or", "logical_xor", "logspace",
    "logsumexp", "masked_select", "meshgrid", "moveaxis", "movedim", "mv", "nan_to_num", "nonzero",
    "normal", "outer", "randint_like", "reciprocal", "remainder", "repeat_interleave", "roll", "rsqrt",
    "searchsorted", "sign", "sinh", "sort", "square", "t", "take_along_dim", "tile", "trace",
    "tril_indices", "triu_indices", "true_divide", "trunc", "unflatten", "unique", "vstack", "xlogy"
]
__all__ += ["divide", "index_add", "index_fill", "multiply", "nanmean", "nansum", "ravel", "subtract", "tan",
            "tensor_split"]
