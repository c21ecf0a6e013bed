"""The differentiable operations, as ``ag.*`` functions (Tensor methods delegate here),
grouped by op family as ``asyncgrad.ops`` is; every name is importable from here.

Each function normalises its arguments, runs the primitive's numpy kernel and hands the
result to :func:`asyncgrad.autograd.graph.record.record`. Derivative rules live in
``asyncgrad.ops``; nothing here knows about the engine.

* ``elementwise``: arithmetic, functions of one tensor, selections, comparisons, casts, fills;
* ``reductions``: sums, means, moments, extremes, products, norms, order statistics;
* ``shape``: reshapes, transposes, joins, splits and the other views;
* ``indexing``: ``x[index]``, its writes and its gradient;
* ``linalg``: matrix products and the linear layer;
* ``nn``: softmax, GELU and the losses;
* ``_dispatch``: how arguments become arrays and results recorded tensors (the binary and
  unary dispatch the hottest Tensor methods call directly, views, dimension arguments).
"""

from __future__ import annotations
from ._dispatch import (  # noqa: F401
    _py_max, _py_min, _const, _CATEGORY, _promote, _binary, _raise_broadcast_error, _SCALARS, _SCALAR_CACHE,
    _scalar_const, _unary, _unary_params, _tensor, _dims, _reduction_dims, _dim, _view,
)
from .elementwise import (  # noqa: F401
    add, sub, mul, div, _is_floating_operand, pow, neg, abs, exp, log, sqrt, sin, cos, tanh, sigmoid, relu,
    erf, sgn, threshold_backward, clone, clamp, clip, maximum, minimum, where, compare, isfinite, isinf,
    to_dtype, fill, zero, copy_from, masked_fill, _tri, tril, triu, eq, ne, lt, le, gt, ge, relu_,
)
from .reductions import (  # noqa: F401
    sum, mean, var, _extreme, max, min, sum_to, prod, prod_others, _pick, topk, _median, median, nanmedian,
    std, _moment, _with_mean, var_mean, std_mean, norm, _reduced_dims, amax, amin,
)
from .indexing import (  # noqa: F401
    _normalise_index, _basic_index_spec, getitem, index_add, index_put, _index_array, _check_bounds,
    _full_index, gather, index_select, scatter_add, scatter, _leading_part, _scatter_index,
)
from .shape import (  # noqa: F401
    reshape, flatten, transpose, swapaxes, permute, squeeze, unsqueeze, expand, broadcast_to, cat, concat,
    stack, _infer_shape, view, view_as, contiguous, _multi_view, _dim_for, narrow, select, unbind,
    _split_views, split, chunk, diagonal, repeat, split_with_sizes, unfold,
)
from .linalg import (  # noqa: F401
    matmul, mm, linear, _check_linear_dtypes, einsum, tensordot,
)
from .nn import (  # noqa: F401
    softmax, log_softmax, gelu, nll_loss, cross_entropy, mse_loss,
)

# The ops (not the helpers or the modules these import).
__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and getattr(v, "__module__", "").startswith(__name__ + ".")]
