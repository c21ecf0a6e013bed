"""Worker chains through light forks and joins (Note [Worker chains] in
autograd/sched/placement.py): a fork whose branches are all light runs whole on the worker, and
a node whose remaining gradients all come from the chain follows in it.

The graphs are shaped as a transformer block's backward: q, k and v of one split
(a 3-way light fork joining in a 3-slot SplitBackward0), and a residual add whose two
gradients both come from one chain."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Engine, set_engine
from asyncgrad.autograd import gradcheck

N = 4096  # elements per branch
# a sin over N elements (its gradient and its saved input: 2N) is light, anything
# larger heavy (Note [Inline or offload] in sched/placement.py)
THRESHOLD = 2 * N + 1


@pytest.fixture
def engines(restore_engine):
    """A chaining engine and an all-inline one (the default engine restored afterwards)."""
    return Engine(inline_threshold=THRESHOLD), Engine(inline_threshold=2**62)


async def _backward_with(engine: Engine, loss) -> None:
    set_engine(engine)
    await ag.backward(loss)


def _fork_loss(x, hook=None):
    """x -> sin (heavy) -> split in 3 (one node, 3 slots; heavy) -> a light sin per
    piece -> stack (heavy) -> sin (heavy) -> sum. Backward: the stack's node makes the
    three light sins ready at once, and they join again in the split's node."""
    h = x.sin()
    qs = [p.sin() for p in h.split(x.shape[0] // 3)]
    if hook is not None:
        qs[1].register_hook(hook)
    return ag.stack(qs).sin().sum(), qs, h


def _x(n=N, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, 3 * n)


async def test_a_light_three_way_fork_joining_in_a_split_node_runs_in_one_chain(engines):
    offload, inline = engines
    x1 = ag.tensor(_x(), requires_grad=True)
    x2 = ag.tensor(_x(), requires_grad=True)
    await _backward_with(offload, _fork_loss(x1)[0])
    await _backward_with(inline, _fork_loss(x2)[0])
    stats = offload.statistics()
    # one hop: the top sin, the stack, the three branches, the split and the bottom sin
    # (before: the fork went back to the loop, and the split and the bottom sin each
    # took a hop of their own, 3 hops)
    assert stats.thread_hops == 1
    assert stats.nodes_offloaded == 7
    np.testing.assert_array_equal(x1.grad.numpy(), x2.grad.numpy())  # float64, exactly
    v = _x()
    expected = np.cos(np.sin(v)) * np.cos(v)  # d/dv of sum(sin(sin(sin v))) with the outer cos
    expected *= np.cos(np.sin(np.sin(v)))
    np.testing.assert_allclose(x1.grad.numpy(), expected, rtol=1e-12, atol=1e-15)


def test_the_fork_graph_passes_gradcheck():
    x = ag.tensor(_x(n=4, seed=1), requires_grad=True)
    assert gradcheck(lambda t: _fork_loss(t)[0], (x,))


async def test_an_error_in_a_fork_branch_names_that_node(engines):
    """A branch's saved value cannot be unpacked: the error is raised on the worker, inside
    the chain, names that branch's node (once), and no gradient is written."""
    offload, inline = engines
    threads = []

    def unpack(t):
        threads.append(threading.current_thread() is threading.main_thread())
        raise ValueError("cannot unpack")

    for engine in (offload, inline):
        x = ag.tensor(_x(), requires_grad=True)
        h = x.sin()
        pieces = h.split(N)
        qs = [pieces[0].sin(), pieces[1].sin()]
        with ag.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            qs.append(pieces[2].sin())
        loss = ag.stack(qs).sin().sum()
        with pytest.raises(ValueError, match="cannot unpack") as info:
            await _backward_with(engine, loss)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert notes.count("asyncgrad: raised while running") == 1
        assert f"SinBackward0 (sequence_nr={qs[2].grad_fn.sequence_nr})" in notes
        assert x.grad is None
    assert threads == [False, True]  # on the chain's worker; on the loop inline
    assert offload.statistics().thread_hops == 1


async def test_a_hook_on_a_branch_ends_the_chain_before_the_fork(engines):
    offload, inline = engines
    seen = []
    grads = []
    for name, engine in (("offload", offload), ("inline", inline)):
        x = ag.tensor(_x(), requires_grad=True)
        loss, _, _ = _fork_loss(x, hook=lambda g, name=name: seen.append(
            (name, threading.current_thread() is threading.main_thread(), g.numpy().copy())))
        await _backward_with(engine, loss)
        grads.append(x.grad.numpy())
    # the top sin and the stack in one hop, then the branches on the loop, the split
    # and the bottom sin a hop each
    assert offload.statistics().thread_hops == 3
    assert [(n, main) for n, main, _ in seen] == [("offload", True), ("inline", True)]
    np.testing.assert_array_equal(seen[0][2], seen[1][2])
    np.testing.assert_array_equal(grads[0], grads[1])


def _residual_loss(x):
    """j = sin x (heavy); r = j + cos(tanh j) (both heavy); loss = sum(sin r). Backward:
    the add (light) sends one gradient to j's node, and the tanh-cos branch the other:
    both come from the chain that starts at the top sin."""
    j = x.sin()
    return (j + j.tanh().cos()).sin().sum()


async def test_a_residual_join_fed_twice_from_one_chain_follows_in_it(engines):
    offload, inline = engines
    x1 = ag.tensor(_x(), requires_grad=True)
    x2 = ag.tensor(_x(), requires_grad=True)
    await _backward_with(offload, _residual_loss(x1))
    await _backward_with(inline, _residual_loss(x2))
    stats = offload.statistics()
    # top sin, add, cos, tanh, then j's sin: one hop (before: the add went back to the
    # loop, and the chain after it stopped before j's sin, which waited for 2 gradients)
    assert stats.thread_hops == 1
    assert stats.nodes_offloaded == 5
    np.testing.assert_array_equal(x1.grad.numpy(), x2.grad.numpy())  # same order of additions
    v = _x()
    j = np.sin(v)
    r = j + np.cos(np.tanh(j))
    expected = np.cos(r) * (1.0 - np.sin(np.tanh(j)) * (1.0 - np.tanh(j) ** 2)) * np.cos(v)
    np.testing.assert_allclose(x1.grad.numpy(), expected, rtol=1e-12, atol=1e-15)
    assert gradcheck(_residual_loss, (ag.tensor(_x(n=3, seed=2), requires_grad=True),))


async def test_leaves_fed_through_pass_throughs_in_a_chain_get_arrays_of_their_own(engines):
    """An add passes its gradient on two edges: to a leaf, and to the next node of the
    chain, which passes it on to another leaf. Neither leaf may adopt that array as its
    ``.grad`` (Note [Owned gradients]): a later commit may add into ``.grad`` in place."""
    _, inline = engines
    offload = Engine(inline_threshold=N)  # (the sins heavy)
    v = _x()[:N]
    results = []
    for engine in (offload, inline):
        x = ag.tensor(v, requires_grad=True)
        a = ag.tensor(np.zeros(N), requires_grad=True)
        b = ag.tensor(np.zeros(N), requires_grad=True)
        for _ in range(2):
            await _backward_with(engine, ((x.sin() + a) + b).sin().sum())
            assert not np.shares_memory(a.grad.numpy(), b.grad.numpy())
        results.append((x.grad.numpy(), a.grad.numpy(), b.grad.numpy()))
    assert offload.statistics().thread_hops == 2  # one per backward: sin, add, add, sin
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(results[0][1], 2 * np.cos(np.sin(v)), rtol=1e-12)


async def test_cancelling_a_forked_chain_and_retrying_gives_the_gradient(engines):
    """Cancelled while a branch of the fork runs on the worker: the chain stops between
    nodes, nothing is written, and the same graph's backward runs again."""
    offload, inline = engines
    unpacked: list[int] = []
    blocking = threading.Event()
    release = threading.Event()

    def unpack(t):
        unpacked.append(1)
        if len(unpacked) == 2 and not release.is_set():  # the top sin's, then a branch's
            blocking.set()
            release.wait(10)
        return t

    x = ag.tensor(_x(), requires_grad=True)
    with ag.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        loss, _, _ = _fork_loss(x)
    set_engine(offload)
    task = asyncio.create_task(ag.backward(loss))
    while not blocking.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    for _ in range(20):
        await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(unpacked) == 2
    assert x.grad is None
    await ag.backward(loss)
    x2 = ag.tensor(_x(), requires_grad=True)
    await _backward_with(inline, _fork_loss(x2)[0])
    np.testing.assert_array_equal(x.grad.numpy(), x2.grad.numpy())


# --- a transformer's attention blocks (the shape of bench/gpt.py with sdpa) ---------------
def _attention_blocks(x, ws, blocks=3, heads=2):
    """``blocks`` pre-norm attention blocks sharing weights: x + c_proj(sdpa(q, k, v)) with
    q, k, v split from one c_attn product and reshaped per head (views)."""
    from asyncgrad.nn import functional as F

    B, T, C = x.shape
    w1, b1, w2, b2, g, bb = ws
    for _ in range(blocks):
        qkv = F.linear(F.layer_norm(x, (C,), g, bb), w1, b1)
        q, k, v = (t.reshape((B, T, heads, C // heads)).transpose(1, 2) for t in qkv.split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape((B, T, C))
        x = x + F.linear(y, w2, b2)
    return x.sin().sum()


def _attention_inputs(B=2, T=16, C=32, seed=0):
    rng = np.random.default_rng(seed)
    x = ag.tensor(rng.standard_normal((B, T, C)), requires_grad=True)
    ws = [ag.tensor(a, requires_grad=True) for a in (
        rng.standard_normal((3 * C, C)) / 6, rng.standard_normal(3 * C) / 6, rng.standard_normal((C, C)) / 6,
        rng.standard_normal(C) / 6, rng.uniform(0.5, 1.5, C), rng.standard_normal(C) / 6)]
    return x, ws


async def test_attention_blocks_backward_is_one_chain(blas_threaded, restore_engine):
    """The products and the attention kernels are heavy, the views, splits, layer norms
    and adds light: one hop from the last block's c_proj to the first block's c_attn
    (before: two per block, the q, k, v views and the split, and the residual adds,
    back on the loop). Gradients exactly as the all-inline engine's (float64)."""
    offload, inline = Engine(inline_threshold=4096), Engine(inline_threshold=2**62)
    grads = []
    for engine in (offload, inline):
        x, ws = _attention_inputs()
        await _backward_with(engine, _attention_blocks(x, ws))
        grads.append([t.grad.numpy() for t in (x, *ws)])
    assert offload.statistics().thread_hops == 1
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)
    x, ws = _attention_inputs(B=1, T=4, C=8, seed=3)
    assert gradcheck(lambda t: _attention_blocks(t, ws, heads=2), (x,))


async def test_no_split_while_other_processes_leave_one_core(monkeypatch, blas_single, restore_engine):
    """BLAS single-threaded (several calls in flight) would split a linear layer into
    one kernel per gradient, on two workers at once. With one core left by other
    processes (Note [Other processes' load]) the parts would only take turns, and the
    split would end the worker chain: the blocks run whole, in one chain."""
    from asyncgrad.autograd.runtime.blas import BlasThreads

    hops = {}
    for free in (2, 1):
        monkeypatch.setattr(BlasThreads, "free_cores", property(lambda self, free=free: free))
        engine = Engine(inline_threshold=4096)
        x, ws = _attention_inputs()
        await _backward_with(engine, _attention_blocks(x, ws))
        hops[free] = engine.statistics().thread_hops
        got = [t.grad.numpy() for t in (x, *ws)]
        x, ws = _attention_inputs()
        await _backward_with(Engine(inline_threshold=2**62), _attention_blocks(x, ws))
        for a, t in zip(got, (x, *ws)):
            if free == 1:
                np.testing.assert_array_equal(a, t.grad.numpy())
            else:  # a weight fed by two split products is staged in the order their parts
                # arrive (Note [Input gradient first]): its sum's last bits follow the race
                np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert hops[2] > 1  # split products: each part a hop, and the chains end at them
    assert hops[1] == 1
