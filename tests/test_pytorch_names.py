"""PyTorch's names that model code uses (issue 32): dtype aliases, conversions, dtype
queries, the ``new*`` family, ``split_with_sizes``, ``InplaceFunction``, and the small
namespaces (``cuda``, ``backends``). Values are checked against torch where installed."""

import numpy as np
import pytest

import asyncgrad as ag


def test_dtype_aliases_are_numpy_dtypes_with_pytorchs_names():
    assert (ag.long, ag.int, ag.short, ag.float, ag.double, ag.half, ag.bool) == (
        np.int64, np.int32, np.int16, np.float32, np.float64, np.float16, np.bool_)
    assert (ag.int8, ag.int16, ag.int32, ag.uint8, ag.float16) == (np.int8, np.int16, np.int32, np.uint8,
                                                                   np.float16)
    assert ag.bool_ is ag.bool and isinstance(ag.long, ag.dtype)
    assert ag.zeros(2, 3, dtype=ag.long).dtype == np.int64
    assert ag.arange(0, 4, dtype=ag.float).dtype == np.float32
    import builtins

    ns = {}
    exec("from asyncgrad import *", ns)
    assert "int" not in ns and "float" not in ns and "bool" not in ns and ns["long"] is ag.long
    assert builtins.int is int


@pytest.mark.parametrize("method, dtype", [("long", np.int64), ("int", np.int32), ("float", np.float32),
                                           ("double", np.float64), ("half", np.float16), ("bool", np.bool_),
                                           ("byte", np.uint8), ("char", np.int8), ("short", np.int16)])
def test_conversion_methods(method, dtype):
    x = ag.tensor([0.0, 1.5, -2.0])
    y = getattr(x, method)()
    assert y.dtype == dtype
    assert y.tolist() == np.array([0.0, 1.5, -2.0]).astype(dtype).tolist()


def test_half_is_differentiable_and_integer_casts_are_not():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    (x.half() * 3).float().sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    assert not x.long().requires_grad and not x.bool().requires_grad


def test_is_floating_point_and_is_complex():
    assert ag.ones(2).is_floating_point() and ag.is_floating_point(ag.ones(2, dtype=ag.half))
    assert not ag.ones(2, dtype=ag.long).is_floating_point() and not ag.is_floating_point(ag.tensor([True]))
    assert not ag.ones(2).is_complex() and not ag.is_complex(ag.ones(2))


def test_finfo_and_iinfo():
    assert ag.finfo(ag.float32).eps == np.finfo(np.float32).eps
    assert ag.finfo().eps == ag.finfo(ag.get_default_dtype()).eps
    assert ag.finfo(ag.half).max == 65504.0 and ag.finfo(ag.double).tiny == np.finfo(np.float64).tiny
    assert ag.iinfo(ag.int32).max == 2**31 - 1 and ag.iinfo(ag.uint8).min == 0
    with pytest.raises(TypeError, match="floating point"):
        ag.finfo(ag.long)
    with pytest.raises(TypeError, match="integer"):
        ag.iinfo(ag.float)
    with pytest.raises(TypeError, match="integer"):
        ag.iinfo(ag.bool)


def test_new_and_the_new_family_take_this_tensors_dtype():
    x = ag.ones(2, dtype=ag.float32)
    assert x.new(2, 3).shape == (2, 3) and x.new(2, 3).dtype == np.float32
    assert x.new().shape == (0,)
    assert x.new([1, 2]).tolist() == [1.0, 2.0] and x.new([1, 2]).dtype == np.float32
    assert x.new_zeros(2, 2).tolist() == [[0, 0], [0, 0]] and x.new_zeros((3,)).dtype == np.float32
    assert x.new_ones(2).tolist() == [1.0, 1.0] and x.new_full((2,), 7).tolist() == [7.0, 7.0]
    assert x.new_empty(4).shape == (4,) and x.new_tensor([3]).dtype == np.float32
    assert x.new_zeros(2, dtype=ag.long).dtype == np.int64
    with pytest.raises(TypeError):
        x.new([1], [2])


def test_split_with_sizes():
    x = ag.arange(6.0, requires_grad=True)
    a, b = x.split_with_sizes([2, 4])
    assert a.tolist() == [0.0, 1.0] and b.tolist() == [2.0, 3.0, 4.0, 5.0]
    assert a.grad_fn.name() == "SplitWithSizesBackward0"
    (a.sum() * 2 + b.sum()).backward()
    assert x.grad.tolist() == [2.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    c, d = ag.split_with_sizes(x.detach().reshape(2, 3), (1, 2), dim=1)
    assert c.shape == (2, 1) and d.shape == (2, 2)
    with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes to sum exactly to 6"):
        x.split_with_sizes([1, 2])


def test_inplace_function():
    from asyncgrad.autograd.function import InplaceFunction

    class Twice(InplaceFunction):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    with pytest.warns(DeprecationWarning):
        assert InplaceFunction(inplace=True).inplace is True
    x = ag.ones(2, requires_grad=True)
    Twice.apply(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_small_namespaces_say_there_is_no_gpu():
    assert ag.cuda.is_available() is False and ag.cuda.device_count() == 0
    ag.cuda.manual_seed_all(0)
    ag.backends.cudnn.deterministic = True
    assert ag.backends.mps.is_available() is False
    assert ag.is_tensor(ag.ones(1)) and not ag.is_tensor(np.ones(1))
    assert ag.numel(ag.ones(2, 3)) == 6 and ag.typename(ag.ones(1, dtype=ag.float)) == "asyncgrad.FloatTensor"
    assert ag.is_nonzero(ag.tensor([2.0])) is True
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        ag.is_nonzero(ag.ones(2))
    model = ag.nn.Linear(2, 2)
    assert ag.compile(model) is model
    assert ag.Size([2, 3]) == (2, 3) and ag.ones(2, 3).shape == ag.Size([2, 3])
    assert ag.get_num_threads() >= 1
    ag.set_num_threads(1)
    ag.use_deterministic_algorithms(True)


def test_an_optimizer_whose_step_takes_no_closure():
    class PlainSGD(ag.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        def step(self):  # no closure, as in many hand-written optimizers
            for group in self.param_groups:
                for p in group["params"]:
                    p.data -= group["lr"] * p.grad.data

    w = ag.tensor([1.0, 2.0], requires_grad=True)
    opt = PlainSGD([w], lr=0.5)
    (w * w).sum().backward()
    assert opt.step() is None
    assert w.tolist() == [0.0, 0.0]
    with pytest.raises(TypeError):
        opt.step(lambda: None)  # its signature takes none
    sgd = ag.optim.SGD([w], lr=0.1)
    assert sgd.step(lambda: 7.0) == 7.0  # a closure still reaches the built-in optimizers


@pytest.mark.parametrize("name, kwargs", [
    ("RMSprop", {"lr": 0.01}), ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
    ("Adadelta", {}), ("Adadelta", {"lr": 0.5, "rho": 0.8, "weight_decay": 0.01, "maximize": True}),
])
def test_more_optimizers_follow_pytorchs_updates(name, kwargs):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(4)
    grads = [rng.standard_normal(4) for _ in range(3)]
    w = ag.tensor(w0.copy(), requires_grad=True)
    opt = getattr(ag.optim, name)([w], **kwargs)
    for g in grads:
        w.grad = ag.tensor(g)
        opt.step()
    assert np.isfinite(w.numpy()).all() and not np.allclose(w.numpy(), w0)
    assert opt.state[w]["step"] == 3
    torch = pytest.importorskip("torch")
    tw = torch.tensor(w0.copy(), requires_grad=True)
    topt = getattr(torch.optim, name)([tw], **kwargs)
    for g in grads:
        tw.grad = torch.tensor(g)
        topt.step()
    assert np.allclose(w.numpy(), tw.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert set(opt.state[w]) == set(topt.state[tw])


def test_where_with_one_argument_and_more_init_functions():
    rows, cols = ag.where(ag.tensor([[0.0, 1.0], [2.0, 0.0]]) > 0)
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0] and rows.dtype == np.int64
    w = ag.empty(300)
    ag.nn.init.trunc_normal_(w, std=1.0, a=-1.0, b=1.5)
    assert w.numpy().min() >= -1.0 and w.numpy().max() <= 1.5 and w.numpy().std() > 0.3
    q = ag.nn.init.orthogonal_(ag.empty(3, 5), gain=2.0)
    assert np.allclose(q.numpy() @ q.numpy().T, 4 * np.eye(3))
    assert ag.nn.init.eye_(ag.empty(2, 3)).tolist() == [[1, 0, 0], [0, 1, 0]]
