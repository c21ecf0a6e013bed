"""Sequence models written once in PyTorch's idioms, as functions of the namespace
``(torch, nn, F)``: the SAME source builds a torch model and an asyncgrad model with only
the imports swapped. Both start from torch's weights (through the state_dict) and are
compared on the forward, every gradient and a few AdamW steps (float64)."""

import math

import numpy as np
import pytest

import asyncgrad


def char_lstm(torch, nn, F):
    class CharLSTM(nn.Module):
        def __init__(self, vocab_size, embed, hidden, layers):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, embed)
            self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
            self.drop = nn.Dropout(0.0)
            self.head = nn.Linear(hidden, vocab_size)

        def forward(self, idx, targets, state=None):
            x = self.embed(idx)
            out, (h, c) = self.lstm(x, state)
            logits = self.head(self.drop(out))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss, (h.detach(), c.detach())

    return CharLSTM(11, 6, 8, 2)


def char_gru(torch, nn, F):
    class CharGRU(nn.Module):
        def __init__(self, vocab_size, hidden):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, hidden)
            self.rnn = nn.GRU(hidden, hidden, bidirectional=True)
            self.head = nn.Linear(2 * hidden, vocab_size)

        def forward(self, idx, targets, state=None):
            out, h = self.rnn(self.embed(idx).transpose(0, 1), state)
            logits = self.head(out.transpose(0, 1))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            return logits, loss, h.detach()

    return CharGRU(11, 7)


def word_language_model(torch, nn, F):
    """The shape of PyTorch's word-language-model example: an RNN chosen by name, tied
    initialisation by ``nn.init``, hidden states from ``weight.new_zeros``."""

    class RNNModel(nn.Module):
        def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers):
            super().__init__()
            self.drop = nn.Dropout(0.0)
            self.encoder = nn.Embedding(ntoken, ninp)
            if rnn_type in ["LSTM", "GRU"]:
                self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=0.0)
            else:
                self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity="tanh", dropout=0.0)
            self.decoder = nn.Linear(nhid, ntoken)
            self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers
            initrange = 0.1
            nn.init.uniform_(self.encoder.weight, -initrange, initrange)
            nn.init.zeros_(self.decoder.bias)
            nn.init.uniform_(self.decoder.weight, -initrange, initrange)

        def init_hidden(self, bsz):
            weight = next(self.parameters())
            return weight.new_zeros((self.nlayers, bsz, self.nhid))

        def forward(self, idx, targets, hidden=None):
            emb = self.drop(self.encoder(idx.t()))
            if hidden is None:
                hidden = self.init_hidden(idx.size(0))
            output, hidden = self.rnn(emb, hidden)
            decoded = self.decoder(self.drop(output)).view(-1, 11)
            loss = F.nll_loss(F.log_softmax(decoded, dim=1), targets.t().reshape(-1))
            return decoded, loss, hidden.detach()

    return RNNModel("RNN_TANH", 11, 6, 8, 2)


def gpt_block(torch, nn, F, explicit_attention=False):
    n_embd, n_head, block_size = 16, 4, 8

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.n_head, self.n_embd = n_head, n_embd
            if explicit_attention:
                self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                                     .view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            if explicit_attention:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(n_embd)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
            return x

    class TinyGPT(nn.Module):
        def __init__(self, vocab_size=13):
            super().__init__()
            self.wte = nn.Embedding(vocab_size, n_embd)
            self.wpe = nn.Embedding(block_size, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(2)])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

        def forward(self, idx, targets, state=None):
            b, t = idx.size()
            pos = torch.arange(0, t, dtype=torch.int64)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss, None

    return TinyGPT()


def encoder_classifier(torch, nn, F):
    class Classifier(nn.Module):
        def __init__(self, vocab_size=13, d_model=16):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d_model)
            layer = nn.TransformerEncoderLayer(d_model, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=2)
            self.head = nn.Linear(d_model, vocab_size)

        def forward(self, idx, targets, state=None):
            x = self.encoder(self.embed(idx))
            logits = self.head(x.mean(dim=1))
            return logits, F.cross_entropy(logits, targets[:, 0]), None

    return Classifier()


def train(torch, model, idx, targets, steps):
    """The training loop, written once: AdamW steps carrying the recurrent state."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses, state = [], None
    for _ in range(steps):
        opt.zero_grad()
        _, loss, state = model(idx, targets, state)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _namespaces(torch):
    return {"torch": (torch, torch.nn, torch.nn.functional),
            "asyncgrad": (asyncgrad, asyncgrad.nn, asyncgrad.nn.functional)}


@pytest.mark.parametrize("build", [char_lstm, char_gru, word_language_model, gpt_block,
                                   lambda *ns: gpt_block(*ns, explicit_attention=True), encoder_classifier],
                         ids=["char_lstm", "char_gru", "word_language_model", "gpt_block", "gpt_block_explicit_mask",
                              "encoder"])
def test_same_source_same_numbers(build):
    torch = pytest.importorskip("torch")
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        ns = _namespaces(torch)
        theirs, mine = build(*ns["torch"]), build(*ns["asyncgrad"])
        assert list(mine.state_dict()) == list(theirs.state_dict())
        mine.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
        rng = np.random.default_rng(0)
        idx, targets = rng.integers(0, 11, (3, 8)), rng.integers(0, 11, (3, 8))
        t_args = torch.tensor(idx), torch.tensor(targets)
        a_args = asyncgrad.tensor(idx), asyncgrad.tensor(targets)
        t_logits, t_loss, _ = theirs(*t_args)
        a_logits, a_loss, _ = mine(*a_args)
        np.testing.assert_allclose(a_logits.numpy(), t_logits.detach().numpy(), rtol=1e-10, atol=1e-12)
        t_loss.backward()
        a_loss.backward()
        for (name, p), (_, q) in zip(theirs.named_parameters(), mine.named_parameters()):
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
        t_losses = train(torch, theirs, *t_args, steps=4)
        a_losses = train(asyncgrad, mine, *a_args, steps=4)
        np.testing.assert_allclose(a_losses, t_losses, rtol=1e-9)
        assert a_losses[-1] < a_losses[0]
        for (name, p), (_, q) in zip(theirs.named_parameters(), mine.named_parameters()):
            np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-8, atol=1e-10, err_msg=name)
    finally:
        torch.set_default_dtype(prev)
