"""Conv1d, Conv2d and ConvTranspose2d: values and every gradient against PyTorch over a grid
of arguments (float64), gradcheck and gradgradcheck, PyTorch's messages, the modules'
state, init and repr."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn as nn
import asyncgrad.nn.functional as F
from asyncgrad.autograd import gradcheck, gradgradcheck


@pytest.fixture(autouse=True, scope="module")
def _torch_on_one_thread():
    """PyTorch's thread pool, spinning beside asyncgrad's on a shared machine, makes its
    tiny oracle convolutions take tenths of a second each; one thread keeps them fast."""
    try:
        import torch
    except ImportError:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape)


def _leaves(arrays: list[np.ndarray]) -> list[ag.Tensor]:
    return [ag.tensor(a, requires_grad=True) for a in arrays]


def assert_matches_torch(ours: Any, theirs: Any, arrays: list[np.ndarray], seed: int = 1) -> None:
    """``ours`` on asyncgrad leaves and ``theirs`` on torch leaves agree in value and in the
    gradient of every input for a random output gradient."""
    torch = pytest.importorskip("torch")
    a_in = _leaves(arrays)
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    ya, yt = ours(*a_in), theirs(*t_in)
    assert ya.shape == tuple(yt.shape)
    np.testing.assert_allclose(ya.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = np.random.default_rng(seed).standard_normal(ya.shape)
    grads = ag.grad_sync(ya, a_in, ag.tensor(g))
    t_grads = torch.autograd.grad(yt, t_in, torch.tensor(g))
    for ga, gt in zip(grads, t_grads):
        np.testing.assert_allclose(ga.numpy(), gt.numpy(), rtol=1e-10, atol=1e-10)


pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")  # (PyTorch's own)

CONV2D = [
    {},
    {"stride": 2},
    {"stride": (2, 1), "padding": (1, 2)},
    {"padding": 1, "dilation": 2},
    {"padding": "same"},
    {"padding": "same", "dilation": (1, 2)},
    {"padding": "valid", "stride": 3},
    {"groups": 2, "padding": 1},
    {"groups": 4, "stride": 2, "padding": 1},  # depthwise
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kw", CONV2D, ids=str)
def test_conv2d_matches_torch(kw: dict[str, Any], bias: bool) -> None:
    import torch.nn.functional as TF

    pytest.importorskip("torch")
    groups = kw.get("groups", 1)
    arrays = [_rand(2, 4, 7, 6), _rand(6 if groups != 4 else 4, 4 // groups, 3, 2, seed=1)]
    if bias:
        arrays.append(_rand(arrays[1].shape[0], seed=2))
    assert_matches_torch(lambda *a: F.conv2d(*a, **kw), lambda *a: TF.conv2d(*a, **kw), arrays)


def test_conv2d_unbatched_and_kernel_larger_than_stride_window() -> None:
    import torch.nn.functional as TF

    pytest.importorskip("torch")
    assert_matches_torch(lambda x, w: F.conv2d(x, w, stride=2), lambda x, w: TF.conv2d(x, w, stride=2),
                         [_rand(3, 8, 9), _rand(5, 3, 4, 4)])


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1}, {"padding": "same", "dilation": 3},
                                {"groups": 3, "bias": True}], ids=str)
def test_conv1d_matches_torch(kw: dict[str, Any]) -> None:
    import torch.nn.functional as TF

    pytest.importorskip("torch")
    kw = dict(kw)
    groups = kw.get("groups", 1)
    arrays = [_rand(2, 3, 11), _rand(6, 3 // groups, 3, seed=1)]
    if kw.pop("bias", False):
        arrays.append(_rand(6, seed=2))
    assert_matches_torch(lambda *a: F.conv1d(*a, **kw), lambda *a: TF.conv1d(*a, **kw), arrays)


CONV_T = [
    {},
    {"stride": 2},
    {"stride": 2, "padding": 1, "output_padding": 1},
    {"stride": (3, 2), "padding": (2, 0), "output_padding": (1, 0), "dilation": (1, 2)},
    {"groups": 2, "stride": 2},
    {"padding": 1, "dilation": 2, "output_padding": 1},
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kw", CONV_T, ids=str)
def test_conv_transpose2d_matches_torch(kw: dict[str, Any], bias: bool) -> None:
    import torch.nn.functional as TF

    pytest.importorskip("torch")
    groups = kw.get("groups", 1)
    arrays = [_rand(2, 4, 4, 5), _rand(4, 6 // groups, 3, 3, seed=1)]
    if bias:
        arrays.append(_rand(6, seed=2))
    assert_matches_torch(lambda *a: F.conv_transpose2d(*a, **kw), lambda *a: TF.conv_transpose2d(*a, **kw), arrays)


@pytest.mark.parametrize("kw", [{}, {"padding": 1, "groups": 2}, {"padding": (0, 2), "dilation": (2, 1)}], ids=str)
def test_wide_images_match_torch(kw: dict[str, Any]) -> None:
    """Images wide enough that stride-1 kernels run on wide rows (Note [Wide rows])."""
    import torch.nn.functional as TF

    pytest.importorskip("torch")
    g = kw.get("groups", 1)
    arrays = [_rand(2, 4, 5, 13), _rand(4, 4 // g, 3, 3, seed=1), _rand(4, seed=2)]
    assert_matches_torch(lambda *a: F.conv2d(*a, **kw), lambda *a: TF.conv2d(*a, **kw), arrays)
    assert_matches_torch(lambda *a: F.conv_transpose2d(*a, **kw), lambda *a: TF.conv_transpose2d(*a, **kw), arrays)


@pytest.mark.parametrize("kw", [{"padding": 1}, {"padding": 1, "groups": 2}, {"stride": 2, "padding": 1},
                                {"padding": (0, 2), "dilation": (2, 1)}, {}], ids=str)
def test_batches_cut_into_image_chunks_match_torch(monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]) -> None:
    """Every image its own chunk (Note [Convolution by image chunks]): forward, both
    gradients and a transposed convolution as over the whole batch, wide rows or not."""
    import torch.nn.functional as TF

    from asyncgrad.ops import conv as ops_conv

    pytest.importorskip("torch")
    monkeypatch.setattr(ops_conv, "CHUNK_BYTES", 1)
    monkeypatch.setattr(ops_conv, "PIXEL_ROWS", False)  # (the chunks are channels first's)
    g = kw.get("groups", 1)
    arrays = [_rand(3, 4, 5, 13), _rand(4, 4 // g, 3, 3, seed=1), _rand(4, seed=2)]
    assert_matches_torch(lambda *a: F.conv2d(*a, **kw), lambda *a: TF.conv2d(*a, **kw), arrays)
    assert_matches_torch(lambda *a: F.conv_transpose2d(*a, **kw), lambda *a: TF.conv_transpose2d(*a, **kw), arrays)


def test_image_chunks_are_sized_from_the_cores_l2_as_linux_reports_it(tmp_path: Any) -> None:
    """Note [Convolution by image chunks]: half the L2 (the level-2 data or unified entry,
    not the instruction cache or L3), clamped to 256 kB..4 MB; 1 MB where unknown."""
    from asyncgrad.ops import conv as ops_conv

    for entry, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                                 ("2", "Unified", "2048K"), ("3", "Unified", "480M")]):
        d = tmp_path / f"index{entry}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(value + "\n")
    assert ops_conv.core_cache_bytes(str(tmp_path)) == 2048 << 10
    assert ops_conv.core_cache_bytes(str(tmp_path / "absent")) is None
    (tmp_path / "index2" / "size").write_text("garbled\n")
    assert ops_conv.core_cache_bytes(str(tmp_path)) is None
    assert ops_conv.chunk_bytes(512 << 10) == 1 << 20
    assert ops_conv.chunk_bytes(1024 << 10) == 2 << 20
    assert ops_conv.chunk_bytes(128 << 10) == 512 << 10
    assert ops_conv.chunk_bytes(64 << 20) == 4 << 20
    assert ops_conv.chunk_bytes(None) == 1 << 20


@pytest.mark.parametrize("kw", [{"padding": 2}, {"padding": (1, 3)}, {"padding": 1, "dilation": (1, 2)}], ids=str)
def test_stride_one_padding_beyond_the_kernel_matches_torch(kw: dict[str, Any]) -> None:
    """Stride 1 with more padding than the kernel's reach (Note [A stride-1 adjoint is a
    convolution] does not apply: the input's gradient is the product folded back)."""
    import torch.nn.functional as TF

    pytest.importorskip("torch")
    arrays = [_rand(2, 3, 5, 6), _rand(4, 3, 2, 2, seed=1)]
    assert_matches_torch(lambda *a: F.conv2d(*a, **kw), lambda *a: TF.conv2d(*a, **kw), arrays)


def test_torch_namespace_functions_are_the_functional_ones() -> None:
    assert ag.conv2d is F.conv2d and ag.conv1d is F.conv1d and ag.conv_transpose2d is F.conv_transpose2d


# --- derivatives without torch ------------------------------------------------------------------
def _t(*shape: int, seed: int = 0) -> ag.Tensor:
    return ag.tensor(_rand(*shape, seed=seed), requires_grad=True)


GRADCHECK_CASES = [
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), ((1, 4, 4, 4), (2, 2, 3, 3), (2,))),
    ("conv2d dilated same", lambda x, w, b: F.conv2d(x, w, b, padding="same", dilation=2),
     ((1, 2, 4, 4), (2, 2, 2, 3), (2,))),
    ("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), ((2, 2, 5), (2, 2, 3), (2,))),
    ("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
     ((1, 2, 2, 3), (2, 2, 3, 3), (2,))),
    ("conv_transpose2d groups", lambda x, w, b: F.conv_transpose2d(x, w, b, groups=2, dilation=2),
     ((1, 4, 3, 2), (4, 1, 2, 2), (2,))),
]


@pytest.mark.parametrize("name, fn, shapes", GRADCHECK_CASES, ids=[c[0] for c in GRADCHECK_CASES])
def test_gradcheck_and_gradgradcheck(name: str, fn: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
    inputs = tuple(_t(*s, seed=i) for i, s in enumerate(shapes))
    assert gradcheck(fn, inputs)
    assert gradgradcheck(fn, inputs)


def test_gradient_of_gradient_matches_torch() -> None:
    """A saliency-style double backward: d/dw of |d loss / dx|^2 through a strided conv."""
    torch = pytest.importorskip("torch")
    x0, w0 = _rand(2, 3, 6, 6), _rand(4, 3, 3, 3, seed=1)

    def ours() -> list[np.ndarray]:
        x, w = _leaves([x0, w0])
        (gx,) = ag.grad_sync(F.conv2d(x, w, stride=2, padding=1).tanh().sum(), [x], create_graph=True)
        return [g.numpy() for g in ag.grad_sync((gx * gx).sum(), [x, w])]

    def theirs() -> list[np.ndarray]:
        x, w = (torch.tensor(a, requires_grad=True) for a in (x0, w0))
        (gx,) = torch.autograd.grad(torch.nn.functional.conv2d(x, w, stride=2, padding=1).tanh().sum(), [x],
                                    create_graph=True)
        return [g.numpy() for g in torch.autograd.grad((gx * gx).sum(), [x, w])]

    for a, t in zip(ours(), theirs()):
        np.testing.assert_allclose(a, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kw", [{"padding": 1}, {"stride": 2, "groups": 2}], ids=str)
def test_one_gradient_alone_equals_the_joint_rule(kw: dict[str, Any]) -> None:
    """The per-input rules (one gradient needed) and the joint one (several) agree."""
    x, w, b = _t(2, 4, 6, 6), _t(4, 4 // kw.get("groups", 1), 3, 3, seed=1), _t(4, seed=2)
    g = ag.tensor(_rand(*F.conv2d(x, w, b, **kw).shape, seed=3))
    together = ag.grad_sync(F.conv2d(x, w, b, **kw), [x, w, b], g)
    for i, t in enumerate((x, w, b)):
        (alone,) = ag.grad_sync(F.conv2d(x, w, b, **kw), [t], g)
        np.testing.assert_allclose(alone.numpy(), together[i].numpy(), rtol=1e-12, atol=1e-12)


def test_node_name_is_torchs() -> None:
    y = F.conv2d(_t(1, 1, 4, 4), _t(1, 1, 3, 3))
    assert y.grad_fn.name() == "ConvolutionBackward0"


# --- errors ---------------------------------------------------------------------------------------
ERRORS = [
    (lambda: F.conv2d(ag.zeros(2, 4, 10, 10), ag.zeros(8, 3, 3, 3)),
     "Given groups=1, weight of size [8, 3, 3, 3], expected input[2, 4, 10, 10] to have 3 channels, but got 4 "
     "channels instead"),
    (lambda: F.conv2d(ag.zeros(4, 10, 10), ag.zeros(8, 3, 3, 3)),
     "Given groups=1, weight of size [8, 3, 3, 3], expected input[1, 4, 10, 10] to have 3 channels, but got 4 "
     "channels instead"),
    (lambda: F.conv2d(ag.zeros(2, 3), ag.zeros(8, 3, 3, 3)),
     "Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: [2, 3]"),
    (lambda: F.conv2d(ag.zeros(2, 3, 10, 10, dtype=ag.float64), ag.zeros(8, 3, 3, 3, dtype=ag.float32)),
     "expected scalar type Double but found Float"),
    (lambda: F.conv2d(ag.zeros(2, 3, 10, 10, dtype=ag.float32), ag.zeros(8, 3, 3, 3, dtype=ag.float32),
                      ag.zeros(8, dtype=ag.float64)),
     "Input type (float) and bias type (double) should be the same"),
    (lambda: F.conv2d(ag.zeros(2, 3, 2, 2), ag.zeros(8, 3, 3, 3)),
     "Calculated padded input size per channel: (2 x 2). Kernel size: (3 x 3). Kernel size can't be greater than "
     "actual input size"),
    (lambda: F.conv2d(ag.zeros(2, 3, 5, 5), ag.zeros(8, 3, 3, 3), stride=2, padding="same"),
     "padding='same' is not supported for strided convolutions"),
    (lambda: F.conv2d(ag.zeros(2, 4, 10, 10), ag.zeros(8, 2, 3, 3), groups=3),
     "Given groups=3, expected weight to be divisible by 3 at dimension 0, but got weight of size [[8, 2, 3, 3]] "
     "instead"),
    (lambda: F.conv2d(ag.zeros(2, 4, 10, 10), ag.zeros(8, 4, 3, 3), ag.zeros(7)),
     "Given weight of size [8, 4, 3, 3], expected bias to be 1-dimensional with 8 elements, but got bias of size "
     "[7] instead"),
    (lambda: F.conv2d(ag.zeros(2, 3, 10, 10), ag.zeros(8, 3, 3, 3), stride=0), "non-positive stride is not supported"),
    (lambda: F.conv2d(ag.zeros(2, 3, 10, 10), ag.zeros(8, 3, 3, 3), padding=-1), "negative padding is not supported"),
    (lambda: F.conv1d(ag.zeros(2, 4, 10), ag.zeros(8, 3, 3)),
     "Given groups=1, weight of size [8, 3, 3], expected input[2, 4, 10] to have 3 channels, but got 4 channels "
     "instead"),
    (lambda: F.conv_transpose2d(ag.zeros(2, 4, 10, 10), ag.zeros(3, 8, 3, 3)),
     "Given transposed=1, weight of size [3, 8, 3, 3], expected input[2, 4, 10, 10] to have 3 channels, but got 4 "
     "channels instead"),
    (lambda: F.conv_transpose2d(ag.zeros(2, 4, 5, 5), ag.zeros(4, 3, 3, 3), stride=2, output_padding=2),
     "output padding must be smaller than either stride or dilation, but got output_padding_height: 2 "
     "output_padding_width: 2 stride_height: 2 stride_width: 2 dilation_height: 1 dilation_width: 1"),
]


@pytest.mark.parametrize("call, message", ERRORS, ids=[m[:40] for _, m in ERRORS])
def test_errors_are_torchs(call: Any, message: str) -> None:
    with pytest.raises(RuntimeError) as info:
        call()
    assert str(info.value) == message


@pytest.mark.parametrize("kwargs, message", [
    ({"groups": 4, "in_channels": 4, "out_channels": 6}, "out_channels must be divisible by groups"),
    ({"groups": 3, "in_channels": 5, "out_channels": 6}, "in_channels must be divisible by groups"),
    ({"padding_mode": "foo"}, "padding_mode must be one of {'zeros', 'reflect', 'circular', 'replicate'}, but got "
                              "padding_mode='foo'"),
])
def test_module_argument_errors(kwargs: dict[str, Any], message: str) -> None:
    args = {"in_channels": 4, "out_channels": 6, "kernel_size": 3, **kwargs}
    with pytest.raises(ValueError) as info:
        nn.Conv2d(**args)
    assert str(info.value) == message


# --- modules --------------------------------------------------------------------------------------
MODULES = [
    ("Conv2d", (3, 4, 3), {}),
    ("Conv2d", (4, 6, (3, 2)), {"stride": 2, "padding": 1, "groups": 2, "bias": False}),
    ("Conv2d", (3, 4, 3), {"padding": "same", "dilation": 2}),
    ("Conv2d", (3, 4, 3), {"padding": 2, "padding_mode": "reflect"}),
    ("Conv2d", (3, 4, 3), {"padding": 1, "padding_mode": "circular"}),
    ("Conv2d", (3, 4, 4), {"padding": "same", "padding_mode": "replicate"}),
    ("Conv1d", (3, 4, 5), {"stride": 2, "padding": 2}),
    ("ConvTranspose2d", (3, 4, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
]


@pytest.mark.parametrize("name, args, kwargs", MODULES, ids=[f"{n}{a}{k}" for n, a, k in MODULES])
def test_module_state_repr_and_forward_match_torch(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    theirs = getattr(torch.nn, name)(*args, **kwargs).double()
    ours = getattr(nn, name)(*args, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    shape = (2, args[0], 9) if name == "Conv1d" else (2, args[0], 7, 8)
    x = _rand(*shape)
    params = [p for _, p in ours.named_parameters()]
    t_params = [p for _, p in theirs.named_parameters()]
    xa, xt = ag.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ya, yt = ours(xa), theirs(xt)
    np.testing.assert_allclose(ya.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = _rand(*ya.shape, seed=5)
    for a, t in zip(ag.grad_sync(ya, [xa, *params], ag.tensor(g)),
                    torch.autograd.grad(yt, [xt, *t_params], torch.tensor(g))):
        np.testing.assert_allclose(a.numpy(), t.numpy(), rtol=1e-10, atol=1e-10)


def test_conv_init_is_torchs_distribution() -> None:
    conv = nn.Conv2d(4, 8, 3, groups=2)
    bound = 1 / np.sqrt(2 * 3 * 3)  # fan_in = in_channels / groups * kernel taps
    w, b = conv.weight.numpy(), conv.bias.numpy()
    assert w.shape == (8, 2, 3, 3) and b.shape == (8,)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() > 0.8 * bound  # uniform over the whole range, not a narrower one
    assert conv.weight.requires_grad and conv.weight.grad_fn is None


def test_conv_transpose_output_size() -> None:
    torch = pytest.importorskip("torch")
    theirs = torch.nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1).double()
    ours = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    x = _rand(1, 2, 4, 4)
    ya, yt = ours(ag.tensor(x), output_size=(8, 8)), theirs(torch.tensor(x), output_size=(8, 8))
    assert ya.shape == (1, 3, 8, 8)
    np.testing.assert_allclose(ya.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="requested an output size of"):
        ours(ag.tensor(x), output_size=(10, 10))


def test_float32_stays_float32() -> None:
    conv = nn.Conv2d(3, 4, 3, dtype=ag.float32)
    x = ag.tensor(_rand(2, 3, 6, 6).astype(np.float32), requires_grad=True)
    y = conv(x)
    assert y.dtype == ag.float32
    (gx,) = ag.grad_sync(y.sum(), [x])
    assert gx.dtype == ag.float32
