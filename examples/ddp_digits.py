"""Data-parallel training of the digits MLP on several MPI processes.

    pip install "asyncgrad[examples,mpi]"
    mpiexec -n 2 python -m mpi4py examples/ddp_digits.py              # 2 ranks on this machine
    mpiexec -n 2 python -m mpi4py examples/ddp_digits.py --reference  # and compare with 1 process

Every rank holds the same model (``DistributedDataParallel`` broadcasts rank 0's
weights) and takes its share of each mini-batch; ``await ag.backward(loss)`` averages the
gradients over the ranks while it runs, so every rank's optimizer takes the same step as
one process would on the whole batch. Each rank prints its own progress.

Why ``python -m mpi4py``: an uncaught exception under plain ``python`` leaves the other
ranks waiting in a collective forever; ``-m mpi4py`` turns it into ``MPI_Abort`` and the
job ends in a fraction of a second. On a cluster: ``mpiexec -f hostfile -n 8 python -m
mpi4py examples/ddp_digits.py`` (MPICH), or under Slurm ``srun --mpi=pmix -n 8 python -m
mpi4py examples/ddp_digits.py`` (see docs/guides/distributed.md).
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
except ImportError as e:  # pragma: no cover - exercised by hand
    sys.exit(f"this example needs the examples extra: pip install 'asyncgrad[examples]' ({e})")
try:
    from asyncgrad import distributed as dist
except ImportError as e:  # pragma: no cover - exercised by hand
    sys.exit(str(e))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64, help="global batch, split over the ranks")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference", action="store_true",
                   help="rank 0 then trains the same model on one process and compares")
    return p.parse_args(argv)


def make_model(hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def load(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return train_test_split(x, digits.target.astype(np.int64), test_size=0.2, random_state=seed,  # type: ignore[no-any-return]
                            stratify=digits.target)


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with ag.no_grad():
        return float((model(ag.tensor(x)).numpy().argmax(axis=1) == y).mean())


async def train(args: argparse.Namespace, rank: int, size: int, forward_of: str) -> nn.Module:
    """Train on ``size`` ranks (``forward_of="ddp"``) or alone on whole batches."""
    ag.manual_seed(args.seed + rank)  # different on each rank: the broadcast makes them equal
    x_train, x_test, y_train, y_test = load(args.seed)
    model = make_model(args.hidden)
    forward = dist.DistributedDataParallel(model) if forward_of == "ddp" else model
    opt = ag.optim.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)  # the same order on every rank
    n, bs = len(x_train), args.batch_size
    tag = f"[rank {rank}/{size}]" if forward_of == "ddp" else "[one process]"
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n)
        total, seen = 0.0, 0
        for i in range(0, n, bs):
            idx = order[i:i + bs]
            mine = np.array_split(idx, size)[rank]
            opt.zero_grad()
            # Summed over this rank's share, divided by the global batch and multiplied by
            # the world size: the average over ranks is exactly the whole batch's mean loss.
            logits = forward(ag.tensor(x_train[mine]))
            ce = ag.nn.functional.cross_entropy(logits, ag.tensor(y_train[mine]))
            await ag.backward(ce * (len(mine) * size / len(idx)))
            opt.step()
            total, seen = total + ce.item() * len(mine), seen + len(mine)
        say(f"{tag} epoch {epoch:>3}/{args.epochs}  train loss on this rank's share {total / seen:.4f}  "
            f"test accuracy {accuracy(model, x_test, y_test):.2%}")
    say(f"{tag} final test accuracy: {accuracy(model, x_test, y_test):.2%} ({time.perf_counter() - start:.1f} s)")
    return model


def say(line: str) -> None:
    """One line in one write: the ranks share the terminal, and print() writes the text and
    its newline separately, so two ranks' lines could run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main_async(args: argparse.Namespace) -> None:
    rank, size = dist.rank(), dist.world_size()
    model = await train(args, rank, size, "ddp")
    if args.reference and rank == 0:
        single = await train(args, 0, 1, "single")
        diff = max(float(np.abs(a.numpy() - b.numpy()).max())
                   for a, b in zip(model.parameters(), single.parameters()))
        print(f"max |weight difference| DDP vs one process: {diff:.2e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    anyio.run(main_async, parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
