"""The array-backend seam (Note [One array backend] in asyncgrad/backend.py): the engine
runs a graph whose gradients are another library's arrays (array_api_strict, which has
only the array API standard's names) unchanged, and its core names no numpy."""

import ast
import pathlib

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import Function
from asyncgrad.autograd.graph import record as graph_record
from asyncgrad.autograd.graph.record import record
from asyncgrad.autograd.task import input_buffer
from asyncgrad.ops import elementwise as E
from asyncgrad.ops import linalg as L
from asyncgrad.ops import reductions as R
from asyncgrad.backend import NUMPY, active_backend, use_backend, xp

xs = pytest.importorskip("array_api_strict")
ARRAY = type(xs.asarray(0.0))  # array_api_strict's array type
from asyncgrad.backend_array_api import ArrayApiBackend  # noqa: E402

ENGINE_CORE = ("task", "sched", "runtime")
# (while a test runs, the graph's metadata cache holds numpy's and array_api_strict's
# dtypes side by side: array_api_strict warns when they are compared, and they are unequal)
pytestmark = pytest.mark.filterwarnings("ignore:You are comparing a array_api_strict dtype:UserWarning")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


# --- an MLP written with custom Functions that compute with array_api_strict -----------
def wrap(a):
    assert type(a) is ARRAY  # nothing on the way turned an array into numpy's
    return ag.Tensor(a)


def arr(t):
    """A Tensor's array, checked to be array_api_strict's (a gradient the engine handed)."""
    assert type(t.data) is ARRAY
    return t.data


class Linear(Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return wrap(xs.matmul(x.data, xs.matrix_transpose(w.data)) + b.data)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gd = arr(g)
        # the bias's gradient has the batch axis still: the engine sums it down
        return wrap(xs.matmul(gd, w.data)), wrap(xs.matmul(xs.matrix_transpose(gd), x.data)), g


class ReLU(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return wrap(xs.where(x.data > 0, x.data, xs.zeros_like(x.data)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return wrap(xs.where(x.data > 0, arr(g), xs.zeros_like(g.data)))


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return wrap(x.data * x.data)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return wrap(2.0 * x.data * arr(g))


class Mean(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return wrap(xs.mean(x.data))

    @staticmethod
    def backward(ctx, g):
        n = int(np.prod(ctx.shape))
        return wrap(xs.broadcast_to(arr(g) / n, ctx.shape))  # a read-only view


class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        return wrap(a.data + b.data)

    @staticmethod
    def backward(ctx, g):
        return g, g  # one array on two edges


def mlp_loss(x, w1, b1, w2, b2):
    """``mean(lin(h)^2) + mean(lin(h))`` with ``h = relu(lin(x))``: the second layer's
    weights and ``h`` are used twice, so gradients meet in input buffers and at leaves."""
    h = ReLU.apply(Linear.apply(x, w1, b1))
    return Add.apply(Mean.apply(Square.apply(Linear.apply(h, w2, b2))), Mean.apply(Linear.apply(h, w2, b2)))


def numpy_loss(x, w1, b1, w2, b2):
    """The same MLP with asyncgrad's built-in (numpy) ops."""
    h = ag.relu(x @ w1.T + b1)
    return ((h @ w2.T + b2) ** 2).mean() + (h @ w2.T + b2).mean()


def values():
    rng = np.random.default_rng(3)
    return [rng.standard_normal(s) for s in [(6, 4), (5, 4), (5,), (3, 5), (3,)]]


def leaves_on(backend_arrays, arrays):
    """Leaves that require grad (the input ``x`` too) on numpy or array_api_strict."""
    return [ag.Tensor(xs.asarray(a) if backend_arrays else a, requires_grad=True) for a in arrays]


@pytest.fixture
def array_api():
    with use_backend(ArrayApiBackend(xs)) as backend:
        yield backend
    assert active_backend() is NUMPY
    # the graph's interned (shape, dtype) metadata now holds array_api_strict dtypes,
    # which hash as numpy's and warn when compared with them: later tests start clean
    graph_record._META_CACHE.clear()


def grads_of(ts):
    return [np.asarray(t.grad.data) for t in ts]


@pytest.mark.anyio
@pytest.mark.parametrize("deferred", [False, True], ids=["eager-sums", "deferred-sums"])
async def test_mlp_backward_through_the_engine_on_array_api_strict(array_api, engine, monkeypatch, deferred):
    if deferred:  # every sum of two gradients waits for its consumer (Note [Deferred sums])
        monkeypatch.setattr(input_buffer, "LAZY_SUM_MIN", 1)
    ours = leaves_on(True, values())
    loss = mlp_loss(*ours)
    assert type(loss.data) is ARRAY
    await ag.backward(loss)
    with use_backend(NUMPY):
        ref = leaves_on(False, values())
        await ag.backward(numpy_loss(*ref))
    for t, r in zip(ours, ref):
        assert type(t.grad.data) is ARRAY and t.grad.dtype == xs.float64
        np.testing.assert_allclose(np.asarray(t.grad.data), r.grad.data, rtol=1e-12, atol=1e-14)

    # a second backward adds into the same .grad tensors
    before = [t.grad for t in ours]
    await ag.backward(mlp_loss(*ours))
    for t, g, r in zip(ours, before, ref):
        assert t.grad is g and type(t.grad.data) is ARRAY
        np.testing.assert_allclose(np.asarray(t.grad.data), 2 * r.grad.data, rtol=1e-12, atol=1e-14)


@pytest.mark.anyio
async def test_grad_captures_array_api_strict_gradients(array_api):
    ours = leaves_on(True, values())
    gx, gw1 = await ag.grad(mlp_loss(*ours), [ours[0], ours[1]])
    assert all(t.grad is None for t in ours)  # grad() writes no .grad
    with use_backend(NUMPY):
        ref = leaves_on(False, values())
        rx, rw1 = await ag.grad(numpy_loss(*ref), [ref[0], ref[1]])
    for g, r in [(gx, rx), (gw1, rw1)]:
        assert type(g.data) is ARRAY
        np.testing.assert_allclose(np.asarray(g.data), r.data, rtol=1e-12, atol=1e-14)


@pytest.mark.anyio
async def test_hooks_and_retained_gradients_see_array_api_strict_arrays(array_api):
    ours = leaves_on(True, values())
    seen = []

    def double(g):
        seen.append(type(g.data))
        return wrap(g.data * 2.0)

    ours[1].register_hook(double)
    h = ReLU.apply(Linear.apply(*ours[:3]))
    h.retain_grad()
    await ag.backward(Add.apply(Mean.apply(Square.apply(Linear.apply(h, *ours[3:]))), Mean.apply(h)))
    with use_backend(NUMPY):
        ref = leaves_on(False, values())
        rh = ag.relu(ref[0] @ ref[1].T + ref[2])
        rh.retain_grad()
        await ag.backward(((rh @ ref[3].T + ref[4]) ** 2).mean() + rh.mean())
    assert seen == [ARRAY]
    assert type(h.grad.data) is ARRAY
    np.testing.assert_allclose(np.asarray(h.grad.data), rh.grad.data, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(ours[1].grad.data), 2 * ref[1].grad.data, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(ours[3].grad.data), ref[3].grad.data, rtol=1e-12, atol=1e-14)


def test_blocking_backward_on_array_api_strict(array_api):
    ours = leaves_on(True, values())
    ag.backward_sync(mlp_loss(*ours))
    with use_backend(NUMPY):
        ref = leaves_on(False, values())
        ag.backward_sync(numpy_loss(*ref))
    for g, r in zip(grads_of(ours), ref):
        np.testing.assert_allclose(g, r.grad.data, rtol=1e-12, atol=1e-14)


def test_use_backend_switches_and_restores():
    backend = ArrayApiBackend(xs)
    assert active_backend() is NUMPY and xp.array_type is np.ndarray
    with use_backend(backend) as b:
        assert b is backend and active_backend() is backend and xp.array_type is ARRAY
        assert xp.math is backend.math
    assert active_backend() is NUMPY and xp.array_type is np.ndarray and xp.add_into is NUMPY.add_into


def test_use_backend_refuses_an_incomplete_backend():
    class Half:
        name = "half"
        array_type = list

    with pytest.raises(TypeError, match="Half is not an array backend: it has no math, asarray"):
        use_backend(Half())
    assert active_backend() is NUMPY and xp.array_type is np.ndarray


# --- an MLP of built-in nodes: their rules get the backend's math namespace -------------
def recorded(spec, out, *inputs, **params):
    """A built-in op's node over a forward computed with array_api_strict (the built-in
    forward kernels are numpy's; this is what ``ag.matmul`` and the others do after
    theirs): its derivative rules then run with ``xp.math``, in the engine's fused step."""
    assert type(out) is ARRAY
    return record(spec, inputs, out, params=params or None)


def builtin_mlp_loss(x, w1, b1, w2, b2):
    """``sum(y * y)`` with ``y = relu(x @ w1 + b1) @ w2 + b2``: a product of a tensor
    with itself (Note [A tensor times itself]) and biases broadcast over the batch."""
    h = recorded(L.matmul, xs.matmul(x.data, w1.data), x, w1)
    h = recorded(E.add, h.data + b1.data, h, b1)
    h = recorded(E.relu, xs.where(h.data > 0, h.data, xs.zeros_like(h.data)), h)
    y = recorded(L.matmul, xs.matmul(h.data, w2.data), h, w2)
    y = recorded(E.add, y.data + b2.data, y, b2)
    sq = recorded(E.mul, y.data * y.data, y, y)
    return recorded(R.sum_all, xs.sum(sq.data), sq, dim=None, keepdim=False, shape=sq.shape)


def builtin_numpy_loss(x, w1, b1, w2, b2):
    y = ag.relu(x @ w1 + b1) @ w2 + b2
    return (y * y).sum()


def builtin_values():
    rng = np.random.default_rng(4)
    return [rng.standard_normal(s) for s in [(6, 4), (4, 5), (5,), (5, 3), (3,)]]


@pytest.fixture(params=["inline", "offloaded"])
def engine(request):
    """The default engine, or one that runs every node on its worker threads."""
    if request.param == "inline":
        yield ag.autograd.get_engine()
        return
    previous = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=0))
    try:
        yield ag.autograd.get_engine()
    finally:
        ag.autograd.set_engine(previous)


@pytest.mark.anyio
async def test_builtin_rules_run_on_the_backends_math(array_api, engine):
    ours = leaves_on(True, builtin_values())
    loss = builtin_mlp_loss(*ours)
    assert loss.grad_fn.name() == "SumBackward0"
    await ag.backward(loss)
    with use_backend(NUMPY):
        ref = leaves_on(False, builtin_values())
        await ag.backward(builtin_numpy_loss(*ref))
    for t, r in zip(ours, ref):
        assert type(t.grad.data) is ARRAY
        np.testing.assert_allclose(np.asarray(t.grad.data), r.grad.data, rtol=1e-12, atol=1e-14)


# --- the engine core names no numpy -----------------------------------------------------
def core_files():
    root = pathlib.Path(ag.__file__).parent / "autograd"
    files = sorted(p for part in ENGINE_CORE for p in (root / part).rglob("*.py"))
    assert len(files) > 10
    return files


def numpy_uses(source):
    """Lines of ``source`` that import numpy or name ``np``/``numpy`` in code (comments
    and strings, docstrings included, do not count)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "numpy" for a in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "numpy":
            found.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in ("np", "numpy"):
            found.append(node.lineno)
    return sorted(found)


def test_numpy_uses_finds_imports_and_names_not_words():
    code = 'import numpy as np\nfrom numpy import add\n"""numpy np.add"""\n# np.add\nx = np.add\n'
    assert numpy_uses(code) == [1, 2, 5]


@pytest.mark.parametrize("path", core_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_engine_core_names_no_numpy(path):
    assert numpy_uses(path.read_text()) == [], f"{path} uses numpy itself (Note [One array backend])"
