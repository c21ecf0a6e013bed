"""Activation checkpointing: ports of the intent of PyTorch's checkpoint tests
(pytorch_engine_semantics.md §9, cases 62-66) for both forms, plus asyncgrad's own
guarantees: fn recomputed once per backward, parameter hooks fired once per backward,
commit-on-success, concurrent backward calls."""

import asyncio
import tracemalloc

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.ops.kernels import loader as kernels
from asyncgrad.utils.checkpoint import checkpoint, checkpoint_sequential

BOTH = pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "hooks"])


def dropout(x, p=0.5):
    mask = (ag.rand(*x.shape) > p).double() / (1 - p)
    return x * mask


class MLP:
    """Two tanh layers with closure parameters and a forward counter."""

    def __init__(self, width=4):
        self.w1 = ag.randn(width, width, requires_grad=True)
        self.b1 = ag.randn(width, requires_grad=True)
        self.w2 = ag.randn(width, width, requires_grad=True)
        self.calls = 0

    def params(self):
        return [self.w1, self.b1, self.w2]

    def __call__(self, x):
        self.calls += 1
        return ((x @ self.w1 + self.b1).tanh() @ self.w2).sin()


def grads_of(tensors):
    out = [None if t.grad is None else t.grad.numpy().copy() for t in tensors]
    for t in tensors:
        t.grad = None
    return out


def assert_grads_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


@BOTH
def test_same_gradients_as_without_checkpoint(reentrant):
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    leaves = [x, *m.params()]
    (m(m(x)) * 2).sum().backward()
    expected = grads_of(leaves)
    y = checkpoint(m, x, use_reentrant=reentrant)
    (m(y) * 2).sum().backward()
    assert_grads_equal(grads_of(leaves), expected)


@BOTH
def test_recomputes_once_per_backward(reentrant):
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    y = checkpoint(m, x, use_reentrant=reentrant).sum()
    assert m.calls == 1
    y.backward(retain_graph=True)
    assert m.calls == 2
    y.backward()
    assert m.calls == 3
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()


@BOTH
def test_parameter_hooks_fire_once_with_full_gradient(reentrant):
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    leaves = [x, *m.params()]
    # w1 is used in two checkpointed segments and outside them
    (m(m(x)) @ m.w1).sum().backward()
    expected = grads_of(leaves)

    seen, post = [], []
    m.w1.register_hook(lambda g: seen.append(g.numpy().copy()))
    m.w1.register_post_accumulate_grad_hook(lambda p: post.append(p.grad.numpy().copy()))
    h = checkpoint(m, x, use_reentrant=reentrant)
    h = checkpoint(m, h, use_reentrant=reentrant)
    (h @ m.w1).sum().backward()
    assert len(seen) == 1 and len(post) == 1
    np.testing.assert_allclose(seen[0], expected[1])
    np.testing.assert_allclose(post[0], expected[1])
    assert_grads_equal(grads_of(leaves), expected)


def test_reentrant_with_grad_or_inputs_raises_then_backward_works():
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    y = checkpoint(m, x, use_reentrant=True).sum()
    with pytest.raises(RuntimeError, match="When use_reentrant=True, asyncgrad.utils.checkpoint is "
                                           r"incompatible with .grad\(\) or passing an `inputs` parameter"):
        ag.grad_sync(y, x, retain_graph=True)
    with pytest.raises(RuntimeError, match="incompatible with .grad"):
        y.backward(inputs=[x], retain_graph=True)
    assert x.grad is None
    y.backward()  # checkpoint validity is per backward (test_checkpoint_valid_reset_on_error)
    assert x.grad is not None


def test_non_reentrant_works_with_grad_and_inputs():
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    (ex, ew1) = ag.grad_sync(m(x).sum(), (x, m.w1))
    y = checkpoint(m, x, use_reentrant=False).sum()
    gx, gw1 = ag.grad_sync(y, (x, m.w1), retain_graph=True)
    np.testing.assert_allclose(gx.numpy(), ex.numpy())
    np.testing.assert_allclose(gw1.numpy(), ew1.numpy())
    y.backward(inputs=[m.w1])
    assert x.grad is None and m.b1.grad is None
    np.testing.assert_allclose(m.w1.grad.numpy(), ew1.numpy())


def test_non_reentrant_double_backward():
    x = ag.randn(3, requires_grad=True)
    (g,) = ag.grad_sync(checkpoint(lambda t: (t ** 3).sum(), x, use_reentrant=False), x, create_graph=True)
    np.testing.assert_allclose(g.numpy(), 3 * x.numpy() ** 2)
    (gg,) = ag.grad_sync(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), 6 * x.numpy())


@BOTH
def test_rng_state_is_preserved(reentrant):
    x = ag.randn(50, requires_grad=True)
    w = ag.randn(50, requires_grad=True)

    def fn(t):
        return dropout(t * w).exp()

    state = ag.get_rng_state()
    fn(x).sum().backward()
    expected = grads_of([x, w])
    ag.set_rng_state(state)
    y = checkpoint(fn, x, use_reentrant=reentrant)
    ag.randn(10)  # the generator moves on before backward
    y.sum().backward()
    assert_grads_equal(grads_of([x, w]), expected)

    ag.set_rng_state(state)
    y = checkpoint(fn, x, use_reentrant=reentrant, preserve_rng_state=False)
    y.sum().backward()
    assert not np.allclose(grads_of([x, w])[0], expected[0])  # a different mask


def test_reentrant_partial_grad():
    def run_fn(t1, t2):
        return t1, t2

    a = ag.randn(1, 4, requires_grad=True)
    b = ag.randn(1, 4)
    out = checkpoint(run_fn, a, b, use_reentrant=True)
    out[0].sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), np.ones((1, 4)))

    def run_fn2(t1, t2):
        return t1

    a = ag.randn(1, 4)
    b = ag.randn(1, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"none of output has requires_grad=True, this checkpoint\(\) "
                                           r"is not necessary"):
        checkpoint(run_fn2, a, b, use_reentrant=True).sum().backward()


def test_reentrant_warns_when_nothing_requires_grad():
    a = ag.randn(3)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = checkpoint(lambda t: t * 2, a, use_reentrant=True)
    assert out.grad_fn is None


def test_closure_parameter_gets_gradient_even_without_grad_inputs():
    m = MLP()
    x = ag.randn(3, 4)
    m(x).sum().backward()
    expected = grads_of(m.params())
    checkpoint(m, x, use_reentrant=True).sum().backward()
    assert_grads_equal(grads_of(m.params()), expected)


@BOTH
def test_non_tensor_inputs_and_outputs(reentrant):
    def foo(t1, t2, scale, t3):
        t4 = t1 + t2 * t3
        t5 = t1 * t2 + t3
        t4 *= scale
        t5 *= scale
        return scale, t4, None, True, t5, "bar", t1

    t1 = ag.rand(10, requires_grad=True)
    t2 = ag.rand(10, requires_grad=True)
    t3 = ag.rand(10)
    scale = 7
    res = checkpoint(foo, t1, t2, scale, t3, use_reentrant=reentrant)
    assert res[0] == scale and res[2] is None and res[3] is True and res[5] == "bar"
    np.testing.assert_allclose(res[1].numpy(), ((t1 + t2 * t3) * scale).numpy())
    np.testing.assert_allclose(res[4].numpy(), ((t1 * t2 + t3) * scale).numpy())
    np.testing.assert_allclose(res[6].numpy(), t1.numpy())

    res[1].sum().backward(retain_graph=True)
    res[4].sum().backward(retain_graph=True)
    res[6].sum().backward()
    if reentrant:  # the checkpoint node itself saved the inputs
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
            res[6].sum().backward()
    got = grads_of([t1, t2])

    res = foo(t1, t2, scale, t3)
    ag.backward_sync([res[1].sum(), res[4].sum(), res[6].sum()])
    assert_grads_equal(grads_of([t1, t2]), got)


@BOTH
def test_checkpoint_sequential_recompute_counts(reentrant):
    counts = [0] * 10
    weights = [ag.randn(4, 4, requires_grad=True) * 0.5 for _ in range(10)]
    weights = [w.detach().requires_grad_() for w in weights]

    def layer(i):
        def f(x):
            counts[i] += 1
            return (x @ weights[i]).tanh()
        return f

    functions = [layer(i) for i in range(10)]
    x = ag.randn(2, 4, requires_grad=True)
    functions_out = x
    for f in functions:
        functions_out = f(functions_out)
    functions_out.sum().backward()
    expected = grads_of([x, *weights])
    counts[:] = [0] * 10

    out = checkpoint_sequential(functions, 2, x, use_reentrant=reentrant)
    out.sum().backward()
    assert counts == [2] * 5 + [1] * 5  # the first segment ran forward twice
    assert_grads_equal(grads_of([x, *weights]), expected)

    class Seq:  # anything with children(), like nn.Sequential
        def children(self):
            return iter(functions)

    counts[:] = [0] * 10
    checkpoint_sequential(Seq(), 5, x, use_reentrant=reentrant).sum().backward()
    assert counts == [2] * 8 + [1] * 2
    assert_grads_equal(grads_of([x, *weights]), expected)


@BOTH
def test_checkpoint_under_no_grad_is_a_plain_call(reentrant):
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    with ag.no_grad():
        y = checkpoint(m, x, use_reentrant=reentrant)
    assert y.grad_fn is None and m.calls == 1


@BOTH
async def test_concurrent_backward_calls(reentrant):
    m = MLP(width=8)
    xs = [ag.randn(5, 8, requires_grad=True) for _ in range(6)]
    for x in xs:
        await ag.backward(m(m(x)).sum())
    expected_x = [x.grad.numpy().copy() for x in xs]
    expected_p = grads_of(m.params())
    for x in xs:
        x.grad = None

    losses = [m(checkpoint(m, x, use_reentrant=reentrant)).sum() for x in xs]
    await asyncio.gather(*(ag.backward(loss) for loss in losses))
    for x, e in zip(xs, expected_x):
        np.testing.assert_allclose(x.grad.numpy(), e, rtol=1e-10)
    for p, e in zip(m.params(), expected_p):
        np.testing.assert_allclose(p.grad.numpy(), e, rtol=1e-10)


@BOTH
async def test_concurrent_backward_on_worker_threads(reentrant):
    """Large enough that the checkpoint's nodes are offloaded to worker threads."""
    w = ag.randn(300, 300, requires_grad=True)

    def fn(t):
        return (t @ w).tanh() @ w

    xs = [ag.randn(300, 300) * 0.05 for _ in range(4)]
    for x in xs:
        await ag.backward(fn(x).sum())
    expected = grads_of([w])[0]
    losses = [checkpoint(fn, x, use_reentrant=reentrant).sum() for x in xs]
    await asyncio.gather(*(ag.backward(loss) for loss in losses))
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-9)


@BOTH
async def test_failed_backward_commits_nothing(reentrant):
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    y = checkpoint(m, x, use_reentrant=reentrant)

    def boom(g):
        raise KeyError("boom")

    handle = x.register_hook(boom)
    with pytest.raises(KeyError):
        await ag.backward(y.sum())
    assert all(p.grad is None for p in m.params())
    handle.remove()
    await ag.backward(y.sum())  # nothing was freed
    assert all(p.grad is not None for p in m.params())


def test_nested_reentrant_checkpoints():
    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    leaves = [x, *m.params()]
    m(m(x)).sum().backward()
    expected = grads_of(leaves)
    y = checkpoint(lambda t: checkpoint(m, m(t), use_reentrant=True), x, use_reentrant=True)
    y.sum().backward()
    assert_grads_equal(grads_of(leaves), expected)


def test_non_reentrant_unpack_errors():
    calls = {"n": 0}

    def fn(t):
        calls["n"] += 1
        return (t * t).exp() if calls["n"] == 1 else t.exp()

    x = ag.randn(3, requires_grad=True)
    y = checkpoint(fn, x, use_reentrant=False)
    with pytest.raises(RuntimeError, match="A different number of tensors was saved"):
        y.sum().backward()


@BOTH
def test_checkpoint_saves_memory(reentrant):
    """Activations of the checkpointed segments are not kept between forward and backward."""
    w = ag.randn(256, 256) * 0.05
    w.requires_grad_()
    layers = [lambda t: (t @ w).tanh() for _ in range(16)]  # 4 segments: keeps 3 + 4 of 16
    x = ag.randn(256, 256, requires_grad=True)

    def peak_after_forward(use_checkpoint):
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            if use_checkpoint:
                out = checkpoint_sequential(layers, 4, x, use_reentrant=reentrant)
            else:
                out = x
                for f in layers:
                    out = f(out)
            kept = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        out.sum().backward()
        return kept

    # what runs once (the compiled kernels' loading, the engine's set-up and worker
    # threads) allocates on other threads, which tracemalloc counts too: done first
    kernels.start()
    kernels.wait(60)
    peak_after_forward(True)
    plain = peak_after_forward(False)
    with_checkpoint = peak_after_forward(True)
    assert with_checkpoint < plain / 2


def test_reentrant_double_backward_with_create_graph():
    x = ag.randn(4, requires_grad=True)
    y = checkpoint(lambda t: (t ** 3).sum(), x, use_reentrant=True)
    with pytest.warns(UserWarning, match="create_graph=True will create a reference cycle"):
        y.backward(create_graph=True)
    g = x.grad
    np.testing.assert_allclose(g.numpy(), 3 * x.numpy() ** 2)
    (gg,) = ag.grad_sync(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), 6 * x.numpy())


@BOTH
def test_closure_nonleaf_and_repeated_inputs(reentrant):
    w = ag.randn(4, requires_grad=True)
    x = ag.randn(4, requires_grad=True)

    def run(use_checkpoint):
        h = w * 2  # a non-leaf from outside the checkpointed function
        fired = []
        h.register_hook(lambda g: fired.append(1))

        def f(a, b):
            return (a * b * h).sin() * h

        y = checkpoint(f, x, x, use_reentrant=reentrant) if use_checkpoint else f(x, x)
        (y.sum() + h.sum()).backward()
        return [*grads_of([w, x]), len(fired)]

    plain, ckpt = run(False), run(True)
    assert_grads_equal(ckpt[:2], plain[:2])
    assert ckpt[2] == plain[2] == 1


@BOTH
def test_checkpoint_inside_saved_tensors_hooks(reentrant):
    packed = []

    def pack(t):
        packed.append(1)
        return t.numpy().copy()

    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    leaves = [x, *m.params()]
    m(x).sum().backward()
    expected = grads_of(leaves)
    with ag.autograd.graph.saved_tensors_hooks(pack, ag.tensor):
        y = checkpoint(m, x * 1, use_reentrant=reentrant)
    y.sum().backward()
    assert_grads_equal(grads_of(leaves), expected)


@BOTH
async def test_cancellation_during_checkpoint_backward(reentrant):
    import anyio

    delay = {"s": 10.0}

    class Sleepy(ag.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        async def backward(ctx, g):
            await anyio.sleep(delay["s"])
            return g * 2

    m = MLP()
    x = ag.randn(3, 4, requires_grad=True)
    for p in m.params():
        p.grad = ag.ones(*p.shape)
    y = checkpoint(lambda t: Sleepy.apply(m(t)), x, use_reentrant=reentrant).sum()
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await ag.backward(y)
    assert x.grad is None
    assert all(np.array_equal(p.grad.numpy(), np.ones(p.shape)) for p in m.params())
    delay["s"] = 0.0
    await ag.backward(y)  # nothing was freed: the same backward runs again
    assert x.grad is not None
    assert not np.array_equal(m.w1.grad.numpy(), np.ones((4, 4)))


@BOTH
def test_under_trio(reentrant):
    import anyio

    w = ag.randn(300, 300, requires_grad=True)  # large: recomputation and kernels on threads
    x = ag.randn(300, 300) * 0.05

    def fn(t):
        return (t @ w).tanh() @ w

    async def main():
        await ag.backward(fn(x).sum())
        expected = grads_of([w])[0]
        await ag.backward(checkpoint(fn, x, use_reentrant=reentrant).sum())
        return expected, grads_of([w])[0]

    expected, got = anyio.run(main, backend="trio")
    np.testing.assert_allclose(got, expected, rtol=1e-10)
