"""Activation checkpointing: recompute in backward instead of keeping activations.

    python examples/checkpointing.py

A deep MLP with dropout runs three ways: plainly, with
``checkpoint_sequential(model, segments, x)`` (the reentrant form, as PyTorch's default)
and with ``use_reentrant=False``. The gradients are the same, dropout masks included,
because checkpointing saves and restores asyncgrad's random generator around the
recomputation. The saved-tensor count shows what checkpointing keeps.
"""

from __future__ import annotations

import anyio
import numpy as np

import asyncgrad as ag
from asyncgrad import nn
from asyncgrad.autograd.graph import saved_tensors_hooks

try:
    from asyncgrad.utils.checkpoint import checkpoint_sequential
except ImportError as e:  # pragma: no cover
    raise SystemExit(f"this asyncgrad has no asyncgrad.utils.checkpoint ({e})") from None


def make_model(depth: int = 8, width: int = 64) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers, nn.Linear(width, 1))


async def gradients(model: nn.Sequential, x: ag.Tensor, mode: str) -> tuple[list[np.ndarray], int]:
    """Gradients of the parameters, and how many tensors the forward saved for backward."""
    saved = 0

    def pack(t: ag.Tensor) -> ag.Tensor:
        nonlocal saved
        saved += 1
        return t

    model.zero_grad()
    ag.manual_seed(1)  # the same dropout masks in every mode
    with saved_tensors_hooks(pack, lambda t: t):
        if mode == "plain":
            out = model(x)
        else:
            out = checkpoint_sequential(model, 4, x, use_reentrant=(mode == "reentrant"))
    await ag.backward(out.pow(2).mean())
    return [p.grad.numpy().copy() for p in model.parameters()], saved  # type: ignore[union-attr]


async def main() -> None:
    ag.set_default_dtype(np.float64)
    ag.manual_seed(0)
    model = make_model()
    x = ag.randn(32, 64)
    plain, n_plain = await gradients(model, x, "plain")
    for mode in ("reentrant", "non-reentrant"):
        grads, n = await gradients(model, x, mode)
        same = all(np.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(plain, grads))
        print(f"{mode:>13}: gradients equal to the plain run: {same}; tensors saved in forward: "
              f"{n} (plain: {n_plain})")


if __name__ == "__main__":
    anyio.run(main)
