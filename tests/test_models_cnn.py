"""A LeNet and a small ResNet (basic blocks with batch norm), written once in PyTorch's
idioms and built twice from the same source, once with torch's modules and once with
asyncgrad's (only the namespaces swapped): forward, every parameter's gradient and a few
SGD steps (weights and batch-norm statistics) agree."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn as ag_nn
import asyncgrad.nn.functional as ag_F
from test_conv import _torch_on_one_thread  # noqa: F401  (the fixture applies here)


def model_source(nn: Any, F: Any, torch: Any) -> dict[str, Any]:
    """The models as a PyTorch user writes them; ``nn``, ``F`` and ``torch`` are the only
    names they use."""

    class LeNet(nn.Module):
        def __init__(self, num_classes: int = 10) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, num_classes)

        def forward(self, x: Any) -> Any:
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.avg_pool2d(F.relu(self.conv2(x)), 2)
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            return self.fc3(x)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x: Any) -> Any:
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return self.relu(out)

    class TinyResNet(nn.Module):
        def __init__(self, num_classes: int = 5) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, kernel_size=3, stride=1, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = BasicBlock(8, 8)
            self.layer2 = BasicBlock(8, 16, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(16, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
            x = self.layer2(self.layer1(x))
            x = torch.flatten(self.avgpool(x), 1)
            return self.fc(x)

    return {"LeNet": LeNet, "TinyResNet": TinyResNet}


CASES = [("LeNet", (4, 1, 28, 28), 10), ("TinyResNet", (4, 3, 12, 12), 5)]


def _pair(name: str) -> tuple[Any, Any, Any]:
    torch = pytest.importorskip("torch")
    theirs = model_source(torch.nn, torch.nn.functional, torch)[name]().double()
    ours = model_source(ag_nn, ag_F, ag)[name]()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    return torch, ours, theirs


def _batch(shape: tuple[int, ...], classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), rng.integers(0, classes, shape[0])


@pytest.mark.parametrize("name, shape, classes", CASES, ids=[c[0] for c in CASES])
def test_forward_and_every_gradient_match_torch(name: str, shape: tuple[int, ...], classes: int) -> None:
    torch, ours, theirs = _pair(name)
    x, y = _batch(shape, classes, 0)
    xa = ag.tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    la = ag_F.cross_entropy(ours(xa), y)
    lt = torch.nn.functional.cross_entropy(theirs(xt), torch.tensor(y))
    np.testing.assert_allclose(la.item(), lt.item(), rtol=1e-10)
    ag.backward_sync(la)
    lt.backward()
    np.testing.assert_allclose(xa.grad.numpy(), xt.grad.numpy(), rtol=1e-8, atol=1e-12)
    for (ka, pa), (kt, pt) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert ka == kt
        np.testing.assert_allclose(pa.grad.numpy(), pt.grad.numpy(), rtol=1e-8, atol=1e-12, err_msg=ka)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("name, shape, classes", CASES, ids=[c[0] for c in CASES])
def test_sgd_steps_match_torch(name: str, shape: tuple[int, ...], classes: int, backend: str) -> None:
    torch, ours, theirs = _pair(name)
    opt_a = ag.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)

    async def train() -> None:
        for step in range(3):
            x, y = _batch(shape, classes, step)
            opt_a.zero_grad()
            await ag.backward(ag_F.cross_entropy(ours(ag.tensor(x)), y))
            opt_a.step()

    anyio.run(train, backend=backend)
    for step in range(3):
        x, y = _batch(shape, classes, step)
        opt_t.zero_grad()
        torch.nn.functional.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y)).backward()
        opt_t.step()
    for (ka, a), (kt, t) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert ka == kt
        np.testing.assert_allclose(a.numpy(), t.numpy(), rtol=1e-7, atol=1e-10, err_msg=ka)
    ours.eval()
    theirs.eval()
    x, _ = _batch(shape, classes, 9)
    np.testing.assert_allclose(ours(ag.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               rtol=1e-7, atol=1e-10)


def test_input_saliency_gradient_of_gradient_matches_torch() -> None:
    """The gradient of an input-gradient norm (double backward through conv, batch norm,
    max pool, adaptive pool), as gradient-regularised training and saliency methods take it."""
    torch, ours, theirs = _pair("TinyResNet")
    ours.eval()
    theirs.eval()
    x, _ = _batch((2, 3, 12, 12), 5, 3)
    xa, xt = ag.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (ga,) = ag.grad_sync(ours(xa)[:, 1].sum(), [xa], create_graph=True)
    (gt,) = torch.autograd.grad(theirs(xt)[:, 1].sum(), [xt], create_graph=True)
    np.testing.assert_allclose(ga.numpy(), gt.detach().numpy(), rtol=1e-8, atol=1e-12)
    wa, wt = ours.layer1.conv1.weight, theirs.layer1.conv1.weight
    (ha,) = ag.grad_sync((ga * ga).sum(), [wa])
    (ht,) = torch.autograd.grad((gt * gt).sum(), [wt])
    np.testing.assert_allclose(ha.numpy(), ht.numpy(), rtol=1e-7, atol=1e-12)


def test_cnn_bench_workload_runs_tiny() -> None:
    """The bench's ``cnn`` workload (its model built from the PyTorch-idiom source) runs
    a step; no timing is asserted."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.run import run_workload

    r = run_workload("cnn", ["asyncgrad"], rounds=1, batch=2, size=8, width=4)
    assert [row["impl"] for row in r.rows] == ["asyncgrad"]
    assert r.rows[0]["step_ms"] > 0 and 1.0 < r.rows[0]["loss"] < 4.0  # cross-entropy over 10 classes: ~2.3
    assert r.targets == []  # no peer measured: nothing to compare
