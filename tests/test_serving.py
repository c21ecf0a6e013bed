"""asyncgrad.serving.GradientBatcher (API.md §10): every answer checked against one
backward per request (float64), on asyncio and trio. Batches are formed by ``max_rows``
or by gates the test opens (an async ``loss_fn`` waiting on an Event), never by the
clock: every batcher here has ``max_wait=60``."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import nn, serving
from asyncgrad.nn import functional as F

BACKENDS = ["asyncio", "trio"]
WAIT = 60.0  # max_wait of every batcher here: batches start by max_rows or at a gate


def run(backend, fn, *args):
    return anyio.run(fn, *args, backend=backend)


def mlp():
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def requests(sizes, features=4, classes=3, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n, features)), rng.integers(0, classes, n)) for n in sizes]


def ce_loss(model):
    def loss_fn(x, y):
        return F.cross_entropy(model(x), y, reduction="none")
    return loss_fn


async def submit_all(batcher, reqs, outcomes, priorities=None):
    """Each request submitted by its own task, in list order (each joins the queue before
    the next task starts: trio shuffles the tasks it starts together); its answer or its
    error in ``outcomes``."""
    async def client(i, arrays):
        try:
            outcomes[i] = await batcher.submit(*arrays, priority=0 if priorities is None else priorities[i])
        except (ValueError, RuntimeError, FloatingPointError, KeyError) as e:
            outcomes[i] = e

    async with anyio.create_task_group() as tg:
        for i, arrays in enumerate(reqs):
            seen = batcher.statistics()
            tg.start_soon(client, i, arrays)
            while batcher.statistics().requests + batcher.statistics().failed == seen.requests + seen.failed:
                await anyio.sleep(0)  # (submit queues or refuses a request before its first await)


async def alone(loss_of, arrays, params, grad_inputs=(0,)):
    """One backward per request: its loss, input gradients and parameter gradients."""
    tensors = [ag.tensor(a, requires_grad=i in grad_inputs) for i, a in enumerate(arrays)]
    loss = loss_of(*tensors).mean()
    grads = await ag.grad(loss, [tensors[i] for i in grad_inputs] + list(params), allow_unused=True,
                          materialize_grads=True)
    k = len(grad_inputs)
    return loss.item(), [g.numpy() for g in grads[:k]], [g.numpy() for g in grads[k:]]


def same(tensors, others):
    return len(tensors) == len(others) and all(t is o for t, o in zip(tensors, others))


def grads_of(params):
    return [None if p.grad is None else p.grad.numpy().copy() for p in params]


def assert_answer(answer, expected, per_request=False):
    loss, input_grads, param_grads = expected
    assert answer.loss == pytest.approx(loss, rel=1e-12, abs=1e-14)
    assert len(answer.input_grads) == len(input_grads)
    for a, e in zip(answer.input_grads, input_grads):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-13)
    if per_request:
        assert len(answer.param_grads) == len(param_grads)
        for a, e in zip(answer.param_grads, param_grads):
            np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-13)
    else:
        assert answer.param_grads is None


def assert_sum(accumulated, expected_each):
    for i, got in enumerate(accumulated):
        want = sum(e[2][i] for e in expected_each)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)


# --- answers equal one backward per request ------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_row_counts_one_batch_equal_one_backward_each(backend):
    async def main():
        model = mlp()
        loss_fn = ce_loss(model)
        reqs = requests([1, 3, 2, 4])
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=10, max_wait=WAIT, grad_inputs=(0,)) as b:
            await submit_all(b, reqs, outcomes)
        stats = b.statistics()
        assert (stats.requests, stats.batches, stats.rows, stats.retries, stats.failed) == (4, 1, 10, 0, 0)
        params = list(model.parameters())
        assert same(b.params, params)  # params=None: the model's, in parameters() order
        accumulated = grads_of(params)
        model.zero_grad()
        expected = [await alone(loss_fn, r, params) for r in reqs]
        for i, e in enumerate(expected):
            assert_answer(outcomes[i], e)
            assert outcomes[i].rows == len(reqs[i][0])
        assert_sum(accumulated, expected)  # .grad is the sum of the per-request gradients

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_of_recurring_and_changing_layouts_each_equal_one_backward_each(backend):
    """A pass reuses the layout (row counts) of an earlier batch: batches of sizes
    [2, 3], [3, 2], [2, 3] again and [5] are each answered as if every request ran alone,
    and ``.grad`` is the sum over all of them."""
    async def main():
        model = mlp()
        loss_fn = ce_loss(model)
        sizes = [2, 3, 3, 2, 2, 3, 5]
        reqs = requests(sizes, seed=4)
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=5, max_wait=WAIT, grad_inputs=(0,)) as b:
            await submit_all(b, reqs, outcomes)
        stats = b.statistics()
        assert (stats.requests, stats.batches, stats.rows, stats.retries) == (7, 4, 20, 0)
        params = list(model.parameters())
        accumulated = grads_of(params)
        model.zero_grad()
        expected = [await alone(loss_fn, r, params) for r in reqs]
        for i, e in enumerate(expected):
            assert_answer(outcomes[i], e)
            assert outcomes[i].rows == sizes[i]
        assert_sum(accumulated, expected)

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("accumulate", [True, False])
def test_a_loss_fn_returning_its_input_gets_its_gradient(backend, accumulate):
    """``loss_fn`` may return a tensor it was given (a leaf, no graph of its own): each
    request's loss is the mean of its rows, its input gradient ``1 / rows`` per row."""
    async def main():
        rng = np.random.default_rng(2)
        reqs = [(rng.standard_normal(n),) for n in (1, 3, 4)]
        outcomes = {}
        async with serving.GradientBatcher(lambda x: x, max_rows=8, max_wait=WAIT, grad_inputs=(0,),
                                           accumulate=accumulate) as b:
            await submit_all(b, reqs, outcomes)
        assert b.statistics().batches == 1 and b.params == ()
        for i, (x,) in enumerate(reqs):
            assert outcomes[i].loss == pytest.approx(x.mean(), rel=1e-12)
            np.testing.assert_array_equal(outcomes[i].input_grads[0], np.full(len(x), 1 / len(x)))

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_request", [False, True])
def test_a_batch_graph_is_freed_without_the_cyclic_gc(backend, per_request):
    """Once a batch is answered nothing holds its graph: with the cyclic GC off (as a
    latency-minded service may run) every tensor of the batch's forward (the layers'
    outputs, the row losses) is freed by reference counting alone, the per-sample
    rules' recording of the layers' calls included."""
    import gc
    import weakref

    async def main():
        model = mlp()
        made = []  # weak references to the batches' tensors
        for layer in model:
            layer.register_forward_hook(lambda m, args, out: made.append(weakref.ref(out)))

        def loss_fn(x, y):
            out = F.cross_entropy(model(x), y, reduction="none")
            made.append(weakref.ref(out))
            return out

        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=3, max_wait=WAIT, grad_inputs=(0,),
                                           per_request_param_grads=per_request) as b:
            await submit_all(b, requests([1, 2, 3]), outcomes)
        assert b.statistics().batches == 2 and len(made) == 2 * (len(model) + 1)
        assert [ref() for ref in made] == [None] * len(made)

    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        run(backend, main)
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_loss_fn_accumulate_false_and_explicit_params(backend):
    async def main():
        model = mlp()
        params = [model[2].weight, model[0].bias]

        async def loss_fn(x, y):
            await anyio.sleep(0)
            return F.cross_entropy(model(x), y, reduction="none")

        reqs = requests([2, 1, 3])
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=6, max_wait=WAIT, grad_inputs=(0,), params=params,
                                           accumulate=False, per_request_param_grads=True) as b:
            await submit_all(b, reqs, outcomes)
        assert all(p.grad is None for p in model.parameters())  # accumulate=False: .grad untouched
        assert b.statistics().batches == 1
        for i, r in enumerate(reqs):
            assert_answer(outcomes[i], await alone(ce_loss(model), r, params), per_request=True)

    run(backend, main)


class Tokens(nn.Module):
    """Every layer with a per-sample rule: Embedding (with padding_idx), Linear on 3-d
    input, LayerNorm, Linear without bias; each request's rows are (tokens, features)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4, padding_idx=0)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3, bias=False)

    def forward(self, x, tokens):
        h = self.norm(self.proj(x + self.emb(tokens))).tanh()
        return self.head(h).mean(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_request_param_grads_for_every_layer_with_a_rule(backend):
    async def main():
        model = Tokens()

        def loss_fn(x, tokens, y):
            return F.cross_entropy(model(x, tokens), y, reduction="none")

        rng = np.random.default_rng(3)
        reqs = [(rng.standard_normal((n, 2, 4)), rng.integers(0, 6, (n, 2)), rng.integers(0, 3, n))
                for n in (2, 1, 3)]
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=6, max_wait=WAIT, grad_inputs=(0,),
                                           per_request_param_grads=True) as b:
            await submit_all(b, reqs, outcomes)
        stats = b.statistics()
        assert (stats.batches, stats.per_request_backwards) == (1, 0)  # all by rules, in the one pass
        params = list(model.parameters())
        assert same(b.params, params)
        accumulated = grads_of(params)
        model.zero_grad()
        expected = [await alone(loss_fn, r, params) for r in reqs]
        for i, e in enumerate(expected):
            assert_answer(outcomes[i], e, per_request=True)
        assert_sum(accumulated, expected)

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("large", [False, True])
def test_parameters_without_a_rule_fall_back_to_one_backward_each(backend, large, monkeypatch):
    """A free parameter (no layer owns it) and a Linear weight also used outside its layer:
    both are answered by one backward per request, the covered ones by rules; so too when
    the batch is large (limits set to 0: the batch's own backward runs on a worker thread,
    Note [Off-loop backward], the rules' hooks in it)."""
    from asyncgrad.serving import batched_pass

    if large:
        monkeypatch.setattr(batched_pass, "OFFLOAD_FORWARD_ABOVE", 0)
        monkeypatch.setattr(batched_pass, "OFFLOAD_CHECKS_ABOVE", 0)

    async def main():
        model = mlp()
        scale = ag.tensor(np.array([1.5, -0.5, 2.0]), requires_grad=True)

        def loss_fn(x, y):
            logits = model(x) * scale + (model[0].weight ** 2).sum() * 0.1
            return F.cross_entropy(logits, y, reduction="none")

        reqs = requests([2, 3, 1])
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=6, max_wait=WAIT, grad_inputs=(0,),
                                           per_request_param_grads=True) as b:
            await submit_all(b, reqs, outcomes)
        assert b.statistics().per_request_backwards == 3  # one backward per request for this batch
        params = list(b.params)
        assert same(params, [*model.parameters(), scale])
        accumulated = grads_of(params)
        for p in params:
            p.grad = None
        expected = [await alone(loss_fn, r, params) for r in reqs]
        for i, e in enumerate(expected):
            assert_answer(outcomes[i], e, per_request=True)
        assert_sum(accumulated, expected)

    run(backend, main)


# --- batch formation ---------------------------------------------------------------------
class Gate:
    """An async loss_fn that records each batch's requests (by the first feature of each
    row) and waits at ``hold`` on its first call until the test opens it."""

    def __init__(self, model):
        self.model = model
        self.calls = []
        self.started = anyio.Event()
        self.open = anyio.Event()

    async def __call__(self, x, y):
        self.calls.append(sorted(set(x.numpy()[:, 0].tolist())))
        if len(self.calls) == 1:
            self.started.set()
            await self.open.wait()
        return F.cross_entropy(self.model(x), y, reduction="none")


def tagged(tag, rows=1, seed=0):
    x, y = requests([rows], seed=seed)[0]
    x[:, 0] = tag
    return x, y


@pytest.mark.parametrize("backend", BACKENDS)
def test_priority_order_and_the_next_batch_fills_while_one_runs(backend):
    async def main():
        gate = Gate(mlp())
        outcomes = {}
        async with serving.GradientBatcher(gate, max_rows=1, max_wait=WAIT) as b, \
                anyio.create_task_group() as tg:
            tg.start_soon(submit_all, b, [tagged(100)], outcomes)
            await gate.started.wait()  # the first batch runs; the others queue meanwhile
            for n, (tag, priority) in enumerate([(0, 0), (5, 5), (1, 1), (5.5, 5)]):
                tg.start_soon(submit_all, b, [tagged(tag)], {}, [priority])
                while b.statistics().requests < n + 2:  # (one at a time: a known arrival order)
                    await anyio.sleep(0)
            gate.open.set()
        assert gate.calls == [[100], [5], [5.5], [1], [0]]  # higher priority first, then arrival order
        assert b.statistics().batches == 5

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fractional_priority_is_answered(backend):
    """Requests order by any finite priority; the batch's backward gets an int one (the
    engine's ``priority=`` takes ints only)."""
    async def main():
        model = mlp()
        reqs = requests([2, 3])
        outcomes = {}
        async with serving.GradientBatcher(ce_loss(model), max_rows=5, max_wait=WAIT, grad_inputs=(0,)) as b:
            await submit_all(b, reqs, outcomes, priorities=[2.5, -0.5])
        for i, (x, y) in enumerate(reqs):
            loss, grads, _ = await alone(ce_loss(model), (x, y), list(model.parameters()))
            assert outcomes[i].loss == pytest.approx(loss, rel=1e-12)
            np.testing.assert_allclose(outcomes[i].input_grads[0], grads[0], rtol=1e-10)

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_different_trailing_shapes_or_dtypes_go_to_different_batches(backend):
    async def main():
        shapes = []

        def loss_fn(x):
            shapes.append((x.shape, x.dtype))
            return (x.reshape(x.shape[0], -1) ** 2).sum(1)

        rng = np.random.default_rng(0)
        reqs = [rng.standard_normal((2, 3)), rng.standard_normal((2, 4)), rng.standard_normal((2, 3)),
                rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((2, 4)),
                rng.standard_normal((2, 4)).astype(np.float32)]
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=4, max_wait=WAIT, grad_inputs=(0,)) as b:
            await submit_all(b, [(r,) for r in reqs], outcomes)
        assert sorted((s, str(d)) for s, d in shapes) == [
            ((4, 3), "float64"), ((4, 4), "float32"), ((4, 4), "float64")]
        for i, r in enumerate(reqs):
            np.testing.assert_allclose(outcomes[i].input_grads[0], 2 * r / 2, rtol=1e-6)

    run(backend, main)


# --- bad input ---------------------------------------------------------------------------
BAD = [
    ("wrong number of arrays", lambda x, y: (x,), "loss_fn takes 2 arrays (x, y), got 1"),
    ("an argument without rows", lambda x, y: (x[:0], y[:0]), "argument 0 (x) has no rows"),
    ("a 0-d argument", lambda x, y: (x, np.int64(1)), "argument 1 (y) has no rows"),
    ("different row counts", lambda x, y: (x, y[:1]), "argument 1 (y) has 1 rows, but argument 0 (x) has 2"),
    ("a non-numeric array", lambda x, y: (x, np.array(["a", "b"])), "argument 1 (y) is not a numeric array"),
    ("an object array", lambda x, y: (x.astype(object), y), "argument 0 (x) is not a numeric array"),
    ("an integer grad input", lambda x, y: (x.astype(np.int64), y), "argument 0 (x) is in grad_inputs"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("kind", "spoil", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_alone_before_joining(backend, kind, spoil, message):
    async def main():
        model = mlp()
        loss_fn = ce_loss(model)
        good = requests([1, 1])
        bad = spoil(*requests([2], seed=9)[0])
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=2, max_wait=WAIT, grad_inputs=(0,)) as b:
            await submit_all(b, [good[0], bad, good[1]], outcomes)
        assert isinstance(outcomes[1], ValueError) and message in str(outcomes[1]), outcomes[1]
        stats = b.statistics()
        assert (stats.requests, stats.failed, stats.batches, stats.retries) == (2, 1, 1, 0)
        accumulated = grads_of(model.parameters())
        model.zero_grad()
        expected = [await alone(loss_fn, r, list(model.parameters())) for r in good]
        assert_answer(outcomes[0], expected[0])
        assert_answer(outcomes[2], expected[1])
        assert_sum(accumulated, expected)

    run(backend, main)


# --- isolation inside a pass -------------------------------------------------------------
def guarded(model):
    """A loss whose pass raises for a request with a 999, and has an infinite gradient
    (with a finite loss) for a row whose last feature is -5: sqrt(x3 + 5 + (c - 1)) at 0."""
    c = ag.tensor(1.0, requires_grad=True)

    def loss_fn(x, y):
        if (x.numpy() == 999).any():
            raise KeyError("row 999 refused")
        return F.cross_entropy(model(x), y, reduction="none") + (x[:, 3] + 5.0 + (c - 1.0)) ** 0.5
    return loss_fn, c


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["raises", "nan loss", "inf gradient"])
def test_a_faulty_request_fails_alone_among_good_ones(backend, fault):
    async def main():
        model = mlp()
        loss_fn, c = guarded(model)
        params = [*model.parameters(), c]
        reqs = requests([2, 1, 2, 1], seed=4)
        x, y = requests([2], seed=5)[0]
        if fault == "raises":
            x[1, 2] = 999
        elif fault == "nan loss":
            x[0, 1] = np.nan
        else:
            x[1, 3] = -5.0
        reqs.insert(2, (x, y))
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=8, max_wait=WAIT) as b:
            await submit_all(b, reqs, outcomes)
        bad = outcomes.pop(2)
        stats = b.statistics()
        if fault == "raises":
            assert isinstance(bad, KeyError) and "row 999 refused" in str(bad)
            assert stats.retries == 4  # 5 -> [0 1] [2 3 4] -> [2] [3 4]
        elif fault == "nan loss":
            assert isinstance(bad, FloatingPointError) and "loss is not finite" in str(bad)
            assert stats.retries == 1  # found before the backward: the others rerun once
        else:
            assert isinstance(bad, FloatingPointError) and "gradient" in str(bad) and "not finite" in str(bad)
            assert stats.retries == 4  # found by splitting the batch
        assert (stats.requests, stats.failed, stats.batches) == (5, 1, 1)
        accumulated = grads_of(params)
        for p in params:
            p.grad = None
        good = [r for i, r in enumerate(reqs) if i != 2]
        expected = [await alone(loss_fn, r, params, grad_inputs=()) for r in good]
        for i, e in zip([0, 1, 3, 4], expected):
            assert_answer(outcomes[i], e)
        assert_sum(accumulated, expected)  # nothing of the failed request reached .grad

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_non_finite_input_gradient_fails_its_request_without_a_split(backend):
    async def main():
        model = mlp()
        loss_fn, c = guarded(model)
        params = [*model.parameters(), c]
        x, y = requests([1], seed=5)[0]
        x[0, 3] = -5.0
        reqs = [*requests([1, 2], seed=6), (x, y)]
        outcomes = {}
        async with serving.GradientBatcher(loss_fn, max_rows=4, max_wait=WAIT, grad_inputs=(0,)) as b:
            await submit_all(b, reqs, outcomes)
        assert isinstance(outcomes[2], FloatingPointError)
        assert "gradient with respect to argument 0 (x) is not finite" in str(outcomes[2])
        assert b.statistics().retries == 1
        accumulated = grads_of(params)
        for p in params:
            p.grad = None
        expected = [await alone(loss_fn, r, params) for r in reqs[:2]]
        assert_answer(outcomes[0], expected[0])
        assert_answer(outcomes[1], expected[1])
        assert_sum(accumulated, expected)

    run(backend, main)


# --- cancellation and closing ------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_cancelled_while_waiting_leaves_the_queue(backend):
    async def main():
        model = mlp()
        loss_fn = ce_loss(model)
        reqs = requests([2, 1])
        outcomes, cancelled = {}, {}
        async with serving.GradientBatcher(loss_fn, max_rows=2, max_wait=WAIT, grad_inputs=(0,)) as b:
            with anyio.CancelScope() as waiting:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(submit_all, b, reqs[1:], cancelled)
                    while b.statistics().requests < 1:
                        await anyio.sleep(0)
                    waiting.cancel()  # one row waiting of two: no batch has started
            assert b.statistics().cancelled == 1 and b.statistics().batches == 0
            await submit_all(b, reqs[:1], outcomes)  # 2 rows: a batch without the withdrawn row
        stats = b.statistics()
        assert (stats.requests, stats.cancelled, stats.batches, stats.rows, stats.failed) == (2, 1, 1, 2, 0)
        assert not cancelled
        accumulated = grads_of(model.parameters())
        model.zero_grad()
        expected = [await alone(loss_fn, reqs[0], list(model.parameters()))]
        assert_answer(outcomes[0], expected[0])
        assert_sum(accumulated, expected)

    run(backend, main)


class SlowBackward(ag.autograd.Function):
    """Identity whose backward waits at a gate on its first call."""

    started = None
    release = None

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    async def backward(ctx, g):
        if not SlowBackward.started.is_set():
            SlowBackward.started.set()
            await SlowBackward.release.wait()
        return g


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_request_cancelled_while_its_batch_runs_adds_nothing(backend, where):
    async def main():
        model = mlp()
        gate = Gate(model)
        SlowBackward.started, SlowBackward.release = anyio.Event(), anyio.Event()
        if where == "forward":
            loss_fn, started, release = gate, gate.started, gate.open
        else:
            def loss_fn(x, y):
                return F.cross_entropy(SlowBackward.apply(model(x)), y, reduction="none")
            started, release = SlowBackward.started, SlowBackward.release
        reqs = [tagged(1, rows=2, seed=1), tagged(2, rows=1, seed=2)]
        outcomes, second = {}, {}
        async with serving.GradientBatcher(loss_fn, max_rows=3, max_wait=WAIT, grad_inputs=(0,)) as b:
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as first:
                    async with anyio.create_task_group() as clients:
                        clients.start_soon(submit_all, b, reqs[:1], outcomes)
                        tg.start_soon(submit_all, b, reqs[1:], second)
                        await started.wait()  # both requests are in the running batch
                        first.cancel()
                release.set()
        stats = b.statistics()
        assert (stats.batches, stats.cancelled, stats.retries, stats.failed) == (1, 1, 1, 0)
        assert not outcomes
        accumulated = grads_of(model.parameters())
        model.zero_grad()
        expected = [await alone(ce_loss(model), reqs[1], list(model.parameters()))]
        assert_answer(second[0], expected[0])
        assert_sum(accumulated, expected)  # the cancelled request added nothing

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_closing_fails_waiting_requests_and_submit_outside_raises(backend):
    async def main():
        model = mlp()
        outcomes = {}
        b = serving.GradientBatcher(ce_loss(model), max_rows=100, max_wait=WAIT)
        with pytest.raises(RuntimeError, match="outside `async with"):
            await b.submit(*requests([1])[0])
        async with anyio.create_task_group() as tg:
            async with b:
                tg.start_soon(submit_all, b, requests([1, 2]), outcomes)
                while b.statistics().requests < 2:
                    await anyio.sleep(0)
        assert all(isinstance(outcomes[i], RuntimeError) and "closed" in str(outcomes[i]) for i in (0, 1))
        assert b.statistics().failed == 2 and b.statistics().batches == 0
        assert all(p.grad is None for p in model.parameters())
        with pytest.raises(RuntimeError, match="outside `async with"):
            await b.submit(*requests([1])[0])

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_large_plain_batch_runs_its_backward_off_the_loop_with_the_same_answers(backend, accumulate, asynchronous,
                                                                                  monkeypatch):
    """Note [Off-loop backward]: past the size limit (set to 0 here) a plain graph's
    backward runs on a worker thread (with the forward of a sync ``loss_fn``, after that
    of an async one), a graph with a hook on the loop; the answers and ``.grad`` equal
    one backward per request either way."""
    import threading

    from asyncgrad.serving import batched_pass

    monkeypatch.setattr(batched_pass, "OFFLOAD_FORWARD_ABOVE", 0)

    async def main():
        loop_thread = threading.get_ident()
        for hooked in (False, True):
            model = mlp()
            seen: list[int] = []
            if hooked:  # (a hook is code of the user's: the backward stays on the loop)
                model[2].weight.register_hook(lambda g, seen=seen: seen.append(threading.get_ident()))
            reqs = requests([1, 3, 2], seed=5)
            outcomes = {}

            async def async_loss(x, y, model=model):
                await anyio.sleep(0)
                return ce_loss(model)(x, y)

            loss_fn = async_loss if asynchronous else ce_loss(model)
            with ag.autograd.profiler.profile() as prof:
                async with serving.GradientBatcher(loss_fn, max_rows=6, max_wait=WAIT, grad_inputs=(0,),
                                                   accumulate=accumulate) as b:
                    await submit_all(b, reqs, outcomes)
            threads = {e.thread_id for e in prof.events if e.name == "NllLossBackward0"}
            assert len(threads) == 1 and (threading.get_native_id() in threads) == hooked
            assert seen == ([loop_thread] if hooked else [])
            params = list(model.parameters())
            accumulated = grads_of(params)
            model.zero_grad()
            expected = [await alone(ce_loss(model), r, params) for r in reqs]
            for i, e in enumerate(expected):
                assert_answer(outcomes[i], e)
            if accumulate:
                assert_sum(accumulated, expected)
            else:
                assert all(g is None for g in accumulated)

    run(backend, main)


class Stop(Exception):
    """Leaves a batcher's ``async with`` by an error (its task is cancelled)."""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("accumulate", [True, False])
def test_a_batcher_left_by_an_error_while_its_backward_runs_off_the_loop_commits_nothing(
        backend, accumulate, monkeypatch):
    """A plain graph's backward runs on a worker thread (Note [Off-loop backward]); the
    batcher left by an error while that backward checks its gradients (before its commit)
    commits nothing, and the batch's requests fail with RuntimeError."""
    import threading

    from asyncgrad.serving import batched_pass

    checking, release = threading.Event(), threading.Event()
    check = batched_pass.BatchedPass._check

    def slow_check(self, *args):
        checking.set()
        release.wait(30)
        return check(self, *args)

    monkeypatch.setattr(batched_pass, "OFFLOAD_FORWARD_ABOVE", 0)  # (every batch is large)
    monkeypatch.setattr(batched_pass.BatchedPass, "_check", slow_check)

    async def main():
        model = mlp()
        outcomes = {}
        left_by = None
        async with anyio.create_task_group() as clients:
            try:
                async with serving.GradientBatcher(ce_loss(model), max_rows=3, max_wait=WAIT, grad_inputs=(0,),
                                                   accumulate=accumulate) as b:
                    clients.start_soon(submit_all, b, requests([1, 2]), outcomes)
                    while not checking.is_set():
                        await anyio.sleep(0.001)
                    threading.Timer(0.05, release.set).start()  # (after the batcher's task is cancelled)
                    raise Stop
            except BaseException as e:  # (the batcher's task group may wrap it in a group)
                left_by = e
        while len(getattr(left_by, "exceptions", ())) == 1:
            left_by = left_by.exceptions[0]
        assert isinstance(left_by, Stop)
        assert sorted(outcomes) == [0, 1]
        assert all(isinstance(outcomes[i], RuntimeError) and "closed while" in str(outcomes[i]) for i in (0, 1))
        assert b.statistics().batches == 1
        assert all(p.grad is None for p in model.parameters())

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_cancelled_while_its_backward_runs_off_the_loop_adds_nothing(backend, monkeypatch):
    """Withdrawn while its batch's off-loop backward checks the gradients (before the
    commit): the batch commits nothing, the other request is rerun alone and answered."""
    import threading

    from asyncgrad.serving import batched_pass

    checking, release = threading.Event(), threading.Event()
    check = batched_pass.BatchedPass._check

    def slow_check(self, *args):
        if not checking.is_set():  # (the first pass only)
            checking.set()
            release.wait(30)
        return check(self, *args)

    monkeypatch.setattr(batched_pass, "OFFLOAD_FORWARD_ABOVE", 0)  # (every batch is large)
    monkeypatch.setattr(batched_pass.BatchedPass, "_check", slow_check)

    async def main():
        model = mlp()
        reqs = requests([2, 1], seed=3)
        outcomes, second = {}, {}
        async with serving.GradientBatcher(ce_loss(model), max_rows=3, max_wait=WAIT, grad_inputs=(0,)) as b:
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as first:
                    async with anyio.create_task_group() as clients:
                        clients.start_soon(submit_all, b, reqs[:1], outcomes)
                        tg.start_soon(submit_all, b, reqs[1:], second)
                        while not checking.is_set():
                            await anyio.sleep(0.001)
                        first.cancel()
                release.set()
        stats = b.statistics()
        assert (stats.batches, stats.cancelled, stats.retries, stats.failed) == (1, 1, 1, 0)
        assert not outcomes
        accumulated = grads_of(model.parameters())
        model.zero_grad()
        expected = await alone(ce_loss(model), reqs[1], list(model.parameters()))
        assert_answer(second[0], expected)
        assert_sum(accumulated, [expected])

    run(backend, main)


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="max_rows"):
        serving.GradientBatcher(lambda x: x, max_rows=0)
    with pytest.raises(ValueError, match="max_wait"):
        serving.GradientBatcher(lambda x: x, max_wait=float("nan"))
    with pytest.raises(ValueError, match="grad_inputs"):
        serving.GradientBatcher(lambda x: x, grad_inputs=(-1,))
    with pytest.raises(ValueError, match="params"):
        serving.GradientBatcher(lambda x: x, params=[ag.zeros(2)])
    with pytest.raises(TypeError, match="loss_fn"):
        serving.GradientBatcher(3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_large_batch_runs_its_forward_and_checks_off_the_loop(backend, monkeypatch):
    """Past the size limits (set to 0 here) the forward, the per-sample rules and the
    checks run on a worker thread, in the batcher's context: grad mode on, the layers'
    calls recorded; the answers are the same."""
    import threading

    from asyncgrad.serving import batched_pass

    monkeypatch.setattr(batched_pass, "OFFLOAD_FORWARD_ABOVE", 0)
    monkeypatch.setattr(batched_pass, "OFFLOAD_CHECKS_ABOVE", 0)

    async def main():
        model = mlp()
        seen = []

        def loss_fn(x, y):
            seen.append((threading.get_ident(), ag.is_grad_enabled()))
            return F.cross_entropy(model(x), y, reduction="none")

        reqs = requests([2, 3])
        outcomes = {}
        with ag.no_grad():  # (the batcher's forward records its graph whatever the caller's mode)
            async with serving.GradientBatcher(loss_fn, max_rows=5, max_wait=WAIT, grad_inputs=(0,),
                                               per_request_param_grads=True) as b:
                await submit_all(b, reqs, outcomes)
        assert seen and all(t != threading.get_ident() and enabled for t, enabled in seen)
        assert b.statistics().per_request_backwards == 0
        params = list(model.parameters())
        accumulated = grads_of(params)
        model.zero_grad()
        expected = [await alone(loss_fn, r, params) for r in reqs]
        for i, e in enumerate(expected):
            assert_answer(outcomes[i], e, per_request=True)
        assert_sum(accumulated, expected)

    run(backend, main)


class Image(nn.Module):
    """The image layers with per-sample rules (when this ag.nn has them): Conv2d with
    stride, padding and groups, Conv1d with dilation and reflect padding, GroupNorm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2)
        self.norm = nn.GroupNorm(2, 4)
        self.line = nn.Conv1d(4, 3, 2, dilation=2, padding=1, padding_mode="reflect")
        self.head = nn.Linear(3, 3)

    def forward(self, x):
        h = self.norm(self.conv(x)).tanh()  # (rows, 4, 3, 3)
        h = self.line(h.reshape(h.shape[0], 4, 9))  # (rows, 3, 8)
        return self.head(h.mean(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_request_param_grads_for_the_image_layers(backend):
    async def main():
        model = Image()

        def loss_fn(x, y):
            return F.cross_entropy(model(x), y, reduction="none")

        rng = np.random.default_rng(5)
        reqs = [(rng.standard_normal((n, 2, 5, 5)), rng.integers(0, 3, n)) for n in (2, 1, 2)]
        for equal in (False, True):  # unequal row counts, then equal ones (one batched contraction)
            batch = reqs if not equal else [reqs[0], reqs[2]]
            outcomes = {}
            async with serving.GradientBatcher(loss_fn, max_rows=sum(len(r[0]) for r in batch), max_wait=WAIT,
                                               grad_inputs=(0,), accumulate=False,
                                               per_request_param_grads=True) as b:
                await submit_all(b, batch, outcomes)
            assert (b.statistics().batches, b.statistics().per_request_backwards) == (1, 0)
            params = list(model.parameters())
            assert same(b.params, params)
            for i, r in enumerate(batch):
                assert_answer(outcomes[i], await alone(loss_fn, r, params), per_request=True)

    run(backend, main)
