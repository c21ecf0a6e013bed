"""ag.nn: registration, modes, state dicts, initialisation and the layers' gradients."""

import math

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.nn import functional as F


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.norm = nn.LayerNorm(4)
        self.drop = nn.Dropout(0.5)
        self.scale = nn.Parameter(ag.ones(1))
        self.register_buffer("steps", ag.zeros(1))
        self.note = "not state"
        self.cache = ag.zeros(2)  # a tensor that does not require grad: a plain attribute

    def forward(self, x):
        return self.drop(self.norm(self.fc(x))) * self.scale


# --- registration -------------------------------------------------------------------------
def test_parameters_and_submodules_are_registered_in_order():
    m = nn.Sequential(Block(), nn.ReLU(), nn.Linear(4, 2))
    names = [n for n, _ in m.named_parameters()]
    assert names == ["0.scale", "0.fc.weight", "0.fc.bias", "0.norm.weight", "0.norm.bias",
                     "2.weight", "2.bias"]
    assert [n for n, _ in m.named_buffers()] == ["0.steps"]
    assert [type(c).__name__ for c in m.children()] == ["Block", "ReLU", "Linear"]
    assert [n for n, _ in m.named_modules()] == ["", "0", "0.fc", "0.norm", "0.drop", "1", "2"]
    assert len(list(m.modules())) == 7
    assert all(isinstance(p, nn.Parameter) for p in m.parameters())
    assert m[0].note == "not state" and "cache" not in dict(m[0].named_buffers())


def test_parameter_is_a_plain_leaf_tensor_sharing_memory():
    data = ag.zeros(3)
    p = nn.Parameter(data)
    assert type(p) is ag.Tensor and p.is_leaf and p.requires_grad
    p.data[0] = 5.0
    assert data.data[0] == 5.0
    assert not isinstance(ag.ones(2), nn.Parameter)
    assert not isinstance(p * 2, nn.Parameter)


def test_shared_parameter_and_module_appear_once():
    lin = nn.Linear(2, 2)
    m = nn.Sequential(lin, nn.Tanh(), lin)
    assert len(list(m.parameters())) == 2
    assert [n for n, _ in m.named_parameters()] == ["0.weight", "0.bias"]


def test_reassigning_and_frozen_parameters():
    lin = nn.Linear(2, 3)
    with pytest.raises(TypeError, match="cannot assign"):
        lin.weight = ag.ones(3, 2)  # does not require grad
    lin.bias = None
    assert lin.bias is None and [n for n, _ in lin.named_parameters()] == ["weight"]
    assert lin(ag.ones(1, 2)).shape == (1, 3)
    lin.register_parameter("frozen", ag.ones(2))
    assert "frozen" in dict(lin.named_parameters())
    del lin.frozen
    assert "frozen" not in dict(lin.named_parameters())
    with pytest.raises(AttributeError):
        lin.missing  # noqa: B018


def test_setattr_before_init_raises():
    class Bad(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(1, 1)

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()


def test_module_list_and_dict():
    m = nn.Module()
    m.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    m.heads = nn.ModuleDict({"a": nn.Linear(2, 1)})
    assert [n for n, _ in m.named_parameters()] == [
        "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "heads.a.weight", "heads.a.bias"]
    assert len(m.layers) == 2 and isinstance(m.heads["a"], nn.Linear)


# --- modes and grads -------------------------------------------------------------------------
def test_train_eval_propagate():
    m = nn.Sequential(Block(), nn.Linear(4, 4))
    assert all(x.training for x in m.modules())
    assert m.eval() is m
    assert not any(x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())


def test_dropout_train_and_eval():
    d = nn.Dropout(0.25)
    x = ag.ones(200, 50, requires_grad=True)
    y = d(x)
    kept = y.numpy() != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.75)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.75)
    d.eval()
    assert d(x) is x
    assert F.dropout(x, 0.25, training=False) is x
    assert np.all(F.dropout(x, 1.0).numpy() == 0)


def test_dropout_mask_follows_the_default_generator():
    x = ag.ones(10, 10)
    ag.manual_seed(123)
    a = F.dropout(x, 0.5).numpy()
    ag.manual_seed(123)
    b = F.dropout(x, 0.5).numpy()
    state = ag.get_rng_state()
    c = F.dropout(x, 0.5).numpy()
    ag.set_rng_state(state)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(F.dropout(x, 0.5).numpy(), c)
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def test_zero_grad():
    lin = nn.Linear(3, 2)
    lin(ag.ones(4, 3)).sum().backward()
    assert lin.weight.grad is not None
    lin.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(lin.weight.grad.numpy(), 0)
    lin.zero_grad()
    assert lin.weight.grad is None and lin.bias.grad is None


async def test_concurrent_backward_on_a_shared_module_sums_gradients():
    model = nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    xs = [ag.randn(8, 5) for _ in range(12)]
    ys = [ag.randint(0, 3, (8,)) for _ in range(12)]

    async def one(i):
        await ag.backward(F.cross_entropy(model(xs[i]), ys[i]))

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(one, i)
    together = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    for i in range(12):
        await one(i)
    for a, p in zip(together, model.parameters()):
        np.testing.assert_allclose(a, p.grad.numpy(), rtol=1e-12, atol=1e-12)


# --- state ----------------------------------------------------------------------------------------
def test_state_dict_round_trip_through_a_file(tmp_path):
    ag.manual_seed(1)
    a = Block().eval()
    a.steps.data[0] = 7.0
    ag.manual_seed(2)
    b = Block().eval()
    x = ag.randn(2, 3)
    assert not np.allclose(a(x).numpy(), b(x).numpy())
    path = tmp_path / "model.npz"
    a.save(path)
    assert path.exists()
    with np.load(path, allow_pickle=False) as z:  # a plain npz file, no pickles
        assert sorted(z.files) == sorted(a.state_dict())
    versions = [p._version for p in b.parameters()]
    assert b.load(path) == ([], [])
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    assert b.steps.item() == 7.0
    assert [p._version for p in b.parameters()] == [v + 1 for v in versions]


def test_state_dict_shares_memory_and_is_detached():
    lin = nn.Linear(2, 2)
    sd = lin.state_dict()
    assert list(sd) == ["weight", "bias"]
    assert not sd["weight"].requires_grad
    assert np.shares_memory(sd["weight"].numpy(), lin.weight.numpy())


def test_load_state_dict_checks_keys_and_shapes():
    lin = nn.Linear(2, 2)
    before = lin.weight.numpy().copy()
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "bias"'):
        lin.load_state_dict({"weight": np.zeros((2, 2))})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        lin.load_state_dict({"weight": np.zeros((2, 2)), "bias": np.zeros(2), "extra": np.zeros(1)})
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        lin.load_state_dict({"weight": np.zeros((3, 2)), "bias": np.zeros(2)})
    np.testing.assert_array_equal(lin.weight.numpy(), before)  # nothing copied on error
    keys = lin.load_state_dict({"weight": ag.zeros(2, 2)}, strict=False)
    assert keys.missing_keys == ["bias"] and keys.unexpected_keys == []
    np.testing.assert_array_equal(lin.weight.numpy(), 0)


def test_to_dtype_keeps_identity():
    lin = nn.Linear(2, 2)
    w = lin.weight
    lin.float()
    assert lin.weight is w and w.dtype == np.float32
    assert lin(ag.ones(1, 2, dtype=np.float32)).dtype == np.float32


# --- layers ---------------------------------------------------------------------------------------
def test_linear_init_and_forward():
    ag.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    assert w.shape == (300, 400) and b.shape == (300,)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.02 * bound  # U(-bound, bound)
    x = ag.randn(5, 400)
    np.testing.assert_allclose(lin(x).numpy(), x.numpy() @ w.T + b, rtol=1e-12)
    ag.manual_seed(0)
    np.testing.assert_array_equal(nn.Linear(400, 300).weight.numpy(), w)  # seeded by ag.manual_seed
    assert nn.Linear(3, 2, bias=False).bias is None


def test_layer_norm_forward_and_gradcheck():
    x = ag.randn(3, 4, 5, requires_grad=True)
    ln = nn.LayerNorm((4, 5))
    y = ln(x).numpy()
    xd = x.numpy()
    mu = xd.mean(axis=(1, 2), keepdims=True)
    ref = (xd - mu) / np.sqrt(xd.var(axis=(1, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-12)
    w, b = ag.randn(5, requires_grad=True), ag.randn(5, requires_grad=True)
    xs = ag.randn(2, 5, requires_grad=True)
    assert ag.autograd.gradcheck(lambda x, w, b: F.layer_norm(x, 5, w, b), (xs, w, b))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        ln(ag.randn(2, 3))


def test_embedding_forward_gradients_and_padding():
    emb = nn.Embedding(6, 3, padding_idx=1)
    np.testing.assert_array_equal(emb.weight.numpy()[1], 0)
    idx = ag.tensor([[0, 1, 2], [2, 2, 5]])
    out = emb(idx)
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out.numpy(), emb.weight.numpy()[idx.numpy()])
    out.sum().backward()
    counts = np.array([1, 0, 3, 0, 0, 1], dtype=float)  # padding row gets no gradient
    np.testing.assert_array_equal(emb.weight.grad.numpy(), np.repeat(counts[:, None], 3, axis=1))
    w = ag.randn(4, 2, requires_grad=True)
    assert ag.autograd.gradcheck(lambda w: F.embedding(np.array([[3, 0], [3, 3]]), w), (w,))
    with pytest.raises(IndexError):
        emb(ag.tensor([6]))


def test_activations_and_losses_match_functional():
    x = ag.randn(4, 3)
    t = ag.tensor([0, 2, 1, 1])
    np.testing.assert_array_equal(nn.ReLU()(x).numpy(), np.maximum(x.numpy(), 0))
    np.testing.assert_array_equal(nn.Tanh()(x).numpy(), np.tanh(x.numpy()))
    np.testing.assert_array_equal(nn.GELU()(x).numpy(), F.gelu(x).numpy())
    np.testing.assert_array_equal(nn.Softmax(1)(x).numpy(), F.softmax(x, 1).numpy())
    assert nn.CrossEntropyLoss()(x, t).item() == F.cross_entropy(x, t).item()
    assert nn.MSELoss()(x, ag.zeros(4, 3)).item() == pytest.approx((x.numpy() ** 2).mean())
    assert nn.Flatten()(ag.zeros(2, 3, 4)).shape == (2, 12)


def test_matches_torch_forward_and_backward():
    torch = pytest.importorskip("torch")
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3))
    tmodel = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                 torch.nn.Linear(8, 3)).double()
    tmodel.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    x = ag.randn(5, 6)
    y = ag.tensor([0, 1, 2, 2, 1])
    F.cross_entropy(model(x), y).backward()
    torch.nn.functional.cross_entropy(tmodel(torch.from_numpy(x.numpy())), torch.from_numpy(y.numpy())).backward()
    for (name, p), (tname, tp) in zip(model.named_parameters(), tmodel.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-10, atol=1e-12)
    emb, temb = nn.Embedding(5, 3), torch.nn.Embedding(5, 3).double()
    temb.weight.data = torch.from_numpy(emb.weight.numpy().copy())
    np.testing.assert_array_equal(emb([4, 0]).numpy(), temb(torch.tensor([4, 0])).detach().numpy())


def test_forward_hooks():
    lin = nn.Linear(2, 2)
    seen = []
    h1 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    h2 = lin.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    out = lin(ag.ones(3, 2))
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(lin.bias.numpy(), (3, 2)))
    assert seen == [(3, 2)]
    h1.remove()
    h2.remove()
    lin(ag.ones(1, 2))
    assert seen == [(3, 2)]


def test_clip_grad_norm_and_value():
    a, b = ag.zeros(2, requires_grad=True), ag.zeros(1, requires_grad=True)
    a.grad, b.grad = ag.tensor([3.0, 0.0]), ag.tensor([4.0])
    total = nn.utils.clip_grad_norm_([a, b], max_norm=1.0)
    assert total.item() == pytest.approx(5.0)
    np.testing.assert_allclose(np.concatenate([a.grad.numpy(), b.grad.numpy()]), [0.6, 0.0, 0.8], rtol=1e-5)
    assert nn.utils.clip_grad_norm_([a, b], max_norm=10.0).item() == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0.0], rtol=1e-5)  # under the limit: unchanged
    nn.utils.clip_grad_value_([a, b], 0.7)
    np.testing.assert_allclose(b.grad.numpy(), [0.7])


def test_buffers_persistent_and_not():
    m = nn.Module()
    m.register_buffer("kept", ag.ones(2))
    m.register_buffer("scratch", ag.zeros(2), persistent=False)
    assert list(m.state_dict()) == ["kept"]
    assert [n for n, _ in m.named_buffers()] == ["kept", "scratch"]
    m.register_buffer("scratch", ag.zeros(2))
    assert list(m.state_dict()) == ["kept", "scratch"]
    m.kept = ag.full((2,), 3.0)  # assigning a tensor to a buffer name replaces the buffer
    assert m.state_dict()["kept"].tolist() == [3.0, 3.0]
