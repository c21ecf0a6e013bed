"""``ag.autograd.queue_pre_commit``: a step after every node and before the commit that
sees the staged gradients, may replace them, and may stop the commit (API.md §3)."""

import anyio
import numpy as np
import pytest

import asyncgrad as ag


def leaves():
    w = ag.tensor([1.0, 2.0, 3.0], dtype=ag.float64, requires_grad=True)
    b = ag.tensor([0.5], dtype=ag.float64, requires_grad=True)
    return w, b


def loss_of(w, b):
    return (w * w).sum() + (b * 3).sum()


async def test_sees_every_staged_gradient_and_may_replace_it():
    w, b = leaves()
    w.grad = ag.tensor([10.0, 10.0, 10.0], dtype=ag.float64)
    seen = {}

    def halve(staged):
        for var, g in staged.items():
            seen[id(var)] = g.numpy().copy()
            staged[var] = g * 0.5

    loss = loss_of(w, b)
    loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(halve))
    await ag.backward(loss)
    np.testing.assert_array_equal(seen[id(w)], [2.0, 4.0, 6.0])  # staged, not yet added to .grad
    np.testing.assert_array_equal(seen[id(b)], [3.0])
    np.testing.assert_array_equal(w.grad.numpy(), [11.0, 12.0, 13.0])
    np.testing.assert_array_equal(b.grad.numpy(), [1.5])


async def test_sees_retained_non_leaf_gradients():
    w, _ = leaves()
    h = w * 2
    h.retain_grad()
    keys = []
    loss = h.sum()
    loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(lambda s: keys.extend(s)))
    await ag.backward(loss)
    assert any(k is h for k in keys) and any(k is w for k in keys) and len(keys) == 2


@pytest.mark.parametrize("form", ["async", "sync"])
def test_raising_commits_nothing_and_frees_nothing(form):
    w, b = leaves()
    w.grad = ag.tensor([1.0, 1.0, 1.0], dtype=ag.float64)
    loss = loss_of(w, b)

    def refuse(staged):
        raise ValueError("vote failed")

    handle = loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(refuse))
    with pytest.raises(ValueError, match="vote failed"):
        if form == "async":
            anyio.run(ag.backward, loss)
        else:
            loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0, 1.0])
    assert b.grad is None
    handle.remove()
    loss.backward()  # saved tensors were not freed: the same graph runs again
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 5.0, 7.0])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_pre_commit_runs_on_the_loop_and_cancellation_commits_nothing(backend):
    w, b = leaves()

    async def slow(staged):
        await anyio.sleep(30)

    async def main():
        loss = loss_of(w, b)
        loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(slow))
        with anyio.move_on_after(0.05) as scope:
            await ag.backward(loss)
        assert scope.cancelled_caught
        assert w.grad is None and b.grad is None

        async def replace(staged):
            await anyio.sleep(0)
            staged[w] = ag.ones(3, dtype=ag.float64)

        loss = loss_of(w, b)
        loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(replace))
        await ag.backward(loss)
        np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(b.grad.numpy(), [3.0])

    anyio.run(main, backend=backend)


def test_sync_form_runs_an_async_pre_commit_as_part_of_its_backward():
    w, b = leaves()
    seen = []

    async def double(staged):
        await anyio.sleep(0)
        seen.append(ag.autograd.current_graph_task_id())
        staged[b] = staged[b] * 2

    loss = loss_of(w, b)
    loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(double))
    loss.backward()
    np.testing.assert_array_equal(b.grad.numpy(), [6.0])
    assert seen[0] is not None  # it runs inside the backward (it may queue callbacks, ...)


async def test_a_replacement_of_the_wrong_shape_is_refused_naming_both_shapes():
    w, b = leaves()
    loss = loss_of(w, b)

    def wrong(staged):
        staged[w] = ag.ones(2, dtype=ag.float64)

    loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(wrong))
    with pytest.raises(RuntimeError, match=r"shape \(2,\) for a tensor of shape \(3,\)"):
        await ag.backward(loss)
    assert w.grad is None and b.grad is None


async def test_a_replacement_of_another_dtype_is_refused_naming_both_dtypes():
    w, b = leaves()
    loss = loss_of(w, b)

    def wrong(staged):
        staged[w] = staged[w].float()  # float32 for a float64 leaf: refused, not silently cast

    loss.grad_fn.register_prehook(lambda g: ag.autograd.queue_pre_commit(wrong))
    with pytest.raises(RuntimeError, match="dtype float32 for a tensor of dtype float64"):
        await ag.backward(loss)
    assert w.grad is None and b.grad is None


async def test_runs_before_final_callbacks_and_grad_calls_see_an_empty_mapping():
    w, b = leaves()
    order = []
    loss = loss_of(w, b)

    def install(g):
        ag.autograd.queue_callback(lambda: order.append(("callback", w.grad is not None)))
        ag.autograd.queue_pre_commit(lambda s: order.append(("pre", w.grad is not None, len(s))))

    loss.grad_fn.register_prehook(install)
    await ag.backward(loss, retain_graph=True)
    assert order == [("pre", False, 2), ("callback", True)]
    order.clear()
    await ag.grad(loss, [w])  # grad() changes no .grad: nothing staged
    assert order == [("pre", True, 0), ("callback", True)]


def test_outside_backward_raises():
    with pytest.raises(RuntimeError, match="only be installed during backward"):
        ag.autograd.queue_pre_commit(lambda s: None)
