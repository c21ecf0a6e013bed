"""Hooks and the order things run in: tensor hooks, retain_grad, node pre/post-hooks,
post-accumulate-grad hooks, removal, return checks, and the ready-queue order.

Ports the intent of cases 26, 27, 30-43 of
/work/shared/reference/pytorch_engine_semantics.md (sections 3 and 6). One deliberate
difference from PyTorch (API.md §3 "Commit on success"): post-accumulate-grad hooks fire
at commit time, after every node (AccumulateGrad post-hooks included) has run.
"""

import re
import warnings

import numpy as np
import pytest

import asyncgrad as ag


def close(t, expected):
    e = expected.numpy() if isinstance(expected, ag.Tensor) else expected
    np.testing.assert_allclose(t.numpy(), e, rtol=1e-12, atol=1e-12)


def acc_of(leaf, via):
    """The AccumulateGrad node of ``leaf`` as reached from the non-leaf ``via``."""
    for node, _ in via.grad_fn.next_functions:
        if node is not None and getattr(node, "variable", None) is leaf:
            return node
    raise AssertionError("leaf not found among next_functions")


def logger(log, name):
    def hook(*_):
        log.append(name)
    return hook


# --------------------------------------------------------------------------------------
# Ready-queue order
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("a_first", [True, False])
async def test_latest_created_ready_node_runs_first(a_first):
    # case 26 / 3.3: branches a=x*2, b=x*3, c=a.exp(), d=b.sin() run Sin, Exp, Mul3, Mul2;
    # creating b before a swaps the two Muls
    x = ag.randn(3, requires_grad=True)
    if a_first:
        a = x * 2
        b = x * 3
    else:
        b = x * 3
        a = x * 2
    c = a.exp()
    d = b.sin()
    s = (c + d).sum()
    log = []
    for t, name in ((a, "Mul2"), (b, "Mul3"), (c, "Exp"), (d, "Sin")):
        t.grad_fn.register_prehook(logger(log, name))
    acc_of(x, a).register_prehook(logger(log, "x"))
    await ag.backward(s)
    muls = ["Mul3", "Mul2"] if a_first else ["Mul2", "Mul3"]
    assert log == ["Sin", "Exp", *muls, "x"]
    close(x.grad, 2 * np.exp(2 * x.numpy()) + 3 * np.cos(3 * x.numpy()))


async def test_accumulate_grad_runs_as_soon_as_it_is_ready():
    # case 27 / 3.4: ((x*2)*w).exp() -> Exp, Mul(w), w accumulated, Mul(x), x accumulated
    x = ag.randn(3, requires_grad=True)
    w = ag.randn(3, requires_grad=True)
    x2 = x * 2
    xw = x2 * w
    h = xw.exp()
    log = []
    h.grad_fn.register_prehook(logger(log, "Exp"))
    xw.grad_fn.register_prehook(logger(log, "Mul(w)"))
    x2.grad_fn.register_prehook(logger(log, "Mul(x)"))
    acc_of(w, xw).register_prehook(logger(log, "w"))
    acc_of(x, x2).register_prehook(logger(log, "x"))
    await ag.backward(h.sum())
    assert log == ["Exp", "Mul(w)", "w", "Mul(x)", "x"]


async def test_a_node_runs_once_with_all_grads_summed():
    # case 42 / 3.2: a tensor with two consumers: its hook fires once, with the sum
    x = ag.tensor([[1.0, 2.0]], requires_grad=True)
    y = x * 1
    seen = []
    y.register_hook(lambda g: seen.append(g.numpy().copy()))
    await ag.backward((y * 3 + y * 4).sum())
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], [[7.0, 7.0]])


# --------------------------------------------------------------------------------------
# Tensor hooks
# --------------------------------------------------------------------------------------
async def test_tensor_hooks_fire_on_every_backward_and_can_modify():
    # case 30 (test_hooks)
    x = ag.ones(5, 5, requires_grad=True)
    y = (ag.ones(5, 5) * 4).requires_grad_(True)
    counter = [0]

    def bw_hook(inc, grad):
        assert isinstance(grad, ag.Tensor)
        counter[0] += inc

    z = x**2 + x * 2 + x * y + y
    x.register_hook(lambda g: bw_hook(0, g))
    test = z.register_hook(lambda g: bw_hook(1, g))
    go = ag.ones(5, 5)
    await ag.backward(z, go, retain_graph=True)
    assert counter[0] == 1
    test2 = z.register_hook(lambda g: bw_hook(2, g))
    await ag.backward(z, go, retain_graph=True)
    assert counter[0] == 4
    test2.remove()
    test2.remove()  # idempotent
    await ag.backward(z, go, retain_graph=True)
    assert counter[0] == 5

    def bw_hook_modify(grad):
        return grad.mul(2)

    test.remove()
    z.register_hook(bw_hook_modify)
    with ag.no_grad():
        y.grad.zero_()
    await ag.backward(z, go, retain_graph=True)
    close(y.grad, (x.numpy() + 1) * 2)
    y.register_hook(bw_hook_modify)
    with ag.no_grad():
        y.grad.zero_()
    await ag.backward(z, go)
    close(y.grad, (x.numpy() + 1) * 4)
    assert counter[0] == 5


async def test_leaf_tensor_hook_return_is_what_accumulates():
    x = ag.randn(3, requires_grad=True)
    x.register_hook(lambda g: g * 0 + 42)
    await ag.backward((x * 5).sum())
    close(x.grad, [42.0] * 3)


def test_register_hook_requires_grad():
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
        ag.ones(2).register_hook(lambda g: g)


async def test_tensor_hooks_and_inplace():
    # case 39 (test_tensor_hooks_inplace): hooks stay on the node they were registered on
    counts = [0, 0]

    def fn1(grad):
        counts[0] += 1
        close(grad, [4.0])
        return grad * 2

    def fn2(grad):
        counts[1] += 1
        close(grad, [1.0])
        return grad * 2

    a = ag.tensor([1.0], requires_grad=True)
    b = a.clone()
    b.register_hook(fn1)
    b.mul_(2)
    b.register_hook(fn2)
    await ag.backward(b.sum())
    assert counts == [1, 1]
    close(a.grad, [8.0])

    a = ag.tensor([1.0], requires_grad=True)
    b = a.clone()
    b.register_hook(fn1)
    b.mul_(2)
    b.mul_(2)
    await ag.backward(b.sum())
    assert counts == [2, 1]
    close(a.grad, [8.0])


async def test_retain_grad_follows_inplace():
    # case 40 (test_retain_grad_inplace)
    a = ag.tensor([1.0], requires_grad=True).clone()
    a.retain_grad()
    a.mul_(2)
    await ag.backward(a.sum())
    close(a.grad, [1.0])

    a = ag.tensor([1.0], requires_grad=True).clone()
    a.retain_grad()
    a.mul_(2)
    a.mul_(2)
    await ag.backward(a.sum())
    close(a.grad, [1.0])


async def test_hooks_run_with_grad_mode_equal_to_create_graph():
    # 6.8 / 12.3
    x = ag.randn(3, requires_grad=True)
    modes = []
    y = x * x
    y.register_hook(lambda g: modes.append(ag.is_grad_enabled()))
    s = y.sum()
    await ag.backward(s, retain_graph=True)
    with ag.no_grad():
        (g,) = await ag.grad(s, x, create_graph=True)
        assert not ag.is_grad_enabled()
    assert modes == [False, True]
    assert g.requires_grad
    assert ag.is_grad_enabled()


async def test_hooks_receive_none_for_a_dropped_gradient():
    # 4.2 / 4.4 / 6.5: a pre-hook may drop a grad with (None,); nodes below still run and
    # hooks see None; post-accumulate hooks are called with .grad still None
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    y.grad_fn.register_prehook(lambda g: (None,))
    seen = []
    x.register_hook(lambda g: seen.append(("tensor", g)))
    acc_of(x, y).register_prehook(lambda g: seen.append(("pre", g)))
    acc_of(x, y).register_hook(lambda gi, go: seen.append(("post", gi, go)))
    x.register_post_accumulate_grad_hook(lambda t: seen.append(("post_acc", t.grad)))
    await ag.backward(y.sum())
    assert seen == [("tensor", None), ("pre", (None,)), ("post", (), (None,)), ("post_acc", None)]
    assert x.grad is None


# --------------------------------------------------------------------------------------
# Order inside one node, and retain_grad
# --------------------------------------------------------------------------------------
async def test_prehook_ordering():
    # case 31 (test_prehook_ordering)
    log = []

    def hook1(g):
        log.append(1)
        return g * 3

    def hook2(gs):
        log.append(2)
        return tuple(g * 2 for g in gs)

    a = ag.tensor(1.0, requires_grad=True)
    b = a.clone()
    b.grad_fn.register_prehook(hook2)
    b.register_hook(hook1)
    b.grad_fn.register_prehook(hook2)
    acc = b.grad_fn.next_functions[0][0]
    a.register_hook(hook1)
    acc.register_prehook(hook2)
    a.register_hook(hook1)

    await ag.backward(b.sum(), retain_graph=True)
    assert log == [1, 2, 2, 1, 1, 2]
    assert a.grad.item() == 3 * 2 * 2 * 3 * 3 * 2

    # grad() runs the tensor hooks of the input it captures, but not its node's pre-hooks
    log.clear()
    (ga,) = await ag.grad(b.sum(), inputs=(a,), retain_graph=True)
    assert log == [1, 2, 2, 1, 1]
    assert ga.item() == 3 * 2 * 2 * 3 * 3

    log.clear()
    await ag.backward(b.sum(), inputs=(b,))
    assert log == [1, 2, 2]
    # retains-grad hooks run after tensor hooks but before node pre-hooks
    assert b.grad.item() == 3


async def test_one_node_full_order():
    # 6.2: tensor hooks (chained) -> retain_grad -> node pre-hook -> node -> post-hook
    x = ag.tensor([1.0], requires_grad=True)
    y = x * 2
    log = []

    def th1(g):
        log.append(("th1", g.item()))
        return g * 10

    def th2(g):
        log.append(("th2", g.item()))
        return g + 1

    def pre(gs):
        log.append(("pre", gs[0].item()))

    def post(gi, go):
        log.append(("post", gi[0].item(), go[0].item()))

    y.grad_fn.register_hook(post)
    y.grad_fn.register_prehook(pre)
    y.retain_grad()
    y.register_hook(th1)
    y.register_hook(th2)
    await ag.backward(y, ag.tensor([3.0]))
    assert log == [("th1", 3.0), ("th2", 30.0), ("pre", 31.0), ("post", 62.0, 31.0)]
    close(y.grad, [31.0])
    close(x.grad, [62.0])


async def test_retains_grad_can_always_observe_tensor_prehook():
    # case 32
    def tensor_prehook(g):
        return g * 2

    a = ag.tensor(1.0, requires_grad=True)
    b = a.clone()
    b.register_hook(tensor_prehook)
    b.retain_grad()
    b.register_hook(tensor_prehook)
    await ag.backward(b.clone())
    assert b.grad.item() == 4

    a = ag.tensor(1.0, requires_grad=True)
    b = a.clone()
    b.retain_grad()
    b.register_hook(tensor_prehook)
    await ag.backward(b.clone())
    assert b.grad.item() == 2


async def test_accumulate_grad_hooks_order_with_commit():
    # case 33 adapted to API.md §3: tensor hook -> AccumulateGrad pre-hook -> AccumulateGrad
    # post-hook -> (commit) -> post-accumulate-grad hook -> final callbacks
    t = ag.tensor([1.0, 1.0, 1.0], requires_grad=True)
    log = []

    def pre_hook(grad):
        log.append(("tensor", grad.numpy().tolist()))
        return grad.sub(2.0)

    def acc_pre(grad_out):
        log.append(("acc_pre", grad_out[0].numpy().tolist()))
        return (grad_out[0].div(5.0),)

    def post_acc(tensor):
        log.append(("post_acc", tensor.grad.numpy().tolist()))
        ag.autograd.queue_callback(lambda: log.append(("callback", tensor.grad.numpy().tolist())))

    def acc_post(grad_in, grad_out):
        log.append(("acc_post", grad_in, grad_out[0].numpy().tolist(), t.grad))

    v = t * 1
    acc = v.grad_fn.next_functions[0][0]
    t.register_hook(pre_hook)
    acc.register_prehook(acc_pre)
    t.register_post_accumulate_grad_hook(post_acc)
    acc.register_hook(acc_post)
    await ag.backward(v.sum())
    g = [-0.2] * 3
    assert log == [
        ("tensor", [1.0] * 3),
        ("acc_pre", [-1.0] * 3),
        ("acc_post", (), g, None),  # .grad is committed only after every node ran
        ("post_acc", g),
        ("callback", g),
    ]
    close(t.grad, g)


async def test_post_accumulate_grad_hooks_fire_in_ready_order_after_all_nodes():
    x = ag.randn(3, requires_grad=True)
    w = ag.randn(3, requires_grad=True)
    x2 = x * 2
    xw = x2 * w
    log = []
    x.register_post_accumulate_grad_hook(lambda t: log.append(("post_acc", "x", t.grad is not None)))
    w.register_post_accumulate_grad_hook(lambda t: log.append(("post_acc", "w", t.grad is not None)))
    x2.grad_fn.register_prehook(logger(log, "Mul(x)"))
    acc_of(x, x2).register_hook(logger(log, "acc x"))
    await ag.backward(xw.exp().sum())
    assert log == ["Mul(x)", "acc x", ("post_acc", "w", True), ("post_acc", "x", True)]


async def test_post_accumulate_grad_hooks_not_run_by_grad():
    # 2.9
    x = ag.randn(3, requires_grad=True)
    x.register_post_accumulate_grad_hook(lambda t: pytest.fail("must not run"))
    (g,) = await ag.grad((x * 2).sum(), x)
    close(g, [2.0] * 3)


def test_post_accumulate_grad_hook_checks():
    # case 41 (test_post_accumulate_grad_hook_on_non_leaf, _returns_not_None)
    x = ag.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="post accumulate grad hooks cannot be registered on non-leaf tensors"):
        (x * 2).register_post_accumulate_grad_hook(lambda t: None)
    x.register_post_accumulate_grad_hook(lambda t: t)
    with pytest.raises(RuntimeError, match="Tensor post accumulate grad hooks should return None."):
        (x * 2).sum().backward()


async def test_node_post_hook_replaces_grad_inputs():
    # 6.5: (gI[0]*100, gI[1]) -> x.grad == 200
    x = ag.tensor([1.0], requires_grad=True)
    y = ag.tensor([2.0], requires_grad=True)
    z = x * y
    seen = []

    def post(gi, go):
        seen.append((len(gi), len(go)))
        return (gi[0] * 100, gi[1])

    z.grad_fn.register_hook(post)
    await ag.backward(z.sum())
    assert seen == [(2, 1)]
    close(x.grad, [200.0])
    close(y.grad, [1.0])


async def test_node_post_hook_sees_none_for_an_invalid_edge():
    x = ag.randn(2, requires_grad=True)
    c = ag.randn(2)
    z = x * c
    seen = []
    z.grad_fn.register_hook(lambda gi, go: seen.append(gi[1]))
    await ag.backward(z.sum())
    assert seen == [None]


# --------------------------------------------------------------------------------------
# Which hooks run under grad() / inputs=
# --------------------------------------------------------------------------------------
async def test_hook_counts_with_grad_and_inputs():
    # case 35 (test_hook_edge_case_when_called_with_grad)
    a = ag.tensor(1.0, requires_grad=True)
    b = a * 2
    c = b * 2
    counts = {"tensor": 0, "pre": 0, "post": 0}

    def bump(kind):
        def hook(*_):
            counts[kind] += 1
        return hook

    a.register_hook(bump("tensor"))
    b.register_hook(bump("tensor"))
    acc = b.grad_fn.next_functions[0][0]
    acc.register_hook(bump("post"))
    acc.register_prehook(bump("pre"))
    b.grad_fn.register_hook(bump("post"))
    b.grad_fn.register_prehook(bump("pre"))

    async def run(coro):
        for k in counts:
            counts[k] = 0
        await coro
        return counts["tensor"], counts["pre"], counts["post"]

    assert await run(ag.grad(c, inputs=(b,), retain_graph=True)) == (1, 0, 0)
    assert await run(ag.grad(c, inputs=(a, b), retain_graph=True)) == (2, 1, 1)
    assert await run(ag.backward(c, retain_graph=True)) == (2, 2, 2)
    assert await run(ag.backward(c, inputs=(a, b), retain_graph=True)) == (2, 2, 2)


async def test_hooks_of_unrequested_leaves_do_not_run():
    # case 36 (test_accumulate_grad_posthooks_should_not_execute)
    def boom(*_):
        raise RuntimeError("must not run")

    a = ag.tensor(1.0, requires_grad=True)
    a.register_hook(boom)
    b = ag.tensor(1.0, requires_grad=True)
    c = a.clone()
    c.grad_fn.next_functions[0][0].register_hook(boom)
    a.register_post_accumulate_grad_hook(boom)
    out = a + b + c
    await ag.backward(out.sum(), inputs=[b])
    assert b.grad.item() == 1
    assert a.grad is None


# --------------------------------------------------------------------------------------
# Node pre-hooks: chaining and removal
# --------------------------------------------------------------------------------------
async def test_grad_fn_prehooks_chain():
    # case 37 (test_grad_fn_prehooks)
    a = ag.tensor([1.0], requires_grad=True)
    b = a * 2
    post_counter = [0]
    pre_counter = [0]

    def posthook(grad_input, grad_output):
        assert pre_counter[0] == 3
        close(grad_output[0], [8.0])
        close(grad_input[0], [16.0])
        post_counter[0] += 1
        return grad_input

    def prehook(grad_output):
        pre_counter[0] += 1
        return (grad_output[0] * 2,)

    b.grad_fn.register_hook(posthook)
    b.grad_fn.register_hook(posthook)
    b.grad_fn.register_prehook(prehook)
    b.grad_fn.register_prehook(lambda g: None)
    b.grad_fn.register_prehook(prehook)
    b.grad_fn.register_prehook(prehook)
    b.grad_fn.register_prehook(lambda g: g)
    b.grad_fn.register_prehook(lambda g: None)
    await ag.backward(b.sum())
    assert post_counter[0] == 2
    assert pre_counter[0] == 3
    close(a.grad, [16.0])

    a = ag.rand(3, 3, requires_grad=True)
    b = a * 2

    def prehook_none(grad_output):
        pre_counter[0] += 1
        return None

    b.grad_fn.register_prehook(prehook_none)
    await ag.backward(b.sum())
    assert pre_counter[0] == 4
    close(a.grad, np.full((3, 3), 2.0))


async def test_grad_fn_prehooks_remove_hooks():
    # case 38 (test_grad_fn_prehooks_remove_hooks)
    a = ag.rand(3, 3, requires_grad=True)
    b = a * 2
    counter = [0]

    def prehook(grad_output):
        counter[0] += 1

    handle = b.grad_fn.register_prehook(prehook)
    b.grad_fn.register_prehook(prehook)
    handle.remove()
    await ag.backward(b.sum(), retain_graph=True)
    close(a.grad, np.full((3, 3), 2.0))
    assert counter[0] == 1

    # removed by an earlier hook of the same node during the pass: still runs this pass
    a = ag.rand(3, 3, requires_grad=True)
    b = a * 2
    counter = [0]

    def prehook1(grad_output):
        handle2.remove()
        handle3.remove()  # removing a removed hook is fine

    def prehook2(grad_output):
        counter[0] += 1

    b.grad_fn.register_prehook(prehook1)
    handle2 = b.grad_fn.register_prehook(prehook2)
    handle3 = b.grad_fn.register_prehook(prehook2)
    handle3.remove()
    await ag.backward(b.sum(), retain_graph=True)
    close(a.grad, np.full((3, 3), 2.0))
    assert counter[0] == 1
    await ag.backward(b.sum())  # takes effect on the next pass
    assert counter[0] == 1


async def test_tensor_hook_removed_by_an_earlier_hook_still_runs_this_pass():
    x = ag.randn(2, requires_grad=True)
    y = x * 2
    log = []

    def first(g):
        log.append("first")
        h2.remove()

    y.register_hook(first)
    h2 = y.register_hook(lambda g: log.append("second"))
    await ag.backward(y.sum(), retain_graph=True)
    assert log == ["first", "second"]
    await ag.backward(y.sum())
    assert log == ["first", "second", "first"]


async def test_removable_handle_as_context_manager():
    x = ag.randn(2, requires_grad=True)
    calls = []
    with x.register_hook(lambda g: calls.append(1)):
        await ag.backward((x * 2).sum())
    await ag.backward((x * 2).sum())
    assert calls == [1]


# --------------------------------------------------------------------------------------
# Hook return checks (PyTorch's texts)
# --------------------------------------------------------------------------------------
async def test_tensor_hook_changing_the_size():
    # case 43
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: ag.ones(4))
    with pytest.raises(RuntimeError, match=re.escape("hook '<lambda>' has changed the size of value")):
        await ag.backward(y.sum())
    assert x.grad is None


async def test_tensor_hook_changing_the_type():
    x = ag.randn(3, requires_grad=True)
    y = x * 2

    def to32(g):
        return g.to(ag.float32)

    y.register_hook(to32)
    with pytest.raises(RuntimeError, match="hook 'to32' has changed the type of value"):
        await ag.backward(y.sum())


async def test_hook_returning_a_non_tensor():
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: 1)
    with pytest.raises(TypeError, match="expected Variable, but hook returned 'int'"):
        await ag.backward(y.sum())


async def test_prehook_returning_the_wrong_number_of_values():
    x = ag.randn(3, requires_grad=True)
    z = x * ag.randn(3, requires_grad=True)

    def two(gi, go):
        return (gi[0],)

    z.grad_fn.register_hook(two)
    msg = "hook 'two' has returned an incorrect number of values (got 1, but expected 2)"
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        await ag.backward(z.sum())

    y = x * 2

    def pre(go):
        return (go[0], go[0])

    y.grad_fn.register_prehook(pre)
    with pytest.raises(RuntimeError, match=re.escape("(got 2, but expected 1)")):
        await ag.backward(y.sum())


async def test_hook_cannot_replace_a_none_gradient():
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    y.grad_fn.register_prehook(lambda g: (None,))
    y.grad_fn.next_functions[0][0].register_prehook(lambda g: (ag.ones(3),))
    with pytest.raises(RuntimeError, match="can't replace a None gradient with a non-None value"):
        await ag.backward(y.sum())
    assert x.grad is None


async def test_hook_exception_propagates_with_its_type_and_commits_nothing():
    x = ag.randn(3, requires_grad=True)
    w = ag.randn(3, requires_grad=True)
    y = (x * w).sum()
    await ag.backward(y, retain_graph=True)
    before = x.grad.numpy().copy()

    class Boom(Exception):
        pass

    def hook(g):
        raise Boom("hook failed")

    h = x.register_hook(hook)
    with pytest.raises(Boom, match="hook failed"):
        await ag.backward(y, retain_graph=True)
    close(x.grad, before)
    close(w.grad, x.numpy())
    h.remove()
    await ag.backward(y)
    close(x.grad, 2 * before)


# --------------------------------------------------------------------------------------
# Differential: the whole hook sequence against PyTorch (case 34's intent)
# --------------------------------------------------------------------------------------
def _summary(g):
    return None if g is None else round(float(g.sum()), 8)


def _instrument(named, leaves, log, modify=False):
    """Hooks on every tensor, node and AccumulateGrad; each logs (kind, label, values).
    With ``modify``, tensor hooks double and node pre-hooks halve what flows on."""
    def tensor_hook(label):
        def hook(g):
            log.append(("tensor", label, _summary(g)))
            return g * 2 if modify and g is not None else None
        return hook

    def pre(label):
        def hook(gs):
            log.append(("pre", label, tuple(_summary(g) for g in gs)))
            return tuple(None if g is None else g * 0.5 for g in gs) if modify else None
        return hook

    def post(label):
        return lambda gi, go: log.append(("post", label, tuple(_summary(g) for g in gi),
                                          tuple(_summary(g) for g in go)))

    def post_acc(label):
        return lambda t: log.append(("post_acc", label, _summary(t.grad)))

    accs = {}
    for t in named.values():
        for node, _ in t.grad_fn.next_functions:
            var = getattr(node, "variable", None)
            if var is not None:
                accs[id(var)] = node
    for label, t in named.items():
        t.register_hook(tensor_hook(label))
        t.grad_fn.register_prehook(pre(label))
        t.grad_fn.register_hook(post(label))
    for label, t in leaves.items():
        t.register_hook(tensor_hook(label))
        acc = accs[id(t)]
        acc.register_prehook(pre(label))
        acc.register_hook(post(label))
        t.register_post_accumulate_grad_hook(post_acc(label))


def _graph_linear(lib, data):
    x = lib.tensor(data["x"], requires_grad=True)
    w = lib.tensor(data["w"], requires_grad=True)
    b = lib.tensor(data["b"], requires_grad=True)
    wt = w.T
    mm = x @ wt
    pre = mm + b
    act = pre.relu()
    loss = act.sum()
    return {"wt": wt, "mm": mm, "pre": pre, "act": act, "loss": loss}, {"x": x, "w": w, "b": b}, [loss]


def _graph_diamond(lib, data):
    x = lib.tensor(data["x"], requires_grad=True)
    w = lib.tensor(data["w"][0], requires_grad=True)
    y = x * w
    e = y.exp()
    s = y.sin()
    sw = s * w
    z = e + sw
    loss = z.sum()
    return {"y": y, "e": e, "s": s, "sw": sw, "z": z, "loss": loss}, {"x": x, "w": w}, [loss]


def _graph_two_roots(lib, data):
    x = lib.tensor(data["x"], requires_grad=True)
    w = lib.tensor(data["w"][0], requires_grad=True)
    q = x * 2
    qw = q * w
    a = qw.sum()
    c = q.cos()
    cc = c * c
    b = cc.sum()
    return {"q": q, "qw": qw, "a": a, "c": c, "cc": cc, "b": b}, {"x": x, "w": w}, [a, b]


def _graph_constant_operand(lib, data):
    x = lib.tensor(data["x"], requires_grad=True)
    c = lib.tensor(data["w"][0])  # no grad: an invalid edge
    y = x * c
    t = y.tanh()
    r = t * y
    loss = r.sum()
    return {"y": y, "t": t, "r": r, "loss": loss}, {"x": x}, [loss]


def _pytorch_log_under_commit(log):
    """PyTorch's order with post-accumulate-grad hooks moved to commit time (API.md §3)."""
    return [e for e in log if e[0] != "post_acc"] + [e for e in log if e[0] == "post_acc"]


@pytest.mark.parametrize("graph", [_graph_linear, _graph_diamond, _graph_two_roots, _graph_constant_operand])
@pytest.mark.parametrize("mode", ["backward", "backward_inputs", "grad", "modify", "create_graph", "retain"])
async def test_hook_sequence_matches_pytorch(graph, mode):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    data = {"x": rng.standard_normal((2, 3)), "w": rng.standard_normal((4, 3)) if graph is _graph_linear
            else rng.standard_normal((1, 3)), "b": rng.standard_normal(4)}
    if graph is not _graph_linear:
        data["w"] = data["w"].reshape(1, 3)

    def run(lib):
        named, leaves, roots = graph(lib, data)
        log = []
        _instrument(named, leaves, log, modify=mode in ("modify", "retain"))
        if mode == "retain":
            for t in named.values():
                t.retain_grad()
        first = next(iter(leaves.values()))
        return named, leaves, roots, first, log

    named, leaves, roots, first, tlog = run(torch)
    if mode in ("backward", "modify", "retain"):
        torch.autograd.backward(roots)
    elif mode == "create_graph":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.autograd.backward(roots, create_graph=True)
    elif mode == "backward_inputs":
        torch.autograd.backward(roots, inputs=[first])
    else:
        tres = torch.autograd.grad(roots, list(leaves.values()))
    expected = _pytorch_log_under_commit(tlog)
    tgrads = {k: None if v.grad is None else v.grad.detach().numpy().copy() for k, v in leaves.items()}

    tnamed = {k: v.grad.numpy().copy() for k, v in named.items()} if mode == "retain" else {}

    named, leaves, roots, first, alog = run(ag)
    if mode in ("backward", "modify", "retain"):
        await ag.backward(roots)
    elif mode == "create_graph":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            await ag.backward(roots, create_graph=True)
    elif mode == "backward_inputs":
        await ag.backward(roots, inputs=[first])
    else:
        ares = await ag.grad(roots, list(leaves.values()))
        for t, a in zip(tres, ares):
            np.testing.assert_allclose(a.numpy(), t.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert alog == expected
    for k, g in tnamed.items():
        np.testing.assert_allclose(named[k].grad.numpy(), g, rtol=1e-10, atol=1e-12)
    for k, v in leaves.items():
        if tgrads[k] is None:
            assert v.grad is None
        else:
            np.testing.assert_allclose(v.grad.numpy(), tgrads[k], rtol=1e-10, atol=1e-12)


_UNARY = ("sin", "tanh", "cos")
_BINARY = ("mul", "add", "sub")


def _random_spec(rng):
    nleaves = int(rng.integers(1, 4))
    ops, n = [], nleaves + 1  # leaves, then one constant, then the results so far
    for _ in range(int(rng.integers(2, 9))):
        op = str(rng.choice(_UNARY + _BINARY))
        ops.append((op, int(rng.integers(0, n)), int(rng.integers(0, n))))
        n += 1
    return nleaves, ops


def _random_graph(lib, nleaves, ops, data):
    leaves = {f"L{i}": lib.tensor(data[i], requires_grad=True) for i in range(nleaves)}
    pool = [*leaves.values(), lib.tensor(data[-1])]
    named = {}
    for i, (op, a, b) in enumerate(ops):
        x, y = pool[a], pool[b]
        t = getattr(x, op)() if op in _UNARY else {"mul": x * y, "add": x + y, "sub": x - y}[op]
        if not t.requires_grad:
            t = t + leaves["L0"]
        named[f"N{i}"] = t
        pool.append(t)
    return leaves, named


def _run_random(lib, nleaves, ops, data, mode, modify, roots_idx, input_idx, backward, grad):
    leaves, named = _random_graph(lib, nleaves, ops, data)
    used = {id(getattr(node, "variable", None)) for t in named.values() for node, _ in t.grad_fn.next_functions}
    log = []
    _instrument(named, {k: v for k, v in leaves.items() if id(v) in used}, log, modify=modify)
    nodes = list(named.values())
    roots = [nodes[i].sum() for i in roots_idx]
    every = [*leaves.values(), *nodes]
    inputs = [every[i] for i in input_idx]
    result = None
    if mode == "backward":
        backward(roots)
    elif mode == "inputs":
        backward(roots, inputs=inputs)
    else:
        result = grad(roots, inputs, allow_unused=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        grads = [None if t.grad is None else np.array(t.grad.detach().numpy()) for t in every]
    if result is not None:
        result = [None if r is None else np.array(r.detach().numpy()) for r in result]
    return log, grads, result


def _same_arrays(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(y, x, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_match_pytorch(seed):
    """Random DAGs of small ops, every tensor/node/AccumulateGrad hooked: the hook
    sequence, the values hooks see, .grad and grad() results all match PyTorch (with
    post-accumulate-grad hooks moved to commit time)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    nleaves, ops = _random_spec(rng)
    data = [rng.standard_normal(3) for _ in range(nleaves + 1)]
    roots_idx = sorted({int(i) for i in rng.integers(0, len(ops), size=int(rng.integers(1, 3)))})
    input_idx = sorted({int(i) for i in rng.integers(0, nleaves + len(ops), size=int(rng.integers(1, 4)))})
    # modify=True with grad(): PyTorch captures a needed non-leaf input *before* its tensor
    # hooks (and an unneeded one after); asyncgrad always captures after them (2.7).
    runs = [(m, False) for m in ("backward", "inputs", "grad")] + [("backward", True), ("inputs", True)]
    for mode, modify in runs:
        args = (nleaves, ops, data, mode, modify, roots_idx, input_idx)
        tlog, tgrads, tres = _run_random(torch, *args, torch.autograd.backward, torch.autograd.grad)
        alog, agrads, ares = _run_random(ag, *args, ag.backward_sync, ag.grad_sync)
        assert alog == _pytorch_log_under_commit(tlog), (mode, modify)
        _same_arrays(tgrads, agrads)
        if tres is not None:
            _same_arrays(tres, ares)


async def test_grad_captures_after_tensor_hooks_even_when_the_node_runs():
    """2.7: the captured value is taken after tensor hooks. (PyTorch 2.13 does that only
    when the captured node is not otherwise executed; asyncgrad is consistent.)"""
    x = ag.tensor([1.0], requires_grad=True)
    y = x * 2
    z = y * 3
    y.register_hook(lambda g: g * 2)
    gy, gx = await ag.grad(z.sum(), [y, x], retain_graph=True)
    assert gy.item() == 6.0 and gx.item() == 12.0
    (gy,) = await ag.grad(z.sum(), [y])
    assert gy.item() == 6.0


@pytest.fixture
def offload_everything():
    """Every kernel goes to a worker thread (inline_threshold=0)."""
    previous = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=0, max_workers=2))
    yield
    ag.autograd.set_engine(previous)


async def test_offloaded_kernels_keep_start_order_and_hooks_on_the_loop(offload_everything):
    """API.md §5 / porting notes: ready nodes *start* in priority order even when their
    kernels run on worker threads; every hook runs on the thread driving the backward."""
    import threading

    loop_thread = threading.get_ident()
    x = ag.randn(3, requires_grad=True)
    a = x * 2
    b = x * 3
    c = a.exp()
    d = b.sin()
    s = (c + d).sum()
    log, threads = [], set()

    def pre(name):
        def hook(gs):
            log.append(name)
            threads.add(threading.get_ident())
        return hook

    def post(gi, go):
        threads.add(threading.get_ident())

    for t, name in ((a, "Mul2"), (b, "Mul3"), (c, "Exp"), (d, "Sin")):
        t.grad_fn.register_prehook(pre(name))
        t.grad_fn.register_hook(post)
    x.register_hook(lambda g: threads.add(threading.get_ident()))
    x.register_post_accumulate_grad_hook(lambda t: threads.add(threading.get_ident()))
    await ag.backward(s)
    assert log[:2] == ["Sin", "Exp"]
    assert sorted(log[2:]) == ["Mul2", "Mul3"]
    assert threads == {loop_thread}
    close(x.grad, 2 * np.exp(2 * x.numpy()) + 3 * np.cos(3 * x.numpy()))
    assert ag.autograd.get_engine().statistics().nodes_offloaded > 0
