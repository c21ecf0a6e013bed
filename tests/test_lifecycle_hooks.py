"""A backward's lifecycle hooks (API.md §3, autograd/task/lifecycle.py): the start hook
(``register_backward_start_hook``), the abort functions (``queue_on_abort``), and a
pre-commit that adds leaves the backward did not reach (Note [Pre-commit]). Each test
checks the order of events, the values committed, or the error raised."""

import gc
import weakref

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.task import lifecycle
from asyncgrad.autograd.engine import Engine, get_engine, set_engine

F = ag.autograd


class Step(F.Function):
    """Identity whose backward records itself, and can fail or sleep."""

    @staticmethod
    def forward(ctx, x, name, events, mode=None):
        ctx.name, ctx.events, ctx.mode = name, events, mode
        return x.clone()

    @staticmethod
    async def backward(ctx, g):
        ctx.events.append(("node", ctx.name))
        if ctx.mode == "fail":
            raise ValueError(f"{ctx.name} failed")
        if ctx.mode == "sleep":
            await anyio.sleep(30)
        return g, None, None, None


def graph(events, mode=None):
    """``loss`` through a marked node ``m`` then a ``loss`` node that may fail; leaves
    ``w`` (reached) and ``u`` (never used)."""
    w = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    u = ag.tensor([[5.0, 6.0]], requires_grad=True)
    w.grad = ag.tensor([10.0, 10.0, 10.0])
    marked = Step.apply(w * 2, "marked", events)
    loss = Step.apply(marked, "loss", events, mode).sum()
    return w, u, marked, loss


def track(events, node, *, precommit=None, abort=None):
    """Register a start hook on ``node`` that records itself and queues an abort
    function, a pre-commit and a callback that record themselves."""

    def start():
        events.append("start")
        F.queue_on_abort(abort or (lambda e: events.append(("abort", type(e).__name__))))
        F.queue_pre_commit(precommit or (lambda staged: events.append("pre-commit")))
        F.queue_callback(lambda: events.append("callback"))

    return F.register_backward_start_hook(node, start)


def test_success_runs_start_before_any_node_then_pre_commit_then_callbacks_and_no_abort():
    events = []
    w, _, marked, loss = graph(events)
    track(events, marked.grad_fn)
    loss.backward()
    assert events == ["start", ("node", "loss"), ("node", "marked"), "pre-commit", "callback"]
    np.testing.assert_array_equal(w.grad.numpy(), [12.0, 12.0, 12.0])


@pytest.mark.parametrize("form", ["async", "blocking"])
def test_a_failing_node_before_the_marked_one_aborts_and_commits_nothing(form):
    events = []
    w, _, marked, loss = graph(events, mode="fail")
    track(events, marked.grad_fn)
    with pytest.raises(ValueError, match="loss failed"):
        anyio.run(ag.backward, loss) if form == "async" else loss.backward()
    assert events == ["start", ("node", "loss"), ("abort", "ValueError")]
    np.testing.assert_array_equal(w.grad.numpy(), [10.0, 10.0, 10.0])


async def test_a_failing_pre_commit_aborts_after_every_node_and_commits_nothing():
    events = []
    w, _, marked, loss = graph(events)

    def refuse(staged):
        events.append("pre-commit")
        raise RuntimeError("vote: no")

    track(events, marked.grad_fn, precommit=refuse)
    with pytest.raises(RuntimeError, match="vote: no"):
        await ag.backward(loss)
    assert events == ["start", ("node", "loss"), ("node", "marked"), "pre-commit", ("abort", "RuntimeError")]
    np.testing.assert_array_equal(w.grad.numpy(), [10.0, 10.0, 10.0])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cancellation_runs_an_async_abort_shielded_after_the_nodes_stopped(backend):
    events = []

    async def slow_abort(error):
        events.append(("abort", type(error).__name__ in ("CancelledError", "Cancelled")))
        await anyio.sleep(0.01)  # the caller is cancelled: only a shielded abort gets past this
        events.append("abort done")

    async def main():
        w, _, marked, loss = graph(events, mode="sleep")
        track(events, marked.grad_fn, abort=slow_abort)
        with anyio.move_on_after(0.05) as scope:
            await ag.backward(loss)
        assert scope.cancelled_caught
        events.append("returned")
        np.testing.assert_array_equal(w.grad.numpy(), [10.0, 10.0, 10.0])

    anyio.run(main, backend=backend)
    assert events == ["start", ("node", "loss"), ("abort", True), "abort done", "returned"]


def test_the_blocking_form_runs_an_async_abort_to_its_end():
    events = []

    async def abort(error):
        await anyio.sleep(0)
        events.append(("abort", str(error), F.current_graph_task_id() is not None))

    _, _, marked, loss = graph(events, mode="fail")
    track(events, marked.grad_fn, abort=abort)
    with pytest.raises(ValueError):
        loss.backward()
    assert events == ["start", ("node", "loss"), ("abort", "loss failed", True)]


def test_a_nested_backward_has_its_own_start_and_abort_inner_first():
    events = []
    outer_w, _, outer_marked, outer_loss = graph([])
    track(events, outer_marked.grad_fn, abort=lambda e: events.append("outer abort"))
    inner_events = []
    _, _, inner_marked, inner_loss = graph(inner_events, mode="fail")
    F.register_backward_start_hook(inner_marked.grad_fn, lambda: (
        events.append("inner start"), F.queue_on_abort(lambda e: events.append("inner abort"))))

    def run_inner(grad_outputs):
        events.append("outer node")
        ag.backward_sync(inner_loss)  # nested in the outer backward; raises

    outer_loss.grad_fn.register_prehook(run_inner)
    with pytest.raises(ValueError, match="loss failed"):
        outer_loss.backward()
    assert events == ["start", "outer node", "inner start", "inner abort", "outer abort"]
    np.testing.assert_array_equal(outer_w.grad.numpy(), [10.0, 10.0, 10.0])


async def test_an_abort_function_that_raises_leaves_the_original_error_with_a_note():
    events = []
    w, _, marked, loss = graph(events, mode="fail")

    def broken(error):
        raise KeyError("abort broke")

    def start():
        F.queue_on_abort(broken)
        F.queue_on_abort(lambda e: events.append("second abort still ran"))

    F.register_backward_start_hook(marked.grad_fn, start)
    with pytest.raises(ValueError, match="loss failed") as info:
        await ag.backward(loss)
    assert events[-1] == "second abort still ran"
    notes = [n for n in info.value.__notes__ if n.startswith("asyncgrad: while aborting this backward, ")]
    assert len(notes) == 1 and notes[0].endswith(".broken raised KeyError: 'abort broke'")
    assert info.value.__context__ is None  # the abort's error does not replace or chain the original
    np.testing.assert_array_equal(w.grad.numpy(), [10.0, 10.0, 10.0])


async def test_abort_functions_are_refused_after_the_commit_and_outside_backward():
    events = []
    _, _, marked, loss = graph(events)
    errors = []

    def late():
        try:
            F.queue_on_abort(lambda e: events.append("never"))
        except RuntimeError as e:
            errors.append(str(e))

    F.register_backward_start_hook(marked.grad_fn, lambda: F.queue_callback(late))
    await ag.backward(loss)
    assert len(errors) == 1 and "already committed or been aborted" in errors[0]
    assert "never" not in events
    with pytest.raises(RuntimeError, match="only be installed during backward"):
        F.queue_on_abort(lambda e: None)


async def test_start_hooks_run_only_for_backwards_that_execute_the_node():
    events = []
    w = ag.tensor([1.0, 2.0], requires_grad=True)
    side_leaf = ag.tensor(0.0, requires_grad=True)
    side = Step.apply(side_leaf, "side", [])  # a branch of its own, as DDP's marker
    loss = (w * w).sum() + side
    handle = F.register_backward_start_hook(side.grad_fn, lambda: events.append("start"))
    await ag.grad(loss, [w], retain_graph=True)  # pruned: the side branch leads to no input
    await ag.backward(loss, inputs=[w], retain_graph=True)
    assert events == []
    await ag.backward(loss, retain_graph=True)
    assert events == ["start"]
    handle.remove()
    await ag.backward(loss)
    assert events == ["start"]


def test_start_hooks_of_several_nodes_run_highest_sequence_nr_first_and_may_be_async():
    events = []
    w = ag.tensor([1.0], requires_grad=True)
    a = w * 2
    b = a * 3

    async def later():
        await anyio.sleep(0)
        events.append("a")

    F.register_backward_start_hook(a.grad_fn, later)
    F.register_backward_start_hook(b.grad_fn, lambda: events.append("b1"))
    F.register_backward_start_hook(b.grad_fn, lambda: events.append("b2"))
    b.sum().backward(retain_graph=True)
    anyio.run(ag.backward, b.sum())
    assert events == ["b1", "b2", "a"] * 2


async def test_a_raising_start_hook_fails_the_backward_before_any_node_and_aborts_earlier_ones():
    events = []
    w, _, marked, loss = graph(events)
    track(events, loss.grad_fn)  # the highest sequence_nr: runs first

    def refuse():
        raise RuntimeError("not now")

    F.register_backward_start_hook(marked.grad_fn, refuse)
    with pytest.raises(RuntimeError, match="not now"):
        await ag.backward(loss)
    assert events == ["start", ("abort", "RuntimeError")]  # no node ran
    np.testing.assert_array_equal(w.grad.numpy(), [10.0, 10.0, 10.0])


async def test_a_cancellation_during_set_up_runs_the_start_hooks_then_the_aborts():
    events = []
    x = ag.tensor([1.0], requires_grad=True)
    h = x
    nodes = []
    for _ in range(3000):  # the set-up yields every 1024 nodes (yield_interval 0)
        h = h * 1.0
        nodes.append(h.grad_fn)
    track(events, nodes[100])  # about 2900 nodes from the root: found after the first yield
    prev = get_engine()
    set_engine(Engine(yield_interval=0.0))
    try:
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:

                async def cancel_at_first_yield():
                    events.append("cancel")
                    scope.cancel()

                tg.start_soon(cancel_at_first_yield)
                await ag.backward(h.sum())
    finally:
        set_engine(prev)
    assert events == ["cancel", "start", ("abort", "CancelledError")]
    assert x.grad is None


def test_a_registration_does_not_keep_the_graph_alive_and_bad_arguments_are_refused():
    y = ag.tensor([1.0], requires_grad=True) * 2
    node = weakref.ref(y.grad_fn)
    F.register_backward_start_hook(y.grad_fn, lambda: None)
    key = id(y.grad_fn)
    assert key in lifecycle.START_HOOKS
    del y
    gc.collect()
    assert node() is None and key not in lifecycle.START_HOOKS
    with pytest.raises(TypeError, match="expects a graph Node .* got Tensor"):
        F.register_backward_start_hook(ag.tensor([1.0]), lambda: None)
    with pytest.raises(TypeError, match="expects a callable, got int"):
        F.register_backward_start_hook((ag.tensor([1.0], requires_grad=True) * 2).grad_fn, 3)


# --- a pre-commit adding leaves the backward did not reach -----------------------------------
@pytest.mark.parametrize("form", ["async", "blocking"])
def test_a_pre_commit_adds_an_unreached_leaf_in_the_same_commit(form):
    events = []
    w, u, marked, loss = graph([])

    def add(staged):
        assert u not in staged
        staged[u] = ag.tensor([[1.0, 2.0]])

    # a post-accumulate-grad hook of the reached leaf runs after the whole commit: it sees u's
    w.register_post_accumulate_grad_hook(lambda t: events.append(("w hook sees u", u.grad.tolist())))
    u.register_post_accumulate_grad_hook(lambda t: events.append("u hook"))
    loss.grad_fn.register_prehook(lambda g: F.queue_pre_commit(add))
    anyio.run(ag.backward, loss) if form == "async" else loss.backward()
    np.testing.assert_array_equal(u.grad.numpy(), [[1.0, 2.0]])
    np.testing.assert_array_equal(w.grad.numpy(), [12.0, 12.0, 12.0])
    assert events == [("w hook sees u", [[1.0, 2.0]]), "u hook"]


async def test_an_added_leaf_accumulates_into_its_grad_and_a_later_refusal_commits_neither():
    w, u, marked, loss = graph([])
    u.grad = ag.tensor([[1.0, 1.0]])
    loss.grad_fn.register_prehook(lambda g: F.queue_pre_commit(lambda s: s.__setitem__(u, ag.ones(1, 2))))
    await ag.backward(loss, retain_graph=True)
    np.testing.assert_array_equal(u.grad.numpy(), [[2.0, 2.0]])

    def refuse(staged):
        raise RuntimeError("refused")

    loss = Step.apply(marked, "again", []).sum()
    def install(grad_outputs):
        F.queue_pre_commit(lambda s: s.__setitem__(u, ag.ones(1, 2)))
        F.queue_pre_commit(refuse)

    loss.grad_fn.register_prehook(install)
    with pytest.raises(RuntimeError, match="refused"):
        await ag.backward(loss)
    np.testing.assert_array_equal(u.grad.numpy(), [[2.0, 2.0]])
    np.testing.assert_array_equal(w.grad.numpy(), [12.0, 12.0, 12.0])


def _bad_additions():
    leaf = ag.tensor([[5.0, 6.0]], requires_grad=True)
    frozen = ag.tensor([[5.0, 6.0]])
    nonleaf = leaf * 2
    return [
        ("non-leaf", lambda u: (nonleaf, ag.ones(1, 2)), RuntimeError,
         r"added a tensor of shape \(1, 2\) that is not a leaf; only leaves that require grad"),
        ("no grad", lambda u: (frozen, ag.ones(1, 2)), RuntimeError,
         "is a leaf that does not require grad"),
        ("shape", lambda u: (u, ag.ones(2)), RuntimeError,
         r"staged a gradient of shape \(2,\) for a tensor of shape \(1, 2\)"),
        ("dtype", lambda u: (u, ag.ones(1, 2, dtype=ag.float32)), RuntimeError,
         "staged a gradient of dtype float32 for a tensor of dtype float64"),
        ("value", lambda u: (u, np.ones((1, 2))), TypeError, "staged a ndarray .* expected a Tensor"),
        ("key", lambda u: ("u", ag.ones(1, 2)), TypeError, "added a key of type str; expected a Tensor"),
    ]


@pytest.mark.parametrize(("what", "entry", "error", "message"), _bad_additions(),
                         ids=[b[0] for b in _bad_additions()])
async def test_a_bad_addition_is_refused_clearly_and_commits_nothing(what, entry, error, message):
    w, u, marked, loss = graph([])

    def add(staged):
        staged[w] = staged[w] * 0  # a valid replacement: it must not be committed either
        key, value = entry(u)
        staged[key] = value

    loss.grad_fn.register_prehook(lambda g: F.queue_pre_commit(add))
    with pytest.raises(error, match=message):
        await ag.backward(loss)
    assert u.grad is None
    np.testing.assert_array_equal(w.grad.numpy(), [10.0, 10.0, 10.0])


async def test_a_grad_call_refuses_additions():
    w, u, marked, loss = graph([])
    loss.grad_fn.register_prehook(lambda g: F.queue_pre_commit(lambda s: s.__setitem__(u, ag.ones(1, 2))))
    with pytest.raises(RuntimeError, match=r"added an entry to a grad\(\) call, which commits nothing"):
        await ag.grad(loss, [w])
    assert u.grad is None
