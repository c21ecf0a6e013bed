"""The GPT used by the transformer workload and the op profile: nanoGPT's architecture
(pre-norm blocks, causal attention, exact GELU MLP, tied input/output embedding),
written once with ``ag.nn`` and once with ``torch.nn`` under the same parameter names so
both start from the same weights.

    asyncgrad: loss = model(idx, targets); await ag.backward(loss); opt.step()
    torch:     the same model

Both take ``attention="manual"`` (the scores, mask and softmax as separate ops, nanoGPT's
fallback) or ``"sdpa"`` (``F.scaled_dot_product_attention``, what nanoGPT calls).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 65
    block: int = 64
    layers: int = 4
    heads: int = 4
    dims: int = 128
    batch: int = 16

    def describe(self) -> str:
        return (f"{self.layers} layers, {self.heads} heads, {self.dims} dims, block {self.block}, "
                f"batch {self.batch}, vocab {self.vocab}, float32, AdamW")


def make_batch(cfg: GPTConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random token batch ``(idx, targets)`` of shape ``(batch, block)`` each."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.block + 1))
    return data[:, :-1].astype(np.int64), data[:, 1:].astype(np.int64)


# --- asyncgrad -------------------------------------------------------------------------------
def ag_model(cfg: GPTConfig, attention: str = "manual") -> Any:
    """nanoGPT with ``ag.nn`` layers; ``attention`` is ``"manual"`` (scores, mask, softmax
    as separate ops) or ``"sdpa"`` (``F.scaled_dot_product_attention``, one fused node)."""
    import asyncgrad as ag
    from asyncgrad import nn
    from asyncgrad.nn import functional as F

    causal = np.tril(np.ones((cfg.block, cfg.block), dtype=bool))

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(cfg.dims, 3 * cfg.dims)
            self.c_proj = nn.Linear(cfg.dims, cfg.dims)

        def forward(self, x: Any) -> Any:
            B, T, C = x.shape
            h, hs = cfg.heads, C // cfg.heads
            # split, as nanoGPT and the torch model: one SplitBackward0 node writes the
            # three gradients into qkv's, where three slices' backward would each write a
            # zero-filled qkv-sized array, then summed (3-5 ms per step)
            q, k, v = (t.reshape((B, T, h, hs)).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
                att = ag.where(causal[:T, :T], att, -math.inf)
                att = F.softmax(att, -1)
                y = att @ v
            y = y.transpose(1, 2).reshape((B, T, C))
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc = nn.Linear(cfg.dims, 4 * cfg.dims)
            self.c_proj = nn.Linear(4 * cfg.dims, cfg.dims)

        def forward(self, x: Any) -> Any:
            return self.c_proj(F.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(cfg.dims)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(cfg.dims)
            self.mlp = MLP()

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab, cfg.dims)
            self.wpe = nn.Embedding(cfg.block, cfg.dims)
            self.h = nn.ModuleList([Block() for _ in range(cfg.layers)])
            self.ln_f = nn.LayerNorm(cfg.dims)

        def forward(self, idx: np.ndarray, targets: np.ndarray) -> Any:
            B, T = idx.shape
            x = self.wte(idx) + self.wpe(np.arange(T))
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.transpose(0, 1)  # tied weights
            return F.cross_entropy(logits.reshape((B * T, cfg.vocab)), targets.reshape(-1))

    model = GPT()
    for name, p in model.named_parameters():  # nanoGPT's initialisation
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.ndim == 2:
            nn.init.normal_(p, 0.0, _init_std(name, cfg))
    return model


def _init_std(name: str, cfg: GPTConfig) -> float:
    return 0.02 / math.sqrt(2 * cfg.layers) if name.endswith("c_proj.weight") else 0.02


# --- PyTorch ---------------------------------------------------------------------------------
def torch_model(cfg: GPTConfig, attention: str = "manual") -> Any:
    """The same nanoGPT in ``torch.nn``; ``attention`` is ``"manual"`` or ``"sdpa"``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    causal = torch.tril(torch.ones(cfg.block, cfg.block, dtype=torch.bool))

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(cfg.dims, 3 * cfg.dims)
            self.c_proj = nn.Linear(cfg.dims, cfg.dims)

        def forward(self, x: Any) -> Any:
            B, T, C = x.shape
            h, hs = cfg.heads, C // cfg.heads
            q, k, v = (t.view(B, T, h, hs).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
                att = att.masked_fill(~causal[:T, :T], float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc = nn.Linear(cfg.dims, 4 * cfg.dims)
            self.c_proj = nn.Linear(4 * cfg.dims, cfg.dims)

        def forward(self, x: Any) -> Any:
            return self.c_proj(F.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(cfg.dims)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(cfg.dims)
            self.mlp = MLP()

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab, cfg.dims)
            self.wpe = nn.Embedding(cfg.block, cfg.dims)
            self.h = nn.ModuleList([Block() for _ in range(cfg.layers)])
            self.ln_f = nn.LayerNorm(cfg.dims)

        def forward(self, idx: Any, targets: Any) -> Any:
            B, T = idx.shape
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(B * T, cfg.vocab), targets.view(-1))

    model = GPT()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 2:
                p.normal_(0.0, _init_std(name, cfg))
    return model


def copy_weights(torch_gpt: Any, ag_gpt: Any) -> None:
    """Give the asyncgrad model the torch model's weights (same names, same shapes)."""
    import asyncgrad as ag

    state = {k: ag.from_numpy(v.detach().numpy().copy()) for k, v in torch_gpt.state_dict().items()}
    ag_gpt.load_state_dict(state)


def torch_sdpa_steps(cfg: GPTConfig, idx: Any, targets: Any, steps: int = 1) -> Callable[[], None] | None:
    """``steps`` training steps (zero_grad, forward, backward, AdamW) of torch's model
    with SDPA attention on ``idx``/``targets`` (numpy arrays), seeded 0; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    model = torch_model(cfg, "sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ti, tt = torch.from_numpy(idx), torch.from_numpy(targets)

    def run() -> None:
        for _ in range(steps):
            opt.zero_grad()
            model(ti, tt).backward()
            opt.step()
    return run
