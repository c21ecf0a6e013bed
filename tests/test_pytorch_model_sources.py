"""PyTorch model code runs with only its imports changed (issue 32): each model below is
one source text, written in PyTorch's idioms, executed once with ``torch`` and once with
``asyncgrad`` bound to the same names. With the same initial weights, losses, every
gradient and a few optimizer steps must agree (float64). Without torch the asyncgrad side
still runs, and must train (its loss falls)."""

import math

import numpy as np
import pytest

import asyncgrad

GPT = '''
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.0)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay = [p for n, p in param_dict.items() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.argmax(probs, dim=-1, keepdim=True)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def train(model, data, steps):
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    losses = []
    for step in range(steps):
        x = torch.stack([data[i:i + 8] for i in (0, 3)])
        y = torch.stack([data[i + 1:i + 9] for i in (0, 3)])
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses
'''

WORD_LM = '''
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.0, max_len=64):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


class BagModel(nn.Module):
    def __init__(self, ntoken=13, ninp=6):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.pos_encoder = PositionalEncoding(ninp)
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src):
        src = self.encoder(src) * math.sqrt(6)
        src = self.pos_encoder(src)
        output = self.decoder(torch.tanh(src))
        return F.log_softmax(output, dim=-1)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def train(model, data, steps):
    criterion = nn.NLLLoss()
    lr = 0.5
    train_data = batchify(data, 2)
    losses = []
    for step in range(steps):
        seq_len = min(5, len(train_data) - 1)
        src, target = train_data[0:seq_len], train_data[1:1 + seq_len].reshape(-1)
        model.zero_grad()
        output = model(src)
        loss = criterion(output.view(-1, 13), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        with torch.no_grad():  # (``p.data.add_``: asyncgrad's ``.data`` is the ndarray itself)
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses
'''

MNIST_MLP = '''
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 12)
        self.fc2 = nn.Linear(12, 4)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, p=0.0, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(model, data, steps):
    x = data.to(torch.get_default_dtype()).view(-1, 1, 4, 4) / 10.0
    target = (data.view(-1, 16).sum(dim=1) % 4).long()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    model.train()
    for step in range(steps):
        optimizer.zero_grad()
        output = model(x)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        output = model(x)
        test_loss = F.nll_loss(output, target, reduction="sum").item()
        pred = output.argmax(dim=1, keepdim=True)
        correct = pred.eq(target.view_as(pred)).sum().item()
    return losses + [test_loss, float(correct)]
'''

MODELS = {"gpt": (GPT, "GPT", 64), "word_lm": (WORD_LM, "BagModel", 31), "mnist_mlp": (MNIST_MLP, "Net", 64)}


def _namespace(torch, source):
    ns = {"torch": torch, "nn": torch.nn, "F": torch.nn.functional, "math": math}
    exec(compile(source, "<model source>", "exec"), ns)
    return ns


def _data(torch, n):
    return torch.tensor(np.random.default_rng(0).integers(0, 11, n), dtype=torch.long)


def _run(torch, name, steps, weights=None):
    source, cls, n = MODELS[name]
    ns = _namespace(torch, source)
    torch.manual_seed(0)
    model = ns[cls]()
    if weights is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    losses = ns["train"](model, _data(torch, n), steps)
    grads = {k: p.grad.numpy().copy() for k, p in model.named_parameters() if p.grad is not None}
    final = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return model, ns, start, losses, grads, final


@pytest.mark.parametrize("name", list(MODELS))
def test_the_model_trains_in_asyncgrad(name):
    asyncgrad.set_default_dtype(np.float64)
    _, _, _, losses, grads, _ = _run(asyncgrad, name, 8)
    assert grads and all(np.isfinite(g).all() for g in grads.values())
    assert losses[7] < losses[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_the_model_matches_pytorch(name):
    torch = pytest.importorskip("torch")
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, _, start, t_losses, t_grads, t_final = _run(torch, name, 4)
    finally:
        torch.set_default_dtype(prev)
    model, ns, a_start, a_losses, a_grads, a_final = _run(asyncgrad, name, 4, weights=start)
    assert set(a_start) == set(start)  # the same state_dict keys
    assert np.allclose(a_losses, t_losses, rtol=1e-9, atol=1e-10)
    assert set(a_grads) == set(t_grads)
    for k in t_grads:
        assert np.allclose(a_grads[k], t_grads[k], rtol=1e-7, atol=1e-10), k
    for k in t_final:
        assert np.allclose(a_final[k], t_final[k], rtol=1e-7, atol=1e-10), k
    if name == "gpt":
        out = model.generate(asyncgrad.tensor([[1, 2]]), 3, top_k=3)
        assert out.shape == (1, 5) and out.dtype == np.int64
