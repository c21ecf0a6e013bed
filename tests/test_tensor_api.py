"""The Tensor surface of API §1: dtype rules, memory sharing, attributes and conversions."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgrad as ag

NONLEAF_MSG = ("you can only change requires_grad flags of leaf variables. If you want to use a computed "
               "variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach().")


@pytest.fixture
def float32_default():
    ag.set_default_dtype(np.float32)
    yield


# --- dtype rules ---------------------------------------------------------------------------------
def test_default_dtype_is_float32_and_settable(float32_default: None) -> None:
    assert ag.get_default_dtype() == np.float32
    assert ag.tensor(1.0).dtype == np.float32
    assert ag.tensor([1.0, 2]).dtype == np.float32
    assert ag.tensor([[1, 2.5]]).dtype == np.float32
    assert ag.zeros(2).dtype == ag.ones(2).dtype == ag.eye(2).dtype == np.float32
    assert ag.randn(2).dtype == ag.rand(2).dtype == ag.full((2,), 1.5).dtype == np.float32
    assert ag.arange(0.0, 1.0, 0.25).dtype == np.float32
    ag.set_default_dtype(np.float64)
    assert ag.get_default_dtype() == np.float64
    assert ag.tensor(1.0).dtype == np.float64 and ag.zeros(2).dtype == np.float64
    assert ag.tensor([1, 2]).dtype == np.int64  # ints are not affected
    with pytest.raises(TypeError):
        ag.set_default_dtype(np.int64)
    assert ag.get_default_dtype() == np.float64


def test_python_values_become_pytorch_dtypes(float32_default: None) -> None:
    assert ag.tensor(3).dtype == np.int64
    assert ag.tensor([1, 2, 3]).dtype == np.int64
    assert ag.tensor(True).dtype == np.bool_
    assert ag.tensor([True, False]).dtype == np.bool_
    assert ag.full((2,), 3).dtype == np.int64 and ag.full((2,), True).dtype == np.bool_
    assert ag.tensor([1, 2], dtype=ag.float64).dtype == np.float64
    assert ag.tensor(1.0, dtype=np.float16).dtype == np.float16
    assert isinstance(ag.tensor(1.0).dtype, np.dtype)
    assert (ag.float32, ag.float64, ag.int64, ag.bool_) == tuple(
        np.dtype(t) for t in (np.float32, np.float64, np.int64, np.bool_))


def test_numpy_arrays_keep_their_dtype(float32_default: None) -> None:
    for dt in (np.float64, np.float32, np.int32, np.int64, np.bool_, np.uint8):
        assert ag.tensor(np.zeros(2, dtype=dt)).dtype == dt
        assert ag.from_numpy(np.zeros(2, dtype=dt)).dtype == dt
    assert ag.tensor(np.float64(1.5)).dtype == np.float64


def test_arange_follows_pytorch(float32_default: None) -> None:
    a = ag.arange(5)
    assert a.dtype == np.int64 and a.tolist() == [0, 1, 2, 3, 4]
    assert ag.arange(2, 8, 2).tolist() == [2, 4, 6]
    assert ag.arange(5.0).dtype == np.float32
    assert ag.arange(0, 1, 0.5).tolist() == [0.0, 0.5]
    assert ag.arange(3, dtype=np.float64).dtype == np.float64


def test_scalar_operands_keep_the_tensor_dtype(float32_default: None) -> None:
    f = ag.tensor([1.0, 2.0])
    for out in (f * 2.0, 2.0 * f, f + 1, 1 - f, f / 3, 3 / f, f ** 2, 2 ** f, f * 2.5, ag.maximum(f, 1.5),
                ag.where(f > 1, f, 0.0), f.clamp(0.5, 1.5)):
        assert out.dtype == np.float32
    h = ag.tensor([1.0, 2.0], dtype=np.float64)
    assert (h * 2.0).dtype == np.float64 and (h * 2).dtype == np.float64
    i = ag.tensor([1, 2])
    assert (i * 2).dtype == np.int64 and (i + True).dtype == np.int64
    assert (i * 2.5).dtype == np.float32  # int tensor with a float scalar: the default dtype
    assert (i / 2).dtype == np.float32 and (i / i).dtype == np.float32
    assert (i / 2).tolist() == [0.5, 1.0]
    # tensor-tensor: category wins, a 0-d tensor of the same category does not widen
    assert (i * f).dtype == np.float32
    assert (f * ag.tensor(2.0, dtype=np.float64)).dtype == np.float32
    assert (f * ag.tensor([2.0, 1.0], dtype=np.float64)).dtype == np.float64
    assert (ag.tensor(2.0, dtype=np.float64) * i).dtype == np.float64
    assert (ag.tensor([True, False]) * ag.tensor(3)).dtype == np.int64


def test_mixed_precision_gradients_have_input_dtypes() -> None:
    a = ag.tensor([1.0, 2.0], dtype=np.float32, requires_grad=True)
    b = ag.tensor(3.0, dtype=np.float64, requires_grad=True)
    c = ag.tensor([0.5, 0.5], dtype=np.float64, requires_grad=True)
    y = a * b
    assert y.dtype == np.float32
    (y.sum() + (a * c).sum()).backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64 and c.grad.dtype == np.float64
    np.testing.assert_allclose(a.grad.numpy(), [3.5, 3.5])
    assert b.grad.item() == 3.0


def test_only_floating_tensors_can_require_grad() -> None:
    with pytest.raises(RuntimeError, match="floating point"):
        ag.tensor([1, 2], requires_grad=True)
    with pytest.raises(RuntimeError, match="floating point"):
        ag.tensor([True]).requires_grad_()
    t = ag.arange(3)
    with pytest.raises(RuntimeError):
        t.requires_grad = True
    assert not t.requires_grad
    assert ag.tensor([1.0], dtype=np.float32, requires_grad=True).requires_grad


def test_comparisons_return_non_differentiable_bool_tensors() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    for c, want in [(x < 2, [True, False, False]), (x <= 2, [True, True, False]), (y > 2, [False, False, True]),
                    (y >= 2, [False, True, True]), (x == 2, [False, True, False]), (x != 2, [True, False, True]),
                    (x > y - 0.5, [True, True, True]), (2 < x, [False, False, True])]:
        assert isinstance(c, ag.Tensor) and c.dtype == np.bool_
        assert not c.requires_grad and c.grad_fn is None and c.is_leaf
        assert c.tolist() == want
    assert ((x > 1) & (x < 3)).tolist() == [False, True, False]
    assert ((x < 2) | (x > 2)).tolist() == [True, False, True]
    assert (~(x > 1)).tolist() == [True, False, False]
    assert (np.True_ & (x > 1)).tolist() == [False, True, True]  # reflected: numpy defers to Tensor
    assert (np.array([True, False, False]) | (x > 2)).tolist() == [True, False, True]


# --- memory sharing -------------------------------------------------------------------------------
def test_numpy_shares_memory_also_when_requiring_grad() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    arr = x.numpy()
    assert arr is x.data
    arr[0] = 10.0
    assert x.tolist() == [10.0, 2.0]
    assert x._version == 0  # not tracked


def test_tensor_copies_and_from_numpy_shares() -> None:
    a = np.array([1.0, 2.0, 3.0])
    t, s = ag.tensor(a), ag.from_numpy(a)
    a[0] = 9.0
    assert t.tolist() == [1.0, 2.0, 3.0]
    assert s.tolist() == [9.0, 2.0, 3.0]
    s.add_(1.0)
    np.testing.assert_array_equal(a, [10.0, 3.0, 4.0])
    with pytest.raises(TypeError):
        ag.from_numpy([1.0, 2.0])  # type: ignore[arg-type]


def test_detach_shares_memory_and_version_counter() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    d = y.detach()
    assert d.is_leaf and not d.requires_grad and d.grad_fn is None
    assert np.shares_memory(d.numpy(), y.numpy())
    d.add_(1)
    assert y.tolist() == [3.0, 5.0]
    assert y._version == d._version == 1
    xd = x.detach()
    xd.zero_()  # allowed: the detached tensor does not require grad
    assert x.tolist() == [0.0, 0.0] and x._version == 1


def test_detach_inplace_and_clone() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert y.detach_() is y
    assert y.is_leaf and not y.requires_grad
    c = x.clone()
    assert c.grad_fn is not None and c.grad_fn.name() == "CloneBackward0"
    assert not np.shares_memory(c.numpy(), x.numpy())
    c.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]


# --- attributes and conversions -------------------------------------------------------------------
def test_attributes() -> None:
    x = ag.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    assert x.shape == (2, 3) and x.ndim == 2 and x.dim() == 2 and x.dtype == np.float64
    assert x.is_leaf and x.grad is None and x.grad_fn is None and not x.retains_grad
    assert x.T.shape == (3, 2) and x.T.tolist() == [[0, 3], [1, 4], [2, 5]]
    assert x._version == 0
    y = x * 2
    assert not y.is_leaf and y.requires_grad and y.grad_fn is not None
    assert y.grad_fn is y.grad_fn  # same Node object on every access
    z = ag.tensor([1.0])
    assert not z.requires_grad and z.is_leaf


def test_requires_grad_setter_and_method() -> None:
    x = ag.tensor([1.0, 2.0])
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad = False
    assert not x.requires_grad
    x.requires_grad = True
    y = x * 2
    with pytest.raises(RuntimeError) as exc:
        y.requires_grad = False
    assert str(exc.value) == NONLEAF_MSG
    with pytest.raises(RuntimeError):
        y.requires_grad_(False)
    y.requires_grad = True  # setting True on a non-leaf that requires grad is a no-op
    assert y.requires_grad


def test_item_tolist_size_numel() -> None:
    x = ag.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert x.size() == (2, 3) and x.size(1) == 3 and x.size(-1) == 3
    assert x.numel() == 6 and isinstance(x.numel(), int)
    assert x.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert ag.tensor(2.5).item() == 2.5 and isinstance(ag.tensor(2.5).item(), float)
    assert ag.tensor([7]).item() == 7 and isinstance(ag.tensor(7).item(), int)
    assert ag.tensor(True).item() is True
    assert ag.tensor(3.0).tolist() == 3.0
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        x.item()
    assert float(ag.tensor(1.5)) == 1.5 and int(ag.tensor(3)) == 3
    assert len(x) == 2 and [r.tolist() for r in x] == x.tolist()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x)
    assert bool(ag.tensor([1.0]))
    assert [0, 1, 2][ag.tensor(1)] == 1


def test_ag_functions_and_methods_agree() -> None:
    x = ag.tensor(np.linspace(0.1, 1.0, 6).reshape(2, 3))
    pairs = [
        (ag.exp(x), x.exp()), (ag.sum(x, 1), x.sum(1)), (ag.mean(x, 0, True), x.mean(0, keepdim=True)),
        (ag.max(x, 1).values, x.max(1).values), (ag.var(x), x.var()), (ag.reshape(x, (3, 2)), x.reshape(3, 2)),
        (ag.transpose(x, 0, 1), x.transpose(0, 1)), (ag.permute(x, (1, 0)), x.permute(1, 0)),
        (ag.unsqueeze(x, 0), x.unsqueeze(0)), (ag.squeeze(ag.unsqueeze(x, 0)), x), (ag.flatten(x), x.flatten()),
        (ag.softmax(x, 1), x.softmax(1)), (ag.log_softmax(x, 0), x.log_softmax(0)),
        (ag.clamp(x, 0.2, 0.5), x.clamp(0.2, 0.5)), (ag.where(x > 0.5, x, 0.0), x.where(x > 0.5, 0.0)),
        (ag.add(x, 1, alpha=2), x.add(1, alpha=2)), (ag.sub(x, 1), x.sub(1)), (ag.mul(x, x), x.mul(x)),
        (ag.div(x, 2), x.div(2)), (ag.pow(x, 2), x.pow(2)), (ag.neg(x), x.neg()), (ag.matmul(x, x.T), x @ x.T),
        (ag.abs(x), abs(x)), (ag.sqrt(x), x.sqrt()), (ag.log(x), x.log()), (ag.sin(x), x.sin()),
        (ag.cos(x), x.cos()), (ag.tanh(x), x.tanh()), (ag.sigmoid(x), x.sigmoid()), (ag.relu(x), x.relu()),
        (ag.erf(x), x.erf()), (ag.minimum(x, 0.5), x.minimum(ag.tensor(0.5))),
    ]
    for a, b in pairs:
        np.testing.assert_allclose(a.numpy(), b.numpy())
    assert ag.tensor([1.0, 2.0]).add(ag.tensor([1.0, 1.0]), alpha=3).tolist() == [4.0, 5.0]


def test_dtype_conversions() -> None:
    x = ag.tensor([1.5, 2.5], requires_grad=True)
    f = x.float()
    assert f.dtype == np.float32 and f.grad_fn is not None
    (f * 2).sum().backward()
    assert x.grad.dtype == np.float64 and x.grad.tolist() == [2.0, 2.0]
    assert x.long().dtype == np.int64 and x.long().tolist() == [1, 2] and not x.long().requires_grad
    assert x.double() is x
    assert x.to(np.float32).dtype == np.float32


def test_repr() -> None:
    assert repr(ag.tensor([1.0, 2.0], dtype=np.float32)) == "tensor([1., 2.])"
    assert "requires_grad=True" in repr(ag.tensor([1.0], requires_grad=True))
    assert "grad_fn=<MulBackward0>" in repr(ag.tensor([1.0], requires_grad=True) * 2)
    assert "dtype=float64" in repr(ag.tensor([1.0], dtype=np.float64))


def test_grad_setter_checks_shape_and_dtype() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    x.grad = ag.tensor([1.0, 1.0])
    assert x.grad.tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError):
        x.grad = ag.tensor([1.0])
    with pytest.raises(RuntimeError):
        x.grad = ag.tensor([1.0, 1.0], dtype=np.float32)
    x.grad = None
    assert x.grad is None


def test_nonleaf_grad_access_warns() -> None:
    x = ag.tensor([1.0], requires_grad=True)
    y = x * 2
    with pytest.warns(UserWarning, match="not a leaf"):
        assert y.grad is None
    y.retain_grad()
    assert y.retains_grad
    (y * 3).sum().backward()
    assert y.grad.tolist() == [3.0]


def test_broadcasting_errors_are_runtime_errors() -> None:
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        ag.ones(2) + ag.ones(3)
    with pytest.raises(RuntimeError):
        ag.where(ag.tensor([True, False]), ag.ones(2), ag.ones(3))


def test_zero_dim_indexing_is_a_view() -> None:
    x = ag.tensor([1.0, 2.0, 3.0])
    e = x[1]
    assert e.shape == ()
    e.add_(10)
    assert x.tolist() == [1.0, 12.0, 3.0] and x._version == 1


def test_reshape_copy_is_not_a_view() -> None:
    x = ag.tensor(np.arange(6.0).reshape(2, 3))
    r = x.T.reshape(6)  # numpy has to copy here
    r.add_(100)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert x._version == 0
    v = x.reshape(6)  # a real view
    v.add_(1)
    assert x.tolist() == [[1, 2, 3], [4, 5, 6]] and x._version == 1


def test_tensors_hash_by_identity() -> None:
    """Tensors key dicts and sets by identity (``==`` is elementwise), and an in-place
    change keeps the key: the engine stages gradients in dicts keyed by leaves."""
    a, b = ag.ones(3), ag.ones(3)
    d = {a: 1, b: 2}
    assert len(d) == 2 and d[a] == 1 and d[b] == 2
    h = hash(a)
    a.add_(1)
    assert hash(a) == h and d[a] == 1 and a in {a} and b not in {a}
