"""Train an MLP on scikit-learn's handwritten digits with asyncgrad.

    pip install "asyncgrad[examples]"
    python examples/train_digits.py                 # ~97% test accuracy in a few seconds
    python examples/train_digits.py --checkpoint    # the same with checkpoint_sequential

The digits data set (1797 8x8 images) ships inside scikit-learn: nothing is downloaded.
Each mini-batch is split into ``--shards`` pieces whose backward passes run
*concurrently* (``await ag.backward`` in a task group) and accumulate into the shared
parameters' ``.grad``; the sum equals the gradient of the whole batch, so the optimizer
step is the usual one.
"""

from __future__ import annotations

import argparse
import sys
import time

import anyio
import numpy as np

import asyncgrad as ag
from asyncgrad import nn

try:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from tqdm import tqdm
except ImportError as e:  # pragma: no cover - exercised by hand
    sys.exit(f"this example needs the examples extra: pip install 'asyncgrad[examples]' ({e})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--hidden", type=int, default=128, help="width of the two hidden layers")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shards", type=int, default=4, help="concurrent backward calls per mini-batch")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--limit", type=int, default=None, help="use only this many training examples (for tests)")
    p.add_argument("--checkpoint", action="store_true",
                   help="run the model through ag.utils.checkpoint.checkpoint_sequential (recompute in backward)")
    p.add_argument("--segments", type=int, default=2, help="checkpoint segments (with --checkpoint)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, help="write the trained weights here (numpy .npz, no pickles)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (plain log lines)")
    return p.parse_args(argv)


def load_checkpoint_sequential():  # type: ignore[no-untyped-def]
    try:
        from asyncgrad.utils.checkpoint import checkpoint_sequential
    except ImportError as e:
        sys.exit(f"--checkpoint needs asyncgrad.utils.checkpoint.checkpoint_sequential, which this "
                 f"asyncgrad does not have yet ({e})")
    return checkpoint_sequential


def make_model(hidden: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(hidden, 10),
    )


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with ag.no_grad():
        pred = model(ag.tensor(x)).numpy().argmax(axis=1)
    model.train()
    return float((pred == y).mean())


async def train(args: argparse.Namespace) -> float:
    ag.manual_seed(args.seed)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target.astype(np.int64), test_size=0.2, random_state=args.seed, stratify=digits.target)
    if args.limit:
        x_train, y_train = x_train[: args.limit], y_train[: args.limit]
    model = make_model(args.hidden, args.dropout)
    opt = ag.optim.Adam(model.parameters(), lr=args.lr)
    forward = model
    if args.checkpoint:
        checkpoint_sequential = load_checkpoint_sequential()
        segments = args.segments

        def forward(inp: ag.Tensor) -> ag.Tensor:  # type: ignore[misc]
            return checkpoint_sequential(model, segments, inp)

    print(f"digits: {len(x_train)} train / {len(x_test)} test, MLP 64-{args.hidden}-{args.hidden}-10, "
          f"{args.shards} concurrent backward calls per batch"
          + (f", checkpoint_sequential({args.segments} segments)" if args.checkpoint else ""))
    rng = np.random.default_rng(args.seed)
    n, bs = len(x_train), args.batch_size

    async def shard_backward(xb: np.ndarray, yb: np.ndarray, weight: float, losses: list[float]) -> None:
        # each shard's loss is scaled so the summed gradients equal the batch mean's
        loss = ag.nn.functional.cross_entropy(forward(ag.tensor(xb)), ag.tensor(yb)) * weight
        await ag.backward(loss)
        losses.append(loss.item())

    start = time.perf_counter()
    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n)
        batches = [order[i:i + bs] for i in range(0, n, bs)]
        bar = tqdm(batches, desc=f"epoch {epoch:>3}/{args.epochs}", unit="batch", leave=False,
                   disable=args.no_progress, dynamic_ncols=True)
        total = 0.0
        for idx in bar:
            opt.zero_grad()
            losses: list[float] = []
            shards = [s for s in np.array_split(idx, min(args.shards, len(idx))) if len(s)]
            async with anyio.create_task_group() as tg:
                for s in shards:
                    tg.start_soon(shard_backward, x_train[s], y_train[s], len(s) / len(idx), losses)
            opt.step()
            batch_loss = sum(losses)
            total += batch_loss * len(idx)
            bar.set_postfix(loss=f"{batch_loss:.4f}")
        bar.close()
        acc = accuracy(model, x_test, y_test)
        line = f"epoch {epoch:>3}/{args.epochs}  train loss {total / n:.4f}  test accuracy {acc:.2%}"
        tqdm.write(line) if not args.no_progress else print(line, flush=True)
    elapsed = time.perf_counter() - start
    print(f"final test accuracy: {acc:.2%} ({args.epochs} epochs in {elapsed:.1f} s)")
    if args.save:
        model.save(args.save)
        print(f"saved weights to {args.save}")
    return acc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    anyio.run(train, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
