"""ag.attribution against the definitions of its methods: saliency is the input gradient,
SmoothGrad the mean gradient at the same noise, Integrated Gradients is complete and exact
for a linear model, Grad-CAM equals a hand computation; one backward per call, no .grad
touched (also when cancelled), bad arguments refused by name."""

import math

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.attribution import grad_cam, integrated_gradients, saliency, smoothgrad
from asyncgrad.attribution._resize import resize_linear
from asyncgrad.autograd import Function

METHODS = ["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


def mlp(n_in=4, classes=3):
    return nn.Sequential(nn.Linear(n_in, 8), nn.Tanh(), nn.Linear(8, classes))


def backwards_started():
    return ag.autograd.get_engine().statistics().graph_tasks_started


async def per_example_gradient(model, x, target):
    """The gradient of ``model(x)[i, target[i]]`` with respect to example i, one at a time."""
    rows = []
    for i in range(x.shape[0]):
        xi = ag.tensor(x.numpy()[i:i + 1], requires_grad=True)
        out = model(xi)
        score = out[0] if out.ndim == 1 else out[0, target[i]]
        (g,) = await ag.grad(score, [xi])
        rows.append(g.numpy()[0])
    return np.stack(rows)


class ChannelMix(nn.Module):
    """A 1x1 convolution, (N, C, H, W) -> (N, D, H, W), as a Linear over the channel axis."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.mix = nn.Linear(c_in, c_out)

    def forward(self, x):
        return self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class TinyCNN(nn.Module):
    def __init__(self, c_in=2, channels=3, side=4, classes=5):
        super().__init__()
        self.conv = ChannelMix(c_in, channels)
        self.head = nn.Linear(channels * side * side, classes)

    def forward(self, x):
        return self.head(ag.relu(self.conv(x)).flatten(1))


# --- saliency ---------------------------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("use_abs", [True, False])
async def test_saliency_is_the_input_gradient(use_abs):
    model, x = mlp(), ag.randn(5, 4)
    target = [0, 2, 1, 1, 0]
    got = (await saliency(model, x, target, abs=use_abs)).numpy()
    want = await per_example_gradient(model, x, target)
    np.testing.assert_allclose(got, np.abs(want) if use_abs else want, rtol=1e-12, atol=1e-15)
    before = backwards_started()
    chunked = (await saliency(model, x, target, abs=use_abs, internal_batch_size=2)).numpy()
    assert backwards_started() - before == 3  # 5 examples, 2 at a time
    np.testing.assert_allclose(chunked, got, rtol=1e-12, atol=1e-15)
    assert got.shape == (5, 4) and got.dtype == np.float64
    assert not use_abs or (got >= 0).all()
    assert use_abs or (got < 0).any()  # signed: not the absolute values


@pytest.mark.anyio
async def test_saliency_of_a_scalar_output_model_and_an_int_target():
    w = np.array([1.0, -2.0, 3.0])
    x = ag.randn(4, 3)
    got = await saliency(lambda t: (t * t * ag.tensor(w)).sum(1), x, abs=False)  # output (N,)
    np.testing.assert_allclose(got.numpy(), 2 * x.numpy() * w, rtol=1e-14)
    model, x4 = mlp(), ag.randn(4, 4)
    one = await saliency(model, x4, 2)
    np.testing.assert_allclose(one.numpy(), (await saliency(model, x4, [2, 2, 2, 2])).numpy(), rtol=0)


@pytest.mark.anyio
async def test_saliency_records_under_no_grad_and_splits_additional_forward_args():
    w = ag.randn(3, 2)
    scale = ag.tensor([1.0, 2.0, -3.0])

    def model(t, s, offset):
        return (t @ w) * s.reshape(-1, 1) + offset

    x = ag.randn(3, 3)
    with ag.no_grad():
        got = await saliency(model, x, 1, abs=False, additional_forward_args=(scale, 5.0))
    np.testing.assert_allclose(got.numpy(), scale.numpy()[:, None] * w.numpy()[:, 1][None, :], rtol=1e-14)


# --- SmoothGrad -------------------------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("nt_type", ["smoothgrad", "smoothgrad_sq", "vargrad"])
async def test_smoothgrad_is_the_mean_gradient_at_the_same_noise(nt_type):
    model, x = mlp(), ag.randn(3, 4)
    target, samples, stdevs = [2, 0, 1], 6, 0.3
    got = await smoothgrad(model, x, target, nt_samples=samples, stdevs=stdevs, nt_type=nt_type,
                           generator=ag.Generator(7))
    noise = ag.Generator(7).rng.standard_normal((samples, 3, 4)) * stdevs
    grads = np.stack([await per_example_gradient(model, ag.tensor(x.numpy() + noise[s]), target)
                      for s in range(samples)])
    want = {"smoothgrad": grads.mean(0), "smoothgrad_sq": (grads ** 2).mean(0), "vargrad": grads.var(0)}[nt_type]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-14)
    plain = (await saliency(model, x, target, abs=False)).numpy()
    assert nt_type != "smoothgrad" or not np.allclose(got.numpy(), plain)  # the noise changed something


@pytest.mark.anyio
async def test_smoothgrad_abs_and_chunks_give_the_same_mean():
    model, x = mlp(), ag.randn(3, 4)
    kw = dict(nt_samples=5, stdevs=0.5, abs=True)
    whole = await smoothgrad(model, x, 1, generator=ag.Generator(3), **kw)
    before = backwards_started()
    chunked = await smoothgrad(model, x, 1, generator=ag.Generator(3), internal_batch_size=4, **kw)
    assert backwards_started() - before == math.ceil(5 * 3 / 4)
    np.testing.assert_allclose(chunked.numpy(), whole.numpy(), rtol=1e-12)
    noise = ag.Generator(3).rng.standard_normal((5, 3, 4)) * 0.5
    want = np.mean([np.abs(await per_example_gradient(model, ag.tensor(x.numpy() + noise[s]), [1, 1, 1]))
                    for s in range(5)], axis=0)
    np.testing.assert_allclose(whole.numpy(), want, rtol=1e-10)


@pytest.mark.anyio
async def test_smoothgrad_with_zero_noise_is_saliency():
    model, x = mlp(), ag.randn(2, 4)
    got = await smoothgrad(model, x, 0, nt_samples=3, stdevs=0.0)
    np.testing.assert_allclose(got.numpy(), (await saliency(model, x, 0, abs=False)).numpy(), rtol=1e-12)


# --- Integrated Gradients -----------------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("method", METHODS)
async def test_integrated_gradients_of_a_linear_model_is_input_minus_baseline_times_weight(method):
    lin = nn.Linear(4, 3)
    x, base = ag.randn(5, 4), ag.randn(5, 4)
    target = [0, 1, 2, 2, 1]
    got = await integrated_gradients(lin, x, base, target, n_steps=7, method=method)
    w = lin.weight.detach().numpy()
    np.testing.assert_allclose(got.numpy(), (x.numpy() - base.numpy()) * w[target], rtol=1e-12, atol=1e-15)


@pytest.mark.anyio
@pytest.mark.parametrize("method", METHODS)
async def test_integrated_gradients_is_complete_within_the_step_error_and_converges(method):
    model = mlp()
    x, base = ag.randn(3, 4) * 2, ag.zeros(3, 4)
    target = [1, 0, 2]
    f = model(x).detach().numpy()[np.arange(3), target] - model(base).detach().numpy()[np.arange(3), target]
    errors = []
    for n_steps in (4, 16, 64):
        attr, delta = await integrated_gradients(model, x, target=target, n_steps=n_steps, method=method,
                                                 return_convergence_delta=True)
        sums = attr.numpy().sum(1)
        np.testing.assert_allclose(delta.numpy(), sums - f, rtol=1e-10, atol=1e-13)  # the delta returned
        errors.append(np.abs(sums - f).max())
    if method == "gausslegendre":
        assert errors[1] < 1e-9 and errors[2] < 1e-9  # exact to rounding for a smooth model
    else:
        assert errors[0] > errors[1] > errors[2], errors
        order = 1 if method in ("riemann_left", "riemann_right") else 2  # the rule's order in 1 / n_steps
        assert errors[2] < 2 * 4.0 ** -order * errors[1], errors  # 4x the steps: 4**order x smaller


@pytest.mark.anyio
async def test_integrated_gradients_baselines_broadcast_and_chunks_and_scalar_outputs():
    model = mlp(classes=1)
    x = ag.randn(4, 4)
    b = ag.randn(4)
    before = backwards_started()
    full, delta = await integrated_gradients(lambda t: model(t)[:, 0], x, b.reshape(1, 4) * 0 + b, n_steps=9,
                                             internal_batch_size=10, return_convergence_delta=True)
    assert backwards_started() - before == math.ceil(9 * 4 / 10)
    same = await integrated_gradients(model, x, b, n_steps=9)  # output (N, 1) and target None
    np.testing.assert_allclose(full.numpy(), same.numpy(), rtol=1e-12)
    assert np.abs(delta.numpy()).max() < 1e-8
    plain = await integrated_gradients(model, x, 0.5, n_steps=9, multiply_by_inputs=False)
    points = [0.5 + a * (x.numpy() - 0.5) for a in (np.polynomial.legendre.leggauss(9)[0] + 1) / 2]
    weights = np.polynomial.legendre.leggauss(9)[1] / 2
    want = np.zeros((4, 4))
    for w, p in zip(weights, points):
        want += w * await per_example_gradient(model, ag.tensor(p), [0] * 4)
    np.testing.assert_allclose(plain.numpy(), want, rtol=1e-10)


# --- Grad-CAM -----------------------------------------------------------------------------

def hand_grad_cam(model, x, target):
    """Grad-CAM of ``model.conv`` for TinyCNN, by hand: A = conv(x), out = W2 relu(A).flatten + b2."""
    w1, b1 = model.conv.mix.weight.detach().numpy(), model.conv.mix.bias.detach().numpy()
    w2 = model.head.weight.detach().numpy()
    a = np.einsum("dc,nchw->ndhw", w1, x) + b1[None, :, None, None]
    n, d, h, w = a.shape
    g = w2[target].reshape(n, d, h, w) * (a > 0)  # d out[i, t_i] / d A
    weights = g.mean(axis=(2, 3), keepdims=True)
    return np.maximum((weights * a).sum(1, keepdims=True), 0), (weights * a).sum(1, keepdims=True)


@pytest.mark.anyio
async def test_grad_cam_equals_a_hand_computation():
    model = TinyCNN()
    x = ag.randn(3, 2, 4, 4)
    target = [4, 0, 2]
    got = await grad_cam(model, model.conv, x, target)
    want, signed = hand_grad_cam(model, x.numpy(), target)
    assert got.shape == (3, 1, 4, 4)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)
    raw = await grad_cam(model, model.conv, x, target, relu_attributions=False)
    np.testing.assert_allclose(raw.numpy(), signed, rtol=1e-12, atol=1e-15)
    assert (signed < 0).any()  # the ReLU cut something
    assert len(model.conv._forward_hooks) == 0  # the hook is gone
    before = backwards_started()
    chunked = await grad_cam(model, model.conv, x, target, internal_batch_size=2)
    assert backwards_started() - before == 2
    np.testing.assert_allclose(chunked.numpy(), want, rtol=1e-12, atol=1e-15)


@pytest.mark.anyio
async def test_grad_cam_of_a_layer_input_and_a_flat_layer():
    model = TinyCNN()
    x = ag.randn(2, 2, 4, 4)
    # the head's input is relu(A).flatten: (N, C) with no spatial axes, so the map is sum_c G * A
    got = await grad_cam(model, model.head, x, [1, 3], attribute_to_layer_input=True, relu_attributions=False)
    feats = ag.relu(model.conv(x)).flatten(1).detach().numpy()
    w2 = model.head.weight.detach().numpy()
    np.testing.assert_allclose(got.numpy(), (feats * w2[[1, 3]]).sum(1, keepdims=True), rtol=1e-12)
    assert got.shape == (2, 1)


@pytest.mark.anyio
async def test_grad_cam_upsampled_to_the_input():
    model = nn.Sequential(ChannelMix(2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 2 * 3, 4))

    class Pool(nn.Module):  # (N, C, 4, 6) -> (N, C, 2, 3): 2x2 average pooling by reshaping
        def forward(self, t):
            n, c, h, w = t.shape
            return t.reshape(n, c, h // 2, 2, w // 2, 2).mean((3, 5))

    pool = Pool()
    cnn = nn.Sequential(pool, model)
    big = ag.randn(2, 2, 4, 6)
    small = await grad_cam(cnn, model[0], big, [0, 3])
    up = await grad_cam(cnn, model[0], big, [0, 3], upsample_to_input=True)
    assert small.shape == (2, 1, 2, 3) and up.shape == (2, 1, 4, 6)
    np.testing.assert_allclose(up.numpy(), resize_linear(small.numpy(), (4, 6)), rtol=1e-12)


class GapCNN(nn.Module):
    """A real CNN: conv, ReLU, max pool, conv, ReLU, global average pool, linear."""

    def __init__(self, classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 5, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(5, classes)

    def forward(self, x):
        h = ag.relu(self.conv2(self.pool(ag.relu(self.conv1(x)))))
        return self.fc(self.gap(h).flatten(1))


@pytest.mark.anyio
async def test_grad_cam_of_a_conv2d_layer_equals_a_hand_computation():
    model = GapCNN()
    x = ag.randn(3, 2, 6, 6)
    target = [3, 0, 1]
    got = await grad_cam(model, model.conv2, x, target, relu_attributions=False)
    # by hand: out_k = fc.w[k] . mean_hw relu(A) + b, so d out_k / d A[c] = fc.w[k, c] (A[c] > 0) / (H W)
    a = model.conv2(model.pool(ag.relu(model.conv1(x)))).detach().numpy()
    w = model.fc.weight.detach().numpy()
    g = w[target][:, :, None, None] * (a > 0) / (a.shape[2] * a.shape[3])
    want = (g.mean(axis=(2, 3), keepdims=True) * a).sum(1, keepdims=True)
    assert got.shape == (3, 1, 3, 3)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)
    up = await grad_cam(model, model.conv2, x, target, upsample_to_input=True)
    np.testing.assert_allclose(up.numpy(), resize_linear(np.maximum(want, 0), (6, 6)), rtol=1e-12, atol=1e-15)


def test_grad_cam_of_a_conv2d_layer_equals_torchs():
    torch = pytest.importorskip("torch")
    model = GapCNN()
    x = ag.randn(2, 2, 6, 6)
    tnet = torch.nn.ModuleDict({"conv1": torch.nn.Conv2d(2, 4, 3, padding=1),
                                "conv2": torch.nn.Conv2d(4, 5, 3, padding=1), "fc": torch.nn.Linear(5, 4)}).double()
    tnet.load_state_dict({k: torch.from_numpy(v.detach().numpy().copy()) for k, v in model.state_dict().items()})
    tx = torch.from_numpy(x.numpy().copy())
    a = tnet["conv2"](torch.nn.functional.max_pool2d(torch.relu(tnet["conv1"](tx)), 2))
    out = tnet["fc"](torch.relu(a).mean((2, 3)))
    (g,) = torch.autograd.grad(out[[0, 1], [2, 1]].sum(), a)
    want = torch.relu((g.mean((2, 3), keepdim=True) * a).sum(1, keepdim=True)).detach().numpy()
    got = anyio.run(lambda: grad_cam(model, model.conv2, x, [2, 1]))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-14)


def test_resize_linear_matches_torch_interpolate():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(0).standard_normal((2, 3, 3, 5))
    for size in [(7, 4), (3, 10), (1, 1), (6, 5)]:
        want = torch.nn.functional.interpolate(torch.from_numpy(a), size=size, mode="bilinear",
                                               align_corners=False).numpy()
        np.testing.assert_allclose(resize_linear(a, size), want, rtol=1e-12, atol=1e-14)
    b = a[:, :, 0]
    want = torch.nn.functional.interpolate(torch.from_numpy(b), size=9, mode="linear", align_corners=False).numpy()
    np.testing.assert_allclose(resize_linear(b, (9,)), want, rtol=1e-12, atol=1e-14)


# --- one backward, .grad untouched, cancellation ------------------------------------------

CALLS = {
    "saliency": lambda m, x: saliency(m, x, 1),
    "smoothgrad": lambda m, x: smoothgrad(m, x, 1, nt_samples=4, stdevs=0.1),
    "integrated_gradients": lambda m, x: integrated_gradients(m, x, target=1, n_steps=8),
    "grad_cam": lambda m, x: grad_cam(m, m.conv, x, 1),
}


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(CALLS))
async def test_one_backward_per_call_and_no_grad_touched(name):
    model = TinyCNN()
    x = ag.randn(3, 2, 4, 4, requires_grad=True)
    model.head.weight.grad = ag.ones(*model.head.weight.shape)
    kept = model.head.weight.grad
    before = backwards_started()
    result = await CALLS[name](model, x)
    assert backwards_started() - before == 1
    assert model.head.weight.grad is kept and (kept.numpy() == 1).all()
    assert all(p.grad is None for p in model.parameters() if p is not model.head.weight)
    assert x.grad is None and not result.requires_grad


class Stall(Function):
    """Identity whose backward waits on ``release`` after setting ``entered``."""
    entered: anyio.Event
    release: anyio.Event

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    async def backward(ctx, g):
        Stall.entered.set()
        await Stall.release.wait()
        return g


class StallingCNN(TinyCNN):
    def forward(self, x):
        return Stall.apply(super().forward(x))


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(CALLS))
async def test_cancelling_leaves_every_grad_and_hook_alone(name):
    model = StallingCNN()
    x = ag.randn(2, 2, 4, 4)
    Stall.entered, Stall.release = anyio.Event(), anyio.Event()
    model.conv.mix.bias.grad = ag.zeros(3)
    finished = False

    async def call():
        nonlocal finished
        await CALLS[name](model, x)
        finished = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await Stall.entered.wait()  # the backward is running
        tg.cancel_scope.cancel()
    assert not finished
    assert (model.conv.mix.bias.grad.numpy() == 0).all()
    assert all(p.grad is None for p in model.parameters() if p is not model.conv.mix.bias)
    assert len(model.conv._forward_hooks) == 0
    assert ag.autograd.get_engine().statistics().graph_tasks_running == 0
    Stall.release.set()


# --- bad arguments ------------------------------------------------------------------------

BAD = [
    (lambda m, x: saliency(m, x.numpy(), 0), "inputs must be an asyncgrad Tensor"),
    (lambda m, x: saliency(m, ag.tensor([[1, 2]]), 0), "inputs must be floating point"),
    (lambda m, x: saliency(m, x, None), "target is None"),
    (lambda m, x: saliency(m, x, 5), r"target must hold class indices < 5"),
    (lambda m, x: saliency(m, x, -1), "target must hold class indices >= 0"),
    (lambda m, x: saliency(m, x, [0, 1]), "target must give one class index per example: 3 expected"),
    (lambda m, x: saliency(m, x, 1.5), "target must be an int"),
    (lambda m, x: saliency(m, x, True), "target must be an int"),
    (lambda m, x: saliency(lambda t: ag.ones(2, 3), x, 0), r"model must return a Tensor of shape"),
    (lambda m, x: saliency(m, x, 0, internal_batch_size=2.0), "internal_batch_size must be an int >= 1"),
    (lambda m, x: smoothgrad(m, x, 0, nt_samples=0), "nt_samples must be an int >= 1"),
    (lambda m, x: smoothgrad(m, x, 0, stdevs=-1.0), "stdevs must be a finite number >= 0"),
    (lambda m, x: smoothgrad(m, x, 0, nt_type="smooth"), "nt_type must be one of"),
    (lambda m, x: smoothgrad(m, x, 0, internal_batch_size=0), "internal_batch_size must be an int >= 1"),
    (lambda m, x: smoothgrad(m, x, 0, generator=np.random.default_rng(0)), "generator must be"),
    (lambda m, x: integrated_gradients(m, x, target=0, n_steps=0), "n_steps must be an int >= 1"),
    (lambda m, x: integrated_gradients(m, x, target=0, n_steps=1, method="riemann_trapezoid"),
     "n_steps must be >= 2 for method='riemann_trapezoid'"),
    (lambda m, x: integrated_gradients(m, x, target=0, method="simpson"), "method must be one of"),
    (lambda m, x: integrated_gradients(m, x, ag.ones(3, 2), target=0), "baselines of shape"),
    (lambda m, x: integrated_gradients(m, x, "zero", target=0), "baselines must be None, a number"),
    (lambda m, x: grad_cam(m, lambda t: t, x, 0), "layer must be an ag.nn.Module"),
    (lambda m, x: grad_cam(m, nn.Linear(2, 2), x, 0), "layer must be called exactly once .* called 0 times"),
    (lambda m, x: grad_cam(m, m.head, x, 0, upsample_to_input=True), "upsample_to_input needs inputs"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("case", range(len(BAD)))
async def test_bad_arguments_raise_value_errors_naming_them(case):
    call, message = BAD[case]
    model = TinyCNN()
    x = ag.randn(3, 2, 4, 4)
    before = backwards_started()
    with pytest.raises(ValueError, match=message):
        await call(model, x)
    assert backwards_started() == before  # refused before any backward
    assert all(p.grad is None for p in model.parameters()) and len(model.conv._forward_hooks) == 0


@pytest.mark.anyio
async def test_a_layer_called_twice_is_refused():
    lin = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="called 2 times"):
        await grad_cam(lambda t: lin(lin(t)), lin, ag.randn(2, 3), 0)
    assert len(lin._forward_hooks) == 0


# --- Captum, where it is installed ----------------------------------------------------------

def test_the_same_numbers_as_captum():
    torch = pytest.importorskip("torch")
    captum_attr = pytest.importorskip("captum.attr")
    model = TinyCNN()
    x = ag.randn(2, 2, 4, 4)
    w1, b1 = (torch.from_numpy(p.detach().numpy().copy()) for p in (model.conv.mix.weight, model.conv.mix.bias))
    w2, b2 = (torch.from_numpy(p.detach().numpy().copy()) for p in (model.head.weight, model.head.bias))

    class Conv(torch.nn.Module):
        def forward(self, t):
            return torch.einsum("dc,nchw->ndhw", w1, t) + b1[None, :, None, None]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = Conv()

        def forward(self, t):
            return torch.relu(self.conv(t)).flatten(1) @ w2.T + b2

    net = Net()  # the same network in torch
    tx = torch.from_numpy(x.numpy().copy())
    target = [3, 1]

    async def ours():
        return (await saliency(model, x, target), await integrated_gradients(model, x, target=target, n_steps=20),
                await integrated_gradients(model, x, target=target, n_steps=20, method="riemann_middle"),
                await grad_cam(model, model.conv, x, target, relu_attributions=False))

    sal, ig, ig_middle, cam = anyio.run(ours)
    np.testing.assert_allclose(sal.numpy(), captum_attr.Saliency(net).attribute(tx, target=target).numpy(),
                               rtol=1e-10)
    # (Captum's Riemann points come from float32 linspace: agreement to ~1e-8 relative. Its
    # trapezoid rule weighs points 1/(n-1) apart by 1/n, so its weights sum to (n-1)/n: not compared)
    np.testing.assert_allclose(ig.numpy(), captum_attr.IntegratedGradients(net).attribute(
        tx, target=target, n_steps=20).numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(ig_middle.numpy(), captum_attr.IntegratedGradients(net).attribute(
        tx, target=target, n_steps=20, method="riemann_middle").numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(cam.numpy(), captum_attr.LayerGradCam(net, net.conv).attribute(
        tx, target=target).detach().numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.anyio
async def test_a_cancellation_reaches_a_long_call_between_its_chunks():
    # a small model's backward runs inline without yielding: the checkpoint before each chunk
    # is where a timeout's deadline, or a cancel() from elsewhere, reaches the call
    lin = nn.Linear(4, 3)
    forwards = 0

    with anyio.CancelScope() as scope:
        def model(t):
            nonlocal forwards
            forwards += 1
            if forwards == 3:
                scope.deadline = anyio.current_time()  # due now: the event loop delivers it
            return lin(t)

        await integrated_gradients(model, ag.randn(2, 4), target=0, n_steps=50, internal_batch_size=4)
    assert scope.cancelled_caught and forwards == 3  # not the 25 chunks
    assert all(p.grad is None for p in lin.parameters())


@pytest.mark.parametrize("n", [1, 2, 7, 64, 257])
def test_gauss_legendre_nodes_and_weights_are_numpys(n):
    from asyncgrad.attribution._integrated_gradients import gauss_legendre

    nodes, weights = gauss_legendre(n)
    want_nodes, want_weights = np.polynomial.legendre.leggauss(n)
    np.testing.assert_allclose(nodes, want_nodes, rtol=0, atol=1e-14)
    np.testing.assert_allclose(weights, want_weights, rtol=0, atol=1e-13)
    for degree in range(0, 2 * n, max(1, n // 4)):  # exact for polynomials of degree < 2n
        assert weights @ nodes ** degree == pytest.approx((1 + (-1) ** degree) / (degree + 1), abs=1e-13)


@pytest.mark.anyio
async def test_other_tasks_run_between_the_chunks_of_a_long_call():
    lin = nn.Linear(4, 3)
    ticks, seen = 0, []
    done = anyio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.sleep(0)

    def model(t):
        seen.append(ticks)
        return lin(t)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await integrated_gradients(model, ag.randn(2, 4), target=0, n_steps=40, internal_batch_size=4)
        done.set()
    assert len(seen) == 20 and all(b > a for a, b in zip(seen, seen[1:])), seen


@pytest.mark.anyio
async def test_additional_forward_args_follow_their_example_through_every_method():
    # model(t, s) = (t @ w) * s per example: linear in t, so each method has a closed form
    w = ag.randn(4, 3)
    scale = ag.tensor([1.0, -2.0, 0.5])
    x, base = ag.randn(3, 4), ag.randn(3, 4)

    def model(t, s):
        return (t @ w) * s.reshape(-1, 1)

    want_grad = scale.numpy()[:, None] * w.numpy()[:, 2][None, :]
    ig = await integrated_gradients(model, x, base, 2, n_steps=5, internal_batch_size=4,
                                    additional_forward_args=scale)
    np.testing.assert_allclose(ig.numpy(), (x.numpy() - base.numpy()) * want_grad, rtol=1e-12)
    sg = await smoothgrad(model, x, 2, nt_samples=3, stdevs=0.5, internal_batch_size=2,
                          additional_forward_args=(scale,))
    np.testing.assert_allclose(sg.numpy(), want_grad, rtol=1e-12)  # the gradient is the same at every point
    lin = nn.Linear(4, 3)
    cam = await grad_cam(lambda t, s: lin(t) * s.reshape(-1, 1), lin, x, 2, relu_attributions=False,
                         internal_batch_size=2, additional_forward_args=scale)
    out = lin(x).detach().numpy()
    np.testing.assert_allclose(cam.numpy()[:, 0], scale.numpy() * out[:, 2], rtol=1e-12)  # sum_c G A, G = s e_2


@pytest.mark.anyio
async def test_float32_inputs_give_float32_attributions():
    model = mlp().to(ag.float32)
    x = ag.randn(2, 4, dtype=ag.float32)
    for call in (saliency(model, x, 1), smoothgrad(model, x, 1, nt_samples=2),
                 integrated_gradients(model, x, target=1, n_steps=4)):
        assert (await call).dtype == np.float32
