"""gradcheck and gradgradcheck (float64, central differences) for every op of API §1.

One row per case: a name, a function of the inputs, and a factory for the inputs. Inputs
are kept away from kinks (relu/abs/clamp/maximum) so finite differences are meaningful.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.functional as AF
import asyncgrad.nn.functional as NF
from asyncgrad.autograd import gradgradcheck
from asyncgrad.autograd import gradcheck


def _t(arr: Any, grad: bool = True) -> ag.Tensor:
    return ag.tensor(np.asarray(arr, dtype=np.float64), requires_grad=grad)


def rn(*shape: int) -> ag.Tensor:
    return _t(np.random.default_rng(sum(shape) + len(shape)).standard_normal(shape))


def pos(*shape: int) -> ag.Tensor:
    """Positive values well away from 0 (log, sqrt, pow bases, divisors)."""
    return _t(np.random.default_rng(7 + sum(shape)).uniform(0.5, 2.0, shape))


def away(*shape: int) -> ag.Tensor:
    """Values with |x| >= 0.2 (for kinks at 0)."""
    rng = np.random.default_rng(11 + sum(shape))
    v = rng.uniform(0.2, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    return _t(v)


def distinct(*shape: int, offset: float = 0.0) -> ag.Tensor:
    """A random permutation of well-separated values (no ties for max/min)."""
    n = int(np.prod(shape))
    rng = np.random.default_rng(n + 3)
    return _t(rng.permutation(np.linspace(-1.0, 1.0, n) + offset).reshape(shape))


MASK = np.array([[True, False, True], [False, False, True]])
SDPA_MASK = np.array([[True, False, True, True], [False, False, False, False], [True, True, False, False]])
IDX = np.array([0, 2, 0, 1])  # with a duplicate

def _inplace(a: ag.Tensor, op: Callable[[ag.Tensor], Any]) -> ag.Tensor:
    """``op`` applied in place to a non-leaf copy of ``a``, which is then used again."""
    y = a * 1.0
    op(y)
    return y * a


def _augmented_slice(a: ag.Tensor, b: ag.Tensor) -> ag.Tensor:
    y = a.sin()  # saves its input, not its output
    y[1:] += b * y[:2].clone()  # (b * y[:2] would save a view that the += modifies)
    return y


def _f_order_base(a: ag.Tensor) -> ag.Tensor:
    y = a.T * 1.0  # numpy lays this result out in Fortran order
    y[0, 1:].mul_(3)
    y[:, ::-2].add_(a[0, :2])
    return y * a.T


Case = tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]]]

CASES: list[Case] = [
    # binary arithmetic, with broadcasting
    ("add", lambda a, b: a + b, lambda: (rn(2, 3), rn(3))),
    ("add_alpha", lambda a, b: ag.add(a, b, alpha=2.5), lambda: (rn(2, 3), rn(2, 1))),
    ("sub", lambda a, b: a - b, lambda: (rn(2, 1), rn(1, 3))),
    ("mul", lambda a, b: a * b, lambda: (rn(2, 3), rn(2, 1))),
    ("div", lambda a, b: a / b, lambda: (rn(2, 3), pos(3))),
    ("pow_scalar", lambda a: a ** 3, lambda: (rn(2, 3),)),
    ("pow_scalar_frac", lambda a: a ** 2.5, lambda: (pos(2, 3),)),
    ("pow_tensor", lambda a, b: a ** b, lambda: (pos(2, 3), rn(3))),
    ("radd", lambda a: 2 + a, lambda: (rn(3),)),
    ("rsub", lambda a: 2 - a, lambda: (rn(3),)),
    ("rmul", lambda a: 2.5 * a, lambda: (rn(3),)),
    ("rdiv", lambda a: 2 / a, lambda: (pos(3),)),
    ("rpow", lambda a: 2 ** a, lambda: (rn(3),)),
    ("ndarray_mul", lambda a: np.array([1.0, -2.0, 3.0]) * a, lambda: (rn(2, 3),)),
    ("ndarray_sub", lambda a: np.array([1.0, -2.0, 3.0]) - a, lambda: (rn(2, 3),)),
    ("matmul_ndarray", lambda a: np.ones((2, 2)) @ a, lambda: (rn(2, 3),)),
    # unary
    ("neg", lambda a: -a, lambda: (rn(2, 3),)),
    ("abs", lambda a: a.abs(), lambda: (away(2, 3),)),
    ("exp", lambda a: a.exp(), lambda: (rn(2, 3),)),
    ("log", lambda a: a.log(), lambda: (pos(2, 3),)),
    ("sqrt", lambda a: a.sqrt(), lambda: (pos(2, 3),)),
    ("sin", lambda a: a.sin(), lambda: (rn(2, 3),)),
    ("cos", lambda a: a.cos(), lambda: (rn(2, 3),)),
    ("tanh", lambda a: a.tanh(), lambda: (rn(2, 3),)),
    ("sigmoid", lambda a: a.sigmoid(), lambda: (rn(2, 3),)),
    ("relu", lambda a: a.relu(), lambda: (away(2, 3),)),
    ("erf", lambda a: a.erf(), lambda: (rn(2, 3),)),
    ("erf_large", lambda a: ag.erf(a), lambda: (_t([-3.0, -1.5, 1.2, 2.5, 4.0]),)),
    ("clamp", lambda a: a.clamp(-0.5, 0.5), lambda: (_t([-1.0, -0.3, 0.1, 0.45, 0.9, 2.0]),)),
    ("clamp_min", lambda a: ag.clamp(a, min=0.0), lambda: (away(2, 3),)),
    ("clamp_max", lambda a: ag.clamp(a, max=0.0), lambda: (away(2, 3),)),
    ("maximum", ag.maximum, lambda: (distinct(2, 3), distinct(3, offset=0.05))),
    ("minimum", ag.minimum, lambda: (distinct(2, 3), distinct(2, 1, offset=0.05))),
    ("where", lambda a, b: ag.where(MASK, a, b), lambda: (rn(2, 3), rn(3))),
    ("where_scalar", lambda a: ag.where(a > 0, a, 0.0), lambda: (away(2, 3),)),
    ("clone", lambda a: a.clone() * 2, lambda: (rn(2, 3),)),
    # reductions
    ("sum", lambda a: a.sum(), lambda: (rn(2, 3),)),
    ("sum_dim", lambda a: a.sum(1), lambda: (rn(2, 3, 2),)),
    ("sum_dims_keepdim", lambda a: a.sum((0, 2), keepdim=True), lambda: (rn(2, 3, 2),)),
    ("sum_neg_dim", lambda a: ag.sum(a, -1), lambda: (rn(2, 3),)),
    ("mean", lambda a: a.mean(), lambda: (rn(2, 3),)),
    ("mean_dim", lambda a: a.mean(0), lambda: (rn(2, 3),)),
    ("mean_dim_keepdim", lambda a: a.mean(-1, keepdim=True), lambda: (rn(2, 3),)),
    ("max", lambda a: a.max(), lambda: (distinct(2, 3),)),
    ("min", lambda a: a.min(), lambda: (distinct(2, 3),)),
    ("max_dim", lambda a: a.max(1).values, lambda: (distinct(2, 3),)),
    ("max_dim_keepdim", lambda a: a.max(0, keepdim=True)[0], lambda: (distinct(2, 3),)),
    ("min_dim", lambda a: a.min(-1).values, lambda: (distinct(3, 2),)),
    ("min_dim_keepdim", lambda a: a.min(1, keepdim=True).values, lambda: (distinct(2, 3),)),
    ("var", lambda a: a.var(), lambda: (rn(2, 3),)),
    ("var_dim", lambda a: a.var(1), lambda: (rn(2, 3),)),
    ("var_dim_keepdim_c0", lambda a: a.var(0, keepdim=True, correction=0), lambda: (rn(3, 2),)),
    # shapes
    ("reshape", lambda a: a.reshape(3, 2) * _t(np.arange(6.0).reshape(3, 2), False), lambda: (rn(2, 3),)),
    ("reshape_minus1", lambda a: ag.reshape(a, (-1,)), lambda: (rn(2, 3),)),
    ("view", lambda a: a.view(6, 1), lambda: (rn(2, 3),)),
    ("flatten", lambda a: a.flatten(), lambda: (rn(2, 3, 2),)),
    ("flatten_partial", lambda a: a.flatten(1), lambda: (rn(2, 3, 2),)),
    ("transpose", lambda a: a.transpose(0, 2), lambda: (rn(2, 3, 2),)),
    ("T", lambda a: a.T, lambda: (rn(2, 3),)),
    ("permute", lambda a: a.permute(2, 0, 1), lambda: (rn(2, 3, 2),)),
    ("squeeze", lambda a: a.squeeze(), lambda: (rn(2, 1, 3, 1),)),
    ("squeeze_dim", lambda a: a.squeeze(1), lambda: (rn(2, 1, 3),)),
    ("unsqueeze", lambda a: a.unsqueeze(1), lambda: (rn(2, 3),)),
    ("unsqueeze_neg", lambda a: a.unsqueeze(-1), lambda: (rn(2, 3),)),
    ("expand", lambda a: a.expand(2, 3, 3), lambda: (rn(3, 1),)),
    ("expand_minus1", lambda a: a.expand(4, -1), lambda: (rn(1, 3),)),
    ("broadcast_to", lambda a: ag.broadcast_to(a, (2, 3)), lambda: (rn(3),)),
    # indexing
    ("getitem_int", lambda a: a[1], lambda: (rn(3, 4),)),
    ("getitem_neg_int", lambda a: a[-1, 2], lambda: (rn(3, 4),)),
    ("getitem_slice", lambda a: a[1:, ::2], lambda: (rn(3, 4),)),
    ("getitem_neg_step", lambda a: a[::-1], lambda: (rn(4),)),
    ("getitem_neg_step_2d", lambda a: a[::-2, 1::-1], lambda: (rn(3, 4),)),
    ("getitem_none_ellipsis", lambda a: a[None, ..., 1], lambda: (rn(2, 3, 2),)),
    ("getitem_adv_int", lambda a: a[IDX], lambda: (rn(3, 2),)),
    ("getitem_adv_list", lambda a: a[[0, 0, 2]], lambda: (rn(3, 2),)),
    ("getitem_adv_tensor", lambda a: a[ag.tensor([2, 2, 1])], lambda: (rn(3, 2),)),
    ("getitem_adv_2d", lambda a: a[IDX, [1, 0, 1, 1]], lambda: (rn(3, 2),)),
    ("getitem_adv_mixed", lambda a: a[1:, IDX[:2]], lambda: (rn(3, 3),)),
    ("getitem_mask", lambda a: a[MASK], lambda: (rn(2, 3),)),
    ("getitem_mask_tensor", lambda a: a[a > 0], lambda: (away(2, 3),)),
    ("cat", lambda a, b: ag.cat([a, b], 1), lambda: (rn(2, 3), rn(2, 1))),
    ("cat_neg_dim_3", lambda a, b, c: ag.cat([a, b, c], -1), lambda: (rn(2, 1), rn(2, 2), rn(2, 1))),
    ("stack", lambda a, b: ag.stack([a, b]), lambda: (rn(2, 3), rn(2, 3))),
    ("stack_last", lambda a, b: ag.stack([a, b], -1), lambda: (rn(2, 3), rn(2, 3))),
    # matmul
    ("matmul_1d_1d", lambda a, b: a @ b, lambda: (rn(3), rn(3))),
    ("matmul_2d_1d", lambda a, b: a @ b, lambda: (rn(2, 3), rn(3))),
    ("matmul_1d_2d", lambda a, b: a @ b, lambda: (rn(3), rn(3, 2))),
    ("matmul_2d_2d", lambda a, b: a @ b, lambda: (rn(2, 3), rn(3, 2))),
    ("matmul_batched", lambda a, b: ag.matmul(a, b), lambda: (rn(2, 2, 3), rn(2, 3, 2))),
    ("matmul_batched_bcast", lambda a, b: a @ b, lambda: (rn(2, 1, 2, 3), rn(3, 3, 2))),
    ("matmul_batched_2d", lambda a, b: a @ b, lambda: (rn(2, 2, 3), rn(3, 2))),
    ("matmul_2d_batched", lambda a, b: a @ b, lambda: (rn(2, 3), rn(2, 3, 2))),
    ("matmul_1d_batched", lambda a, b: a @ b, lambda: (rn(3), rn(2, 3, 2))),
    ("matmul_batched_1d", lambda a, b: a @ b, lambda: (rn(2, 2, 3), rn(3))),
    # nn
    ("softmax", lambda a: a.softmax(1), lambda: (rn(2, 3),)),
    ("softmax_dim0", lambda a: ag.softmax(a, 0), lambda: (rn(2, 3),)),
    ("log_softmax", lambda a: a.log_softmax(-1), lambda: (rn(2, 3),)),
    ("log_softmax_dim0", lambda a: ag.log_softmax(a, 0), lambda: (rn(2, 3),)),
    ("gelu", lambda a: AF.gelu(a), lambda: (rn(2, 3),)),
    ("gelu_tanh", lambda a: AF.gelu(a, approximate="tanh"), lambda: (rn(2, 3),)),
    ("cross_entropy", lambda a: AF.cross_entropy(a, np.array([0, 2])), lambda: (rn(2, 3),)),
    ("cross_entropy_sum", lambda a: AF.cross_entropy(a, np.array([1, 2, 0]), reduction="sum"),
     lambda: (rn(3, 3),)),
    ("cross_entropy_none", lambda a: AF.cross_entropy(a, ag.tensor([1, 0]), reduction="none"),
     lambda: (rn(2, 3),)),
    ("cross_entropy_ignore", lambda a: AF.cross_entropy(a, np.array([1, -100, 2])), lambda: (rn(3, 3),)),
    ("nll_loss", lambda a: AF.nll_loss(a, np.array([0, 2])), lambda: (rn(2, 3),)),
    ("nll_loss_sum", lambda a: AF.nll_loss(a, np.array([0, 2]), reduction="sum"), lambda: (rn(2, 3),)),
    ("nll_loss_none", lambda a: AF.nll_loss(a, np.array([0, 2]), reduction="none"), lambda: (rn(2, 3),)),
    ("mse_loss", lambda a, b: AF.mse_loss(a, b), lambda: (rn(2, 3), rn(2, 3))),
    ("mse_loss_sum", lambda a, b: AF.mse_loss(a, b, reduction="sum"), lambda: (rn(2, 3), rn(2, 3))),
    ("mse_loss_none", lambda a, b: AF.mse_loss(a, b, reduction="none"), lambda: (rn(2, 3), rn(2, 3))),
    ("mse_loss_const_target", lambda a: AF.mse_loss(a, np.ones((2, 3))), lambda: (rn(2, 3),)),
    ("linear", lambda x, w, b: AF.linear(x, w, b), lambda: (rn(4, 3), rn(2, 3), rn(2))),
    ("linear_nobias", lambda x, w: AF.linear(x, w), lambda: (rn(4, 3), rn(2, 3))),
    ("linear_nd", lambda x, w, b: AF.linear(x, w, b), lambda: (rn(2, 2, 3), rn(2, 3), rn(2))),
    ("linear_nd_nobias", lambda x, w: AF.linear(x, w), lambda: (rn(2, 2, 3), rn(2, 3))),
    ("linear_1d", lambda x, w, b: AF.linear(x, w, b), lambda: (rn(3), rn(2, 3), rn(2))),
    # 0-d tensors accept dim 0 / -1 (as PyTorch)
    ("sum_0d_dim", lambda a: a.sum(0) * a.mean(-1), lambda: (_t(1.5),)),
    ("max_0d_dim", lambda a: a.max(0).values * a.min(-1, keepdim=True)[0], lambda: (_t(1.5),)),
    ("softmax_0d", lambda a: a.softmax(0) + a.log_softmax(-1) * a, lambda: (_t(1.5),)),
    ("scalar_ops_0d", lambda a, b: (a * b).exp() / (a - 3.0) + b ** a, lambda: (_t(1.5), pos(2, 2))),
    # in-place ops on non-leaves and on their views (recorded on the base)
    ("inplace_mul", lambda a, b: _inplace(a, lambda y: y.mul_(b)), lambda: (rn(2, 3), rn(3))),
    ("inplace_chain", lambda a, b: _inplace(a, lambda y: y.add_(b).div_(b).pow_(2)), lambda: (rn(2, 3), pos(3))),
    ("setitem_value", lambda a, b: _inplace(a, lambda y: y.__setitem__(0, b * 2)), lambda: (rn(2, 3), rn(3))),
    ("setitem_adv", lambda a, b: _inplace(a, lambda y: y.__setitem__(([0, 1], [2, 0]), b)),
     lambda: (rn(2, 3), rn(2))),
    ("setitem_mask", lambda a: _inplace(a, lambda y: y.__setitem__(y > 0, 0.0)), lambda: (away(2, 3),)),
    ("view_mul_", lambda a, b: _inplace(a, lambda y: y[:, 0].mul_(b)), lambda: (rn(2, 3), rn(2))),
    ("view_iadd_neg_step", lambda a, b: _inplace(a, lambda y: y[1:, ::-1].__iadd__(b)),
     lambda: (rn(2, 3), rn(1, 3))),
    ("view_T_clamp_", lambda a: _inplace(a, lambda y: y.T[0].clamp_(-0.5, 0.5)), lambda: (away(2, 3),)),
    ("view_copy_", lambda a, b: _inplace(a, lambda y: y.view(6)[2:5].copy_(b * b)), lambda: (rn(2, 3), rn(3))),
    ("augmented_slice", lambda a, b: _augmented_slice(a, b), lambda: (rn(3, 2), rn(2, 2))),
    ("view_inplace_f_order_base", lambda a: _f_order_base(a), lambda: (rn(3, 4),)),
    # compositions that reuse a tensor on several paths
    ("composite", lambda a, b: ((a * b).sin() + a.exp() / (1 + b * b)).sum(0), lambda: (rn(2, 3), rn(3))),
    # views added for PyTorch parity (issue 13)
    ("narrow", lambda a: a.narrow(1, 1, 2), lambda: (rn(2, 4),)),
    ("narrow_neg_start", lambda a: ag.narrow(a, -1, -3, 2), lambda: (rn(2, 4),)),
    ("view_as", lambda a, b: a.view_as(b) * b, lambda: (rn(2, 3), rn(3, 2))),
    ("select", lambda a: a.select(1, -1), lambda: (rn(2, 3, 2),)),
    ("unbind", lambda a: a.unbind(1)[0] * a.unbind(1)[2], lambda: (rn(2, 3),)),
    ("unbind_all_used", lambda a: ag.stack(a.unbind(0), 1), lambda: (rn(3, 2),)),
    ("split_size", lambda a: a.split(2, 1)[1] * 2 + a.split(2, 1)[0], lambda: (rn(2, 4),)),
    ("split_uneven", lambda a: ag.cat(a.split(2)[::-1]), lambda: (rn(5, 2),)),
    ("split_sections", lambda a: a.split([1, 3], 1)[1].sum(1) * a.split([1, 3], 1)[0][:, 0],
     lambda: (rn(2, 4),)),
    ("chunk", lambda a: a.chunk(3, -1)[2] * a.chunk(3, -1)[0], lambda: (rn(2, 6),)),
    ("diagonal", lambda a: a.diagonal(), lambda: (rn(3, 4),)),
    ("diagonal_offset", lambda a: a.diagonal(1) * a.diagonal(-1)[:2], lambda: (rn(3, 3),)),
    ("diagonal_dims", lambda a: ag.diagonal(a, -1, 2, 0), lambda: (rn(3, 2, 4),)),
    ("contiguous", lambda a: a.T.contiguous().view(6), lambda: (rn(2, 3),)),
    ("view_inplace_narrow", lambda a, b: _inplace(a, lambda y: y.narrow(1, 1, 2).mul_(b)), lambda: (rn(2, 3), rn(2))),
    ("view_inplace_select", lambda a, b: _inplace(a, lambda y: y.select(1, 0).add_(b * b)), lambda: (rn(2, 3), rn(2))),
    ("view_inplace_diagonal", lambda a, b: _inplace(a, lambda y: y.diagonal().mul_(b)), lambda: (rn(3, 3), rn(3))),
    # ops added for PyTorch parity (issue 13)
    ("repeat", lambda a: a.repeat(2, 3), lambda: (rn(2, 2),)),
    ("repeat_new_dims", lambda a: a.repeat(2, 1, 2), lambda: (rn(3),)),
    ("prod", lambda a: a.prod(), lambda: (rn(2, 3),)),
    ("prod_dim", lambda a: a.prod(1), lambda: (rn(2, 3),)),
    ("prod_dim_keepdim", lambda a: ag.prod(a, 0, keepdim=True), lambda: (rn(3, 2),)),
    ("prod_one_zero", lambda a: a.prod(), lambda: (_t([[1.5, 0.0, -0.7], [0.8, 1.2, 2.0]]),)),
    ("prod_two_zeros", lambda a: a.prod(), lambda: (_t([1.5, 0.0, -0.7, 0.0]),)),
    ("prod_dim_zeros", lambda a: a.prod(-1), lambda: (_t([[1.5, 0.0, -0.7], [0.0, 0.0, 2.0], [0.5, 1.1, 2.0]]),)),
    ("masked_fill", lambda a: a.masked_fill(MASK, 2.0), lambda: (rn(2, 3),)),
    ("masked_fill_bcast", lambda a: ag.masked_fill(a, MASK[0], -1.0), lambda: (rn(2, 3),)),
    ("masked_fill_tensor_value", lambda a, v: a.masked_fill(MASK, v), lambda: (rn(2, 3), _t(0.7))),
    ("masked_fill_", lambda a, v: _inplace(a, lambda y: y.masked_fill_(MASK, v * v)), lambda: (rn(2, 3), _t(0.7))),
    ("tril", lambda a: a.tril(), lambda: (rn(3, 4),)),
    ("tril_offset_batched", lambda a: ag.tril(a, -1), lambda: (rn(2, 3, 3),)),
    ("triu", lambda a: a.triu(1), lambda: (rn(3, 4),)),
    ("triu_", lambda a: _inplace(a, lambda y: y.triu_()), lambda: (rn(3, 3),)),
    ("topk", lambda a: a.topk(2).values, lambda: (distinct(2, 4),)),
    ("topk_smallest_dim0", lambda a: ag.topk(a, 2, 0, largest=False)[0], lambda: (distinct(3, 2),)),
    ("median", lambda a: a.median(), lambda: (distinct(2, 3),)),
    ("median_dim", lambda a: a.median(1).values, lambda: (distinct(3, 4),)),
    ("median_dim_keepdim", lambda a: a.median(0, keepdim=True)[0], lambda: (distinct(3, 2),)),
    ("nanmedian", lambda a: a.nanmedian(), lambda: (_t([0.3, np.nan, -0.5, 1.2]),)),
    ("nanmedian_dim", lambda a: a.nanmedian(1).values, lambda: (_t([[0.3, np.nan, -0.5], [0.1, 0.9, 0.4]]),)),
    ("std", lambda a: a.std(), lambda: (rn(2, 3),)),
    ("std_dim_c0", lambda a: a.std(1, correction=0, keepdim=True), lambda: (rn(2, 3),)),
    ("var_mean", lambda a: ag.var_mean(a, 1)[0] * ag.var_mean(a, 1)[1], lambda: (rn(2, 3),)),
    ("std_mean", lambda a: ag.std_mean(a)[0] + ag.std_mean(a)[1] ** 2, lambda: (rn(2, 3),)),
    ("norm", lambda a: a.norm(), lambda: (rn(2, 3),)),
    ("norm_dim", lambda a: ag.norm(a, dim=1), lambda: (rn(2, 3),)),
    ("norm_1", lambda a: a.norm(1, dim=0, keepdim=True), lambda: (away(2, 3),)),
    ("norm_3", lambda a: a.norm(3), lambda: (away(2, 3),)),
    ("norm_inf", lambda a: a.norm(float("inf"), 1), lambda: (distinct(2, 3),)),
    ("norm_neg_inf", lambda a: a.norm(-float("inf")), lambda: (distinct(2, 3, offset=3.0),)),
    ("norm_fro_dims", lambda a: a.norm("fro", (0, 2)), lambda: (rn(2, 3, 2),)),
    ("relu_inplace", lambda a: _inplace(a, lambda y: NF.relu(y, inplace=True)), lambda: (away(2, 3),)),
    ("sdpa", lambda q, k, v: NF.scaled_dot_product_attention(q, k, v), lambda: (rn(2, 3, 4), rn(2, 5, 4), rn(2, 5, 2))),
    ("sdpa_causal_scale", lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
     lambda: (rn(1, 2, 4, 3), rn(1, 2, 4, 3), rn(1, 2, 4, 2))),
    ("sdpa_bool_mask", lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, attn_mask=SDPA_MASK),
     lambda: (rn(3, 2), rn(4, 2), rn(4, 3))),
    ("sdpa_float_mask", lambda q, k, v, m: NF.scaled_dot_product_attention(q, k, v, attn_mask=m),
     lambda: (rn(3, 2), rn(4, 2), rn(4, 3), rn(3, 4))),
]


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_gradcheck(name: str, fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]]) -> None:
    assert gradcheck(fn, make())


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_gradgradcheck(name: str, fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]]) -> None:
    assert gradgradcheck(fn, make())


async def test_gradcheck_inside_event_loop() -> None:
    assert gradcheck(lambda a, b: (a * b).tanh(), (rn(2, 3), rn(3)))
    assert gradgradcheck(lambda a: a.softmax(0), (rn(3),))


def test_gradcheck_and_gradgradcheck_detect_wrong_derivatives() -> None:
    # detach() hides part of the derivative: first order is wrong for a.detach() * a
    with pytest.raises(ag.autograd.GradcheckError):
        gradcheck(lambda a: a.detach() * a, (rn(3),))
    assert gradcheck(lambda a: a.detach() * a, (rn(3),), raise_exception=False) is False
    # ... and gradgradcheck sees the missing second-order term of a * a.detach()
    assert gradgradcheck(lambda a: a * a.detach(), (rn(3),), raise_exception=False) is False
