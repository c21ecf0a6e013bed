"""``backward`` / ``grad`` / their sync forms: roots, argument errors, pruning, ``inputs=``,
``.grad`` accumulation, retain_graph, create_graph, callbacks and graph-task ids.

Ports the intent of cases 5-25, 29, 45-48, 50, 55-57 of
/work/shared/reference/pytorch_engine_semantics.md; API.md §3 and §5.
"""

import asyncio
import re
import warnings

import numpy as np
import pytest

import asyncgrad as ag


def close(t, expected):
    e = expected.numpy() if isinstance(expected, ag.Tensor) else expected
    np.testing.assert_allclose(t.numpy(), e, rtol=1e-12, atol=1e-12)


def never(*_):
    raise AssertionError("this hook must not run")


# --------------------------------------------------------------------------------------
# Roots
# --------------------------------------------------------------------------------------
async def test_multi_backward_with_a_shared_subgraph():
    # case 5 (test_multi_backward)
    x, y, q, a, b = (ag.randn(5, 5, requires_grad=True) for _ in range(5))
    q2 = q * 2
    z = x + y + q2
    c = a * b + q2
    gz, gc = ag.randn(5, 5), ag.randn(5, 5)
    await ag.backward([z, c], [gz, gc])
    close(x.grad, gz)
    close(y.grad, gz)
    close(a.grad, gc.numpy() * b.numpy())
    close(b.grad, gc.numpy() * a.numpy())
    close(q.grad, (gc.numpy() + gz.numpy()) * 2)


async def test_duplicate_roots_add_up():
    # case 6 (test_duplicate_backward_root) and 1.8 (`backward([y, y], [1, 1])` -> 4)
    a = ag.randn(5, 6, requires_grad=True)
    b = ag.randn(5, 6, requires_grad=True)
    x = a * b
    g = ag.randn(5, 6)
    await ag.backward([x, x], [g, g])
    close(a.grad, b.numpy() * g.numpy() * 2)
    close(b.grad, a.numpy() * g.numpy() * 2)

    x = ag.tensor(1.5, requires_grad=True)
    y = x * 2
    await ag.backward([y, y], [ag.tensor(1.0), ag.tensor(1.0)])
    assert x.grad.item() == 4.0


async def test_duplicate_leaf_roots():
    x = ag.randn(3, requires_grad=True)
    g = ag.ones(3)
    await ag.backward([x, x], [g, g])
    close(x.grad, [2.0] * 3)
    close(g, [1.0] * 3)
    (gx,) = await ag.grad([x, x], x, [g, g])
    close(gx, [2.0] * 3)


async def test_dependent_roots():
    # case 7 (test_dependent_backward): y = x**2, z = y**3 as roots together
    x = ag.randn(10, requires_grad=True)
    y = x**2
    z = y**3
    gy, gz = ag.randn(10), ag.randn(10)
    await ag.backward([y, z], [gy, gz])
    xd = x.numpy()
    np.testing.assert_allclose(x.grad.numpy(), 2 * xd * gy.numpy() + 6 * xd**5 * gz.numpy(), rtol=1e-10)


async def test_backward_on_a_leaf_copies_the_gradient():
    # case 8 (test_backward): v.backward(g) -> v.grad == g, but never the same object
    v = ag.randn(5, 5, requires_grad=True)
    g = ag.randn(5, 5)
    await ag.backward(v, g)
    close(v.grad, g)
    assert v.grad is not g
    assert not np.shares_memory(v.grad.numpy(), g.numpy())
    v.grad.data += 1  # the user's tensor is independent of .grad
    close(v.grad, g.numpy() + 1)


async def test_backward_on_a_leaf_with_create_graph_does_not_alias_the_gradient():
    v = ag.randn(3, requires_grad=True)
    g = ag.randn(3)
    with pytest.warns(UserWarning, match="create_graph=True will create a reference cycle"):
        await ag.backward(v, g, create_graph=True)
    close(v.grad, g)
    assert v.grad is not g
    assert not np.shares_memory(v.grad.numpy(), g.numpy())


async def test_create_graph_grads_of_two_leaves_are_distinct_objects():
    # x + w routes the same gradient to both leaves; their .grad must not be one object,
    # or a later in-place accumulation would count twice (PyTorch clones in AccumulateGrad).
    x = ag.randn(3, requires_grad=True)
    w = ag.randn(3, requires_grad=True)
    g = ag.ones(3)
    with pytest.warns(UserWarning):
        await ag.backward(x + w, g, create_graph=True)
    assert x.grad is not w.grad
    assert x.grad is not g
    await ag.backward(x + w, g)
    close(x.grad, [2.0, 2.0, 2.0])
    close(w.grad, [2.0, 2.0, 2.0])
    close(g, [1.0, 1.0, 1.0])


# --------------------------------------------------------------------------------------
# Argument errors (PyTorch's texts)
# --------------------------------------------------------------------------------------
async def test_root_that_does_not_require_grad():
    # case 9 (test_multi_backward_no_grad) and case 10 (test_backward_badcalls)
    x = ag.randn(3, requires_grad=True)
    z = x * 2
    q = ag.randn(3)
    msg = "element 1 of tensors does not require grad and does not have a grad_fn"
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        await ag.backward([z, q], [ag.ones(3), ag.ones(3)])
    assert x.grad is None
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        await ag.backward(ag.ones(1))


async def test_implicit_grad_only_for_scalars():
    # case 11
    x = ag.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        await ag.backward(x * 2)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        await ag.grad(x * 2, x)
    # a one-element non-0-d output is fine
    await ag.backward((x * 2)[:1])
    close(x.grad, [2.0, 0.0, 0.0])


async def test_root_grad_shape_must_match_exactly():
    # case 12 (test_grad): no broadcasting of root grads
    x = ag.randn(2, requires_grad=True)
    y = x * 2
    msg = ("Mismatch in shape: grad_output[0] has a shape of [3] and output[0] has a shape of [2].")
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        await ag.backward(y, ag.ones(3))
    with pytest.raises(RuntimeError, match=re.escape("grad_output[0] has a shape of [1, 2]")):
        await ag.backward(y, ag.ones(1, 2))
    with pytest.raises(RuntimeError, match="Mismatch in shape: grad_output\\[1\\]"):
        await ag.grad([y, y], x, [ag.ones(2), ag.ones(3)])
    assert x.grad is None


async def test_root_grad_type_and_dtype():
    x = ag.randn(2, requires_grad=True)
    with pytest.raises(TypeError, match="gradients can be either Tensors or None, but got int"):
        await ag.backward([x * 2], [1])
    # other real dtypes are cast to the output's dtype
    await ag.backward(x * 2, ag.tensor([1.0, 1.0], dtype=ag.float32))
    assert x.grad.dtype == np.float64
    close(x.grad, [2.0, 2.0])


async def test_empty_inputs_are_rejected():
    x = ag.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=re.escape("`inputs` argument to `backward()` cannot be empty.")):
        await ag.backward((x * 2).sum(), inputs=[])
    with pytest.raises(RuntimeError, match=re.escape("`inputs` argument to `grad()` cannot be empty.")):
        await ag.grad((x * 2).sum(), [])


async def test_grad_badcalls():
    # case 19 (test_grad_badcalls)
    x = ag.ones(1)
    y = x**2
    with pytest.raises(RuntimeError, match="does not require grad"):
        await ag.grad(x, y)
    with pytest.raises(RuntimeError, match="does not require grad"):
        await ag.grad(y, x)
    x = ag.ones(1, requires_grad=True)
    c = ag.ones(1)
    y = x**2
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not require grad"):
        await ag.grad(y.sum(), [x, c])
    (gx,) = await ag.grad(y.sum(), x)
    close(gx, [2.0])


# --------------------------------------------------------------------------------------
# grad(): unused inputs, materialize_grads, repeated inputs/outputs, never touches .grad
# --------------------------------------------------------------------------------------
async def test_grad_unreachable_inputs():
    # case 15 (test_grad_unreachable)
    x = ag.ones(1, requires_grad=True)
    y = ag.ones(1, requires_grad=True)
    z = x * 2  # noqa: F841  (x and y have grad accumulators)
    w = y * 2  # noqa: F841
    gx, gy = await ag.grad(x * 2, [x, y], allow_unused=True)
    close(gx, [2.0])
    assert gy is None
    fresh = ag.ones(1, requires_grad=True)  # no accumulator at all
    gx, gf = await ag.grad(x * 2, [x, fresh], allow_unused=True)
    close(gx, [2.0])
    assert gf is None
    msg = ("The differentiated Tensor at index 1 appears to not have been used in the graph. "
           "Set allow_unused=True if this is the desired behavior.")
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        await ag.grad(x * 2, [x, y], allow_unused=False)
    with pytest.raises(RuntimeError, match="Set allow_unused=True"):
        await ag.grad(x * 2, [x, y])


async def test_grad_materialize_grads():
    # case 18 (test_grad_materialize_grads)
    x = ag.tensor(0.5, requires_grad=True)
    a = ag.tensor(1.0, requires_grad=True)
    y = x * a
    dydx = await ag.grad(y, x, create_graph=True)
    (none,) = await ag.grad(dydx, x, create_graph=True, allow_unused=True)
    (d2,) = await ag.grad(dydx, x, create_graph=True, allow_unused=True, materialize_grads=True)
    (d3,) = await ag.grad(d2, x, materialize_grads=True)  # allow_unused implied
    assert none is None
    assert d2.item() == 0 and d2.shape == x.shape and d2.requires_grad
    assert d3.item() == 0
    msg = ("Expected allow_unused to be True or not passed when materialize_grads=True, "
           "but got: allow_unused=False.")
    with pytest.raises(ValueError, match=re.escape(msg)):
        await ag.grad(y, x, allow_unused=False, materialize_grads=True)


async def test_grad_repeated_inputs_and_outputs():
    # 2.11: a repeated input gets the same value at each position; repeated outputs add up
    x = ag.randn(3, requires_grad=True)
    y = (x * 3).sum()
    g1, g2 = await ag.grad(y, [x, x], retain_graph=True)
    close(g1, [3.0] * 3)
    close(g2, [3.0] * 3)
    (g,) = await ag.grad([y, y], x)
    close(g, [6.0] * 3)


async def test_grad_never_touches_dot_grad():
    # case 20 (test_grad_nonleaf) + 2.9
    x_init = ag.randn(2, 2, requires_grad=True)
    x = x_init
    y = ag.randn(2, 2, requires_grad=True)
    go = ag.ones(2, 2)

    def fn(x):
        return x**2 + y * x + y**2

    for _ in range(5):
        (gx,) = await ag.grad(fn(x), x, grad_outputs=go, create_graph=True)
        close(gx, 2 * x.numpy() + y.numpy())
        assert y.grad is None
        assert x_init.grad is None
        x = x + 0.05 * gx
    assert fn(x).sum().item() > fn(x_init).sum().item()
    await ag.backward(fn(x), go)
    assert y.grad is not None and x_init.grad is not None

    # an existing .grad is left exactly as it was, object and values
    before = x_init.grad
    saved = before.numpy().copy()
    await ag.grad(fn(x_init).sum(), [x_init, y])
    assert x_init.grad is before
    close(x_init.grad, saved)


async def test_grad_leaves_retained_grads_alone():
    # API.md §3: grad() "leaves every .grad alone" -- also a non-leaf that retain_grad()s
    # (PyTorch would fill it in here; asyncgrad's contract does not)
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    (gx,) = await ag.grad((y * y).sum(), x)
    close(gx, 8 * x.numpy())
    assert y.grad is None
    assert x.grad is None


async def test_grad_of_chunks_does_not_reach_the_base():
    # case 17 (test_grad_nonleaf_many_outputs)
    x = ag.randn(4, 2, requires_grad=True)
    a, b = x[:2], x[2:]
    x.register_hook(never)
    go = ag.randn(2, 2)
    ga, gb = await ag.grad(a + 2 * b, [a, b], grad_outputs=go, create_graph=True)
    close(ga, go)
    close(gb, go.numpy() * 2)
    assert x.grad is None


# --------------------------------------------------------------------------------------
# Pruning: nodes not on the path to the requested inputs never run
# --------------------------------------------------------------------------------------
async def test_nodes_off_the_path_never_run():
    # case 16 (test_grad_unreachable_discovery), with a raising pre-hook as the canary
    x = ag.randn(1, requires_grad=True)
    h = (x * 2).exp()
    h.grad_fn.register_prehook(never)
    h.grad_fn.next_functions[0][0].register_prehook(never)
    y = ag.randn(1, requires_grad=True)
    (gy,) = await ag.grad(h, (y,), allow_unused=True)
    assert gy is None

    z = ag.randn(1, requires_grad=True)
    gy, gz = await ag.grad(h + z, (y, z), allow_unused=True)
    assert gy is None
    close(gz, [1.0])

    await ag.backward(h, inputs=(y,))  # allow_unused is implicitly True
    assert y.grad is None
    assert x.grad is None

    w = ag.randn(1, requires_grad=True)
    await ag.backward(h + w * 3, inputs=[w])
    close(w.grad, [3.0])
    assert x.grad is None


async def test_grad_captures_a_non_leaf_without_running_its_node():
    # 2.6: grad(l, y) does not run y.grad_fn (its pre-hook does not fire)
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    y.grad_fn.register_prehook(never)
    out = (y * y).sum()
    (gy,) = await ag.grad(out, y)
    close(gy, 2 * y.numpy())
    assert x.grad is None


# --------------------------------------------------------------------------------------
# backward(inputs=...)
# --------------------------------------------------------------------------------------
async def test_backward_with_inputs():
    # case 13 (test_backward_with_inputs)
    x = ag.randn(2, 2, requires_grad=True)
    y = ag.randn(2, 2, requires_grad=True)

    def fn():
        return x**2 + y * x + y**2

    go = ag.ones(2, 2)
    xe = 2 * x.numpy() + y.numpy()
    ye = x.numpy() + 2 * y.numpy()

    def reset():
        with ag.no_grad():
            x.grad.zero_()
            y.grad.zero_()

    await ag.backward(fn(), go, inputs=[x, y])
    close(x.grad, xe)
    close(y.grad, ye)
    reset()
    await ag.backward(fn(), go, inputs=[x])
    close(x.grad, xe)
    close(y.grad, np.zeros((2, 2)))
    reset()
    await ag.backward(fn(), go, inputs=[y])
    close(y.grad, ye)
    close(x.grad, np.zeros((2, 2)))
    reset()
    await ag.backward(fn(), go, inputs=y)  # a single tensor
    close(y.grad, ye)
    close(x.grad, np.zeros((2, 2)))
    with pytest.raises(RuntimeError, match="cannot be empty"):
        await ag.backward(fn(), go, inputs=[])


async def test_backward_with_nonleaf_inputs():
    # case 14 (test_backward_with_nonleaf_inputs) + 2.4
    x = ag.randn(2, 2, requires_grad=True)
    xn = x * 1
    y = ag.randn(2, 2, requires_grad=True)
    z = ag.randn(2, 2, requires_grad=True)
    out = xn**2 + y * xn + y**2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        await ag.backward(out, ag.ones(2, 2), create_graph=True, inputs=[x, y, xn])
    close(y.grad, x.numpy() + 2 * y.numpy())
    close(x.grad, 2 * x.numpy() + y.numpy())
    close(xn.grad, 2 * xn.numpy() + y.numpy())
    assert xn.retains_grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        await ag.backward(out, ag.ones(2, 2), create_graph=True, inputs=[z])
    assert z.grad is None


async def test_backward_with_a_nonleaf_input_stops_at_it():
    # 2.6: backward(inputs=[y]) runs y's node but not its children
    x = ag.randn(3, requires_grad=True)
    y = x.exp()
    ran = []
    y.grad_fn.register_prehook(lambda g: ran.append("exp"))
    out = (y * 3).sum()
    await ag.backward(out, inputs=[y])
    assert ran == ["exp"]
    close(y.grad, [3.0] * 3)
    assert x.grad is None


async def test_backward_inputs_must_require_grad():
    x = ag.randn(2, requires_grad=True)
    c = ag.randn(2)
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has requires_grad=False"):
        await ag.backward((x * c).sum(), inputs=[x, c])


# --------------------------------------------------------------------------------------
# .grad accumulation
# --------------------------------------------------------------------------------------
async def test_retain_grad_accumulates_across_calls():
    # case 21 (test_retain_grad)
    inp = ag.rand(1, 3, requires_grad=True)
    h1 = inp * 3
    out = (h1 * h1).sum()
    h1.retain_grad()
    h1.retain_grad()
    assert h1.retains_grad
    await ag.backward(out, retain_graph=True)
    close(h1.grad, h1.numpy() * 2)
    first = h1.grad
    await ag.backward(out, retain_graph=True)
    close(h1.grad, h1.numpy() * 4)
    assert h1.grad is first
    with ag.no_grad():
        inp.grad.zero_()
    inp.retain_grad()  # a no-op on leaves
    inp.retain_grad()
    assert not inp.retains_grad
    await ag.backward(out)
    close(inp.grad, inp.numpy() * 18)


NONLEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute won't "
    "be populated during autograd.backward(). If you indeed want the .grad field to be populated for a "
    "non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. If you access the non-leaf Tensor by "
    "mistake, make sure you access the leaf Tensor instead. See github.com/pytorch/pytorch/pull/30531 for "
    "more information."
)


def test_non_leaf_grad_access_warns():
    # case 22 (test_tensor_grad_warnings)
    x = ag.randn(2, requires_grad=True)
    y = x * 2
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert y.grad is None
    assert len(w) == 1
    assert str(w[0].message) == NONLEAF_GRAD_WARNING
    y.retain_grad()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert y.grad is None
        assert x.grad is None
    assert len(w) == 0


@pytest.mark.parametrize("create_graph", [False, True])
async def test_accumulate_grad_identity(create_graph):
    # case 23 (test_accumulate_grad, test_accumulate_grad_tensor_reference): in-place
    # accumulation keeps the .grad object; create_graph makes a new one
    go = ag.ones(5, 5)
    x = ag.randn(5, 5, requires_grad=True)
    y = x + 2
    await ag.backward(y, go, retain_graph=True)
    x_grad = x.grad
    snapshot = x_grad.numpy().copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        await ag.backward(y, go, create_graph=create_graph)
    close(go, np.ones((5, 5)))  # the user's grad is never mutated
    if create_graph:
        assert x.grad is not x_grad
        close(x_grad, snapshot)
        close(x.grad, snapshot * 2)
    else:
        assert x.grad is x_grad
        close(x_grad, snapshot * 2)


async def test_create_graph_grad_has_a_grad_fn():
    x = ag.randn(3, requires_grad=True)
    with pytest.warns(UserWarning, match="create_graph=True"):
        await ag.backward((x**3).sum(), create_graph=True)
    assert x.grad.grad_fn is not None
    close(x.grad, 3 * x.numpy() ** 2)
    (g2,) = await ag.grad(x.grad.sum(), x)
    close(g2, 6 * x.numpy())


async def test_user_grad_outputs_are_not_mutated():
    # case 24 (test_input_buffer_accum): summing into an input buffer never writes into
    # a tensor the user supplied
    leaf = ag.rand(2, 2, requires_grad=True)
    out1 = leaf.clone()
    out2 = leaf * 1
    g1 = ag.rand(2, 2)
    g2 = ag.rand(2, 2)
    g1_orig, g2_orig = g1.numpy().copy(), g2.numpy().copy()
    await ag.backward((out1, out2), (g1, g2))
    close(g1, g1_orig)
    close(g2, g2_orig)
    close(leaf.grad, g1_orig + g2_orig)
    # and again into an existing .grad
    await ag.backward((leaf.clone(), leaf.clone()), (g1, g2))
    close(g1, g1_orig)
    close(g2, g2_orig)
    close(leaf.grad, 2 * (g1_orig + g2_orig))


async def test_one_grad_buffered_in_three_places():
    # case 25 (test_backward_copy)
    x = ag.ones(5, 5, requires_grad=True)
    y = ag.ones(5, 5, requires_grad=True)
    a = x + 2
    b = y + 2
    c = x + 2
    add1 = a + b
    add2 = add1 + c
    for _ in range(4):
        a = a * 2
        b = b * 2
        c = c * 2
    branch = a + b + c
    out = add2 + branch
    await ag.backward(out, ag.ones(5, 5))
    close(x.grad, np.full((5, 5), 34.0))
    close(y.grad, np.full((5, 5), 17.0))


async def test_gradients_of_a_tensor_used_twice_are_summed():
    x = ag.randn(3, requires_grad=True)
    await ag.backward((x * x).sum())
    close(x.grad, 2 * x.numpy())


# --------------------------------------------------------------------------------------
# retain_graph / freeing saved tensors
# --------------------------------------------------------------------------------------
FREED = "Trying to backward through the graph a second time"


async def test_backward_twice_with_saved_values():
    # case 55 (test_backward_twice_with_saved_values)
    x = ag.randn(3, requires_grad=True)
    c = ag.randn(3)
    y = (x * c).sum()
    await ag.backward(y)
    with pytest.raises(RuntimeError, match=re.escape(FREED)) as info:
        await ag.backward(y)
    assert "Specify retain_graph=True" in str(info.value)
    close(x.grad, c)  # the failed backward committed nothing


async def test_backward_twice_without_saved_values_is_fine():
    # 5.3: the error is lazy (test_backward_twice_without_saved_values)
    x = ag.randn(3, requires_grad=True)
    y = (x + 1).sum()
    await ag.backward(y)
    await ag.backward(y)
    close(x.grad, [2.0] * 3)


async def test_backward_twice_with_retain_graph():
    x = ag.randn(3, requires_grad=True)
    y = (x * x).sum()
    await ag.backward(y, retain_graph=True)
    await ag.backward(y)
    close(x.grad, 4 * x.numpy())
    with pytest.raises(RuntimeError, match=FREED):
        await ag.backward(y)


async def test_freeing_is_per_node():
    # 5.4: a later graph reaching a freed node fails
    x = ag.randn(3, requires_grad=True)
    y = x * x
    await ag.backward(y.sum())
    with pytest.raises(RuntimeError, match=FREED):
        await ag.backward((y * 2).sum())


async def test_grad_with_create_graph_keeps_the_graph():
    # 5.5 + retain_graph defaults to create_graph
    x = ag.randn(3, requires_grad=True)
    y = (x * x).sum()
    (gx,) = await ag.grad(y, x, create_graph=True)
    assert gx.requires_grad
    await ag.backward(y)
    close(x.grad, 2 * x.numpy())


async def test_pruned_nodes_keep_their_saved_tensors():
    # 5.1: only nodes that executed are freed
    x = ag.randn(3, requires_grad=True)
    w = ag.randn(3, requires_grad=True)
    h = x.exp()  # pruned below
    out = (h * w).sum()
    (gw,) = await ag.grad(out, w, retain_graph=False)
    close(gw, h)
    h2 = ag.randn(3, requires_grad=True)
    await ag.backward((h * h2).sum())  # reaches ExpBackward, which was never run
    close(x.grad, h2.numpy() * h.numpy())


async def test_failed_backward_frees_nothing_and_can_be_retried():
    x = ag.randn(3, requires_grad=True)
    y = x.exp()
    handle = y.grad_fn.register_prehook(lambda g: 1 / 0)
    out = (y * y).sum()
    with pytest.raises(ZeroDivisionError):
        await ag.backward(out)
    assert x.grad is None
    handle.remove()
    await ag.backward(out)
    close(x.grad, 2 * np.exp(2 * x.numpy()))


async def test_inplace_on_a_saved_tensor():
    # case 56 (test_inplace)
    x = ag.ones(5, 5, requires_grad=True)
    y = (ag.ones(5, 5) * 4).requires_grad_(True)
    z = x * y
    q = z + y
    w = z * y
    z.add_(2)
    await ag.backward(q, ag.ones(5, 5), retain_graph=True)  # add saves nothing
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        await ag.backward(w, ag.ones(5, 5))


async def test_no_grad_inplace_bumps_the_version():
    # case 57 (test_no_grad_modifies_version)
    x = ag.randn(5, requires_grad=True)
    y = ag.randn(5, requires_grad=True)
    z = (x * y).sum()
    with ag.no_grad():
        x *= 2
    assert x._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        await ag.backward(z)


# --------------------------------------------------------------------------------------
# Higher order
# --------------------------------------------------------------------------------------
async def test_grad_of_grad():
    x = ag.randn(4, requires_grad=True)
    (g1,) = await ag.grad((x**3).sum(), x, create_graph=True)
    close(g1, 3 * x.numpy() ** 2)
    assert g1.grad_fn is not None
    (g2,) = await ag.grad(g1.sum(), x, create_graph=True)
    close(g2, 6 * x.numpy())
    (g3,) = await ag.grad(g2.sum(), x)
    close(g3, np.full(4, 6.0))
    assert g3.grad_fn is None
    assert x.grad is None


async def test_hessian_vector_product_through_backward():
    x = ag.randn(3, requires_grad=True)
    v = ag.randn(3)
    (g,) = await ag.grad((x.sin()).sum(), x, create_graph=True)
    await ag.backward((g * v).sum())
    close(x.grad, -np.sin(x.numpy()) * v.numpy())


# --------------------------------------------------------------------------------------
# Errors inside backward: first error wins, nothing is committed
# --------------------------------------------------------------------------------------
async def test_first_error_wins_and_later_nodes_do_not_run():
    # case 50, with node pre-hooks instead of a custom Function
    x = ag.randn(3, requires_grad=True)
    a = x * 2
    b = x * 3  # created later: runs first
    ran = []
    a.grad_fn.register_prehook(lambda g: ran.append("a"))
    b.grad_fn.register_prehook(lambda g: (_ for _ in ()).throw(ValueError("boom")))
    x.register_hook(lambda g: ran.append("x"))
    out = (a + b).sum()
    cb = []

    def queue(g):
        ag.autograd.queue_callback(lambda: cb.append(1))

    out.grad_fn.register_prehook(queue)
    with pytest.raises(ValueError, match="boom") as info:
        await ag.backward(out)
    assert ran == []
    assert cb == []
    assert x.grad is None
    assert any("MulBackward0" in n for n in getattr(info.value, "__notes__", []))


# --------------------------------------------------------------------------------------
# Final callbacks and graph task ids
# --------------------------------------------------------------------------------------
def test_queue_callback_outside_backward():
    # case 46
    with pytest.raises(RuntimeError, match=re.escape("Final callbacks can only be installed during backward pass.")):
        ag.autograd.queue_callback(lambda: None)


async def test_callback_queues_a_callback_and_sees_committed_grads():
    # case 45 (test_callback_adds_callback) + 7.3
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    seen = []

    def second():
        seen.append(("second", x.grad.numpy().copy()))

    def first():
        seen.append(("first", x.grad.numpy().copy()))
        ag.autograd.queue_callback(second)

    y.grad_fn.register_prehook(lambda g: ag.autograd.queue_callback(first))
    await ag.backward(y.sum())
    assert [s[0] for s in seen] == ["first", "second"]
    for _, g in seen:
        np.testing.assert_allclose(g, [2.0] * 3)


async def test_async_callback():
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    seen = []

    async def cb():
        await asyncio.sleep(0)
        seen.append(ag.autograd.current_graph_task_id())

    ids = []
    y.grad_fn.register_prehook(lambda g: (ids.append(ag.autograd.current_graph_task_id()),
                                          ag.autograd.queue_callback(cb)) and None)
    await ag.backward(y.sum())
    assert seen == ids and seen[0] is not None


async def test_callback_exception_propagates_after_commit():
    # case 48
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    later = []

    def bad():
        raise KeyError("cb")

    def queue(g):
        ag.autograd.queue_callback(bad)
        ag.autograd.queue_callback(lambda: later.append(1))

    y.grad_fn.register_prehook(queue)
    with pytest.raises(KeyError):
        await ag.backward(y.sum())
    close(x.grad, [2.0] * 3)
    assert later == []


def test_callbacks_in_sync_backward():
    x = ag.randn(3, requires_grad=True)
    y = x * 2
    calls = []
    y.grad_fn.register_prehook(lambda g: ag.autograd.queue_callback(lambda: calls.append(x.grad.numpy().copy())))
    y.sum().backward()
    assert len(calls) == 1
    np.testing.assert_allclose(calls[0], [2.0] * 3)


async def test_current_graph_task_id():
    # case 29 (test_current_graph_task_id)
    assert ag.autograd.current_graph_task_id() is None
    x = ag.randn(3, requires_grad=True)
    ids = []
    y = x * 2
    y.grad_fn.register_prehook(lambda g: ids.append(ag.autograd.current_graph_task_id()))
    x.register_hook(lambda g: ids.append(ag.autograd.current_graph_task_id()))
    await ag.backward(y.sum(), retain_graph=True)
    await ag.grad(y.sum(), x)
    assert ag.autograd.current_graph_task_id() is None
    assert len(ids) == 4
    assert all(isinstance(i, int) for i in ids)
    assert ids[0] == ids[1] and ids[2] == ids[3]
    assert ids[2] > ids[0]


# --------------------------------------------------------------------------------------
# Sync forms
# --------------------------------------------------------------------------------------
def test_sync_forms_outside_a_loop():
    x = ag.randn(3, requires_grad=True)
    (x * x).sum().backward()
    close(x.grad, 2 * x.numpy())
    ag.backward_sync((x * 3).sum())
    close(x.grad, 2 * x.numpy() + 3)
    (g,) = ag.grad_sync((x * 5).sum(), x)
    close(g, [5.0] * 3)
    y = x * 2
    y.backward(ag.ones(3), inputs=[x])
    close(x.grad, 2 * x.numpy() + 5)
    assert ag.autograd.backward is ag.backward and ag.autograd.grad is ag.grad


async def test_sync_forms_inside_a_running_loop_raise():
    x = ag.randn(3, requires_grad=True)
    y = (x * x).sum()
    with pytest.raises(RuntimeError, match="await"):
        y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="await"):
        ag.backward_sync(y, retain_graph=True)
    with pytest.raises(RuntimeError, match="await"):
        ag.grad_sync(y, x, retain_graph=True)
    assert x.grad is None
    await ag.backward(y)  # the graph is intact
    close(x.grad, 2 * x.numpy())


async def test_failed_backward_call_leaves_no_retain_grad_behind():
    x = ag.randn(2, requires_grad=True)
    y = x * 2
    c = ag.randn(2)
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        await ag.backward(y, ag.ones(3), inputs=[y])
    assert not y.retains_grad
    with pytest.raises(RuntimeError, match="can't retain_grad"):
        await ag.backward(y, ag.ones(2), inputs=[y, c])
    assert not y.retains_grad
    with pytest.raises(TypeError):
        await ag.backward(y, ag.ones(2), inputs=[y, 3])
    assert not y.retains_grad
