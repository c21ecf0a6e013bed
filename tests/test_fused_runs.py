"""Note [Fused runs] (asyncgrad/autograd/sched/runs.py): the flat schedule computes a run of
small elementwise nodes whose rules are products (Note [Gradient factors] in ops/_spec.py)
with a few stacked calls and one ``np.multiply.accumulate``. It must give the one-by-one
step's gradients bit for bit, the same errors from the same node, and stop a run wherever
a node cannot be in it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import ops as ops_package
from asyncgrad.autograd import Engine
from asyncgrad.autograd.sched import flat as flat_module
from asyncgrad.autograd.sched.runs import RUN_MAX_NODES, RUN_MIN_NODES
from asyncgrad.autograd.tools.reference import ReferenceEngine
from asyncgrad.ops._array_math import ArrayMath
from asyncgrad.ops._spec import FACTOR_MAX_ELEMENTS, OpSpec
from conftest import DynamicEngine
from test_flat_schedule import _run

ENGINES = {"flat": Engine, "dynamic": DynamicEngine, "reference": ReferenceEngine}
DTYPES = [np.float32, np.float64]


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's bit patterns (NaNs compare by payload and sign)."""
    a = np.array(a, copy=True)  # (a 0-d result may be a numpy scalar)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _declared() -> list[tuple[str, OpSpec, int]]:
    """Every (name, spec, input) with a declared factor, from every module of ``ops``."""
    import importlib
    import pkgutil

    found: dict[int, tuple[str, OpSpec, int]] = {}
    for info in pkgutil.iter_modules(ops_package.__path__):
        module = importlib.import_module(f"asyncgrad.ops.{info.name}")
        for name, spec in inspect.getmembers(module, lambda v: isinstance(v, OpSpec)):
            for i, factor in enumerate(spec.factors or ()):
                if factor is not None:
                    found[id(spec) * 8 + i] = (f"{name}[{i}]", spec, i)
    return sorted(found.values(), key=lambda t: t[0])


DECLARED = _declared()


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Normal values with the awkward ones mixed in: zeros of both signs, infinities,
    NaN, subnormals, huge ones."""
    a = rng.standard_normal(shape).astype(dtype)
    flat = a.reshape(-1)
    tiny = np.finfo(dtype).smallest_subnormal
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, tiny, -tiny, 1e30, -3e5, 40.0], dtype=dtype)
    flat[: min(flat.size, special.size)] = special[: flat.size]
    return a


def test_the_factors_are_declared_for_the_ops_they_name():
    names = {name for name, _, _ in DECLARED}
    assert {"add[0]", "add[1]", "sub[0]", "mul[0]", "mul[1]", "sin[0]", "tanh[0]", "exp[0]", "clone[0]"} <= names


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (17,), (4, 8), (FACTOR_MAX_ELEMENTS,)], ids=str)
@pytest.mark.parametrize("name, spec, i", DECLARED, ids=[d[0] for d in DECLARED])
def test_every_declared_factor_is_its_rule_bit_for_bit(name, spec, i, shape, dtype):
    """Note [Gradient factors]: the rule is ``g * factor`` (or returns ``g``), and the
    factor computed on many nodes' values stacked is each node's factor."""
    rng = np.random.default_rng(len(name) * 31 + len(shape))
    with np.errstate(all="ignore"):
        inputs = [_values(rng, shape, dtype) for _ in range(spec.arity)]
        args = (np.asarray(spec.forward(*inputs)), *inputs)
        g = _values(rng, shape, dtype).reshape(-1)[::-1].reshape(shape).copy()
        got = spec.vjps[i](ArrayMath, g, *args)
        factor = spec.factors[i]
        if factor.read is None:
            assert got is g
            return
        value = args[factor.read]
        d = value if factor.fn is None else factor.fn(ArrayMath, value)
        np.testing.assert_array_equal(_bits(got), _bits(g * d))
        # stacked: each row the factor of that row's value
        rows = [_values(rng, shape, dtype) for _ in range(5)]
        together = np.stack(rows) if factor.fn is None else factor.fn(ArrayMath, np.stack(rows))
        for r, row in enumerate(rows):
            alone = row if factor.fn is None else factor.fn(ArrayMath, row)
            np.testing.assert_array_equal(_bits(together[r]), _bits(alone))


# --- graphs ----------------------------------------------------------------------------
def _leaf(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> ag.Tensor:
    return ag.from_numpy(np.asarray(rng.standard_normal(shape), dtype=dtype)).requires_grad_()


def mixed_chain(n: int, shape: tuple[int, ...]) -> Callable[..., Any]:
    """``n`` ops cycling through every op with a factor, with constant operands (arrays
    and Python numbers) and an op the runs do not take (``relu``) every 50 nodes."""
    def build(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
        x = _leaf(rng, shape, dtype)
        c = ag.from_numpy(np.asarray(1 + 0.01 * rng.standard_normal(shape), dtype=dtype))
        y = x
        for i in range(n):
            k = i % 9
            if i % 50 == 49:
                y = y.relu() + 0.5
            elif k == 0:
                y = y.sin()
            elif k == 1:
                y = y * c
            elif k == 2:
                y = y.tanh()
            elif k == 3:
                y = y + c
            elif k == 4:
                y = c * y
            elif k == 5:
                y = (y * 0.3).exp()
            elif k == 6:
                y = y - c
            elif k == 7:
                y = y.clone() * 1.5
            else:
                y = c + y
        return (y * y).sum(), [x]
    build.__name__ = f"mixed_chain_{n}_{'x'.join(map(str, shape)) or 'scalar'}"
    return build


def branches(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
    """Chains whose middle tensors have other consumers (runs must stop there), nodes of
    two leaves, a product of two tensors that need gradients, broadcasting, a cast."""
    x, w = _leaf(rng, (6,), dtype), _leaf(rng, (6,), dtype)
    y = x
    side = []
    for i in range(40):
        y = (y.sin() * 1.01).tanh()
        if i % 7 == 3:
            side.append(y * w)  # y feeds two nodes
    z = y * w  # two gradients to send
    for _ in range(10):
        z = (z * ag.from_numpy(np.full((3, 1), 0.9, dtype=dtype))).sin()  # broadcasts to (3, 6)
    z = z.sum(0)
    for _ in range(10):
        z = (z.double() * 1.01).float().double().to(dtype).tanh()  # casts
    return z.sum() + sum(s.sum() for s in side), [x, w]


GRAPHS = [mixed_chain(n, (16,)) for n in (RUN_MAX_NODES - 1, RUN_MAX_NODES, RUN_MAX_NODES + 1, 700)] \
    + [mixed_chain(120, s) for s in [(), (1,), (3, 5), (FACTOR_MAX_ELEMENTS,), (FACTOR_MAX_ELEMENTS + 1,)]] \
    + [branches]


@pytest.fixture
def runs_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every fused run the flat schedule computed, in order."""
    made: list[int] = []
    real = flat_module.run_gradient

    def counted(math: Any, g: Any, run: Any, modes: Any) -> Any:  # (run_gradient)
        out = real(math, g, run, modes)
        if out is not None:
            made.append(len(run.nodes))
        return out

    monkeypatch.setattr(flat_module, "run_gradient", counted)
    return made


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", GRAPHS, ids=lambda f: f.__name__)
def test_runs_give_the_one_by_one_steps_bits(build, dtype, runs_made, restore_engine):
    got = {name: _run(engine, build, dtype) for name, engine in ENGINES.items()}
    for a, b, ref in zip(got["flat"], got["dynamic"], got["reference"]):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(_bits(a), _bits(b))
        np.testing.assert_array_equal(_bits(a), _bits(ref))
    name = build.__name__
    small = str(FACTOR_MAX_ELEMENTS + 1) not in name
    assert bool(runs_made) == small  # (the test runs through runs where they can be)
    assert all(RUN_MIN_NODES <= n <= RUN_MAX_NODES for n in runs_made)
    if name == "mixed_chain_700_16":
        # 700 ops of 1 or 2 nodes, cut by the relu every 50: every other node in a run
        assert len(runs_made) == 14 and sum(runs_made) > 700


@pytest.mark.parametrize("n, runs", [
    (RUN_MIN_NODES - 1, []), (RUN_MIN_NODES, [RUN_MIN_NODES]), (RUN_MAX_NODES + 1, [RUN_MAX_NODES]),
    (2 * RUN_MAX_NODES + RUN_MIN_NODES, [RUN_MAX_NODES, RUN_MAX_NODES, RUN_MIN_NODES]),
])
def test_runs_are_at_least_the_shortest_and_at_most_the_longest(n, runs, runs_made, restore_engine):
    """``n`` sines after the sum: runs from the top, cut at RUN_MAX_NODES; what is left
    shorter than RUN_MIN_NODES runs one by one."""
    def build(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
        x = _leaf(rng, (16,), dtype)
        y = x * 0.5
        for _ in range(n - 1):
            y = y.sin()
        return y.sum(), [x]

    a = _run(Engine, build, np.float64)
    assert runs_made == runs
    np.testing.assert_array_equal(_bits(a[0]), _bits(_run(DynamicEngine, build, np.float64)[0]))


def test_runs_under_trio(runs_made, restore_engine):
    build = mixed_chain(300, (8,))
    a = _run(Engine, build, np.float32, backend="trio")
    b = _run(DynamicEngine, build, np.float32, backend="trio")
    np.testing.assert_array_equal(_bits(a[0]), _bits(b[0]))
    assert runs_made


def test_a_runs_leaf_gradient_is_its_own_array(runs_made, restore_engine):
    """The run's last gradient reaches the leaf as a new array of its own (no view of the
    run's buffer), so ``.grad`` takes it as the one-by-one step's (Note [Owned gradients])."""
    ag.autograd.set_engine(Engine())
    x = _leaf(np.random.default_rng(3), (5,), np.float64)
    y = x
    for _ in range(12):
        y = y.sin() * 1.1
    anyio.run(ag.backward, y.sum())
    assert runs_made == [24]
    g = x.grad.numpy()
    assert g.base is None and g.flags.writeable and g.flags.owndata
    same = ag.from_numpy(x.detach().numpy().copy()).requires_grad_()  # (a leaf of its own)
    want = _run(DynamicEngine, lambda rng, dt: (_chain_of(same, 12), [same]), np.float64)
    np.testing.assert_array_equal(g, want[0])


def _chain_of(x: ag.Tensor, n: int) -> ag.Tensor:
    y = x
    for _ in range(n):
        y = y.sin() * 1.1
    return y.sum()


def test_a_run_of_identity_rules_passes_the_gradient_on(runs_made, restore_engine):
    ag.autograd.set_engine(Engine())
    x = _leaf(np.random.default_rng(4), (3,), np.float64)
    c = ag.from_numpy(np.ones(3))
    y = x
    for _ in range(10):
        y = (y + c).clone() - c
    anyio.run(ag.backward, y.sum() * 2.0)  # (the sum's gradient: a broadcast view)
    assert runs_made == [30]
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 2.0))


@pytest.mark.parametrize("at", [0, 1, 17, 38])
def test_an_in_place_change_inside_a_run_raises_from_its_node(at, restore_engine):
    """A saved value modified in place ends the run before its node, which raises in its
    own step: the error and the node it names are the one-by-one step's."""
    def error(engine_type: type[Engine]) -> tuple[str, str]:
        ag.autograd.set_engine(engine_type())
        x = _leaf(np.random.default_rng(5), (4,), np.float64)
        ys = [x * 1.0]
        for _ in range(40):
            ys.append(ys[-1].sin())
        with ag.no_grad():
            ys[40 - at - 1].mul_(2.0)  # saved by the sin after it
        with pytest.raises(RuntimeError) as raised:
            anyio.run(ag.backward, ys[-1].sum())
        (note,) = raised.value.__notes__
        name, _, nr = note.split(" in graph task")[0].rpartition("(sequence_nr=")
        return str(raised.value), f"{name}{int(nr.rstrip(')')) - ys[0].grad_fn.sequence_nr}"

    flat, dynamic = error(Engine), error(DynamicEngine)
    assert flat == dynamic
    assert "modified by an inplace operation" in flat[0]
    assert flat[1] == f"asyncgrad: raised while running SinBackward0 {40 - at}"


def test_a_second_backward_through_a_run_raises_and_retain_graph_keeps_it(restore_engine):
    ag.autograd.set_engine(Engine())
    x = _leaf(np.random.default_rng(6), (4,), np.float32)
    loss = _chain_of(x, 20)
    anyio.run(lambda: ag.backward(loss, retain_graph=True))
    first = x.grad.numpy().copy()
    anyio.run(ag.backward, loss)
    np.testing.assert_array_equal(x.grad.numpy(), first + first)
    with pytest.raises(RuntimeError, match="second time"):
        anyio.run(ag.backward, loss)


def _scaled(factor: float, n: int = 12) -> Callable[..., Any]:
    def build(rng: np.random.Generator, dtype: Any) -> tuple[ag.Tensor, list[ag.Tensor]]:
        x = _leaf(rng, (4,), dtype)
        y = x
        for _ in range(n):
            y = y * factor
        return y.sum(), [x]
    return build


def _reported(engine_type: type[Engine], build: Callable[..., Any], **modes: str) -> tuple[Any, ...]:
    """The gradient (or the error raised) and every warning, under ``np.errstate(**modes)``."""
    import warnings

    with warnings.catch_warnings(record=True) as caught, np.errstate(**modes):
        warnings.simplefilter("always")
        try:
            got: Any = _bits(_run(engine_type, build, np.float32)[0]).tolist()
        except FloatingPointError as e:
            got = f"FloatingPointError: {e}"
    return got, [(w.category, str(w.message)) for w in caught]


@pytest.mark.parametrize("factor, modes, fused", [
    (1e-12, {}, True),  # underflow, which numpy ignores by default: the run computes it
    (1e-12, {"under": "raise"}, False),
    (1e-12, {"under": "warn"}, False),
    (1e12, {}, False),  # overflow, which numpy warns of by default
    (1e12, {"over": "raise"}, False),
    (1e12, {"over": "ignore"}, True),
])
def test_floating_point_events_in_a_run_are_reported_as_one_by_one(factor, modes, fused, runs_made,
                                                                   restore_engine):
    """The stacked arithmetic ignores what the caller's ``np.errstate`` ignores and raises
    on the rest, which sends the run through its nodes one by one: the gradient, the
    error and the warnings are the one-by-one step's."""
    build = _scaled(factor)
    flat = _reported(Engine, build, **modes)
    assert bool(runs_made) == fused
    assert flat == _reported(DynamicEngine, build, **modes)
    assert bool(flat[1]) or isinstance(flat[0], str) or fused


def test_saved_tensor_hooks_keep_nodes_out_of_runs(runs_made, restore_engine):
    """A node whose saved values went through ``saved_tensors_hooks`` is unpacked by its
    own step (the hooks run), so no run takes it."""
    def grad_and_unpacks(engine_type: type[Engine]) -> tuple[list[float], int]:
        unpacked: list[int] = []

        def unpack(t: Any) -> Any:
            unpacked.append(1)
            return t

        ag.autograd.set_engine(engine_type())
        x = _leaf(np.random.default_rng(7), (4,), np.float64)
        with ag.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            loss = _chain_of(x, 10)
        anyio.run(ag.backward, loss)
        return x.grad.numpy().tolist(), len(unpacked)

    flat = grad_and_unpacks(Engine)
    assert runs_made == [] and flat[1] == 10
    assert flat == grad_and_unpacks(DynamicEngine)


def test_the_recording_gives_a_factor_only_to_nodes_a_run_can_take():
    """Note [Fused runs]: the conditions that hold from the recording on."""
    from asyncgrad.ops._spec import IDENTITY

    x = _leaf(np.random.default_rng(8), (4, 5), np.float32)
    w = _leaf(np.random.default_rng(9), (4, 5), np.float32)
    c = ag.from_numpy(np.full((4, 5), 1.5, dtype=np.float32))
    row = ag.from_numpy(np.full((5,), 1.5, dtype=np.float32))
    big = _leaf(np.random.default_rng(10), (FACTOR_MAX_ELEMENTS + 1,), np.float32)
    taken = {
        "sin": x.sin(), "tanh": x.tanh(), "exp": x.exp(), "x * c": x * c, "c * x": c * x,
        "x * 2": x * 2.0, "x + c": x + c, "x - c": x - c, "clone": x.clone(),
    }
    not_taken = {
        "x * w (two gradients)": x * w, "x * row (broadcast value)": x * row,
        "c - x (a negated gradient)": c - x, "x * float64 (a cast)": x * ag.from_numpy(np.ones((4, 5))),
        "row + x (a broadcast input)": _leaf(np.random.default_rng(11), (5,), np.float32) + c,
        "relu (no factor)": x.relu(), "too many elements": big.sin(),
    }
    for name, t in taken.items():
        assert t.grad_fn.factor is not None, name
    assert (x + c).grad_fn.factor is IDENTITY
    for name, t in not_taken.items():
        assert t.grad_fn.factor is None, name


def test_an_op_declares_a_factor_or_none_for_each_input():
    from asyncgrad.ops._spec import IDENTITY, defop

    with pytest.raises(ValueError, match="AddLike: factors declares 1 inputs' rules as products, but the op has 2"):
        defop("AddLike", np.add, lambda m, g, ans, x, y: g, lambda m, g, ans, x, y: g, factors=(IDENTITY,))
