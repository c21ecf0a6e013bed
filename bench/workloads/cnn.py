"""cnn: one training step of a small ResNet (CIFAR-sized images) beside PyTorch, float32,
one thread each.

The model is written once in PyTorch's idioms (``resnet_source``) and built with torch's
and with asyncgrad's modules from the same source, with the same initial weights: a 3x3
stem (16 channels) with batch norm and a max pool, three basic blocks (16, 32, 64
channels, the last two strided with 1x1 downsampling), adaptive average pooling and a
linear classifier, on a batch of 32 images of 3 x 32 x 32. A step is forward,
cross-entropy, backward and an SGD update (momentum 0.9), timed as a whole, the libraries
interleaved round by round (bench/common.py: measure_cases).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..common import ASYNCGRAD, BLAS, TORCH, About, Case, Column, Result, Target, measure_cases, median

DEFAULT_ROUNDS = 9

ABOUT = About(
    title="A small ResNet training step, beside PyTorch",
    measures="Forward, loss, backward and SGD step of a small ResNet (stem, three basic blocks with batch norm, "
             "16 to 64 channels) on 32 images of 3 x 32 x 32, float32, both libraries on one thread, the same "
             "model source built with either library's modules.",
    reading="Lower is better; \"x torch\" is asyncgrad's step time over PyTorch's. Convolutions dominate: "
            "asyncgrad's run as im2col and one OpenBLAS product, PyTorch's as oneDNN's direct kernels.",
    plots=(("step_ms", "step ms", False),),
)


def resnet_source(nn: Any, F: Any, torch: Any) -> Any:
    """The model class, in PyTorch's idioms, from the given namespaces."""

    class BasicBlock(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x: Any) -> Any:
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            identity = x if self.downsample is None else self.downsample(x)
            return F.relu(out + identity)

    class SmallResNet(nn.Module):
        def __init__(self, num_classes: int = 10, width: int = 16) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = BasicBlock(width, width)
            self.layer2 = BasicBlock(width, 2 * width, stride=2)
            self.layer3 = BasicBlock(2 * width, 4 * width, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(4 * width, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
            x = self.layer3(self.layer2(self.layer1(x)))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return SmallResNet


def run(impls: list[str], rounds: int | None = None, batch: int = 32, size: int = 32, width: int = 16) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    impls = [i for i in impls if i in (ASYNCGRAD, TORCH)]
    res = Result(
        "cnn", f"small ResNet training step (width {width}), batch {batch} of 3x{size}x{size}, float32, one thread",
        {"batch": batch, "size": size, "width": width, "rounds": rounds, "dtype": "float32"},
        [Column("step_ms", "step ms", "{:.2f}"), Column("x_torch", "x torch", "{:.2f}"),
         Column("loss", "loss after", "{:.4f}")],
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    t_start = time.perf_counter()
    cases: list[Case] = []
    losses: dict[str, list[float]] = {}
    torch = None
    if TORCH in impls:
        import torch

        theirs = resnet_source(torch.nn, torch.nn.functional, torch)(width=width)
        opt_t = torch.optim.SGD(theirs.parameters(), lr=0.01, momentum=0.9)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)

        def torch_step(_: Any) -> None:
            opt_t.zero_grad()
            loss = torch.nn.functional.cross_entropy(theirs(xt), yt)
            loss.backward()
            opt_t.step()
            losses.setdefault(TORCH, []).append(loss.item())

        cases.append(Case(TORCH, lambda: None, torch_step))
    if ASYNCGRAD in impls:
        import asyncgrad as ag

        ours = resnet_source(ag.nn, ag.nn.functional, ag)(width=width)
        ours.to(np.float32)
        if torch is not None:  # the same initial weights
            ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
        opt_a = ag.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)
        xa = ag.from_numpy(x)

        async def ag_step(_: Any) -> None:
            opt_a.zero_grad()
            loss = ag.nn.functional.cross_entropy(ours(xa), y)
            await ag.backward(loss)
            opt_a.step()
            losses.setdefault(ASYNCGRAD, []).append(loss.item())

        cases.append(Case(ASYNCGRAD, lambda: None, ag_step))
    threads = None
    if torch is not None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        with BLAS.limited(1):
            times = measure_cases(cases, rounds)
    finally:
        if torch is not None and threads is not None:
            torch.set_num_threads(threads)
    for impl in impls:
        res.rows.append({"impl": impl, "step_ms": median(times[impl]) * 1e3, "rounds_s": times[impl],
                         "loss": losses[impl][-1]})
    a, t = res.value(ASYNCGRAD, "step_ms"), res.value(TORCH, "step_ms")
    for r in res.rows:
        r["x_torch"] = r["step_ms"] / t if t == t else None
    ratio = res.add_ratio("asyncgrad/torch step", a, t)
    if ratio == ratio:
        res.targets.append(Target("cnn step <= 1.5x torch", ratio, 1.5, "x"))
    res.notes.append("one thread each: numpy's BLAS limited to 1, torch.set_num_threads(1)")
    res.seconds = time.perf_counter() - t_start
    return res
