"""Devices for PyTorch parity (issue 13): ``Tensor.device``, ``cpu()``, ``to(...)`` in all
of PyTorch's forms, ``Module.to``/``cpu``, ``Tensor.type()``, ``ag.device`` and the
factories' ``device=`` keyword."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgrad as ag


def test_device_prints_and_compares_like_torch_and_equals_its_string() -> None:
    d = ag.ones(2).device
    assert repr(d) == "device(type='cpu')" and str(d) == "cpu" and d.type == "cpu" and d.index is None
    assert d == "cpu" and d == ag.device("cpu") and d != "cpu:0" and d != ag.device("cpu", 0)
    assert d != "cuda" and d != "not a device" and hash(d) == hash(ag.device("cpu"))
    assert repr(ag.device("cuda:1")) == "device(type='cuda', index=1)" and str(ag.device("cuda", 1)) == "cuda:1"
    assert ag.device(d) == d and {d: 1}[ag.device("cpu")] == 1
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda, .* device type at start of device string: gpu"):
        ag.device("gpu")
    with pytest.raises(RuntimeError, match="Invalid device string: 'cpu:x'"):
        ag.device("cpu:x")
    x = ag.ones(2)
    assert x.is_cpu and not x.is_cuda


def test_tensor_to_device_is_a_no_op_and_to_dtype_casts() -> None:
    x = ag.tensor([1.0, 2.0], dtype=ag.float32, requires_grad=True)
    for same in (x.to("cpu"), x.to(ag.device("cpu")), x.to("cpu:0"), x.to(device="cpu"), x.cpu(), x.to(x),
                 x.to(ag.float32), x.to("cpu", ag.float32), x.to(dtype=ag.float32, non_blocking=True)):
        assert same is x
    y = x.to("cpu", ag.float64)
    assert y.dtype == np.float64 and y.grad_fn is not None and y.grad_fn.name() == "ToCopyBackward0"
    assert x.to(ag.ones(1, dtype=ag.float64)).dtype == np.float64
    assert x.to(device="cpu", dtype=ag.float16).dtype == np.float16
    assert x.to(np.float64).dtype == np.float64 and x.to("float64").dtype == np.float64
    c = x.to("cpu", copy=True)
    assert c is not x and not np.shares_memory(c.numpy(), x.numpy()) and c.grad_fn is not None
    (g,) = ag.grad_sync((y * y).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0])


def test_tensor_to_another_device_raises_clearly() -> None:
    x = ag.ones(2, dtype=ag.float32)
    for target in ("cuda", "cuda:0", ag.device("mps")):
        with pytest.raises(RuntimeError, match=r"asyncgrad computes with numpy on the CPU only; it cannot put "
                           r"tensors on device '(cuda|cuda:0|mps)'"):
            x.to(target)
    with pytest.raises(RuntimeError, match="on the CPU only"):
        x.to(device="cuda", dtype=ag.float64)
    with pytest.raises(TypeError, match="to\\(\\) expects a dtype or a device, got 'nonsense'"):
        x.to("nonsense")
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        x.to("cpu", bogus=1)
    assert x.dtype == np.float32


def test_tensor_type() -> None:
    names = {ag.float32: "asyncgrad.FloatTensor", ag.float64: "asyncgrad.DoubleTensor",
             ag.float16: "asyncgrad.HalfTensor", ag.int64: "asyncgrad.LongTensor",
             ag.int32: "asyncgrad.IntTensor", ag.bool_: "asyncgrad.BoolTensor", np.uint8: "asyncgrad.ByteTensor"}
    for dt, name in names.items():
        assert ag.zeros(1, dtype=dt).type() == name
    x = ag.tensor([1.5, 2.5], dtype=ag.float32, requires_grad=True)
    assert x.type(ag.float32) is x and x.type("asyncgrad.FloatTensor") is x
    d = x.type("asyncgrad.DoubleTensor")
    assert d.dtype == np.float64 and d.grad_fn is not None
    assert x.type("torch.DoubleTensor").dtype == np.float64  # ported code's spelling
    assert x.type(ag.int64).tolist() == [1, 2]
    with pytest.raises(ValueError, match="invalid type: 'asyncgrad.NoSuchTensor'"):
        x.type("asyncgrad.NoSuchTensor")
    with pytest.raises(ValueError, match="invalid type: 'foo'"):
        x.type("foo")


def test_module_to_and_cpu() -> None:
    m = ag.nn.Sequential(ag.nn.Linear(2, 3), ag.nn.ReLU()).to(ag.float32)
    w = m[0].weight
    assert m.to("cpu") is m and m.cpu() is m and m.to(ag.device("cpu")) is m
    assert w.dtype == np.float32
    version = w._version
    assert w._version == version  # moving to the CPU touched nothing
    assert m.to("cpu", ag.float64) is m and m[0].weight is w and w.dtype == np.float64
    m.to(dtype=ag.float32)
    assert w.dtype == np.float32
    m.to(ag.ones(1, dtype=ag.float64))
    assert w.dtype == np.float64 and m[0].bias.dtype == np.float64
    with pytest.raises(RuntimeError, match="on the CPU only; it cannot put tensors on device 'cuda'"):
        m.to("cuda")
    with pytest.raises(TypeError, match="nn.Module.to only accepts floating point or complex dtypes"):
        m.to(ag.int64)
    assert w.dtype == np.float64
    out = m(ag.ones(4, 2, dtype=ag.float64))
    assert out.dtype == np.float64 and out.device == "cpu"


FACTORIES = [
    ("tensor", lambda d: ag.tensor([1.0], device=d)), ("zeros", lambda d: ag.zeros(2, device=d)),
    ("ones", lambda d: ag.ones(2, device=d)), ("full", lambda d: ag.full((2,), 3.0, device=d)),
    ("empty", lambda d: ag.empty(2, device=d)), ("zeros_like", lambda d: ag.zeros_like(ag.ones(1), device=d)),
    ("ones_like", lambda d: ag.ones_like(ag.ones(1), device=d)),
    ("full_like", lambda d: ag.full_like(ag.ones(1), 2.0, device=d)), ("arange", lambda d: ag.arange(3, device=d)),
    ("linspace", lambda d: ag.linspace(0, 1, 3, device=d)), ("eye", lambda d: ag.eye(2, device=d)),
    ("randn", lambda d: ag.randn(2, device=d)), ("rand", lambda d: ag.rand(2, device=d)),
    ("randint", lambda d: ag.randint(0, 5, (2,), device=d)), ("randperm", lambda d: ag.randperm(3, device=d)),
    ("randn_like", lambda d: ag.randn_like(ag.ones(2), device=d)),
    ("rand_like", lambda d: ag.rand_like(ag.ones(2), device=d)),
    ("new_tensor", lambda d: ag.ones(1).new_tensor([2.0], device=d)),
    ("new_zeros", lambda d: ag.ones(1).new_zeros(2, device=d)),
    ("new_ones", lambda d: ag.ones(1).new_ones(2, device=d)),
    ("new_empty", lambda d: ag.ones(1).new_empty(2, device=d)),
    ("new_full", lambda d: ag.ones(1).new_full((2,), 1.0, device=d)),
]


@pytest.mark.parametrize("name,make", FACTORIES, ids=[f[0] for f in FACTORIES])
def test_factories_accept_the_cpu_device_and_refuse_others(name: str, make: Any) -> None:
    x = ag.ones(1)
    for d in (None, "cpu", ag.device("cpu"), x.device):
        assert make(d).device == "cpu"
    state = ag.get_rng_state()
    with pytest.raises(RuntimeError, match="on the CPU only; it cannot put tensors on device 'cuda'"):
        make("cuda")
    assert ag.get_rng_state() == state  # refused before drawing anything
