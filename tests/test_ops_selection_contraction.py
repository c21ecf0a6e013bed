"""einsum, tensordot, gather, index_select, unfold, scatter(_add), amax/amin (issue 32):
values, gradients (gradcheck and gradgradcheck in float64), errors, and, where torch is
installed, values and gradients equal to PyTorch's."""

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import gradcheck, gradgradcheck

EINSUMS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]), ("ij,jk", [(2, 3), (3, 2)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]),
    ("ij->", [(2, 3)]), ("ij->i", [(2, 3)]), ("...ij,...jk", [(2, 3, 4), (4, 2)]), ("i,j->ij", [(3,), (2,)]),
    ("bij,bij->bi", [(1, 3, 4), (2, 3, 4)]), ("iij->ji", [(2, 2, 3)]), ("ij,jk,kl->il", [(2, 3), (3, 2), (2, 2)]),
    ("i,i", [(3,), (3,)]), ("b h i d, b h j d -> b h i j", [(1, 2, 3, 2), (1, 2, 2, 2)]),
]


def _inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [ag.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]


@pytest.mark.parametrize("equation, shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_values_and_derivatives(equation, shapes):
    xs = _inputs(shapes)
    out = ag.einsum(equation, *xs)
    assert np.allclose(out.numpy(), np.einsum(equation.replace(" ", ""), *(x.numpy() for x in xs)))
    assert out.grad_fn.name() == "EinsumBackward0"
    assert gradcheck(lambda *z: ag.einsum(equation, *z), xs)
    assert gradgradcheck(lambda *z: ag.einsum(equation, *z), xs)


def test_einsum_takes_a_list_and_reports_bad_equations():
    a, b = _inputs([(2, 3), (3, 4)])
    assert ag.einsum("ij,jk->ik", [a, b]).shape == (2, 4)
    with pytest.raises(RuntimeError, match="operands"):
        ag.einsum("ij,jk->ik", a)
    with pytest.raises(RuntimeError, match="does not match the number of dimensions"):
        ag.einsum("ijk,jk->ik", a, b)
    with pytest.raises(RuntimeError, match="output subscript z"):
        ag.einsum("ij,jk->iz", a, b)


@pytest.mark.parametrize("dims, shapes", [
    (2, [(3, 2, 4), (2, 4, 3)]), (1, [(3, 2, 4), (4, 2)]), (0, [(2,), (3,)]),
    (([1, 0], [0, 1]), [(3, 2, 4), (2, 3, 4)]), (([2], [0]), [(3, 2, 4), (4, 2)])])
def test_tensordot(dims, shapes):
    a, b = _inputs(shapes)
    out = ag.tensordot(a, b, dims=dims)
    assert np.allclose(out.numpy(), np.tensordot(a.numpy(), b.numpy(), axes=dims))
    assert gradcheck(lambda x, y: ag.tensordot(x, y, dims=dims), (a, b))
    assert gradgradcheck(lambda x, y: ag.tensordot(x, y, dims=dims), (a, b))


def test_tensordot_checks_the_contracted_sizes():
    a, b = _inputs([(3, 4), (3, 4)])
    with pytest.raises(RuntimeError, match="contracted dimensions need to match, but first has size 4 in dim 1 "
                                           "and second has size 3 in dim 0"):
        ag.tensordot(a, b, dims=([1], [0]))


def test_gather():
    x = ag.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    idx = ag.tensor([[0, 0], [1, 0]])
    out = x.gather(1, idx)
    assert out.tolist() == [[1.0, 1.0], [4.0, 3.0]] and out.grad_fn.name() == "GatherBackward0"
    out.sum().backward()
    assert x.grad.tolist() == [[2.0, 0.0], [1.0, 1.0]]  # repeated picks accumulate
    rng = np.random.default_rng(1)
    big = _inputs([(3, 4, 2)])[0]
    index = ag.tensor(rng.integers(0, 4, (2, 5, 2)))  # smaller outside dim 1, larger along it
    assert ag.gather(big, 1, index).shape == (2, 5, 2)
    assert gradcheck(lambda t: t.gather(1, index), (big,))
    assert gradgradcheck(lambda t: t.gather(1, index), (big,))
    with pytest.raises(RuntimeError, match="Index tensor must have the same number of dimensions"):
        x.gather(1, ag.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 1 with size 2"):
        x.gather(1, ag.tensor([[5]]))
    with pytest.raises(RuntimeError, match="Expected dtype int64 for index"):
        x.gather(1, ag.tensor([[0.0]]))


def test_index_select():
    x = _inputs([(3, 4)])[0]
    idx = ag.tensor([2, 0, 2])
    out = x.index_select(0, idx)
    assert np.array_equal(out.numpy(), x.numpy()[[2, 0, 2]]) and out.grad_fn.name() == "IndexSelectBackward0"
    assert np.array_equal(ag.index_select(x, 1, ag.tensor([3])).numpy(), x.numpy()[:, [3]])
    assert gradcheck(lambda t: t.index_select(0, idx), (x,))
    assert gradgradcheck(lambda t: t.index_select(1, idx), (x,))
    with pytest.raises(IndexError, match="Index is supposed to be a vector"):
        x.index_select(0, ag.tensor([[0]]))
    with pytest.raises(IndexError, match="index out of range in self"):
        x.index_select(0, ag.tensor([3]))
    with pytest.raises(RuntimeError, match="Expected dtype int32 or int64 for index"):
        x.index_select(0, ag.tensor([0.0]))


@pytest.mark.parametrize("dim, size, step", [(1, 2, 2), (1, 3, 1), (0, 2, 1), (-1, 4, 3)])
def test_unfold(dim, size, step):
    x = _inputs([(3, 5)])[0]
    out = x.unfold(dim, size, step)
    ref = np.lib.stride_tricks.sliding_window_view(x.numpy(), size, axis=dim % 2)
    ref = ref[(slice(None),) * (dim % 2) + (slice(None, None, step),)]
    assert np.array_equal(out.numpy(), ref) and out.grad_fn.name() == "UnfoldBackward0"
    assert gradcheck(lambda t: t.unfold(dim, size, step), (x,))
    assert gradgradcheck(lambda t: t.unfold(dim, size, step), (x,))


def test_unfold_errors():
    x = ag.ones(3, 4)
    with pytest.raises(RuntimeError, match="maximum size for tensor at dimension 1 is 4 but size is 5"):
        x.unfold(1, 5, 1)
    with pytest.raises(RuntimeError, match="step is 0 but must be > 0"):
        x.unfold(1, 2, 0)


def test_scatter_and_scatter_add():
    idx = ag.tensor([[0, 1, 0], [2, 2, 1]])
    src = ag.tensor(np.arange(8.0).reshape(2, 4), requires_grad=True)
    added = ag.zeros(2, 4).scatter_add(1, idx, src)
    assert added.tolist() == [[2.0, 1.0, 0.0, 0.0], [0.0, 6.0, 9.0, 0.0]]
    added.sum().backward()
    assert src.grad.tolist() == [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]]  # only the part read
    one_hot = ag.zeros(2, 3).scatter_(1, ag.tensor([[0], [2]]), 1.0)
    assert one_hot.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    x = _inputs([(2, 4)])[0]
    unique = ag.tensor([[3, 0], [1, 2]])
    assert gradcheck(lambda a, b: a.scatter(1, unique, b), (x, _inputs([(2, 2)], 3)[0]))
    assert gradgradcheck(lambda a, b: a.scatter_add(1, idx, b), (x, _inputs([(2, 3)], 4)[0]))


def test_amax_and_amin_take_tuples_and_split_ties():
    x = ag.tensor([[1.0, 3.0], [3.0, 2.0]], requires_grad=True)
    out = x.amax(dim=(0, 1))
    assert out.item() == 3.0 and out.grad_fn.name() == "AmaxBackward0"
    out.backward()
    assert x.grad.tolist() == [[0.0, 0.5], [0.5, 0.0]]
    assert ag.amin(x, 1, keepdim=True).tolist() == [[1.0], [2.0]]
    assert x.amax().item() == 3.0 and x.amin(axis=0).tolist() == [1.0, 2.0]
    y = _inputs([(2, 3, 4)])[0]
    assert gradcheck(lambda t: t.amax(dim=(0, 2)), (y,)) and gradgradcheck(lambda t: t.amin((1,), True), (y,))
    with pytest.raises(RuntimeError, match="dim 0 appears multiple times in the list of dims"):
        y.amax(dim=(0, 0))


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_max_and_min_with_a_tuple_of_dims_raise_as_pytorch(reduce):
    x = ag.ones(2, 3, 4)
    with pytest.raises(TypeError, match=rf"^{reduce}\(\): argument 'dim' \(position 1\) must be int, not tuple$"):
        getattr(x, reduce)(dim=(1, 2))
    with pytest.raises(TypeError):
        getattr(ag, reduce)(x, [1, 2])


def test_values_and_gradients_equal_pytorchs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 4, 5))
    idx = rng.integers(0, 4, (2, 3, 5))
    cases = [
        (lambda t, m: m.einsum("bij,bkj->bik", t, t), None),
        (lambda t, m: m.tensordot(t, t, dims=([1, 2], [1, 2])), None),
        (lambda t, m: t.gather(1, m.tensor(idx)), None),
        (lambda t, m: t.index_select(2, m.tensor([4, 0, 0])), None),
        (lambda t, m: t.unfold(2, 2, 2), None),
        (lambda t, m: t.amax(dim=(0, 2)), None),
        (lambda t, m: m.zeros(3, 6, 5, dtype=m.float64).scatter_add(1, m.tensor(idx), t[:2, :3]), None),
    ]
    for f, _ in cases:
        x = ag.tensor(a, requires_grad=True)
        tx = torch.tensor(a, requires_grad=True)
        y, ty = f(x, ag), f(tx, torch)
        assert np.allclose(y.numpy(), ty.detach().numpy())
        g = rng.standard_normal(y.shape)
        (gx,) = ag.grad_sync(y, x, ag.tensor(g))
        (tgx,) = torch.autograd.grad(ty, tx, torch.tensor(g))
        assert np.allclose(gx.numpy(), tgx.numpy())
    with pytest.raises(TypeError) as info:
        torch.ones(2, 3).max(1, (1, 2))
    assert "must be" in str(info.value) or "invalid combination" in str(info.value)
