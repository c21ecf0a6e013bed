"""Anomaly mode (API §8; PyTorch semantics §8.5-8.7, cases 51-54)."""

import asyncio
import contextvars
import warnings

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.tools import anomaly_mode

pytestmark = pytest.mark.filterwarnings(
    "ignore:Anomaly Detection has been enabled", "ignore:Error detected in", "ignore:\n\nPrevious calculation",
)

NAN = float("nan")


def _notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", ()))


# --- the NaN check ------------------------------------------------------------------------

async def test_nan_in_first_output_names_node_and_index():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = ag.tensor([NAN, 1.0], requires_grad=True)
    with ag.autograd.detect_anomaly():
        z = (x * y).sum()
        with pytest.raises(RuntimeError, match=r"^Function 'MulBackward0' returned nan values in its 0th output\.\n"):
            await ag.backward(z)
    assert x.grad is None and y.grad is None  # nothing committed


async def test_nan_in_second_output_says_1th():
    x = ag.tensor([NAN, 1.0], requires_grad=True)  # d(x*y)/dy = x holds the NaN
    y = ag.tensor([2.0, 3.0], requires_grad=True)
    with ag.autograd.detect_anomaly():
        z = (x * y).sum()
        with pytest.raises(RuntimeError, match=r"Function 'MulBackward0' returned nan values in its 1th output\."):
            await ag.backward(z)


async def test_nan_from_sqrt_of_negative_as_pytorch():
    x = ag.tensor([-1.0, 4.0], requires_grad=True)
    with ag.autograd.detect_anomaly(), np.errstate(invalid="ignore"):
        y = x.sqrt().sum()
        with pytest.raises(RuntimeError, match="Function 'SqrtBackward0' returned nan values in its 0th output."):
            await ag.backward(y)


async def test_nan_without_anomaly_mode_passes_silently():
    x = ag.tensor([1.0], requires_grad=True)
    y = ag.tensor([NAN], requires_grad=True)
    await ag.backward((x * y).sum())
    assert np.isnan(x.grad.numpy()).all()


async def test_inf_is_not_reported():
    x = ag.tensor([0.0], requires_grad=True)
    with ag.autograd.detect_anomaly(), np.errstate(divide="ignore"):
        await ag.backward(x.sqrt().sum())  # gradient +inf: not a NaN
    assert np.isinf(x.grad.numpy()).all()


async def test_check_nan_false_and_nested_check_nan_true():
    x = ag.tensor([1.0], requires_grad=True)
    y = ag.tensor([NAN], requires_grad=True)
    z = (x * y).sum()
    with ag.autograd.detect_anomaly(check_nan=False):
        assert ag.autograd.is_anomaly_enabled()
        assert not ag.autograd.is_anomaly_check_nan_enabled()
        await ag.backward(z, retain_graph=True)
        assert np.isnan(x.grad.numpy()).all()
        with ag.autograd.detect_anomaly(check_nan=True):
            assert ag.autograd.is_anomaly_check_nan_enabled()
            with pytest.raises(RuntimeError, match="returned nan values in its 0th output"):
                await ag.backward(z, retain_graph=True)
        assert not ag.autograd.is_anomaly_check_nan_enabled()
    assert not ag.autograd.is_anomaly_enabled()


async def test_nan_check_on_worker_threads():
    previous = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=0))  # every node offloaded
    try:
        x = ag.tensor([NAN, 1.0], requires_grad=True)
        y = ag.tensor([2.0, 3.0], requires_grad=True)
        with ag.autograd.detect_anomaly():
            z = (x * y).sum()
            with pytest.raises(RuntimeError, match="'MulBackward0' returned nan values in its 1th output") as info:
                await ag.backward(z)
        assert "Error detected in MulBackward0" in _notes(info.value)
    finally:
        ag.autograd.set_engine(previous)


# --- the forward stack, as a note and a warning --------------------------------------------

async def test_error_note_names_the_users_forward_line():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = ag.tensor([NAN, 1.0], requires_grad=True)
    with ag.autograd.detect_anomaly():
        z = (x * y).sum()  # the line the note must name
        line = test_error_note_names_the_users_forward_line.__code__.co_firstlineno + 4
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError) as info:
                await ag.backward(z)
    notes = _notes(info.value)
    assert "Error detected in MulBackward0. Traceback of forward call that caused the error:" in notes
    assert f'File "{__file__}", line {line}, in test_error_note_names_the_users_forward_line' in notes
    assert "z = (x * y).sum()  # the line the note must name" in notes
    # the user's line is the innermost frame shown: no asyncgrad internals after it
    assert notes.rstrip().endswith("z = (x * y).sum()  # the line the note must name")
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any(m.startswith("Error detected in MulBackward0. Traceback of forward call") for m in messages)


async def test_stale_saved_tensor_under_anomaly_as_pytorch_case_54():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ag.autograd.detect_anomaly():
            a = x * 1.0
            b = (a ** 2).sum()
            a.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
                await ag.backward(b)
    messages = [str(w.message) for w in caught]
    assert any("Anomaly Detection has been enabled" in m for m in messages)
    assert any("Error detected in PowBackward0" in m for m in messages)
    assert "b = (a ** 2).sum()" in _notes(info.value)


async def test_graph_built_outside_anomaly_mode_has_no_forward_information():
    x = ag.tensor([1.0], requires_grad=True)
    y = ag.tensor([NAN], requires_grad=True)
    z = (x * y).sum()
    assert z.grad_fn.anomaly_trace is None
    with ag.autograd.detect_anomaly():
        with pytest.raises(RuntimeError) as info:
            await ag.backward(z)
    assert ("Error detected in MulBackward0. No forward pass information available. Enable detect "
            "anomaly during forward pass for more information.") in _notes(info.value)


# --- create_graph: parents ------------------------------------------------------------------

async def test_nodes_built_during_create_graph_backward_record_their_parent():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    with ag.autograd.detect_anomaly():
        y = x ** 3  # the parent's forward line
        (g,) = await ag.grad(y.sum(), x, create_graph=True)  # the child's line
        pow_node = y.grad_fn
        assert pow_node.anomaly_trace.parent is None
        # every node the backward of PowBackward0 built has it as parent
        child = g.grad_fn
        assert child is not None and child.anomaly_trace is not None
        assert child.anomaly_trace.parent is pow_node
        # a NaN flowing into that second-order graph is reported with both stacks
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError, match=f"Function '{child.name()}' returned nan values") as info:
                await ag.backward(g, ag.tensor([NAN, 1.0]))
    notes = _notes(info.value)
    assert f"Error detected in {child.name()}. Traceback of forward call that caused the error:" in notes
    assert "(g,) = await ag.grad(y.sum(), x, create_graph=True)  # the child's line" in notes
    assert ("Previous calculation was induced by PowBackward0. Traceback of forward call that induced "
            "the previous calculation:") in notes
    assert "y = x ** 3  # the parent's forward line" in notes
    messages = [str(w.message) for w in caught]
    assert any(m.startswith(f"Error detected in {child.name()}") for m in messages)
    assert any("Previous calculation was induced by PowBackward0" in m for m in messages)


async def test_parentage_is_tracked_on_worker_threads_too():
    previous = ag.autograd.get_engine()
    ag.autograd.set_engine(ag.autograd.Engine(inline_threshold=0))
    try:
        x = ag.tensor([1.0, 2.0], requires_grad=True)
        with ag.autograd.detect_anomaly():
            y = x.sin()
            (g,) = await ag.grad(y.sum(), x, create_graph=True)
        assert g.grad_fn.anomaly_trace.parent is y.grad_fn
    finally:
        ag.autograd.set_engine(previous)


# --- cost when off, scope ---------------------------------------------------------------------

async def test_anomaly_off_does_no_per_node_work(monkeypatch):
    calls = {"trace": 0, "run": 0}
    real_trace = anomaly_mode.record_forward_trace
    real_run = anomaly_mode.AnomalyMode.run_node

    def counting_trace(node):
        calls["trace"] += 1
        real_trace(node)

    def counting_run(self, node, inputs, math):
        calls["run"] += 1
        return real_run(self, node, inputs, math)

    monkeypatch.setattr(anomaly_mode, "record_forward_trace", counting_trace)
    monkeypatch.setattr(anomaly_mode.AnomalyMode, "run_node", counting_run)

    def build():
        x = ag.randn(3, requires_grad=True)
        return ((x * 2).exp() + x).sum()  # 4 nodes

    await ag.backward(build())
    assert calls == {"trace": 0, "run": 0}
    assert not ag.autograd.is_anomaly_enabled()
    with ag.autograd.detect_anomaly():
        loss = build()
        await ag.backward(loss)
    assert calls == {"trace": 4, "run": 4}


async def test_anomaly_mode_is_context_local():
    enabled_in_a = asyncio.Event()
    done_in_b = asyncio.Event()
    seen = {}

    async def task_a():
        ag.autograd.set_detect_anomaly(True)  # a bare call: this task's context only
        enabled_in_a.set()
        await done_in_b.wait()
        seen["a"] = ag.autograd.is_anomaly_enabled()
        x = ag.tensor([1.0], requires_grad=True)
        y = ag.tensor([NAN], requires_grad=True)
        with pytest.raises(RuntimeError, match="returned nan values"):
            await ag.backward((x * y).sum())

    async def task_b():
        await enabled_in_a.wait()
        seen["b"] = ag.autograd.is_anomaly_enabled()
        x = ag.tensor([1.0], requires_grad=True)
        y = ag.tensor([NAN], requires_grad=True)
        z = (x * y).sum()
        assert z.grad_fn.anomaly_trace is None
        await ag.backward(z)  # no NaN check here
        done_in_b.set()

    await asyncio.gather(task_a(), task_b())
    assert seen == {"a": True, "b": False}
    assert not ag.autograd.is_anomaly_enabled()


def test_set_detect_anomaly_call_context_manager_and_warning():
    def body():
        with pytest.warns(UserWarning, match="Anomaly Detection has been enabled. This mode will increase the "
                                             "runtime and should only be enabled for debugging."):
            ag.autograd.set_detect_anomaly(True, check_nan=False)
        assert ag.autograd.is_anomaly_enabled() and not ag.autograd.is_anomaly_check_nan_enabled()
        with ag.autograd.set_detect_anomaly(False):
            assert not ag.autograd.is_anomaly_enabled()
        assert ag.autograd.is_anomaly_enabled()
        ag.autograd.set_detect_anomaly(False)
        assert not ag.autograd.is_anomaly_enabled()

    contextvars.copy_context().run(body)
    assert not ag.autograd.is_anomaly_enabled()


async def test_detect_anomaly_as_decorator_sync_and_async():
    @ag.autograd.detect_anomaly()
    def sync_fn():
        return ag.autograd.is_anomaly_enabled()

    @ag.autograd.detect_anomaly(check_nan=False)
    async def async_fn():
        await asyncio.sleep(0)
        return ag.autograd.is_anomaly_enabled(), ag.autograd.is_anomaly_check_nan_enabled()

    assert not ag.autograd.is_anomaly_enabled()
    assert sync_fn() is True
    assert await async_fn() == (True, False)
    assert not ag.autograd.is_anomaly_enabled()


def test_sync_backward_under_anomaly():
    x = ag.tensor([1.0], requires_grad=True)
    y = ag.tensor([NAN], requires_grad=True)
    with ag.autograd.detect_anomaly():
        z = (x * y).sum()
        with pytest.raises(RuntimeError, match="'MulBackward0' returned nan values in its 0th output") as info:
            z.backward()
    assert "z = (x * y).sum()" in _notes(info.value)


# --- custom Functions (PyTorch cases 51, 52) ---------------------------------------------------

class MyFunc(ag.autograd.Function):
    @staticmethod
    def forward(ctx, inp1, inp2, fail_0th):
        ctx.fail_0th = fail_0th
        return inp1.sum(0, keepdim=True)

    @staticmethod
    def backward(ctx, g):
        gI = g.clone().expand(10, 10)
        if ctx.fail_0th:
            return gI * NAN, gI, None
        return gI, gI * NAN, None


@pytest.mark.parametrize("fail_0th, index", [(True, "0th"), (False, "1th")])
async def test_custom_function_nan_as_pytorch_case_51(fail_0th, index):
    inp = ag.rand(10, 10, requires_grad=True)
    with ag.autograd.detect_anomaly():
        out = MyFunc.apply(inp, inp, fail_0th)  # the user's line
        with pytest.raises(RuntimeError, match=f"Function 'MyFuncBackward' returned nan values in its {index} output"):
            await ag.backward(out.sum())
        notes = _notes(await _raised(out))
    assert "out = MyFunc.apply(inp, inp, fail_0th)  # the user's line" in notes


async def _raised(out):
    try:
        await ag.backward(out.sum())
    except RuntimeError as e:
        return e
    raise AssertionError("no error")


class MyFunc2(ag.autograd.Function):
    @staticmethod
    def forward(ctx, inp):
        return inp.clone()

    @staticmethod
    def backward(ctx, g):
        return g * NAN


class MyFuncOuter(ag.autograd.Function):
    @staticmethod
    def forward(ctx, inp1):
        ctx.save_for_backward(inp1)
        return inp1.clone()

    @staticmethod
    def backward(ctx, g):
        (inp,) = ctx.saved_tensors
        return MyFunc2.apply(g * inp)  # built while MyFuncOuterBackward runs


async def test_nested_custom_functions_as_pytorch_case_52():
    x = ag.rand(3, requires_grad=True)
    with ag.autograd.detect_anomaly():
        out = MyFuncOuter.apply(x)  # the outer forward
        (gx,) = await ag.grad(out.sum(), x, create_graph=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError, match="Function 'MyFunc2Backward' returned nan values in its 0th output"):
                await ag.backward(gx.sum())
    messages = [str(w.message) for w in caught]
    assert any("Error detected in MyFunc2Backward" in m and "return MyFunc2.apply(g * inp)" in m for m in messages)
    assert any("Previous calculation was induced by MyFuncOuterBackward" in m
               and "out = MyFuncOuter.apply(x)  # the outer forward" in m for m in messages)


def test_nan_check_under_trio():
    import anyio

    async def main():
        x = ag.tensor([1.0], requires_grad=True)
        y = ag.tensor([NAN], requires_grad=True)
        with ag.autograd.detect_anomaly():
            z = (x * y).sum()
            with pytest.raises(RuntimeError, match="'MulBackward0' returned nan values in its 0th output"):
                await ag.backward(z)

    anyio.run(main, backend="trio")
