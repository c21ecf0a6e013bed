"""Reductions: sums, means, moments, extremes, products, norms, order statistics
(``ops/reductions.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._aliases import numpy_aliases
from ..autograd.graph.record import interned_params, record
from ..ops import reductions as R, shape as S
from ..ops._spec import OpSpec
from ..tensor import MinMax, Tensor
from .. import return_types
from ._dispatch import _dim, _dims, _reduction_dims, _tensor
from .elementwise import maximum, minimum, to_dtype


_WHOLE_PARAMS: dict[tuple[bool, tuple[int, ...]], dict[str, Any]] = {}
_WHOLE_PARAMS_MAX = 4096


def _params(dims: tuple[int, ...] | None, keepdim: Any, shape: tuple[int, ...]) -> dict[str, Any]:
    """A reduction node's ``params``: for the whole array (a loss's ``mean()`` or
    ``sum()``, once per forward) the shared dict kept here, which ``record`` knows
    without building its key (Note [Interned node constants] in graph/record.py)."""
    if dims is not None or type(keepdim) is not bool:
        return {"dim": dims, "keepdim": keepdim, "shape": shape}
    key = (keepdim, shape)
    params = _WHOLE_PARAMS.get(key)
    if params is None:
        params = interned_params({"dim": None, "keepdim": keepdim, "shape": shape})
        if len(_WHOLE_PARAMS) < _WHOLE_PARAMS_MAX:
            _WHOLE_PARAMS[key] = params
    return params


@numpy_aliases
def sum(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Sum over ``dim`` (all dims when None)."""
    x = _tensor(x)
    dims = _reduction_dims(dim, x.ndim)
    spec = R.sum_all if dims is None else R.sum
    out = R._sum(x.data, dim=dims, keepdim=keepdim)
    if x.data.dtype.kind in "bi" and dims is None:
        out = out.astype(np.int64)
    return record(spec, (x,), out, params=_params(dims, keepdim, x.shape))


@numpy_aliases
def mean(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Mean over ``dim`` (all dims when None)."""
    x = _tensor(x)
    if x.data.dtype.kind not in "fc":
        raise RuntimeError(
            f"mean(): could not infer output dtype. Input dtype must be either a floating "
            f"point or complex dtype. Got: {x.data.dtype}"
        )
    dims = _reduction_dims(dim, x.ndim)
    spec = R.mean_all if dims is None else R.mean
    out = R._mean(x.data, dim=dims, keepdim=keepdim)
    return record(spec, (x,), out, params=_params(dims, keepdim, x.shape))


@numpy_aliases
def var(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
        unbiased: bool | None = None) -> Tensor:
    """Variance with Bessel's correction by default (``correction=1``)."""
    x = _tensor(x)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dims = _reduction_dims(dim, x.ndim)
    params = {"dim": dims, "keepdim": keepdim, "correction": correction}
    out = R._var(x.data, **params)
    return record(R.var, (x,), out, params={**params, "shape": x.shape})


def _extreme(x: Tensor, dim: Any, keepdim: bool, all_spec: OpSpec, dim_spec: OpSpec) -> Any:
    x = _tensor(x)
    if dim is not None and not isinstance(dim, (int, np.integer)):  # PyTorch's TypeError
        name = "max" if all_spec is R.max_all else "min"
        raise TypeError(f"{name}(): argument 'dim' (position 1) must be int, not {type(dim).__name__}")
    if dim is None:
        if x.data.size == 0:
            raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0.")
        values, weights = all_spec.forward(x.data)
        return record(all_spec, (x,), values, aux=weights)
    d = _dim(int(dim), x.ndim)
    if x.ndim == 0:  # PyTorch: the value itself, index 0
        values, (onehot, idx) = dim_spec.forward(x.data.reshape(1), dim=0, keepdim=False)
        out = record(dim_spec, (x,), values, aux=onehot.reshape(()), params={"dim": 0, "keepdim": True})
        return MinMax(out, Tensor._wrap(np.asarray(idx, dtype=np.int64)))
    values, (onehot, idx) = dim_spec.forward(x.data, dim=d, keepdim=keepdim)
    out = record(dim_spec, (x,), values, aux=onehot, params={"dim": d, "keepdim": keepdim})
    return MinMax(out, Tensor._wrap(np.asarray(idx, dtype=np.int64)))


@numpy_aliases
def max(x: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """The maximum; with ``dim``, a ``(values, indices)`` named tuple."""
    if isinstance(dim, Tensor):  # torch.max(a, b) is maximum
        return maximum(x, dim)
    return _extreme(x, dim, keepdim, R.max_all, R.max_dim)


@numpy_aliases
def min(x: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """The minimum; with ``dim``, a ``(values, indices)`` named tuple."""
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    return _extreme(x, dim, keepdim, R.min_all, R.min_dim)


def sum_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast tensor down to ``shape`` (the engine's shape reduction)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return record(S.sum_to, (x,), S.sum_to.forward(x.data, shape=shape), params={"shape": x.shape})


@numpy_aliases
def prod(x: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The product over ``dim`` (all elements when None); integer inputs give int64.
    Gradients are exact where the input holds zeros (PyTorch's prod_backward)."""
    x = _tensor(x)
    if dtype is not None:
        x = to_dtype(x, dtype)
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError(f"prod(): argument 'dim' must be int, not {type(dim).__name__}")
    dims = _reduction_dims(dim, x.ndim)
    spec = R.prod_all if dims is None else R.prod
    out = R._prod(x.data, dim=dims, keepdim=keepdim)
    return record(spec, (x,), out, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


def prod_others(x: Tensor, dim: tuple[int, ...] | None) -> Tensor:
    """For each element, the product of the others along ``dim`` (prod's derivative)."""
    return record(R.prod_others, (x,), R._prod_others(x.data, dim=dim), params={"dim": dim})


def _pick(spec: OpSpec, x: Tensor, d: int, idx: np.ndarray, keepdim: bool) -> tuple[Tensor, Tensor]:
    """The values of ``x`` at indices ``idx`` along dim ``d`` (laid out as the output),
    recorded so that the gradient goes to those elements, and the indices as int64."""
    index = R.along_index(x.shape, d, idx, keepdim)
    values = record(spec, (x,), x.data[index], params={"index": index, "shape": x.shape})
    return values, Tensor._wrap(np.asarray(idx, dtype=np.int64))


@numpy_aliases
def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """The ``k`` largest (or smallest) elements along ``dim``: ``(values, indices)``,
    in order (NaN counts as the largest, as in PyTorch)."""
    result = return_types.topk
    x = _tensor(x)
    d = _dim(dim, x.ndim)
    data = x.data if x.ndim else x.data.reshape(1)
    n = data.shape[d]
    if not 0 <= int(k) <= n:
        raise RuntimeError("selected index k out of range")
    order = np.argsort(data, axis=d, kind="stable")  # ascending, NaNs last
    order = np.flip(order, d) if largest else order
    idx = np.take(order, np.arange(int(k)), axis=d)
    if x.ndim == 0:
        values, indices = _pick(R.topk, x.reshape(1), 0, idx, True)
        return result(values.reshape(()), indices.reshape(()))
    return result(*_pick(R.topk, x, d, idx, True))


def _median(x: Tensor, dim: int | None, keepdim: bool, skip_nan: bool) -> Any:
    result, nan_result = return_types.median, return_types.nanmedian
    x = _tensor(x)
    if dim is None:
        spec = R.nanmedian_all if skip_nan else R.median_all
        ans, weights = spec.forward(x.data)
        return record(spec, (x,), ans, aux=weights)
    d = _dim(dim, x.ndim)
    if x.ndim == 0:
        values, indices = _median(x.reshape(1), 0, False, skip_nan)
        return (nan_result if skip_nan else result)(values.reshape(()), indices.reshape(()))
    if x.shape[d] == 0:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    idx = R.median_position(x.data, d, skip_nan)
    if not keepdim:
        idx = np.squeeze(idx, d)
    values, indices = _pick(R.nanmedian_dim if skip_nan else R.median_dim, x, d, idx, keepdim)
    return (nan_result if skip_nan else result)(values, indices)


@numpy_aliases
def median(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """The lower median (NaN if any element is NaN); with ``dim``, ``(values, indices)``."""
    return _median(x, dim, keepdim, skip_nan=False)


@numpy_aliases
def nanmedian(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """``median`` ignoring NaNs (NaN only where every element is)."""
    return _median(x, dim, keepdim, skip_nan=True)


@numpy_aliases
def std(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
        unbiased: bool | None = None) -> Tensor:
    """Standard deviation with Bessel's correction by default; zero gradient where it is 0."""
    return _moment(R.std, x, dim, correction, keepdim, unbiased)


def _moment(spec: OpSpec, x: Tensor, dim: Any, correction: int, keepdim: bool,
            unbiased: bool | None) -> Tensor:
    x = _tensor(x)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dims = _reduction_dims(dim, x.ndim)
    params = {"dim": dims, "keepdim": keepdim, "correction": correction}
    return record(spec, (x,), spec.forward(x.data, **params), params={**params, "shape": x.shape})


def _with_mean(x: Tensor, moment: Tensor, dim: Any, keepdim: bool, spec: OpSpec) -> tuple[Tensor, Tensor]:
    x = _tensor(x)
    dims = _reduction_dims(dim, x.ndim)
    mean_out = R._mean(x.data, dim=dims, keepdim=keepdim)
    return moment, record(spec, (x,), mean_out, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


@numpy_aliases
def var_mean(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
             unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
    """``(var, mean)`` over ``dim`` in one call."""
    v = _moment(R.var_of_var_mean, x, dim, correction, keepdim, unbiased)
    return _with_mean(x, v, dim, keepdim, R.mean_of_var_mean)


@numpy_aliases
def std_mean(x: Tensor, dim: Any = None, *, correction: int = 1, keepdim: bool = False,
             unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
    """``(std, mean)`` over ``dim`` in one call."""
    s = _moment(R.std_of_std_mean, x, dim, correction, keepdim, unbiased)
    return _with_mean(x, s, dim, keepdim, R.mean_of_std_mean)


@numpy_aliases
def norm(x: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The vector ``p``-norm over ``dim`` (all elements when None), as ``torch.norm``:
    ``"fro"`` is the 2-norm, ``inf``/``-inf`` the largest/smallest magnitude, 0 counts
    non-zeros. The gradient is zero where the norm is zero."""
    x = _tensor(x)
    if dtype is not None:
        x = to_dtype(x, dtype)
    if isinstance(p, str):
        if p == "nuc":
            raise NotImplementedError("asyncgrad has no nuclear norm (p='nuc'); it needs an SVD")
        if p != "fro":
            raise RuntimeError(f"linalg.matrix_norm: Order {p} not supported.")
        p = 2
    if x.data.dtype.kind not in "fc":
        raise RuntimeError(
            f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {x.data.dtype}")
    p = float(p)
    dims = _reduction_dims(dim, x.ndim)
    params = {"p": p, "dim": dims, "keepdim": keepdim}
    if np.isinf(p):
        ans, weights = R.norm_inf.forward(x.data, **params)
        return record(R.norm_inf, (x,), ans, aux=weights, params={**params, "shape": x.shape})
    return record(R.norm, (x,), R.norm.forward(x.data, **params), params={**params, "shape": x.shape})


def _reduced_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return None
    dims = _dims(dim, ndim)
    if dims is not None and len(set(dims)) != len(dims):
        raise RuntimeError(f"dim {dims[0]} appears multiple times in the list of dims")
    return dims


@numpy_aliases
def amax(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """The maximum over ``dim`` (an int or a tuple; all dims when empty); the gradient is
    split evenly among ties."""
    x = _tensor(x)
    dims = _reduced_dims(dim, x.ndim)
    values, weights = R.amax.forward(x.data, dim=dims, keepdim=keepdim)
    return record(R.amax, (x,), values, aux=weights, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})


@numpy_aliases
def amin(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """The minimum over ``dim`` (an int or a tuple; all dims when empty); ties share the gradient."""
    x = _tensor(x)
    dims = _reduced_dims(dim, x.ndim)
    values, weights = R.amin.forward(x.data, dim=dims, keepdim=keepdim)
    return record(R.amin, (x,), values, aux=weights, params={"dim": dims, "keepdim": keepdim, "shape": x.shape})
