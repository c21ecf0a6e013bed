"""Train a small character-level GPT with asyncgrad, on text that ships with Python.

    pip install "asyncgrad[examples]"
    python examples/train_gpt.py                  # nanoGPT's architecture, a few minutes on 2 cores
    python examples/train_gpt.py --tiny --steps 60 # a few seconds (the test runs this)

The text is the documentation of Python's own standard library (the docstrings of ~40
modules and their public functions and classes, read with ``inspect``): nothing is
downloaded. The model is nanoGPT's (pre-norm blocks, causal self-attention with exact
GELU MLPs, tied input/output embeddings), built from ``ag.nn`` layers, trained with
``ag.optim.AdamW`` and ``await ag.backward(loss)``. At the end it prints the loss on
held-out text and a sample generated from the model.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import math
import sys
import time
from typing import Any

import numpy as np

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.nn import functional as F

try:
    from tqdm import tqdm
except ImportError as e:  # pragma: no cover - exercised by hand
    sys.exit(f"this example needs the examples extra: pip install 'asyncgrad[examples]' ({e})")

MODULES = ("abc", "argparse", "array", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib",
           "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools",
           "glob", "hashlib", "heapq", "inspect", "io", "itertools", "json", "logging", "math", "operator",
           "os", "pathlib", "pickle", "queue", "random", "re", "shutil", "statistics", "string", "subprocess",
           "tempfile", "textwrap", "threading", "typing", "unittest", "urllib.parse", "uuid", "zipfile")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600, help="optimizer steps")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dims", type=int, default=128)
    p.add_argument("--block", type=int, default=64, help="context length in characters")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--tiny", action="store_true", help="1 layer, 2 heads, 32 dims, block 16 (seconds; for tests)")
    p.add_argument("--sample", type=int, default=300, help="characters to generate at the end")
    p.add_argument("--blas-threads", type=int, default=1,
                   help="BLAS threads (default 1: this model's small matrix products run slower on two, "
                        "much slower when other processes share the cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (plain log lines)")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.heads, args.dims, args.block, args.batch_size = 1, 2, 32, 16, 16
        args.lr = max(args.lr, 3e-3)
    if args.dims % args.heads:
        p.error(f"--dims ({args.dims}) must be a multiple of --heads ({args.heads})")
    return args


# --- data ----------------------------------------------------------------------------------------
def stdlib_text() -> str:
    """The docstrings of the standard library modules in MODULES and of their public members."""
    parts: list[str] = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        docs = [inspect.getdoc(mod)]
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr)
            if not attr.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)):
                docs.append(inspect.getdoc(obj))
        parts.extend(d for d in docs if d)
    text = "\n\n".join(dict.fromkeys(parts))  # each docstring once (re-exports repeat them)
    return "".join(c for c in text if c.isascii())


class CharData:
    """The text as integer codes, split 90/10 into train and validation."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.code = {c: i for i, c in enumerate(self.chars)}
        data = np.array([self.code[c] for c in text], dtype=np.int64)
        cut = int(0.9 * len(data))
        self.train, self.val = data[:cut], data[cut:]

    def batch(self, rng: np.random.Generator, split: str, batch: int, block: int) -> tuple[np.ndarray, np.ndarray]:
        data = self.train if split == "train" else self.val
        start = rng.integers(0, len(data) - block - 1, batch)
        rows = start[:, None] + np.arange(block + 1)
        return data[rows[:, :-1]], data[rows[:, 1:]]

    def decode(self, codes: Any) -> str:
        return "".join(self.chars[int(i)] for i in codes)


# --- the model: nanoGPT ------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, dims: int, heads: int, block: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dims, 3 * dims)  # query, key and value in one product
        self.c_proj = nn.Linear(dims, dims)
        self.dropout = dropout
        self.drop = nn.Dropout(dropout)

    def forward(self, x: ag.Tensor) -> ag.Tensor:
        B, T, C = x.shape
        hs = C // self.heads
        # split, as nanoGPT: one SplitBackward0 node writes the three gradients into one
        # qkv-sized array, where three slices would each fill one with zeros to be summed
        q, k, v = (t.reshape(B, T, self.heads, hs).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        # position t attends to 0..t; one fused node (without dropout), as nanoGPT's flash path
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.drop(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, dims: int, heads: int, block: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dims)
        self.attn = CausalSelfAttention(dims, heads, block, dropout)
        self.ln_2 = nn.LayerNorm(dims)
        self.mlp = nn.Sequential(nn.Linear(dims, 4 * dims), nn.GELU(), nn.Linear(4 * dims, dims), nn.Dropout(dropout))

    def forward(self, x: ag.Tensor) -> ag.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dims: int, heads: int, layers: int, block: int, dropout: float) -> None:
        super().__init__()
        self.block = block
        self.wte = nn.Embedding(vocab, dims)
        self.wpe = nn.Embedding(block, dims)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(dims, heads, block, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dims)
        for name, p in self.named_parameters():  # nanoGPT's initialisation
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.ndim == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: np.ndarray) -> ag.Tensor:
        """Logits for the next character at every position of ``idx`` (batch, time)."""
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(np.arange(T)))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.transpose(0, 1)  # tied with the input embedding

    def loss(self, idx: np.ndarray, targets: np.ndarray) -> ag.Tensor:
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def generate(self, start: np.ndarray, n: int, rng: np.random.Generator, temperature: float = 0.8) -> np.ndarray:
        """Sample ``n`` characters after ``start``, one at a time."""
        out = list(start)
        with ag.no_grad():
            for _ in range(n):
                context = np.array(out[-self.block:])[None, :]
                logits = self(context).numpy()[0, -1].astype(np.float64) / temperature
                p = np.exp(logits - logits.max())
                out.append(int(rng.choice(len(p), p=p / p.sum())))
        return np.array(out)


# --- training --------------------------------------------------------------------------------------
def evaluate(model: GPT, data: CharData, rng: np.random.Generator, args: argparse.Namespace, batches: int = 8) -> float:
    model.eval()
    with ag.no_grad():
        losses = [model.loss(*data.batch(rng, "val", args.batch_size, args.block)).item() for _ in range(batches)]
    model.train()
    return float(np.mean(losses))


async def train(args: argparse.Namespace) -> None:
    ag.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    data = CharData(stdlib_text())
    print(f"text: {len(data.train) + len(data.val):,} characters of standard-library docstrings, "
          f"{len(data.chars)} distinct")
    model = GPT(len(data.chars), args.dims, args.heads, args.layers, args.block, args.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.layers} layers, {args.heads} heads, {args.dims} dims, block {args.block}, "
          f"{n_params:,} parameters; batch {args.batch_size}, {args.steps} steps")
    opt = ag.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.99))
    warmup = max(1, args.steps // 20)
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), disable=args.no_progress, unit="step")
    for step in bar:
        # linear warm-up, then cosine decay to a tenth (as nanoGPT)
        frac = (step + 1) / warmup if step < warmup else 0.55 + 0.45 * math.cos(
            math.pi * (step - warmup) / max(1, args.steps - warmup))
        for group in opt.param_groups:
            group["lr"] = args.lr * frac
        x, y = data.batch(rng, "train", args.batch_size, args.block)
        loss = model.loss(x, y)
        opt.zero_grad()
        await ag.backward(loss)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
        if args.no_progress and (step % 100 == 0 or step == args.steps - 1):
            print(f"step {step:5d}  loss {np.mean(losses[-20:]):.4f}", flush=True)
    elapsed = time.perf_counter() - t0
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    print(f"train loss: first {first:.4f} -> last {last:.4f} "
          f"({elapsed:.1f} s, {1e3 * elapsed / max(1, args.steps):.0f} ms/step)")
    print(f"validation loss: {evaluate(model, data, rng, args):.4f} "
          f"(uniform guess: {math.log(len(data.chars)):.4f})")
    prompt = data.val[:args.block // 2]
    print("\nsample (prompt, then generated):\n" + "-" * 60)
    print(data.decode(model.generate(prompt, args.sample, rng)))
    print("-" * 60)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(args.blas_threads, user_api="blas"):
        asyncio.run(train(args))


if __name__ == "__main__":
    main()
