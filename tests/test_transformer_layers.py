"""MultiheadAttention, TransformerEncoderLayer and TransformerEncoder against torch
(float64): outputs, attention weights, every gradient and state_dict keys."""

import numpy as np
import pytest

import asyncgrad as ag

L, S, N, E, HEADS = 5, 6, 2, 8, 2


def _close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def _load(theirs, mine):
    assert list(mine.state_dict()) == list(theirs.state_dict())
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def _masks(torch, rng, length, source):
    causal = np.triu(np.ones((length, source), dtype=bool), 1)
    padding = np.zeros((N, source), dtype=bool)
    padding[1, -2:] = True
    bias = rng.standard_normal((length, source))
    return {
        "none": ({}, {}),
        "bool attn_mask + key_padding_mask": (
            {"attn_mask": causal, "key_padding_mask": padding},
            {"attn_mask": torch.tensor(causal), "key_padding_mask": torch.tensor(padding)}),
        "float attn_mask": ({"attn_mask": bias}, {"attn_mask": torch.tensor(bias)}),
        "3-D bool attn_mask": (
            {"attn_mask": np.broadcast_to(causal, (N * HEADS, length, source)).copy()},
            {"attn_mask": torch.tensor(np.broadcast_to(causal, (N * HEADS, length, source)).copy())}),
    }


CASES = [  # mask, need_weights, average_attn_weights, self-attention
    ("none", True, True, True), ("none", False, True, False), ("none", True, False, False),
    ("bool attn_mask + key_padding_mask", True, False, True), ("bool attn_mask + key_padding_mask", False, True, True),
    ("float attn_mask", True, True, False), ("float attn_mask", False, True, True),
    ("3-D bool attn_mask", True, True, True), ("3-D bool attn_mask", False, True, False),
]


@pytest.mark.parametrize("mask, need_weights, average, self_attention", CASES)
def test_multihead_attention_equals_torch(mask, need_weights, average, self_attention):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, HEADS).double()
    mine = ag.nn.MultiheadAttention(E, HEADS)
    _load(theirs, mine)
    rng = np.random.default_rng(0)
    source = L if self_attention else S
    arrays = [rng.standard_normal((L, N, E))] + [rng.standard_normal((source, N, E)) for _ in range(2)]
    mine_kw, their_kw = _masks(torch, rng, L, source)[mask]
    if self_attention:
        tq = torch.tensor(arrays[0], requires_grad=True)
        aq = ag.tensor(arrays[0], requires_grad=True)
        t_in, a_in = [tq] * 3, [aq] * 3
        t_leaves, a_leaves = [tq], [aq]
    else:
        t_in = t_leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
        a_in = a_leaves = [ag.tensor(a, requires_grad=True) for a in arrays]
    t_out, t_w = theirs(*t_in, need_weights=need_weights, average_attn_weights=average, **their_kw)
    a_out, a_w = mine(*a_in, need_weights=need_weights, average_attn_weights=average, **mine_kw)
    _close(a_out.numpy(), t_out.detach().numpy())
    if need_weights:
        assert a_w.shape == tuple(t_w.shape)
        _close(a_w.numpy(), t_w.detach().numpy())
    else:
        assert a_w is None and t_w is None
    g = rng.standard_normal(a_out.shape)
    loss_t = (t_out * torch.tensor(g)).sum() + (0 if t_w is None else (t_w ** 2).sum())
    loss_a = (a_out * ag.tensor(g)).sum() + (0 if a_w is None else (a_w ** 2).sum())
    loss_t.backward()
    loss_a.backward()
    for t, a in zip(t_leaves, a_leaves):
        _close(a.grad.numpy(), t.grad.numpy())
    for p, q in zip(theirs.parameters(), mine.parameters()):
        _close(q.grad.numpy(), p.grad.numpy())


def test_multihead_attention_kdim_vdim_batch_first_and_unbatched():
    torch = pytest.importorskip("torch")
    theirs = torch.nn.MultiheadAttention(E, HEADS, kdim=3, vdim=4, batch_first=True).double()
    mine = ag.nn.MultiheadAttention(E, HEADS, kdim=3, vdim=4, batch_first=True)
    assert "q_proj_weight" in mine.state_dict() and "in_proj_weight" not in mine.state_dict()
    _load(theirs, mine)
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((N, L, E)), rng.standard_normal((N, S, 3)), rng.standard_normal((N, S, 4))
    t_out, t_w = theirs(*(torch.tensor(a) for a in (q, k, v)))
    a_out, a_w = mine(*(ag.tensor(a) for a in (q, k, v)))
    assert a_out.shape == (N, L, E)
    _close(a_out.numpy(), t_out.detach().numpy())
    _close(a_w.numpy(), t_w.detach().numpy())
    t_out, t_w = theirs(*(torch.tensor(a[0]) for a in (q, k, v)))  # unbatched
    a_out, a_w = mine(*(ag.tensor(a[0]) for a in (q, k, v)))
    assert a_out.shape == (L, E) and a_w.shape == (L, S)
    _close(a_out.numpy(), t_out.detach().numpy())
    _close(a_w.numpy(), t_w.detach().numpy())


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu"), (False, "callable")])
def test_transformer_encoder_equals_torch(norm_first, activation):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    act_t = torch.nn.functional.gelu if activation == "callable" else activation
    act_a = ag.nn.functional.gelu if activation == "callable" else activation
    t_layer = torch.nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=16, dropout=0.0, activation=act_t,
                                               norm_first=norm_first, batch_first=True)
    a_layer = ag.nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=16, dropout=0.0, activation=act_a,
                                            norm_first=norm_first, batch_first=True)
    theirs = torch.nn.TransformerEncoder(t_layer, 2, norm=torch.nn.LayerNorm(E), enable_nested_tensor=False).double()
    mine = ag.nn.TransformerEncoder(a_layer, 2, norm=ag.nn.LayerNorm(E))
    assert list(mine.state_dict())[:4] == ["layers.0.self_attn.in_proj_weight", "layers.0.self_attn.in_proj_bias",
                                           "layers.0.self_attn.out_proj.weight", "layers.0.self_attn.out_proj.bias"]
    _load(theirs, mine)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N, L, E))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    padding = np.zeros((N, L))
    padding[0, -1] = -np.inf  # a float mask, as the causal one (torch deprecates mixing the two kinds)
    tx, ax = torch.tensor(x, requires_grad=True), ag.tensor(x, requires_grad=True)
    t_out = theirs(tx, mask=mask, src_key_padding_mask=torch.tensor(padding))
    a_out = mine(ax, mask=mask.numpy(), src_key_padding_mask=padding)
    _close(a_out.numpy(), t_out.detach().numpy())
    g = rng.standard_normal(a_out.shape)
    t_out.backward(torch.tensor(g))
    a_out.backward(ag.tensor(g))
    _close(ax.grad.numpy(), tx.grad.numpy())
    for p, q in zip(theirs.parameters(), mine.parameters()):
        _close(q.grad.numpy(), p.grad.numpy())


def test_encoder_layers_are_independent_copies_and_dropout_follows_train_mode():
    layer = ag.nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=16)
    enc = ag.nn.TransformerEncoder(layer, 2)
    assert enc.layers[0].linear1.weight is not enc.layers[1].linear1.weight
    np.testing.assert_array_equal(enc.layers[0].linear1.weight.numpy(), enc.layers[1].linear1.weight.numpy())
    x = ag.randn(L, N, E)
    assert not np.allclose(enc(x).numpy(), enc(x).numpy())  # dropout=0.1 while training
    enc.eval()
    np.testing.assert_array_equal(enc(x).numpy(), enc(x).numpy())


def test_errors():
    with pytest.raises(AssertionError, match="embed_dim must be divisible by num_heads"):
        ag.nn.MultiheadAttention(7, 2)
    mha = ag.nn.MultiheadAttention(E, HEADS)
    x = ag.randn(L, N, E)
    with pytest.raises(RuntimeError, match="The shape of the 2D attn_mask is"):
        mha(x, x, x, attn_mask=np.zeros((L, L + 1), dtype=bool))
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        mha(x, x, x, is_causal=True)
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        ag.nn.TransformerEncoderLayer(E, HEADS, activation="tanh")
