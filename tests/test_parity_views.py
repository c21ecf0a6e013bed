"""Views added for PyTorch parity (issue 13): narrow, view_as, select, unbind, split,
chunk, diagonal, contiguous, and ``view`` refusing to copy.

Gradients are checked by finite differences in test_ops_gradcheck.py; here: values and
gradients against torch, memory sharing, version counters, in-place semantics, errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgrad as ag


def arr(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape)


# --- memory sharing and version counters ------------------------------------------------------
VIEWS: list[tuple[str, Callable[[ag.Tensor], ag.Tensor]]] = [
    ("narrow", lambda x: x.narrow(1, 1, 2)),
    ("view_as", lambda x: x.view_as(ag.zeros(4, 3))),
    ("select", lambda x: x.select(0, 2)),
    ("unbind", lambda x: x.unbind(1)[3]),
    ("split", lambda x: x.split(2, 1)[1]),
    ("split_sections", lambda x: x.split([1, 2], 0)[1]),
    ("chunk", lambda x: x.chunk(2, 0)[1]),
    ("diagonal", lambda x: x.diagonal(1)),
]


@pytest.mark.parametrize("name,make", VIEWS, ids=[v[0] for v in VIEWS])
def test_views_share_memory_and_version_counter(name: str, make: Callable[[ag.Tensor], ag.Tensor]) -> None:
    x = ag.tensor(arr(3, 4))
    v = make(x)
    assert v._base is x and np.shares_memory(v.numpy(), x.numpy())
    x.add_(1.0)  # an in-place change of the base is seen by the view ...
    assert v._version == x._version == 1
    before = x.numpy().copy()
    v.mul_(0.0)  # ... and one through the view reaches the base
    assert x._version == 2
    assert (x.numpy() == 0).sum() == v.numel() and not np.array_equal(x.numpy(), before)


def test_view_of_view_keeps_the_first_base() -> None:
    x = ag.tensor(arr(4, 4))
    v = x.narrow(0, 1, 3).select(1, 2).unbind(0)[1]
    assert v._base is x
    v.fill_(7.0)
    assert x.numpy()[2, 2] == 7.0


def test_contiguous_returns_self_or_a_copy_in_the_graph() -> None:
    x = ag.tensor(arr(2, 3), requires_grad=True)
    assert x.contiguous() is x and x.is_contiguous()
    t = x.T
    assert not t.is_contiguous()
    c = t.contiguous()
    assert c.is_contiguous() and c.data.flags.c_contiguous
    assert not np.shares_memory(c.numpy(), x.numpy())
    assert c.grad_fn is not None and c.grad_fn.name() == "CloneBackward0"
    np.testing.assert_array_equal(c.numpy(), x.numpy().T)
    c.view(6)  # now possible


def test_view_of_non_contiguous_raises_as_pytorch_and_reshape_copies() -> None:
    x = ag.tensor(arr(2, 3))
    t = x.T
    with pytest.raises(RuntimeError, match=r"view size is not compatible with input tensor's size and stride "
                       r"\(at least one dimension spans across two contiguous subspaces\)\. "
                       r"Use \.reshape\(\.\.\.\) instead\."):
        t.view(6)
    v0 = t._version
    r = t.reshape(6)  # copies instead
    np.testing.assert_array_equal(r.numpy(), x.numpy().T.reshape(6))
    assert not np.shares_memory(r.numpy(), x.numpy()) and t._version == v0
    # a view that needs no copy still works on a non-contiguous tensor (splitting a dim)
    y = ag.tensor(arr(4, 6))[:, ::2]
    w = y.view(2, 2, 3)
    assert np.shares_memory(w.numpy(), y.numpy())
    # an expanded tensor: splitting the expanded dim is a view, flattening it is not
    e = ag.ones(3, 1).expand(3, 4)
    assert e.view(3, 2, 2).shape == (3, 2, 2)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        e.view(12)
    with pytest.raises(RuntimeError, match=r"shape '\[5\]' is invalid for input of size 6"):
        x.view(5)
    with pytest.raises(RuntimeError, match="only one dimension can be inferred"):
        x.view(-1, -1)
    assert x.view(-1, 2).shape == (3, 2)


def test_inplace_on_base_is_seen_by_views_in_backward() -> None:
    a = ag.tensor(arr(3, 4), requires_grad=True)
    b = ag.tensor(arr(4), requires_grad=True)
    y = a * 1.0
    d = y.select(0, 1)
    y.mul_(b)  # the view d now reads the new values
    loss = (d * d).sum()
    ga, gb = ag.grad_sync(loss, [a, b])
    # d = a[1] * b, so dloss/da[1] = 2 d b, dloss/db = 2 d a[1]
    dv = a.numpy()[1] * b.numpy()
    np.testing.assert_allclose(ga.numpy()[1], 2 * dv * b.numpy())
    np.testing.assert_allclose(ga.numpy()[[0, 2]], 0.0)
    np.testing.assert_allclose(gb.numpy(), 2 * dv * a.numpy()[1])


def test_saved_view_modified_in_place_raises() -> None:
    a = ag.tensor(arr(3, 3), requires_grad=True)
    y = a * 1.0
    d = y.diagonal()
    z = d.exp()  # saves its output... and d is saved by the next op
    w = (d * z).sum()
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ag.grad_sync(w, [a])


@pytest.mark.parametrize("make,name", [
    (lambda y: y.unbind(0), "Unbind"), (lambda y: y.split(1), "Split"),
    (lambda y: y.split([2, 1]), "SplitWithSizes"), (lambda y: y.chunk(3), "Split"),
])
def test_multi_output_views_refuse_inplace_when_recording(make: Callable[[ag.Tensor], Any], name: str) -> None:
    a = ag.tensor(arr(3, 2), requires_grad=True)
    y = a * 1.0
    parts = make(y)
    before = y.numpy().copy()
    with pytest.raises(RuntimeError, match=rf"Output 1 of {name} is a view and is being modified inplace\. This "
                       "view is the output of a function that returns multiple views"):
        parts[1].mul_(2.0)
    np.testing.assert_array_equal(y.numpy(), before)  # nothing changed
    assert parts[1]._version == 0
    with ag.no_grad():  # not recorded: allowed, as in PyTorch
        parts[1].mul_(2.0)
    np.testing.assert_array_equal(y.numpy()[1:2] if name != "SplitWithSizes" else y.numpy()[2:],
                                  (before[1:2] if name != "SplitWithSizes" else before[2:]) * 2.0)
    # without grad there is no restriction either
    plain = make(ag.tensor(arr(3, 2)))
    plain[0].add_(1.0)


def test_view_errors_as_pytorch() -> None:
    x = ag.tensor(arr(3, 4))
    before = x.numpy().copy()
    with pytest.raises(IndexError,
                       match=r"select\(\): index 5 out of range for tensor of size \[3, 4\] at dimension 0"):
        x.select(0, 5)
    with pytest.raises(IndexError, match=r"Dimension out of range"):
        x.select(2, 0)
    with pytest.raises(RuntimeError, match=r"start \(2\) \+ length \(5\) exceeds dimension size \(3\)\."):
        x.narrow(0, 2, 5)
    with pytest.raises(IndexError, match=r"start out of range \(expected to be in range of \[-3, 3\], but got 5\)"):
        x.narrow(0, 5, 1)
    with pytest.raises(RuntimeError,
                       match=r"split_size can only be 0 if dimension size is 0, but got dimension size of 3"):
        x.split(0)
    with pytest.raises(RuntimeError, match=r"split_with_sizes expects split_sizes to sum exactly to 3 \(input "
                       r"tensor's size at dimension 0\), but got split_sizes=\[1, 1\]"):
        x.split([1, 1])
    with pytest.raises(RuntimeError, match="chunk expects `chunks` to be greater than 0, got: 0"):
        x.chunk(0)
    with pytest.raises(RuntimeError, match="diagonal dimensions cannot be identical 0, 0"):
        x.diagonal(0, 0, 0)
    with pytest.raises(IndexError, match=r"select\(\) cannot be applied to a 0-dim tensor"):
        ag.tensor(1.0).select(0, 0)
    np.testing.assert_array_equal(x.numpy(), before)


def test_split_and_chunk_piece_counts_as_pytorch() -> None:
    x = ag.tensor(arr(5, 2))
    assert [p.shape[0] for p in x.split(2)] == [2, 2, 1]
    assert [p.shape[0] for p in x.split(7)] == [5]
    assert [p.shape[0] for p in x.chunk(3)] == [2, 2, 1]
    assert [p.shape[0] for p in x.chunk(4)] == [2, 2, 1]  # ceil(5/4) = 2: fewer pieces
    assert [p.shape[1] for p in x.chunk(5, 1)] == [1, 1]
    assert len(x.unbind(1)) == 2 and x.unbind(1)[0].shape == (5,)
    assert [p.shape for p in ag.tensor(np.zeros((0, 2))).split(2)] == [(0, 2)]


# --- PyTorch as an oracle ------------------------------------------------------------------------
ORACLE: list[tuple[str, Callable[[Any], Any], tuple[int, ...]]] = [
    ("narrow", lambda x: x.narrow(1, -3, 2), (2, 4)),
    ("view_as", lambda x: x.view_as(x.reshape(4, 2)) * 1.0, (2, 4)),
    ("select", lambda x: x.select(-1, 1), (2, 3, 2)),
    ("unbind", lambda x: x.unbind(1)[2] * x.unbind(1)[0], (2, 3)),
    ("split", lambda x: x.split(2, 1)[-1], (2, 5)),
    ("split_sections", lambda x: x.split([2, 0, 3], 1)[2], (2, 5)),
    ("chunk", lambda x: x.chunk(4)[1] * 3.0, (7, 2)),
    ("diagonal", lambda x: x.diagonal(), (3, 4)),
    ("diagonal_offset", lambda x: x.diagonal(-1, 0, 2), (4, 2, 3)),
    ("diagonal_far_offset", lambda x: x.diagonal(5) * 1.0, (3, 4)),
    ("contiguous", lambda x: x.transpose(0, 1).contiguous(), (2, 3)),
]


@pytest.mark.parametrize("name,fn,shape", ORACLE, ids=[o[0] for o in ORACLE])
def test_views_match_torch(name: str, fn: Callable[[Any], Any], shape: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    a = arr(*shape)
    x = ag.tensor(a, requires_grad=True)
    t = torch.tensor(a, requires_grad=True)
    out, tout = fn(x), fn(t)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy())
    assert out.grad_fn is not None and out.grad_fn.name() == tout.grad_fn.name()
    w = np.random.default_rng(1).standard_normal(out.shape)
    ag.backward_sync(out, ag.tensor(w))
    tout.backward(torch.tensor(w))
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy())


def test_inplace_through_views_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    a0, b0 = arr(3, 4), arr(3)

    def run(lib: Any, a: Any, b: Any) -> Any:
        y = a * 1.0
        y.narrow(1, 1, 3).diagonal().mul_(b)
        y.select(0, 2).add_(b[0] * 2)
        return (y * y).sum()

    a, b = ag.tensor(a0, requires_grad=True), ag.tensor(b0, requires_grad=True)
    ta, tb = torch.tensor(a0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    ga = ag.grad_sync(run(ag, a, b), [a, b])
    tg = torch.autograd.grad(run(torch, ta, tb), [ta, tb])
    for g, t in zip(ga, tg):
        np.testing.assert_allclose(g.numpy(), t.numpy())


def test_split_chunk_narrow_shapes_match_torch_over_many_sizes() -> None:
    torch = pytest.importorskip("torch")
    for n in range(0, 8):
        a = np.arange(n * 2.0).reshape(n, 2)
        x, t = ag.tensor(a), torch.tensor(a)
        for k in range(1, 9):
            assert [p.shape for p in x.split(k)] == [tuple(p.shape) for p in t.split(k)], (n, k)
            assert [p.shape for p in x.chunk(k)] == [tuple(p.shape) for p in t.chunk(k)], (n, k)
            for p, q in zip(x.chunk(k), t.chunk(k)):
                np.testing.assert_array_equal(p.numpy(), q.numpy())
        for start in range(-n, n + 1):
            for length in range(0, n - (start + n if start < 0 else start) + 1):
                np.testing.assert_array_equal(x.narrow(0, start, length).numpy(), t.narrow(0, start, length).numpy())


@pytest.mark.parametrize("make,slices,name", [
    (lambda y: y.unbind(1), lambda y: [y[:, 0], y[:, 1], y[:, 2]], "UnbindBackward0"),
    (lambda y: y.split(2, 1), lambda y: [y[:, :2], y[:, 2:]], "SplitBackward0"),
    (lambda y: y.split([1, 2], 1), lambda y: [y[:, :1], y[:, 1:]], "SplitWithSizesBackward0"),
    (lambda y: y.chunk(2, 1), lambda y: [y[:, :2], y[:, 2:]], "SplitBackward0"),
])
def test_multi_output_views_share_one_node_as_pytorch(make: Callable[[ag.Tensor], Any],
                                                      slices: Callable[[ag.Tensor], Any], name: str) -> None:
    a = ag.tensor(arr(2, 3), requires_grad=True)
    y = a * 1.0
    parts = make(y)
    node = parts[0].grad_fn
    assert node is not None and node.name() == name
    assert all(p.grad_fn is node for p in parts) and [p.output_nr for p in parts] == list(range(len(parts)))
    assert node.next_functions == ((y.grad_fn, 0),)
    # only some outputs used: the others count as zeros; hooks and retain_grad work per output
    seen: list[np.ndarray] = []
    parts[-1].register_hook(lambda g: seen.append(g.numpy().copy()))
    parts[0].retain_grad()

    def loss_of(ps: Any) -> ag.Tensor:
        return (ps[0] * 3.0).sum() + (ps[-1] * ps[-1]).sum()

    (g,) = ag.grad_sync(loss_of(parts), [a], retain_graph=True)
    (expect,) = ag.grad_sync(loss_of(slices(a * 1.0)), [a])
    np.testing.assert_allclose(g.numpy(), expect.numpy())
    assert len(seen) == 1 and seen[0].shape == parts[-1].shape
    ag.backward_sync(loss_of(parts))
    np.testing.assert_array_equal(parts[0].grad.numpy(), np.full(parts[0].shape, 3.0))


def test_multi_output_views_without_grad_record_nothing() -> None:
    x = ag.tensor(arr(3, 2))
    assert all(p.grad_fn is None and not p.requires_grad for p in x.unbind())
    a = ag.tensor(arr(3, 2), requires_grad=True)
    with ag.no_grad():
        parts = (a * 1.0).split(1)
    assert all(p.grad_fn is None for p in parts)
    parts[0].mul_(2.0)  # allowed: nothing recorded


@pytest.mark.parametrize("make_view", [lambda x: x.unbind(0)[1], lambda x: x.split(1)[1], lambda x: x.chunk(5)[1]],
                         ids=["unbind", "split", "chunk"])
def test_multi_output_view_of_a_plain_tensor_follows_its_in_place_history(make_view):
    # as a slice does (issue 13 item 4): v is x[1] after x.add_(r), so d/dr (v * r) = 1 + 2r = 3
    r = ag.ones(1, requires_grad=True)
    x = ag.ones(5)
    v = make_view(x)
    x.add_(r)
    (v * r).sum().backward()
    assert r.grad.tolist() == [3.0]
