"""Custom autograd Functions: ports of the intent of PyTorch's test_autograd.py custom
Function tests (see pytorch_engine_semantics.md §11, cases 58, 67-75), plus asyncgrad's
own: ``async def backward``, cancellation, offloading, saved-tensor hooks."""

import asyncio
import threading

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Function
from asyncgrad.autograd.function import once_differentiable
from asyncgrad.autograd.graph import saved_tensors_hooks


class Exp(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class Cube(Function):
    """Differentiable backward (uses ops), for double backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x ** 2


# --- structure --------------------------------------------------------------------------

def test_basic_function_node_and_gradient():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = Exp.apply(x)
    assert y.grad_fn.name() == "ExpBackward"
    assert type(y.grad_fn).__name__ == "ExpBackward"
    assert y.grad_fn is y.grad_fn
    (acc, nr), = y.grad_fn.next_functions
    assert acc.name() == "AccumulateGrad" and nr == 0
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([1.0, 2.0]))


def test_sequence_nr_counts_function_nodes():
    x = ag.tensor([1.0], requires_grad=True)
    a = x * 2
    b = Exp.apply(a)
    c = b * 3
    assert a.grad_fn.sequence_nr < b.grad_fn.sequence_nr < c.grad_fn.sequence_nr


def test_setup_context_style():
    class Mul(Function):
        @staticmethod
        def forward(x, y, scale=2.0):
            return x * y * scale

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, y, scale = inputs
            ctx.save_for_backward(x, y)
            ctx.scale = scale

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y * ctx.scale, g * x * ctx.scale, None

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = ag.tensor([3.0, 4.0], requires_grad=True)
    out = Mul.apply(x, y=y)  # keyword tensor arguments get their edge too
    assert len(out.grad_fn.next_functions) == 3
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 8.0])
    np.testing.assert_allclose(y.grad.numpy(), [2.0, 4.0])


def test_non_tensor_inputs_get_invalid_edges_and_none_slots():
    class Scale(Function):
        @staticmethod
        def forward(ctx, x, k, w):
            ctx.k = k
            return x * k + w

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k, None, g

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    w = ag.tensor([1.0, 1.0])  # does not require grad
    y = Scale.apply(x, 3, w)
    nf = y.grad_fn.next_functions
    assert nf[0][0].name() == "AccumulateGrad"
    assert nf[1] == (None, 0) and nf[2] == (None, 0)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
    assert w.grad is None  # the gradient returned for w (needs none) is dropped


def test_gradient_for_non_tensor_input_raises():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g, g

    x = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="returned a gradient different than None at position 2, "
                                           "but the corresponding forward input was not a Variable"):
        Bad.apply(x, 2.0).sum().backward()


def test_multiple_outputs_and_output_nr():
    class Split(Function):
        @staticmethod
        def forward(ctx, x):
            return x[:5].clone(), x[5:].clone()

        @staticmethod
        def backward(ctx, ga, gb):
            return ag.cat([ga, gb * 10], 0)

    x = ag.randn(10, requires_grad=True)
    a, b = Split.apply(x)
    assert a.output_nr == 0 and b.output_nr == 1
    assert a.grad_fn is b.grad_fn and a.grad_fn.num_outputs == 2
    (a.sum() + b.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0] * 5 + [10.0] * 5)


def test_non_tensor_outputs_pass_through():
    class WithInfo(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, "info", 3

        @staticmethod
        def backward(ctx, g, g_info, g_int):
            assert g_info is None and g_int is None
            return g * 2

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y, info, n = WithInfo.apply(x)
    assert info == "info" and n == 3
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


@pytest.mark.parametrize("shape", [(1,), ()])
def test_function_returns_input(shape):
    class Identity(Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    v = ag.ones(*shape, requires_grad=True)
    out = Identity.apply(v)
    assert out is not v and out._base is v and out.grad_fn.name() == "IdentityBackward"
    assert np.shares_memory(out.numpy(), v.numpy())
    out.backward()
    np.testing.assert_allclose(v.grad.numpy(), np.full(shape, 2.0))
    v.grad = None
    Identity.apply(v.clone()).backward()
    np.testing.assert_allclose(v.grad.numpy(), np.full(shape, 2.0))


def test_return_duplicate_gives_same_object():
    class Dup(Function):
        @staticmethod
        def forward(ctx, x):
            y = x * 2
            return y, y

        @staticmethod
        def backward(ctx, g1, g2):
            return g1 * 2 + g2 * 2

    x = ag.randn(3, requires_grad=True)
    a, b = Dup.apply(x)
    assert a is b
    (a + b).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 4.0))


def test_apply_under_no_grad_or_without_grad_inputs_builds_no_node():
    x = ag.tensor([1.0], requires_grad=True)
    with ag.no_grad():
        y = Exp.apply(x)
    assert y.grad_fn is None and not y.requires_grad
    z = Exp.apply(ag.tensor([1.0]))
    assert z.grad_fn is None and not z.requires_grad


def test_forward_runs_without_grad_and_backward_with_create_graph_mode():
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, x):
            seen["forward"] = ag.is_grad_enabled()
            return x * 1

        @staticmethod
        def backward(ctx, g):
            seen.setdefault("backward", []).append(ag.is_grad_enabled())
            return g

    x = ag.tensor([1.0], requires_grad=True)
    y = Probe.apply(x)
    assert seen["forward"] is False
    y.sum().backward(retain_graph=True)
    ag.grad_sync(y.sum(), x, create_graph=True)
    assert seen["backward"] == [False, True]


def test_function_returns_undefined_gradient():
    class NoGrad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return None

    x = ag.tensor([1.0], requires_grad=True)
    NoGrad.apply(x).sum().backward()
    assert x.grad is None
    (g,) = ag.grad_sync(NoGrad.apply(x).sum(), x, allow_unused=True)
    assert g is None


def test_custom_exception_propagates_with_type():
    class Boom(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            raise ValueError("Simulate error on backward pass")

    x = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="Simulate error on backward pass"):
        Boom.apply(x).sum().backward()
    assert x.grad is None


def test_missing_backward_and_legacy_calls():
    class NoBackward(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

    x = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(NotImplementedError, match="You must implement either the backward or vjp"):
        NoBackward.apply(x).sum().backward()
    with pytest.warns(DeprecationWarning, match="should not be instantiated"):
        f = NoBackward()
    with pytest.raises(RuntimeError, match="Legacy autograd function with non-static forward"):
        f(x)


def test_vjp_alias():
    class V(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def vjp(ctx, g):
            return g * 3

    x = ag.tensor([1.0], requires_grad=True)
    V.apply(x).sum().backward()
    assert x.grad.item() == 3.0


# --- ctx ----------------------------------------------------------------------------------

def test_save_for_backward_type_error_and_none():
    class SaveInt(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, 3)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    x = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(TypeError, match="save_for_backward can only save variables, but argument 1 is of type int"):
        SaveInt.apply(x)

    class SaveNone(Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, None, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, none, y = ctx.saved_tensors
            assert none is None
            return g * y, g * x

    a = ag.tensor([2.0], requires_grad=True)
    b = ag.tensor([5.0], requires_grad=True)
    SaveNone.apply(a, b).sum().backward()
    assert a.grad.item() == 5.0 and b.grad.item() == 2.0


def test_save_intermediate_and_output():
    class Sq(Function):
        @staticmethod
        def forward(ctx, x):
            two_x = x * 2  # an intermediate
            y = x * x
            ctx.save_for_backward(two_x, y)
            return y

        @staticmethod
        def backward(ctx, g):
            two_x, y = ctx.saved_tensors
            assert y.grad_fn is not None  # a saved output keeps its place in the graph
            return g * two_x

    x = ag.tensor([3.0], requires_grad=True)
    y = Sq.apply(x)
    y.backward()
    assert x.grad.item() == 6.0


def test_saved_tensor_version_check():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = Exp.apply(x)
    with ag.no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()

    class SaveInput(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2

    a = ag.tensor([1.0], requires_grad=True)
    h = a * 1
    out = SaveInput.apply(h)
    h.mul_(3)
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0"):
        out.sum().backward()


def test_saved_tensors_freed_after_backward():
    stash = {}

    class Stash(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            stash["ctx"] = ctx
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2

    x = ag.tensor([1.0], requires_grad=True)
    y = Stash.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.item() == 4.0
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        _ = stash["ctx"].saved_tensors


def test_mark_dirty_returns_same_object_with_new_grad_fn():
    class AddOneInplace(Function):
        @staticmethod
        def forward(ctx, a, b):
            a.add_(b)
            ctx.mark_dirty(a)
            return a

        @staticmethod
        def backward(ctx, g):
            return g, g

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = ag.tensor([10.0, 10.0], requires_grad=True)
    a = x * 2
    v0 = a._version
    old_fn = a.grad_fn
    c = AddOneInplace.apply(a, y)
    assert c is a
    assert a._version == v0 + 2  # add_ plus mark_dirty, as PyTorch
    assert a.grad_fn is not old_fn and a.grad_fn.name() == "AddOneInplaceBackward"
    np.testing.assert_allclose(c.numpy(), [12.0, 14.0])
    (c * c).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * 2 * np.array([12.0, 14.0]))
    np.testing.assert_allclose(y.grad.numpy(), 2 * np.array([12.0, 14.0]))


def test_mark_dirty_errors():
    class Inplace(Function):
        @staticmethod
        def forward(ctx, a):
            a.data += 1
            ctx.mark_dirty(a)
            return a

        @staticmethod
        def backward(ctx, g):
            return g

    leaf = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad has been used in an in-place "
                                           "operation."):
        Inplace.apply(leaf)

    class NotReturned(Function):
        @staticmethod
        def forward(ctx, a):
            ctx.mark_dirty(a)
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(RuntimeError, match="Some elements marked as dirty during the forward method were not returned"):
        NotReturned.apply(leaf * 1)


def test_mark_non_differentiable_mixed():
    class MyFunction(Function):
        @staticmethod
        def forward(ctx, x):
            a = x + 1
            b = x + 2
            ctx.mark_non_differentiable(a)
            return a, b

        @staticmethod
        def backward(ctx, grad_a, grad_b):
            assert (grad_a.numpy() == 0).all()
            assert (grad_b.numpy() == 1).all()
            return grad_b

    x = ag.randn(5, 5, requires_grad=True)
    a, b = MyFunction.apply(x)
    assert not a.requires_grad and a.grad_fn is None
    assert b.requires_grad
    b.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((5, 5)))


@pytest.mark.parametrize("materialize", [True, False])
def test_materialize_grads(materialize):
    seen = []

    class Two(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(materialize)
            return x * 1, x * 2

        @staticmethod
        def backward(ctx, ga, gb):
            seen.append(gb)
            return ga + (gb * 2 if gb is not None else 0)

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    a, _ = Two.apply(x)
    a.sum().backward()
    if materialize:
        np.testing.assert_array_equal(seen[0].numpy(), [0.0, 0.0])
    else:
        assert seen[0] is None
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])


def test_needs_input_grad_fixed_at_forward():
    seen = []

    class F2(Function):
        @staticmethod
        def forward(ctx, a, b, k):
            return a * b * k

        @staticmethod
        def backward(ctx, g):
            seen.append(ctx.needs_input_grad)
            return g, g, None

    a = ag.tensor([1.0], requires_grad=True)
    b = ag.tensor([2.0], requires_grad=True)
    c = ag.tensor([3.0])
    out = F2.apply(a, c, 2)
    (ga,) = ag.grad_sync(out.sum(), a)
    assert seen[-1] == (True, False, False)
    out2 = F2.apply(a, b, 2)
    ag.grad_sync(out2.sum(), a)  # only a is asked for: b's grad is still "needed"
    assert seen[-1] == (True, True, False)
    assert ga.item() == 1.0


def test_incorrect_number_of_gradients():
    class TooFew(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g

    a = ag.tensor([1.0], requires_grad=True)
    b = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"function TooFewBackward returned an incorrect number of "
                                           r"gradients \(expected 2, got 1\)"):
        TooFew.apply(a, b).sum().backward()

    class ListIsOne(TooFew):
        @staticmethod
        def backward(ctx, g):
            return [g, g]

    with pytest.raises(RuntimeError, match=r"expected 2, got 1"):
        ListIsOne.apply(a, b).sum().backward()

    class TooMany(TooFew):
        @staticmethod
        def backward(ctx, g):
            return g, g, None, None  # trailing Nones are allowed

    TooMany.apply(a, b).sum().backward()
    assert a.grad.item() == 1.0

    class TooManyNotNone(TooFew):
        @staticmethod
        def backward(ctx, g):
            return g, g, g

    with pytest.raises(RuntimeError, match=r"expected 2, got 3"):
        TooManyNotNone.apply(a, b).sum().backward()


def test_invalid_gradient_shape_names_function_and_index():
    class WrongShape(Function):
        @staticmethod
        def forward(ctx, k, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return None, ag.ones(10)

    x = ag.randn(5, 5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Function WrongShapeBackward returned an invalid gradient "
                                           r"at index 1 - got \[10\] but expected shape compatible with \[5, 5\]"):
        WrongShape.apply(2, x).sum().backward()

    class Broadcast(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return ag.ones(4, 2)  # summed down to [2], as PyTorch

    y = ag.tensor([1.0, 2.0], requires_grad=True)
    Broadcast.apply(y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [4.0, 4.0])


def test_non_tensor_gradient_type_error():
    class IntGrad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return 3

    x = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(TypeError, match=r"expected Variable or None \(got int\)"):
        IntGrad.apply(x).sum().backward()


# --- once_differentiable, double backward, gradcheck ----------------------------------------

class OnceExp(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        assert not ag.is_grad_enabled()
        (y,) = ctx.saved_tensors
        return g * y


def test_once_differentiable():
    x = ag.tensor([0.5, 1.0], requires_grad=True)
    OnceExp.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([0.5, 1.0]))

    go = ag.ones((), requires_grad=True)
    (gx,) = ag.grad_sync(OnceExp.apply(x).sum(), x, go, create_graph=True)
    assert gx.requires_grad and gx.grad_fn.name() == "Error"
    np.testing.assert_allclose(gx.numpy(), np.exp([0.5, 1.0]))
    with pytest.raises(RuntimeError, match="trying to differentiate twice a function that was marked "
                                           "with @once_differentiable"):
        gx.sum().backward()
    with pytest.raises(RuntimeError, match="trying to differentiate twice"):
        ag.grad_sync(gx.sum(), go)


def test_double_backward_through_custom_function():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    (gx,) = ag.grad_sync(Cube.apply(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(gx.numpy(), 3 * x.numpy() ** 2)
    (ggx,) = ag.grad_sync(gx.sum(), x)
    np.testing.assert_allclose(ggx.numpy(), 6 * x.numpy())


def test_gradcheck_custom_function():
    class Softplus(Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return (1 + (x * w).exp()).log()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            s = (x * w).sigmoid()
            return g * s * w, (g * s * x).sum(0)

    x = ag.randn(3, 4, requires_grad=True)
    w = ag.randn(4, requires_grad=True)
    assert ag.autograd.gradcheck(Softplus.apply, (x, w))
    assert ag.autograd.gradcheck(Cube.apply, (x,))
    assert ag.autograd.gradgradcheck(Cube.apply, (x,))


def test_simple_reentrant_backward_inside_function():
    y_data = np.random.default_rng(0).standard_normal((2, 2))

    class Reenter(Function):
        @staticmethod
        def forward(ctx, x):
            with ag.enable_grad():
                ctx.x = ag.tensor(x.numpy(), requires_grad=True)
                ctx.output = ctx.x * ag.tensor(y_data)
            return ctx.output.detach()

        @staticmethod
        def backward(ctx, g):
            with ag.enable_grad():
                ag.backward_sync(ctx.output, g)
            return ctx.x.grad * g

    x = ag.randn(2, 2, requires_grad=True)
    Reenter.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y_data)


# --- async backward, cancellation, offloading ----------------------------------------------

@pytest.fixture
def concurrent_engine(request):
    """For tests of the fast engine's concurrency itself: the reference executor
    (``pytest --reference-engine``) runs one node at a time, by design."""
    if request.config.getoption("--reference-engine"):
        pytest.skip("checks overlapping or offloaded nodes; the reference executor runs them in turn")


async def test_async_backward_overlaps_other_branch(concurrent_engine):
    log = []

    class SlowAsync(Function):
        @staticmethod
        def forward(ctx, x, name):
            ctx.name = name
            return x * 2

        @staticmethod
        async def backward(ctx, g):
            log.append(f"{ctx.name} start")
            await anyio.sleep(0.1)
            log.append(f"{ctx.name} end")
            return g * 2, None

    assert SlowAsync._async_backward
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    t = x * 3  # a synchronous branch
    t.register_hook(lambda g: log.append("sync branch"))
    a = SlowAsync.apply(x, "a")
    b = SlowAsync.apply(x, "b")
    assert a.grad_fn.is_async()
    await ag.backward(a.sum() + b.sum() + t.exp().sum())
    assert log.index("sync branch") < log.index("a end")  # ran while the awaits were pending
    assert log.index("b start") < log.index("a end") and log.index("a start") < log.index("b end")
    np.testing.assert_allclose(x.grad.numpy(), 4 + 3 * np.exp(3 * x.numpy()))


async def test_async_backward_keeps_loop_responsive_and_create_graph():
    class AsyncCube(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        async def backward(ctx, g):
            await anyio.sleep(0)
            (x,) = ctx.saved_tensors
            return g * 3 * x ** 2

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    (gx,) = await ag.grad(AsyncCube.apply(x).sum(), x, create_graph=True)
    (ggx,) = await ag.grad(gx.sum(), x)
    np.testing.assert_allclose(ggx.numpy(), 6 * x.numpy())


def test_sync_backward_accepts_async_function():
    class AsyncDouble(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        async def backward(ctx, g):
            await anyio.sleep(0.001)
            return g * 2

    x = ag.tensor([1.0], requires_grad=True)
    AsyncDouble.apply(x).sum().backward()
    assert x.grad.item() == 2.0


async def test_cancellation_during_async_backward_leaves_grad_unchanged():
    started = anyio.Event()

    class Hang(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        async def backward(ctx, g):
            started.set()
            try:
                await anyio.sleep(ctx.delay)
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)  # the cancellation reached the async backward
                raise
            return g * 2

    cancelled: list[bool] = []
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    x.grad = ag.tensor([5.0, 5.0])
    y = Hang.apply(x)
    y.grad_fn.ctx.delay = 10
    loss = (y * 3).sum() + x.sum()
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.1):
            await ag.backward(loss)
    assert started.is_set() and cancelled == [True]
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0])
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(ag.backward(loss), 0.05)
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0])
    # nothing was freed: the same backward can run again
    y.grad_fn.ctx.delay = 0
    await ag.backward(loss)
    np.testing.assert_array_equal(x.grad.numpy(), [5.0 + 7.0, 5.0 + 7.0])


async def test_large_function_is_offloaded_to_a_worker_thread(concurrent_engine):
    threads = []

    class Big(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            threads.append(threading.get_ident())
            return g * 2

    engine = ag.autograd.get_engine()
    x = ag.randn(engine.inline_threshold + 10, requires_grad=True)
    y = Big.apply(x)
    assert y.grad_fn.work >= engine.inline_threshold
    await ag.backward(y.sum())
    assert threads and threads[0] != threading.get_ident()
    np.testing.assert_allclose(x.grad.numpy(), 2.0)
    small = Big.apply(ag.randn(3, requires_grad=True))
    assert small.grad_fn.work < engine.inline_threshold


# --- saved-tensor hooks ---------------------------------------------------------------------

def test_saved_tensors_hooks_apply_to_functions_and_ops():
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t.numpy().copy()  # e.g. moved elsewhere

    def unpack(arr):
        unpacked.append(arr.shape)
        return ag.tensor(arr)

    x = ag.tensor([1.0, 2.0], requires_grad=True)
    with saved_tensors_hooks(pack, unpack):
        y = Exp.apply(x)   # saves its output
        z = (y * x).sum()  # MulBackward0 saves both operands
    assert len(packed) == 3
    z.backward()
    assert len(unpacked) == 3
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), e + x.numpy() * e)
    w = x * 2  # outside the block: no hooks
    w.sum().backward()
    assert len(packed) == 3


async def test_saved_tensors_hooks_are_context_local():
    counts = {"a": 0, "b": 0}

    async def work(name):
        def pack(t):
            counts[name] += 1
            return t

        x = ag.tensor([1.0, 2.0], requires_grad=True)
        with saved_tensors_hooks(pack, lambda t: t):
            for _ in range(5):
                y = Exp.apply(x)
                await anyio.sleep(0)
        await ag.backward(y.sum())

    async with anyio.create_task_group() as tg:
        tg.start_soon(work, "a")
        tg.start_soon(work, "b")
    assert counts == {"a": 5, "b": 5}


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_backward_under_both_anyio_backends(backend):
    class Sleepy(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        async def backward(ctx, g):
            await anyio.sleep(0.001)
            return g * 2

    async def main():
        x = ag.tensor([1.0, 2.0], requires_grad=True)
        await ag.backward((Sleepy.apply(x) * x).sum())
        return x.grad.numpy()

    np.testing.assert_allclose(anyio.run(main, backend=backend), [4.0, 8.0])  # d(2x * x)/dx


def test_anomaly_mode_names_custom_function():
    class MyFunc(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    x = ag.tensor([1.0], requires_grad=True)
    with pytest.warns(UserWarning) as record:
        with ag.autograd.detect_anomaly():
            y = MyFunc.apply(x)
            with pytest.raises(RuntimeError, match="Function 'MyFuncBackward' returned nan values in its 0th output."):
                y.sum().backward()
    assert any("Error detected in MyFuncBackward" in str(w.message) for w in record)


def test_node_hooks_on_custom_function():
    log = []

    class Triple(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g * 3

    x = ag.tensor([1.0], requires_grad=True)
    y = Triple.apply(x)
    y.grad_fn.register_prehook(lambda go: log.append(("pre", go[0].item())))
    y.grad_fn.register_hook(lambda gi, go: log.append(("post", gi[0].item(), go[0].item())))
    y.register_hook(lambda g: g * 2)
    y.sum().backward()
    assert log == [("pre", 2.0), ("post", 6.0, 2.0)]
    assert x.grad.item() == 6.0
