"""Joint rules (ops/_spec.py, Note [Joint rules]): one call for all the gradients a node
needs in a plain backward; the per-input rules for create_graph and single needs.
layer_norm's joint rule (one compiled pass, or numpy) must equal its three rules."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
import asyncgrad.nn.functional as AF
from asyncgrad.autograd import Engine, get_engine, gradgradcheck, set_engine
from asyncgrad.autograd import gradcheck
from asyncgrad.autograd.graph.record import record
from asyncgrad.ops import nn
from asyncgrad.ops._array_math import ArrayMath
from asyncgrad.ops._spec import defop

# every non-empty choice of (x, w, b) that needs a gradient
MASKS = [m for m in itertools.product([False, True], repeat=3) if any(m)]
PATHS = ["numpy", "compiled"]


def _ln_case(dtype: type, rows: tuple[int, ...] = (3, 100)) -> tuple[np.ndarray, ...]:
    """x, w, b and g for a layer_norm over 24 features; 300 rows by default, so the
    compiled column sums cover two full row blocks and a partial one."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((*rows, 24)) * 3 + 1
    w = rng.standard_normal(24)
    b = rng.standard_normal(24)
    g = rng.standard_normal((*rows, 24))
    return tuple(a.astype(dtype) for a in (x, w, b, g))


def _tol(dtype: type) -> dict[str, float]:
    return {"rtol": 2e-5, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "".join("xwb"[i] for i in range(3) if m[i]))
def test_layer_norm_joint_rule_equals_the_per_input_rules(on_path, path: str, dtype: type,
                                                          mask: tuple[bool, ...]) -> None:
    on_path(path)
    x, w, b, g = _ln_case(dtype)
    _, aux = nn._layer_norm(x, w, b, dims=(2,), eps=1e-5)
    kw: dict[str, Any] = {"dims": (2,), "eps": 1e-5, "aux": aux}
    rules = (nn._ln_rule_x, nn._ln_rule_w, nn._ln_rule_b)
    joint = nn._ln_joint(g, None, x, w, b, mask=mask, **kw)
    assert len(joint) == 3
    for need, rule, got in zip(mask, rules, joint):
        if not need:
            assert got is None
            continue
        want = rule(ArrayMath, g, None, x, w, b, **kw)
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, **_tol(dtype))


def test_compiled_float32_column_sums_stay_near_the_float64_sums_over_many_rows(on_path) -> None:
    """dw and db over 20,000 rows (Note [Column sums by row blocks]): the float32 kernel
    stays within a few float32 ulps of the exact (float64) sums of its float32 inputs."""
    on_path("compiled")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((20_000, 8)) + 3).astype(np.float32)
    g = (rng.standard_normal((20_000, 8)) + 1).astype(np.float32)
    w = np.ones(8, dtype=np.float32)
    _, (xhat, rstd) = nn._layer_norm(x, w, w, dims=(1,), eps=1e-5)
    dx, dw, db = nn._ln_joint(g, None, x, w, w, mask=(True, True, True), dims=(1,), eps=1e-5,
                              aux=(xhat, rstd))
    exact_w = (g.astype(np.float64) * xhat.astype(np.float64)).sum(axis=0)
    exact_b = g.astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(dw, exact_w, rtol=0, atol=4e-7 * np.abs(exact_w).max())
    np.testing.assert_allclose(db, exact_b, rtol=0, atol=4e-7 * np.abs(exact_b).max())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", ["w", "wb"])
def test_layer_norm_backward_gradients_equal_the_rules_for_every_mask(on_path, path: str, dtype: type,
                                                                      affine: str) -> None:
    """Through the engine: each subset of (x, w[, b]) needing a gradient gets the same
    gradients as the per-input rules give for it alone (a single need uses the rule)."""
    on_path(path)
    x, w, b, g = _ln_case(dtype)
    arrays = (x, w, b)[:1 + len(affine)]

    def grads(mask: tuple[bool, ...]) -> list[np.ndarray | None]:
        ts = [ag.from_numpy(a.copy()).requires_grad_(need) for a, need in zip(arrays, mask)]
        y = AF.layer_norm(ts[0], (24,), *ts[1:])
        ag.backward_sync(y, ag.from_numpy(g))
        return [t.grad.numpy() if t.grad is not None else None for t in ts]

    alone = [grads(tuple(j == i for j in range(len(arrays))))[i] for i in range(len(arrays))]
    for mask in itertools.product([False, True], repeat=len(arrays)):
        if not any(mask):
            continue
        for need, got, want in zip(mask, grads(mask), alone):
            assert (got is not None) == need
            if need:
                np.testing.assert_allclose(got, want, **_tol(dtype))


@pytest.mark.parametrize("path", PATHS)
def test_layer_norm_gradcheck_and_gradgradcheck_in_float64(on_path, path: str) -> None:
    on_path(path)
    rng = np.random.default_rng(2)
    x = ag.tensor(rng.standard_normal((4, 5)), requires_grad=True)
    w = ag.tensor(rng.standard_normal(5), requires_grad=True)
    b = ag.tensor(rng.standard_normal(5), requires_grad=True)
    assert gradcheck(lambda *a: AF.layer_norm(a[0], (5,), a[1], a[2]), (x, w, b))
    assert gradcheck(lambda *a: AF.layer_norm(a[0], (5,), a[1]), (x, w))
    assert gradgradcheck(lambda *a: AF.layer_norm(a[0], (5,), a[1], a[2]), (x, w, b))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_backward_and_double_backward_match_torch(on_path, path: str, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    on_path(path)
    x, w, b, g = _ln_case(dtype, rows=(2, 150))
    ours = [ag.from_numpy(a.copy()).requires_grad_() for a in (x, w, b)]
    theirs = [torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b)]
    y = AF.layer_norm(ours[0], (24,), ours[1], ours[2])
    ty = torch.nn.functional.layer_norm(theirs[0], (24,), theirs[1], theirs[2])
    ag.backward_sync(y, ag.from_numpy(g))
    ty.backward(torch.from_numpy(g))
    for a, t in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), **_tol(dtype))
    # double backward: the create_graph path runs the per-input rules in tensor mode
    ours = [ag.from_numpy(a.copy()).requires_grad_() for a in (x, w, b)]
    theirs = [torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b)]
    first = ag.grad_sync(AF.layer_norm(ours[0], (24,), ours[1], ours[2]), ours, ag.from_numpy(g), create_graph=True)
    tfirst = torch.autograd.grad(torch.nn.functional.layer_norm(theirs[0], (24,), theirs[1], theirs[2]), theirs,
                                 torch.from_numpy(g), create_graph=True)
    # (db = sum of g depends on no input: the second derivatives are w.r.t. x and w)
    second = ag.grad_sync(sum(((d * d).sum() for d in first), ag.tensor(0.0, dtype=dtype)), ours[:2])
    tsecond = torch.autograd.grad(sum((d * d).sum() for d in tfirst), theirs[:2])
    loose = {"rtol": 2e-4, "atol": 2e-4} if dtype == np.float32 else _tol(dtype)
    for a, t in zip(second, tsecond):
        np.testing.assert_allclose(a.numpy(), t.numpy(), **loose)


@pytest.mark.parametrize("path", PATHS)
def test_hooks_see_the_joint_rules_gradients(on_path, path: str) -> None:
    """A node with hooks runs the joint rule through the general path: its post-hook and
    the leaves' tensor hooks see the gradients the hookless backward commits."""
    on_path(path)
    x, w, b, g = _ln_case(np.float32)

    def run(hooked: bool) -> tuple[list[np.ndarray], list[Any]]:
        ts = [ag.from_numpy(a.copy()).requires_grad_() for a in (x, w, b)]
        y = AF.layer_norm(ts[0], (24,), ts[1], ts[2])
        seen: list[Any] = []
        if hooked:
            y.grad_fn.register_hook(lambda gi, go: seen.append(("node", [a.numpy().copy() for a in gi])))
            for k, t in enumerate(ts):
                t.register_hook(lambda gr, k=k: seen.append((k, gr.numpy().copy())))
        ag.backward_sync(y, ag.from_numpy(g))
        return [t.grad.numpy() for t in ts], seen

    plain, _ = run(False)
    hooked, seen = run(True)
    assert seen[0][0] == "node"
    node_grads = seen[0][1]
    leaf_grads = {k: v for k, v in seen[1:]}
    assert sorted(leaf_grads) == [0, 1, 2]
    for k in range(3):
        np.testing.assert_array_equal(hooked[k], plain[k])
        np.testing.assert_array_equal(node_grads[k], plain[k])
        np.testing.assert_array_equal(leaf_grads[k], plain[k])


# --- the engine's use of a joint rule, seen by a spy op --------------------------------------
def _spy_mul(calls: list[Any]) -> Callable[[ag.Tensor, ag.Tensor], ag.Tensor]:
    """``a * b`` whose rules and joint rule record their calls."""
    def rule_a(m, g, ans, a, b):  # type: ignore[no-untyped-def]
        calls.append("a")
        return g * b

    def rule_b(m, g, ans, a, b):  # type: ignore[no-untyped-def]
        calls.append("b")
        return g * a

    def joint(g, ans, a, b, *, mask):  # type: ignore[no-untyped-def]
        calls.append(("joint", mask))
        return (g * b if mask[0] else None, g * a if mask[1] else None)

    spec = defop("SpyMulBackward0", np.multiply, rule_a, rule_b, save="x y", joint=joint)
    return lambda a, b: record(spec, (a, b), np.multiply(a.data, b.data))


def test_the_engine_calls_the_joint_rule_for_several_needs_and_the_rules_otherwise() -> None:
    calls: list[Any] = []
    mul = _spy_mul(calls)
    a = ag.tensor([1.0, 2.0], requires_grad=True)
    b = ag.tensor([3.0, 4.0], requires_grad=True)
    c = ag.tensor([5.0, 6.0])
    ag.backward_sync(mul(a, b).sum())
    assert calls == [("joint", (True, True))]
    assert a.grad.tolist() == [3.0, 4.0] and b.grad.tolist() == [1.0, 2.0]
    calls.clear()
    ag.backward_sync(mul(a, c).sum())  # one need: its rule
    assert calls == ["a"]
    calls.clear()
    da, db = ag.grad_sync(mul(a, b).sum(), (a, b), create_graph=True)  # create_graph: the rules
    assert calls == ["a", "b"]
    assert da.requires_grad and db.requires_grad


def test_a_large_joint_rule_node_is_one_kernel_on_a_worker_never_split() -> None:
    """With two workers and every node offloaded a large two-gradient node would be split
    into one kernel per gradient (Policy.splits); a joint-rule node stays one call. (On an
    event loop: ``backward_sync`` runs every node inline.)"""
    calls: list[Any] = []
    mul = _spy_mul(calls)
    prev = get_engine()
    set_engine(Engine(max_workers=2, inline_threshold=0))
    try:
        a = ag.tensor(np.linspace(0, 1, 50_000), requires_grad=True)
        b = ag.tensor(np.linspace(1, 2, 50_000), requires_grad=True)
        anyio.run(ag.backward, mul(a, b).sum())
    finally:
        set_engine(prev)
    assert calls == [("joint", (True, True))]
    np.testing.assert_array_equal(a.grad.numpy(), b.data)
    np.testing.assert_array_equal(b.grad.numpy(), a.data)
