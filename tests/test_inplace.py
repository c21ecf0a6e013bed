"""In-place operations: version counters, leaf errors, recording on non-leaves, and the
saved-tensor version check (PyTorch's test_inplace family)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import asyncgrad as ag

LEAF_MSG = "a leaf Variable that requires grad is being used in an in-place operation."
VIEW_MSG = "a view of a leaf Variable that requires grad is being used in an in-place operation."
MODIFIED = "modified by an inplace operation"

INPLACE: list[tuple[str, Callable[[ag.Tensor], Any]]] = [
    ("add_", lambda t: t.add_(1.0)),
    ("add_alpha", lambda t: t.add_(ag.ones(3), alpha=2.0)),
    ("sub_", lambda t: t.sub_(ag.ones(3))),
    ("mul_", lambda t: t.mul_(2.0)),
    ("div_", lambda t: t.div_(2.0)),
    ("pow_", lambda t: t.pow_(2)),
    ("zero_", lambda t: t.zero_()),
    ("fill_", lambda t: t.fill_(3.0)),
    ("copy_", lambda t: t.copy_(ag.tensor([7.0, 8.0, 9.0]))),
    ("clamp_", lambda t: t.clamp_(0.0, 1.5)),
    ("relu_", lambda t: t.relu_()),
    ("exp_", lambda t: t.exp_()),
    ("neg_", lambda t: t.neg_()),
    ("setitem", lambda t: t.__setitem__(0, 5.0)),
    ("setitem_slice", lambda t: t.__setitem__(slice(1, None), ag.tensor([5.0, 6.0]))),
    ("setitem_mask", lambda t: t.__setitem__(t > 1.5, 0.0)),
    ("iadd", lambda t: t.__iadd__(1.0)),
    ("isub", lambda t: t.__isub__(1.0)),
    ("imul", lambda t: t.__imul__(2.0)),
    ("itruediv", lambda t: t.__itruediv__(2.0)),
]
IDS = [n for n, _ in INPLACE]

REF: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "add_": lambda a: a + 1, "add_alpha": lambda a: a + 2, "sub_": lambda a: a - 1,
    "mul_": lambda a: a * 2, "div_": lambda a: a / 2, "pow_": lambda a: a ** 2,
    "zero_": lambda a: a * 0, "fill_": lambda a: a * 0 + 3, "copy_": lambda a: np.array([7.0, 8.0, 9.0]),
    "clamp_": lambda a: np.clip(a, 0, 1.5), "relu_": lambda a: np.maximum(a, 0), "exp_": np.exp,
    "neg_": lambda a: -a, "setitem": lambda a: np.array([5.0, *a[1:]]),
    "setitem_slice": lambda a: np.array([a[0], 5.0, 6.0]), "setitem_mask": lambda a: np.where(a > 1.5, 0, a),
    "iadd": lambda a: a + 1, "isub": lambda a: a - 1, "imul": lambda a: a * 2, "itruediv": lambda a: a / 2,
}


# --- version counter -------------------------------------------------------------------------------
@pytest.mark.parametrize("name,op", INPLACE, ids=IDS)
def test_inplace_bumps_version_and_writes_same_memory(name: str, op: Callable[[ag.Tensor], Any]) -> None:
    data = np.array([-1.0, 1.0, 2.0])
    t = ag.tensor(data)
    mem = t.numpy()
    view = t[:]
    assert t._version == 0
    op(t)
    assert t._version >= 1
    assert view._version == t._version  # views share the counter
    assert t.numpy() is mem  # same array object, changed in place
    np.testing.assert_allclose(mem, REF[name](data))


def test_inplace_returns_self_and_counts_each_op() -> None:
    t = ag.zeros(3)
    assert t.add_(1) is t
    assert t.mul_(2) is t
    t += 1
    t[0] = 3.0
    assert t._version == 4
    np.testing.assert_array_equal(t.numpy(), [3.0, 3.0, 3.0])


def test_version_shared_with_views_and_detach() -> None:
    t = ag.zeros(2, 3)
    v, d, r = t[0], t.detach(), t.reshape(6)
    v.add_(1)
    assert t._version == d._version == r._version == 1
    d.mul_(2)
    assert t._version == 2
    np.testing.assert_array_equal(t.numpy()[0], [2.0, 2.0, 2.0])
    t.numpy()[:] = 0  # changes through numpy() are not tracked
    assert t._version == 2


# --- leaf errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,op", INPLACE, ids=IDS)
def test_inplace_on_leaf_requiring_grad_raises(name: str, op: Callable[[ag.Tensor], Any]) -> None:
    x = ag.tensor([-1.0, 1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError) as exc:
        op(x)
    assert str(exc.value) == LEAF_MSG
    assert x._version == 0
    np.testing.assert_array_equal(x.numpy(), [-1.0, 1.0, 2.0])


def test_inplace_on_view_of_leaf_raises() -> None:
    x = ag.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    for view in (x[0], x[:, 1], x.view(4), x.T, x.unsqueeze(0)):
        with pytest.raises(RuntimeError) as exc:
            view.mul_(2)
        assert str(exc.value) == VIEW_MSG
    assert x._version == 0


@pytest.mark.parametrize("name,op", INPLACE, ids=IDS)
def test_inplace_under_no_grad_allowed_and_bumps_version(name: str, op: Callable[[ag.Tensor], Any]) -> None:
    data = np.array([-1.0, 1.0, 2.0])
    x = ag.tensor(data, requires_grad=True)
    with ag.no_grad():
        op(x)
    assert x._version >= 1
    assert x.is_leaf and x.requires_grad and x.grad_fn is None
    np.testing.assert_allclose(x.numpy(), REF[name](data))
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * REF[name](data))


def test_no_grad_modification_breaks_saved_tensor() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    z = (x * x).sum()
    with ag.no_grad():
        x *= 2
    assert x._version == 1
    with pytest.raises(RuntimeError, match=MODIFIED):
        z.backward()


# --- recording on non-leaves -----------------------------------------------------------------------
def test_mul_inplace_on_nonleaf() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y.mul_(3)
    assert y.grad_fn is not None and y.grad_fn.name() == "MulBackward0"
    assert y._version == 1 and not y.is_leaf
    np.testing.assert_array_equal(y.numpy(), [6.0, 12.0, 18.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 6.0, 6.0])


@pytest.mark.parametrize("name,op", INPLACE, ids=IDS)
def test_inplace_on_nonleaf_gradients_match_out_of_place(name: str, op: Callable[[ag.Tensor], Any]) -> None:
    """d/dx sum(w * f(x * 1.5)) with f applied in place equals the out-of-place derivative."""
    data = np.array([-1.0, 1.2, 2.0])  # y = x * 1.5 stays away from the kinks at 0 and 1.5
    w = np.array([1.0, -2.0, 0.5])
    x = ag.tensor(data, requires_grad=True)
    y = x * 1.5
    op(y)
    np.testing.assert_allclose(y.numpy(), REF[name](data * 1.5))
    (y * ag.tensor(w)).sum().backward()
    eps = 1e-6
    num = np.array([(np.sum(w * REF[name]((data + eps * e) * 1.5)) - np.sum(w * REF[name]((data - eps * e) * 1.5)))
                    / (2 * eps) for e in np.eye(3)])
    np.testing.assert_allclose(x.grad.numpy(), num, atol=1e-6)


def test_setitem_zeroes_gradient_and_value_gets_gradient() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y[0] = 0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 2.0, 2.0])

    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    v = ag.tensor(5.0, requires_grad=True)
    y = x * 2
    y[1] = v * 3
    np.testing.assert_array_equal(y.numpy(), [2.0, 15.0, 6.0])
    (y * y).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [8.0, 0.0, 24.0])
    assert v.grad.item() == 2 * 15.0 * 3


def test_setitem_on_plain_tensor_with_grad_value_records() -> None:
    buf = ag.zeros(2, 3)
    v = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    buf[1] = v
    assert buf.requires_grad and not buf.is_leaf
    (buf * buf).sum().backward()
    np.testing.assert_array_equal(v.grad.numpy(), [2.0, 4.0, 6.0])


def test_setitem_advanced_index_and_broadcast_value() -> None:
    x = ag.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    v = ag.tensor([10.0], requires_grad=True)
    y = x * 1.0
    y[[0, 1], [2, 0]] = v
    np.testing.assert_array_equal(y.numpy(), [[0, 1, 10], [10, 4, 5]])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 1, 0], [0, 1, 1]])
    assert v.grad.item() == 2.0


def test_copy_into_nonleaf_from_tensor_requiring_grad() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    s = ag.tensor([3.0], requires_grad=True)
    y = x * 2
    y.copy_(s * s)
    np.testing.assert_array_equal(y.numpy(), [9.0, 9.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])
    assert s.grad.item() == 12.0


def test_inplace_on_plain_tensor_with_grad_argument_records() -> None:
    a = ag.ones(3)
    w = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    a.mul_(w)
    a.add_(w)
    assert a.requires_grad and a.grad_fn is not None
    a.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0, 2.0])


def test_iadd_chain_on_nonleaf() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    y += x
    y *= x
    y.sum().backward()
    xs = np.array([1.0, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), 3 * xs ** 2 + 2 * xs)


def test_inplace_dtype_rules() -> None:
    t = ag.tensor([1, 2, 3])
    t.add_(2)
    assert t.dtype == np.int64
    with pytest.raises(RuntimeError):
        t.mul_(1.5)  # float result cannot be written into int64
    f = ag.tensor([1.0, 2.0], dtype=np.float32)
    f.mul_(2.5)
    assert f.dtype == np.float32
    with pytest.raises(RuntimeError):
        ag.zeros(2).add_(ag.ones(3))


# --- saved tensors modified in place ----------------------------------------------------------------
def test_inplace_invalidates_only_nodes_that_saved_the_tensor() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = ag.tensor([3.0, 4.0], requires_grad=True)
    z = x * y
    q = z + y
    w = z * y
    z.add_(2)
    q.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 3.0])
    with pytest.raises(RuntimeError, match=MODIFIED) as exc:
        w.sum().backward()
    assert "is at version 1; expected version 0 instead" in str(exc.value)


def test_detach_then_inplace_breaks_backward() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    yy = y * y
    y.detach().add_(1)
    assert y._version == 1
    with pytest.raises(RuntimeError, match=MODIFIED):
        yy.sum().backward()


def test_inplace_on_output_saved_by_exp() -> None:
    x = ag.tensor([0.5, 1.0], requires_grad=True)
    y = x.exp()  # saves its output
    y.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()


def test_inplace_after_unrelated_use_is_fine() -> None:
    x = ag.tensor([0.5, 1.0], requires_grad=True)
    y = x * 3
    s = y.sum()  # SumBackward0 saves nothing
    y.mul_(10)
    s.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


# --- in-place on views of non-leaves ------------------------------------------------------------------
def test_augmented_assignment_into_slice_of_nonleaf() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y[1:] += x[:2] * 10
    np.testing.assert_array_equal(y.numpy(), [2.0, 14.0, 26.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [12.0, 12.0, 2.0])


def test_inplace_on_view_of_nonleaf_updates_base_gradient() -> None:
    x = ag.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 1.0
    col = y[:, 0]
    col.mul_(5)
    np.testing.assert_array_equal(y.numpy(), [[5.0, 2.0], [15.0, 4.0]])
    assert y._version == 1 and col._version == 1
    (y * y).sum().backward()
    ys = np.array([[5.0, 2.0], [15.0, 4.0]])
    np.testing.assert_array_equal(x.grad.numpy(), 2 * ys * np.array([[5.0, 1.0], [5.0, 1.0]]))


def test_inplace_on_reshaped_and_transposed_views_of_nonleaf() -> None:
    x = ag.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = x + 0.0
    y.T[0].zero_()  # column 0 of y
    y.view(6)[5:].mul_(3)
    np.testing.assert_array_equal(y.numpy(), [[0, 1, 2], [0, 4, 15]])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 1], [0, 1, 3]])


def test_view_gradient_after_base_inplace() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    v = y[1:]
    v.mul_(2)
    v.sum().backward()  # through the view, which now reads the updated base
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 2.0, 2.0])


def test_existing_views_follow_an_inplace_change_of_their_base() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    v = y[1:]
    y.mul_(2)  # v now reads 2 * x[1:]
    np.testing.assert_array_equal(v.numpy(), [4.0, 6.0])
    v.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 2.0, 2.0])


def test_sibling_view_sees_inplace_through_another_view() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    v, w = y[1:], y[:2]
    v.mul_(3)  # y = [1, 6, 9]; w = [1, 6]
    np.testing.assert_array_equal(w.numpy(), [1.0, 6.0])
    (w * w).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 36.0, 0.0])


def test_inplace_on_expanded_view_raises() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = (x * 1.0).expand(3, 2)
    with pytest.raises(RuntimeError):
        y.add_(1)


def test_inplace_node_names_follow_pytorch() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    src = x * 2
    cases = {
        "AddBackward0": lambda t: t.add_(1), "SubBackward0": lambda t: t.sub_(1), "MulBackward0": lambda t: t.mul_(2),
        "DivBackward0": lambda t: t.div_(2), "ZeroBackward0": lambda t: t.zero_(),
        "FillBackward2": lambda t: t.fill_(2.0),
        "CopyBackwards": lambda t: t.copy_(src), "ClampBackward1": lambda t: t.clamp_(0, 1),
        "ReluBackward0": lambda t: t.relu_(), "ExpBackward0": lambda t: t.exp_(), "NegBackward0": lambda t: t.neg_(),
        "PowBackward0": lambda t: t.pow_(2), "CopySlices": lambda t: t.__setitem__(0, 1.0),
        "IndexPutBackward0": lambda t: t.__setitem__([0, 1], 1.0),
    }
    for name, op in cases.items():
        y = x * 1
        op(y)
        assert y.grad_fn is not None and y.grad_fn.name() == name
    y = x * 1
    y[1:].mul_(2)
    assert y.grad_fn is not None and y.grad_fn.name() == "CopySlices"


def test_view_created_under_no_grad_cannot_be_modified_with_grad_mode_on() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    with ag.no_grad():
        v = y[1:]
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        v.mul_(2)
    with ag.no_grad():
        v.mul_(2)  # both inside no_grad: allowed, not tracked
    assert y.tolist() == [1.0, 4.0, 6.0] and y._version == 1


async def test_inplace_graph_through_async_backward() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y.mul_(3)
    y[0] = 0
    await ag.backward(y.sum())
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 6.0, 6.0])
    z = x * x
    w = z * z
    z.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED):
        await ag.backward(w.sum())
    (g,) = await ag.grad((z * 1.0).sum(), [x])  # the in-place add itself is differentiable
    np.testing.assert_array_equal(g.numpy(), 2 * x.numpy())


@st.composite
def _basic_index(draw: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    idx: list[Any] = []
    for n in shape:
        kind = draw(st.sampled_from(["int", "slice", "full"]))
        if kind == "int":
            idx.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.one_of(st.none(), st.integers(-n, n)))
            stop = draw(st.one_of(st.none(), st.integers(-n, n)))
            idx.append(slice(start, stop, draw(st.sampled_from([None, 1, 2, -1, -2]))))
        else:
            idx.append(slice(None))
    if draw(st.booleans()):
        idx.insert(draw(st.integers(0, len(idx))), None)
    return tuple(idx)


@settings(max_examples=40, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), data=st.data())
def test_inplace_through_random_basic_views(shape: tuple[int, ...], data: Any) -> None:
    """``y[idx].mul_(s).add_(x[idx] ** 2)`` on a non-leaf ``y = x * 1`` against numpy."""
    idx = data.draw(_basic_index(shape))
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal(shape), rng.standard_normal(shape)
    x = ag.tensor(a, requires_grad=True)
    y = x * 1.0
    v = y[idx]
    if v.numel() == 0:
        return
    s_np = rng.standard_normal(v.shape)
    s = ag.tensor(s_np, requires_grad=True)
    v.mul_(s).add_(x[idx] ** 2)
    (y * ag.tensor(w)).sum().backward()
    full = idx + (Ellipsis,)  # numpy views even where idx is all ints
    want_y = a.copy()
    want_y[full] = a[full] * s_np + a[full] ** 2
    want_gx = w.copy()
    want_gx[full] = w[full] * s_np + 2 * a[full] * w[full]
    np.testing.assert_allclose(y.numpy(), want_y)
    np.testing.assert_allclose(x.grad.numpy(), want_gx)
    np.testing.assert_allclose(s.grad.numpy(), w[full] * a[full])


def test_expanded_view_follows_inplace_change_of_base() -> None:
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    e = y.expand(3, 2)
    y.mul_(5)
    np.testing.assert_array_equal(e.numpy(), [[5.0, 10.0]] * 3)
    e.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [15.0, 15.0])


def test_inplace_through_view_with_wrong_broadcast_shape_raises() -> None:
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        y[1:].add_(ag.ones(3, 2))
    assert y._version == 0 and y.tolist() == [1.0, 2.0, 3.0]


_VIEWS: list[Callable[[Any], Any]] = [
    lambda t: t, lambda t: t[0], lambda t: t[1:], lambda t: t.transpose(0, -1), lambda t: t.reshape(-1),
    lambda t: t[..., :1], lambda t: t[None, ..., -1:],
]
_OPS: list[Callable[[Any, Any], Any]] = [
    lambda v, o: v.mul_(o), lambda v, o: v.add_(o * 0.5), lambda v, o: v.sub_(o), lambda v, o: v.div_(o * o + 1),
    lambda v, o: v.clamp_(-0.3, 0.4), lambda v, o: v.zero_(), lambda v, o: v.fill_(0.7),
    lambda v, o: v.copy_(o.exp()), lambda v, o: v.neg_(), lambda v, o: v.__iadd__(o),
]


@pytest.mark.parametrize("seed", range(8))
def test_random_inplace_programs_match_torch(seed: int) -> None:
    """Chains of in-place ops through views of a non-leaf (keeping some views alive and using
    them afterwards) give PyTorch's values and gradients."""
    torch = pytest.importorskip("torch")
    import random

    for trial in range(25):
        r = random.Random(seed * 1000 + trial)
        shape = tuple(r.randint(1, 3) for _ in range(r.randint(1, 3)))
        data, odata = (np.round(np.random.default_rng(seed * 1000 + trial + k).standard_normal(shape), 2)
                       for k in (0, 7))
        steps = [(r.randrange(len(_VIEWS)), r.randrange(len(_OPS)), r.random() < 0.3) for _ in range(r.randint(1, 4))]
        results = []
        for lib in (ag, torch):
            x, o = lib.tensor(data, requires_grad=True), lib.tensor(odata, requires_grad=True)
            y = x * 1.5
            kept = []
            for vi, oi, keep in steps:
                view = _VIEWS[vi](y)
                operand = o.reshape(-1)[:view.numel()].reshape(view.shape) if view.numel() <= o.numel() else o.sum()
                if keep:
                    kept.append(view)
                _OPS[oi](view, operand)
            out = (y * y).sum() + sum((k.sum() * 3 for k in kept), lib.tensor(0.0))
            gx, go = (ag.grad_sync if lib is ag else torch.autograd.grad)(
                out, [x, o], allow_unused=True, materialize_grads=True)
            results.append((np.array(y.detach().numpy()), gx.detach().numpy(), go.detach().numpy()))
        for ours, theirs in zip(*results):
            np.testing.assert_allclose(ours, theirs, atol=1e-12)
