"""LSTM, GRU, RNN, LSTMCell and GRUCell: PyTorch's outputs, gradients, state_dict keys and
errors (torch as the oracle, float64), gradcheck and gradgradcheck of the recurrence."""

import itertools

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.nn.rnn import gru_layer, lstm_layer, rnn_layer

T, B, I, H = 4, 3, 5, 6


def _copy_weights(theirs, mine):
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def _close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# (num_layers, bidirectional, batch_first, with h0): every pair of settings appears
SETTINGS = [(1, False, False, False), (1, True, True, True), (2, False, True, True), (2, True, False, True),
            (2, True, True, False), (1, False, True, False), (2, False, False, False)]
GRID = [(kind, *s) for kind, s in itertools.product(("LSTM", "GRU"), SETTINGS)]
GRID += [("RNN", *s) for s in SETTINGS[:3]]


@pytest.mark.parametrize("kind, layers, bidirectional, batch_first, with_h0", GRID)
def test_forward_and_every_gradient_equal_torch(kind, layers, bidirectional, batch_first, with_h0):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(I, H, num_layers=layers, bidirectional=bidirectional,
                                     batch_first=batch_first).double()
    mine = getattr(ag.nn, kind)(I, H, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    assert list(mine.state_dict()) == list(theirs.state_dict())
    _copy_weights(theirs, mine)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, I) if batch_first else (T, B, I))
    d = 2 if bidirectional else 1
    states = [rng.standard_normal((layers * d, B, H)) for _ in range(2 if kind == "LSTM" else 1)]
    tx = torch.tensor(x, requires_grad=True)
    ax = ag.tensor(x, requires_grad=True)
    ts = [torch.tensor(s, requires_grad=True) for s in states]
    as_ = [ag.tensor(s, requires_grad=True) for s in states]
    if kind == "LSTM":
        t_out, (t_h, t_c) = theirs(tx, tuple(ts) if with_h0 else None)
        a_out, (a_h, a_c) = mine(ax, tuple(as_) if with_h0 else None)
        t_outs, a_outs = (t_out, t_h, t_c), (a_out, a_h, a_c)
    else:
        t_out, t_h = theirs(tx, ts[0] if with_h0 else None)
        a_out, a_h = mine(ax, as_[0] if with_h0 else None)
        t_outs, a_outs = (t_out, t_h), (a_out, a_h)
    for t, a in zip(t_outs, a_outs):
        assert tuple(t.shape) == a.shape
        _close(a.numpy(), t.detach().numpy())
    grads = [rng.standard_normal(a.shape) for a in a_outs]
    torch.autograd.backward(t_outs, [torch.tensor(g) for g in grads])
    ag.backward_sync(list(a_outs), [ag.tensor(g) for g in grads])
    _close(ax.grad.numpy(), tx.grad.numpy())
    if with_h0:
        for t, a in zip(ts, as_):
            _close(a.grad.numpy(), t.grad.numpy())
    for (name, p), (name_, q) in zip(theirs.named_parameters(), mine.named_parameters()):
        assert name == name_
        _close(q.grad.numpy(), p.grad.numpy())


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_unbatched_input_no_bias_and_torch_init_range(kind):
    torch = pytest.importorskip("torch")
    extra = {"nonlinearity": "relu"} if kind == "RNN" else {}
    theirs = getattr(torch.nn, kind)(I, H, bias=False, **extra).double()
    mine = getattr(ag.nn, kind)(I, H, bias=False, **extra)
    assert list(mine.state_dict()) == list(theirs.state_dict()) == ["weight_ih_l0", "weight_hh_l0"]
    bound = 1 / np.sqrt(H)
    assert all(np.abs(p.numpy()).max() <= bound for p in mine.parameters())
    assert all(p.numpy().std() > bound / 3 for p in mine.parameters())  # drawn, not zeros
    _copy_weights(theirs, mine)
    x = np.random.default_rng(0).standard_normal((T, I))
    t_out = theirs(torch.tensor(x))
    a_out = mine(ag.tensor(x))
    _close(a_out[0].numpy(), t_out[0].detach().numpy())
    assert a_out[0].shape == (T, H)
    t_h = t_out[1][0] if kind == "LSTM" else t_out[1]
    a_h = a_out[1][0] if kind == "LSTM" else a_out[1]
    assert a_h.shape == tuple(t_h.shape) == (1, H)
    _close(a_h.numpy(), t_h.detach().numpy())


def test_dropout_between_layers_only_while_training():
    ag.manual_seed(0)
    lstm = ag.nn.LSTM(I, H, num_layers=2, dropout=0.5)
    x = ag.randn(T, B, I)
    a, _ = lstm(x)
    b, _ = lstm(x)
    assert not np.allclose(a.numpy(), b.numpy())  # a new mask each call
    lstm.eval()
    c, _ = lstm(x)
    d, _ = lstm(x)
    np.testing.assert_array_equal(c.numpy(), d.numpy())
    one = ag.nn.LSTM(I, H, num_layers=1, dropout=0.5)  # nothing between layers to drop
    np.testing.assert_array_equal(one(x)[0].numpy(), one(x)[0].numpy())


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_cells_equal_torch(kind):
    torch = pytest.importorskip("torch")
    theirs = getattr(torch.nn, kind)(I, H).double()
    mine = getattr(ag.nn, kind)(I, H)
    assert list(mine.state_dict()) == list(theirs.state_dict()) == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    _copy_weights(theirs, mine)
    rng = np.random.default_rng(2)
    x, h, c = rng.standard_normal((B, I)), rng.standard_normal((B, H)), rng.standard_normal((B, H))
    tx, th, tc = (torch.tensor(v, requires_grad=True) for v in (x, h, c))
    ax, ah, ac = (ag.tensor(v, requires_grad=True) for v in (x, h, c))
    if kind == "LSTMCell":
        t_out, a_out = theirs(tx, (th, tc)), mine(ax, (ah, ac))
        t_loss = (t_out[0] * t_out[1]).sum() + t_out[0].sum()
        a_loss = (a_out[0] * a_out[1]).sum() + a_out[0].sum()
        leaves = [(tx, ax), (th, ah), (tc, ac)]
    else:
        t_out, a_out = theirs(tx, th), mine(ax, ah)
        t_loss, a_loss = (t_out ** 2).sum(), (a_out ** 2).sum()
        leaves = [(tx, ax), (th, ah)]
    _close(a_loss.item(), t_loss.item())
    t_loss.backward()
    a_loss.backward()
    for t, a in leaves:
        _close(a.grad.numpy(), t.grad.numpy())
    for p, q in zip(theirs.parameters(), mine.parameters()):
        _close(q.grad.numpy(), p.grad.numpy())
    # unbatched, no state given
    one = mine(ag.tensor(x[0]))
    ref = theirs(torch.tensor(x[0]))
    _close((one[0] if kind == "LSTMCell" else one).numpy(),
           (ref[0] if kind == "LSTMCell" else ref).detach().numpy())


def _leaves(rng, *shapes):
    return [ag.tensor(rng.standard_normal(s) * 0.5, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("reverse", [False, True])
def test_lstm_recurrence_gradcheck_and_gradgradcheck(reverse):
    rng = np.random.default_rng(3)
    args = _leaves(rng, (2, 2, 1), (2, 2), (2, 2), (8, 1), (8, 2), (8,), (8,))
    fn = lambda *a: lstm_layer(*a, reverse=reverse)  # noqa: E731
    assert ag.autograd.gradcheck(fn, args)
    assert ag.autograd.gradgradcheck(fn, args)


@pytest.mark.parametrize("reverse", [False, True])
def test_gru_recurrence_gradcheck_and_gradgradcheck(reverse):
    rng = np.random.default_rng(4)
    args = _leaves(rng, (2, 2, 1), (2, 2), (6, 1), (6, 2), (6,), (6,))
    fn = lambda *a: gru_layer(*a, reverse=reverse)  # noqa: E731
    assert ag.autograd.gradcheck(fn, args)
    assert ag.autograd.gradgradcheck(fn, args)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_recurrence_gradcheck_and_gradgradcheck(nonlinearity):
    rng = np.random.default_rng(7)
    args = _leaves(rng, (2, 2, 1), (2, 2), (2, 1), (2, 2), (2,), (2,))
    fn = lambda *a: rnn_layer(*a, reverse=True, nonlinearity=nonlinearity)  # noqa: E731
    assert ag.autograd.gradcheck(fn, args)
    assert ag.autograd.gradgradcheck(fn, args)


def test_lstm_module_gradgradcheck_over_its_input():
    lstm = ag.nn.LSTM(2, 2, bidirectional=True)
    x = ag.tensor(np.random.default_rng(5).standard_normal((3, 1, 2)), requires_grad=True)
    assert ag.autograd.gradgradcheck(lambda x: lstm(x)[0], [x])


def test_one_gradient_needed_takes_the_per_input_rule():
    """Only the input needs a gradient (weights frozen): the single-input rule, not the
    joint one, and it equals the joint one's."""
    lstm = ag.nn.LSTM(I, H)
    x = ag.tensor(np.random.default_rng(6).standard_normal((T, B, I)), requires_grad=True)
    (lstm(x)[0] ** 2).sum().backward()
    both = x.grad.numpy().copy()
    lstm.requires_grad_(False)
    x.grad = None
    (lstm(x)[0] ** 2).sum().backward()
    _close(x.grad.numpy(), both, 1e-13)


def test_errors_name_what_is_wrong():
    lstm = ag.nn.LSTM(I, H, num_layers=2)
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size. Expected 5, got 4"):
        lstm(ag.randn(T, B, 4))
    with pytest.raises(ValueError, match="Expected input to be 2D or 3D, got 4D"):
        lstm(ag.randn(T, B, I, 1))
    with pytest.raises(RuntimeError, match=r"Expected hidden\[0\] size \(2, 3, 6\), got \[1, 3, 6\]"):
        lstm(ag.randn(T, B, I), (ag.zeros(1, B, H), ag.zeros(2, B, H)))
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(1, 3, 6\), got \[2, 3, 6\]"):
        ag.nn.GRU(I, H)(ag.randn(T, B, I), ag.zeros(2, B, H))
    with pytest.raises(ValueError, match="Unknown nonlinearity 'gelu'"):
        ag.nn.RNN(I, H, nonlinearity="gelu")
    with pytest.raises(ValueError, match="dropout should be a number in range"):
        ag.nn.GRU(I, H, dropout=1.5)
    with pytest.raises(NotImplementedError, match="proj_size"):
        ag.nn.LSTM(I, H, proj_size=2)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_concurrent_async_backwards_through_one_lstm_sum_as_one_by_one(backend):
    """Two tasks' backwards through the shared LSTM, interleaved on one loop, accumulate
    what the same two backwards give one after the other."""
    import anyio

    lstm = ag.nn.LSTM(I, H, num_layers=2, bidirectional=True)
    rng = np.random.default_rng(8)
    xs = [ag.tensor(rng.standard_normal((T, B, I))) for _ in range(2)]

    for x in xs:
        (lstm(x)[0] ** 2).sum().backward()
    expected = [p.grad.numpy().copy() for p in lstm.parameters()]
    lstm.zero_grad()

    async def one(x):
        out, (h, c) = lstm(x)
        await anyio.sleep(0)
        await ag.backward((out ** 2).sum())

    async def main():
        async with anyio.create_task_group() as tg:
            for x in xs:
                tg.start_soon(one, x)

    anyio.run(main, backend=backend)
    for p, e in zip(lstm.parameters(), expected):
        _close(p.grad.numpy(), e, 1e-12)
