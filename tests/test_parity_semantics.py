"""PyTorch parity: behaviours where asyncgrad used to differ from PyTorch 2.13 (issue 13,
"Wrong behaviour", "Autograd API" and "Checkpoint"). Each test states what PyTorch does;
the expected values were checked against torch 2.13, and where torch is installed
``test_issue_scenarios_match_pytorch`` replays the issue's scenarios in it directly."""

import gc
import warnings
import weakref

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Function, GradcheckError
from asyncgrad.autograd import gradcheck
from asyncgrad.autograd.graph import saved_tensors_hooks


def _top_saved_hooks():
    from asyncgrad import _context

    return _context.saved_tensors_hooks.get()


# --- 1. saved_tensors_hooks entered during backward stay in that backward -----------------

def test_saved_tensors_hooks_entered_in_an_unpack_hook_end_with_the_backward():
    x = ag.ones(2, requires_grad=True)
    inner = saved_tensors_hooks(lambda t: t, lambda t: t)

    def unpack(t):
        inner.__enter__()  # never exited: PyTorch confines it to the backward
        return t

    with saved_tensors_hooks(lambda t: t, unpack):
        y = x.exp()
    before = _top_saved_hooks()
    y.sum().backward()
    assert _top_saved_hooks() == before == ()
    assert np.allclose(x.grad.numpy(), np.e)


async def test_saved_tensors_hooks_entered_during_an_async_backward_are_confined():
    x = ag.ones(2, requires_grad=True)

    def unpack(t):
        saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()
        return t

    with saved_tensors_hooks(lambda t: t, unpack):
        y = (x * x).sum()
    await ag.backward(y)
    assert _top_saved_hooks() == ()
    (g,) = await ag.grad((x * 3).sum(), x)
    assert np.allclose(g.numpy(), 3)


# --- 3. grad-mode decorators on generators forward throw() and close() --------------------

def test_no_grad_generator_forwards_throw_and_close_under_its_mode():
    log = []

    @ag.no_grad()
    def gen():
        try:
            while True:
                try:
                    yield ag.is_grad_enabled()
                except ValueError:
                    log.append(("caught", ag.is_grad_enabled()))
        finally:
            log.append(("finally", ag.is_grad_enabled()))

    g = gen()
    assert next(g) is False
    assert g.throw(ValueError("into the generator")) is False  # caught inside, yields again
    assert ag.is_grad_enabled()
    g.close()  # the generator's cleanup runs now, still under no_grad
    assert log == [("caught", False), ("finally", False)]
    assert ag.is_grad_enabled()


def test_generator_decorator_propagates_an_uncaught_throw_and_returns_values():
    @ag.enable_grad()
    def gen():
        received = yield 1
        return received * 2

    g = gen()
    assert next(g) == 1
    with pytest.raises(StopIteration) as stop:
        g.send(21)
    assert stop.value.value == 42

    g = gen()
    next(g)
    with pytest.raises(KeyError):
        g.throw(KeyError("k"))


# --- 6, 7, and gradcheck's nondet_tol / check_undefined_grad ------------------------------

def test_gradcheck_runs_fn_with_grad_mode_on_so_hooks_can_be_registered():
    x = ag.tensor([0.3, -0.4], requires_grad=True)

    def fn(t):
        y = t * 2
        y.register_hook(lambda g: g)  # raised "cannot register a hook" under no_grad
        return y.sin()

    assert gradcheck(fn, (x,))


def test_gradcheck_raises_when_the_output_shape_changes_under_perturbation():
    x = ag.tensor([1.0, 2.0], requires_grad=True)

    def fn(t):
        y = t * 2
        return y if t.data[0] == 1.0 else y[:1]

    with pytest.raises(GradcheckError, match="same shape when inputs are perturbed"):
        gradcheck(fn, (x,))
    with pytest.raises(GradcheckError, match="same shape"):  # not a silent False
        gradcheck(fn, (x,), raise_exception=False)


def test_gradcheck_raises_when_the_output_dtype_changes_under_perturbation():
    x = ag.tensor([1.0, 2.0], requires_grad=True)

    def fn(t):
        y = t * 2
        return y if t.data[0] == 1.0 else y.float()

    with pytest.raises(GradcheckError, match="same dtype when inputs are perturbed"):
        gradcheck(fn, (x,))


class NoisyBackward(Function):
    """The right gradient plus a different tiny error on every backward call."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        NoisyBackward.calls += 1
        return g * (2 + 1e-9 * NoisyBackward.calls)


def test_gradcheck_nondet_tol():
    x = ag.tensor([0.5, 1.5], requires_grad=True)
    with pytest.raises(GradcheckError, match="Backward is not reentrant.*tolerance for nondeterminism was 0.0"):
        gradcheck(NoisyBackward.apply, (x,))
    assert gradcheck(NoisyBackward.apply, (x,), raise_exception=False) is False
    assert gradcheck(NoisyBackward.apply, (x,), nondet_tol=1e-6)


class FailsOnUndefined(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if g is None:
            raise RuntimeError("no gradient")
        return g * 2


class NonZeroOnUndefined(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return ag.ones(2) if g is None else g * 2  # ones for an undefined gradient: wrong


def test_gradcheck_check_undefined_grad():
    x = ag.tensor([0.5, 1.5], requires_grad=True)
    with pytest.raises(GradcheckError, match="Expected backward function to handle undefined output grads"):
        gradcheck(FailsOnUndefined.apply, (x,))
    assert gradcheck(FailsOnUndefined.apply, (x,), check_undefined_grad=False)
    with pytest.raises(GradcheckError, match="Expected all input grads to be undefined or zero"):
        gradcheck(NonZeroOnUndefined.apply, (x,))
    assert gradcheck(NonZeroOnUndefined.apply, (x,), raise_exception=False) is False
    # built-in ops and a default (materializing) Function pass
    assert gradcheck(lambda t: (t.exp(), t * t), (x,))


# --- 8. anomaly mode with warnings turned into errors ---------------------------------------

def test_anomaly_mode_keeps_the_original_error_when_warnings_are_errors(capsys):
    x = ag.ones(2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ag.autograd.detect_anomaly():
            y = x.exp()
            z = y.sum()
    with ag.no_grad():
        y.add_(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (the "enabled" warning)
                anomaly = ag.autograd.detect_anomaly(check_nan=False)
            with anomaly:
                z.backward()
    # the report PyTorch would warn with goes to stderr instead
    assert "Error detected in ExpBackward0" in capsys.readouterr().err


# --- 10. no numpy RuntimeWarnings ------------------------------------------------------------

def test_ops_do_not_emit_numpy_runtime_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan((ag.zeros(1) / 0).item())
        assert (ag.ones(1) / ag.zeros(1)).item() == np.inf
        assert ag.log(ag.zeros(1)).item() == -np.inf
        assert np.isnan(ag.sqrt(-ag.ones(1)).item())
        assert ag.exp(ag.tensor([1000.0])).item() == np.inf
        assert (ag.zeros(1) ** -1.0).item() == np.inf
        row = ag.tensor([[np.inf, 1.0]])  # inf - inf inside the shift by the row's max: nan, as PyTorch
        assert np.isnan(ag.softmax(row, 1).numpy()).all() and np.isnan(ag.log_softmax(row, 1).numpy()).all()
        for fn, expected in ((ag.log, np.inf), (lambda t: 1 / t, -np.inf), (ag.sqrt, np.inf)):
            x = ag.zeros(1, requires_grad=True)
            fn(x).sum().backward()  # the derivative rules divide by zero too
            assert x.grad.item() == expected


# --- 11. x.grad = x ---------------------------------------------------------------------------

def test_assigning_a_tensor_as_its_own_grad_raises():
    x = ag.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="can't assign Variable as its own grad"):
        x.grad = x
    assert x.grad is None
    x.grad = x.detach()  # a different tensor sharing memory is allowed, as in PyTorch
    assert np.array_equal(x.grad.numpy(), [1.0, 1.0])


# --- 17. Linear with a mismatched input dtype -----------------------------------------------

def test_linear_rejects_a_different_input_dtype():
    layer = ag.nn.Linear(2, 3, dtype=np.float32)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype, but got Double and Float"):
        layer(ag.ones(1, 2, dtype=np.float64))
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype, but got Long and Float"):
        layer(ag.ones(1, 2, dtype=np.int64))
    assert layer(ag.ones(1, 2, dtype=np.float32)).dtype == np.float32
    F = ag.nn.functional
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype, but got: double != float"):
        F.linear(ag.ones(2, dtype=np.float64), ag.ones(3, 2, dtype=np.float32))
    with pytest.raises(RuntimeError, match="self and mat2 must have the same dtype, but got Double and Float"):
        F.linear(ag.ones(2, dtype=np.float32), ag.ones(3, 2, dtype=np.float32), ag.ones(3, dtype=np.float64))


# --- 5, 13, 14, 15. custom Functions ----------------------------------------------------------

class AddInPlace(Function):
    @staticmethod
    def forward(ctx, x, b):
        x.add_(b)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, g


def test_mark_dirty_on_a_view_is_recorded_on_its_base():
    a = ag.ones(4, 4, requires_grad=True)
    b = ag.ones(2, 2, requires_grad=True)
    x = a.clone()
    y = AddInPlace.apply(x[1:3, 2:4], b)
    assert y._base is x and x.grad_fn.name() == "CopySlices"
    assert np.array_equal(x.numpy()[1:3, 2:4], np.full((2, 2), 2.0))
    x.sum().backward()  # through the base: b.grad was None before the fix
    assert np.array_equal(b.grad.numpy(), np.ones((2, 2)))
    assert np.array_equal(a.grad.numpy(), np.ones((4, 4)))


def test_mark_dirty_on_a_view_returns_the_view_and_routes_its_gradient():
    a = ag.ones(4, 4, requires_grad=True)
    b = ag.ones(2, 2, requires_grad=True)
    x = a.clone()
    v = x[1:3, 2:4]
    y = AddInPlace.apply(v, b)
    assert y is v
    y.sum().backward()
    expected = np.zeros((4, 4))
    expected[1:3, 2:4] = 1
    assert np.array_equal(a.grad.numpy(), expected)
    assert np.array_equal(b.grad.numpy(), np.ones((2, 2)))


class SaveThree(Function):
    @staticmethod
    def forward(ctx, x):
        y = x * 2
        z = x * 3
        ctx.save_for_backward(x, y, z)
        ctx.z = z
        return y

    @staticmethod
    def backward(ctx, g):
        x, y, z = ctx.saved_tensors
        ctx.seen = (x, z)
        return g * 2


def test_saved_tensors_returns_the_saved_input_and_intermediate_objects():
    x = ag.ones(2, requires_grad=True)
    out = SaveThree.apply(x)
    ctx = out.grad_fn.ctx
    a, b, c = ctx.saved_tensors
    a2, b2, c2 = ctx.saved_tensors
    assert a is x and c is ctx.z and c2 is c  # PyTorch: the same objects
    assert b is not out and np.array_equal(b.numpy(), out.numpy())  # an output: a new one, as PyTorch
    out.sum().backward()
    assert ctx.seen[0] is x and ctx.seen[1] is ctx.z
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _ = ctx.saved_tensors


def test_saved_input_modified_in_place_still_raises_when_unpacked():
    x = ag.ones(2, requires_grad=True)
    h = x * 1
    out = SaveThree.apply(h)
    with ag.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _ = out.grad_fn.ctx.saved_tensors


class DirtyAndSaved(Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_a_tensor_marked_dirty_and_saved_is_freed_without_gc():
    gc.disable()
    try:
        a = ag.ones(2, requires_grad=True)
        x = a.clone()
        y = DirtyAndSaved.apply(x)
        ref = weakref.ref(y)
        del x, y
        assert ref() is None  # no reference cycle through ctx
    finally:
        gc.enable()


class MarkViewOfIntermediate(Function):
    @staticmethod
    def forward(ctx, x):
        v = x.clone()[:1]
        ctx.mark_dirty(v)
        return v

    @staticmethod
    def backward(ctx, g):
        return g


class MarkIntermediate(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        ctx.mark_dirty(y)
        return y

    @staticmethod
    def backward(ctx, g):
        return g


def test_mark_dirty_on_a_view_of_an_intermediate_raises_and_on_an_intermediate_warns():
    x = ag.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"ctx.mark_dirty\(\) received a tensor that was not an input"):
        MarkViewOfIntermediate.apply(x)
    with pytest.warns(UserWarning, match=r"ctx.mark_dirty\(\) received a tensor that was not an input"):
        y = MarkIntermediate.apply(x)
    assert y.grad_fn.name() == "MarkIntermediateBackward"


# --- 2, 4, 9. views and in-place operations ---------------------------------------------------

def test_in_place_on_a_view_of_a_leaf_view_that_requires_grad_raises():
    x = ag.zeros(2)
    y = x.view(2)
    y.requires_grad_(True)  # y: a leaf that views x
    z = y.view(2)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used"):
        z /= 2
    assert z._version == 0 and np.array_equal(x.numpy(), [0.0, 0.0])


def test_a_view_follows_its_plain_base_changed_in_place_by_a_recorded_op():
    r = ag.ones(1, requires_grad=True)
    x = ag.ones(5)
    v = x[1:2]  # taken before the in-place op
    x.add_(r)
    assert v.requires_grad and v.grad_fn is not None
    (v * r).sum().backward()
    assert r.grad.item() == 3.0  # d/dr ((1 + r) * r) at r = 1; was 2 with a stale view


def test_other_views_follow_an_in_place_op_through_one_view_of_a_plain_base():
    r = ag.ones(1, requires_grad=True)
    x = ag.ones(5)
    v, w, overlapping = x[1:2], x[2:4], x[0:3]
    v.mul_(r * 2)
    assert x.grad_fn.name() == "CopySlices"
    (w * r).sum().backward(retain_graph=True)
    assert r.grad.item() == 2.0  # w does not overlap v: its values do not depend on r
    r.grad = None
    (overlapping * r).sum().backward()  # [1, 2r, 1] * r -> d/dr = 1 + 4r + 1
    assert r.grad.item() == 6.0


def test_writing_one_element_of_an_expanded_tensor():
    g = ag.ones(1).expand(10)
    g[0] = 0  # one memory location: allowed, and every element shows it (PyTorch)
    assert np.array_equal(g.numpy(), np.zeros(10)) and g._version == 1
    h = ag.ones(3, 1).expand(3, 4)
    h[1, 2] = 5
    assert np.array_equal(h.numpy()[:, 0], [1.0, 5.0, 1.0])


def test_writing_one_element_of_an_expanded_tensor_that_requires_grad():
    a = ag.ones(1, requires_grad=True)
    v = ag.tensor(5.0, requires_grad=True)
    g = a.clone().expand(3)
    g[1] = v  # recorded on the clone (CopySlices); g reads the new base
    assert np.array_equal(g.numpy(), [5.0, 5.0, 5.0])
    (g * ag.arange(3.0)).sum().backward()
    assert a.grad.item() == 0.0 and v.grad.item() == 3.0  # PyTorch: 0 and 3
    g = ag.ones(1, requires_grad=True).clone().expand(10)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        g[0:2] = 0


@pytest.mark.parametrize("write", [
    lambda g: g.__setitem__(slice(0, 2), 0),
    lambda g: g.add_(1),
    lambda g: g.__setitem__([0, 1], 0),
])
def test_writing_several_aliased_elements_of_an_expanded_tensor_raises(write):
    g = ag.ones(1).expand(10)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single"):
        write(g)
    assert np.array_equal(g.numpy(), np.ones(10)) and g._version == 0


# --- 16. assigning .data ---------------------------------------------------------------------

def test_assigning_data_swaps_the_storage_as_in_pytorch():
    x = ag.ones(2, requires_grad=True)
    assert isinstance(x.data, np.ndarray) and x.data is x.numpy()  # API.md: data is the ndarray
    y = ag.zeros(3)
    x.data = y  # PyTorch: x takes y's storage, keeps its identity and graph place
    assert x.data is y.data and x.shape == (3,) and x.requires_grad and x.is_leaf
    assert x._version == 0
    (x * 2).sum().backward()  # no stale AccumulateGrad for the old shape
    assert np.array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])
    with ag.no_grad():
        x.add_(1)
    assert np.array_equal(y.numpy(), [1.0, 1.0, 1.0])  # shared storage
    x.data = np.arange(3.0)  # an ndarray works too
    assert np.array_equal(x.numpy(), [0.0, 1.0, 2.0])


def test_assigning_data_rejects_other_types_and_changes_nothing():
    x = ag.ones(2)
    with pytest.raises(TypeError, match="Variable data has to be a tensor, but got int"):
        x.data = 5
    assert np.array_equal(x.numpy(), [1.0, 1.0])


# --- Autograd API: increment_version, calling a Node --------------------------------------------

def test_increment_version():
    x = ag.ones(2)
    ag.autograd.graph.increment_version(x)
    ag.autograd.graph.increment_version([x, x])
    assert x._version == 3
    w = ag.ones(2, requires_grad=True)
    y = w.exp()
    ag.autograd.graph.increment_version(y)  # as if y was changed through numpy()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    with pytest.raises(TypeError, match="increment_version expects Tensors"):
        ag.autograd.graph.increment_version([x, 3])
    assert x._version == 3  # nothing bumped by the rejected call


def test_calling_a_node_directly():
    x = ag.ones(2, requires_grad=True)
    gx, gconst = (x * 3).grad_fn(ag.ones(2))  # one per forward input; None for the constant
    assert np.array_equal(gx.numpy(), [3.0, 3.0]) and gconst is None
    g = (x * x).sum().grad_fn(ag.tensor(1.0))  # a one-input node gives a Tensor, not a tuple
    assert isinstance(g, ag.Tensor) and g.shape == (2,)
    a, b = (x * x).grad_fn(ag.ones(2))
    assert a.requires_grad and a.grad_fn.name() == "MulBackward0"  # grad mode on: differentiable
    node = (x * x).grad_fn
    with ag.no_grad():
        a, b = node(ag.ones(2))
    assert not a.requires_grad
    assert (x * x).grad_fn(None) == (None, None)
    assert x.grad is None  # a node call accumulates nothing...
    acc = (x * 2).grad_fn.next_functions[0][0]
    assert acc(ag.ones(2)) == ()  # ...but AccumulateGrad's does, as in PyTorch
    assert np.array_equal(x.grad.numpy(), [1.0, 1.0])


def test_calling_a_node_with_bad_arguments():
    x = ag.ones(2, requires_grad=True)
    z = x * x
    with pytest.raises(TypeError, match="expected 1 arguments, got 2 instead"):
        z.grad_fn(ag.ones(2), ag.ones(2))
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(3\) must match"):
        z.grad_fn(ag.ones(3))
    z.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        z.grad_fn(ag.ones(2))


# --- Checkpoint: use_reentrant warning, early stop, grad inside a non-reentrant checkpoint -------

def test_checkpoint_warns_when_use_reentrant_is_not_passed():
    from asyncgrad.utils.checkpoint import checkpoint, checkpoint_sequential

    x = ag.ones(2, requires_grad=True)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        y = checkpoint(lambda t: t.sin(), x)
    y.sum().backward()  # the reentrant form, as before
    assert np.allclose(x.grad.numpy(), np.cos(1.0))
    with pytest.warns(UserWarning, match="checkpoint_sequential: the use_reentrant parameter should be passed"):
        checkpoint_sequential([lambda t: t * 2, lambda t: t + 1], 2, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint(lambda t: t.sin(), x, use_reentrant=True)
        checkpoint(lambda t: t.sin(), x, use_reentrant=False)


def _logging_fn(log):
    def fn(t):
        a = t.sin()  # saves t: the only tensor the backward needs
        log.append("recomputed past the last saved tensor")
        return a * 2
    return fn


def test_non_reentrant_checkpoint_stops_recomputation_early():
    from asyncgrad.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    log = []
    x = ag.tensor([0.3, 0.6], requires_grad=True)
    y = checkpoint(_logging_fn(log), x, use_reentrant=False)
    log.clear()
    y.sum().backward()
    assert log == []  # the recomputation stopped once t was saved again
    assert np.allclose(x.grad.numpy(), 2 * np.cos([0.3, 0.6]))

    for make in (lambda f: checkpoint(f, x, use_reentrant=False, early_stop=False),
                 lambda f: _with(set_checkpoint_early_stop(False), lambda: checkpoint(f, x, use_reentrant=False))):
        x.grad = None
        y = make(_logging_fn(log))
        log.clear()
        y.sum().backward()  # the whole function runs again
        assert log == ["recomputed past the last saved tensor"]
        assert np.allclose(x.grad.numpy(), 2 * np.cos([0.3, 0.6]))


def _with(cm, fn):
    with cm:
        return fn()


def test_set_checkpoint_early_stop_only_matters_in_forward():
    from asyncgrad.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    log = []
    x = ag.tensor([0.3], requires_grad=True)
    y = checkpoint(_logging_fn(log), x, use_reentrant=False)
    log.clear()
    with set_checkpoint_early_stop(False):  # too late: the forward decided
        y.sum().backward()
    assert log == []


def test_non_reentrant_checkpoint_of_a_function_that_calls_grad():
    from asyncgrad.utils.checkpoint import checkpoint

    def fn(t):
        (g,) = ag.grad_sync((t ** 3).sum(), t, create_graph=True)  # 3 t^2
        return g * 2

    for early_stop in (True, False):
        x = ag.tensor([1.0, 2.0], requires_grad=True)
        out = checkpoint(fn, x, use_reentrant=False, early_stop=early_stop)
        assert np.allclose(out.numpy(), [6.0, 24.0])
        out.sum().backward()
        assert np.allclose(x.grad.numpy(), [12.0, 24.0])  # d/dx sum(6 x^2)


# --- the issue's scenarios replayed in PyTorch (skipped without torch) ----------------------------

def _scenarios(lib, F):
    """Each scenario of issue 13 written once for a torch-like module ``lib`` (torch or
    asyncgrad) and its Function base ``F``; returns the observable results."""
    out = {}
    r = lib.ones(1, requires_grad=True)
    x = lib.ones(5)
    v = x[1:2]
    x.add_(r)
    (v * r).sum().backward()
    out["stale view (4)"] = r.grad.tolist()

    class AddInPlace(F):
        @staticmethod
        def forward(ctx, t, b):
            t.add_(b)
            ctx.mark_dirty(t)
            return t

        @staticmethod
        def backward(ctx, g):
            return g, g

    a = lib.ones(4, 4, requires_grad=True)
    b = lib.ones(2, 2, requires_grad=True)
    x = a.clone()
    AddInPlace.apply(x[1:3, 2:4], b)
    (x * x).sum().backward()
    out["mark_dirty view (5)"] = (b.grad.tolist(), a.grad.tolist())

    g = lib.ones(1).expand(10)
    g[0] = 0
    out["expand write (9)"] = g.tolist()

    w = lib.ones(2, requires_grad=True)
    grads = (w * w).grad_fn(lib.ones(2))
    out["node call"] = [t.tolist() for t in grads]
    return out


def test_issue_scenarios_match_pytorch():
    torch = pytest.importorskip("torch")
    torch.set_default_dtype(torch.float64)
    try:
        expected = _scenarios(torch, torch.autograd.Function)
    finally:
        torch.set_default_dtype(torch.float32)
    assert _scenarios(ag, Function) == expected


def test_the_view_registry_of_a_plain_tensor_stays_bounded():
    x = ag.ones(8)
    for i in range(1000):
        x[i % 8]  # a view made and dropped every step (a data tensor sliced per batch)
    assert len(x._views) <= 32
    kept = [x[i % 8] for i in range(40)]
    for i in range(200):
        x[i % 8]
    assert len(x._views) <= 128 and sum(r() is not None for r in x._views) >= len(kept)


def test_non_reentrant_checkpoint_that_saves_more_when_recomputed_raises():
    from asyncgrad.utils.checkpoint import checkpoint

    calls = []

    def fn(t):
        calls.append(1)
        y = t.sin()
        return y.exp() if len(calls) > 1 else y * 2  # recomputation saves one more tensor

    x = ag.tensor([0.5], requires_grad=True)
    out = checkpoint(fn, x, use_reentrant=False, early_stop=False)
    with pytest.raises(RuntimeError, match="trying to save more tensors during recomputation"):
        out.sum().backward()
    assert x.grad is None
