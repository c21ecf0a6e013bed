"""PyTorch parity: the autograd semantics issue 32 found differing from PyTorch 2.13, one
section per bug. Each test states what PyTorch does (checked against torch 2.13)."""

import gc
import time
import weakref

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd.runtime.threads import running_graph_task
from asyncgrad.utils.checkpoint import checkpoint


# --- 1. a checkpoint's graph is freed by reference counting -------------------------------

def _checkpointed_backward(use_reentrant):
    """Backward through a checkpoint whose function saves its own output (exp); weak
    references to what the recomputation made: exp's output, and (reentrant) the nested
    backward's GraphTask."""
    refs = []
    calls = []

    def fn(a):
        b = a.exp()  # ExpBackward0 saves its output
        calls.append(1)
        if len(calls) == 2:  # the recomputation in backward
            refs.append(weakref.ref(b))
            if use_reentrant:
                b.register_hook(lambda g: refs.append(weakref.ref(running_graph_task())))
        return b.sin()

    x = ag.ones(3, requires_grad=True)
    y = checkpoint(fn, x * 2, use_reentrant=use_reentrant)
    refs.append(weakref.ref(y.grad_fn))
    y.sum().backward()
    del y
    return x, refs, len(calls)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_checkpoint_and_its_recomputation_are_freed_without_the_garbage_collector(use_reentrant):
    gc.collect()
    gc.disable()
    try:
        x, refs, calls = _checkpointed_backward(use_reentrant)
        assert calls == 2
        assert len(refs) == (3 if use_reentrant else 2)
        # freed by reference counting (the collector is off), though maybe a moment later
        # by another thread (a worker dropping its last job's references as it goes idle)
        deadline = time.monotonic() + 5.0
        while any(r() is not None for r in refs) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r() is not None for r in refs] == [False] * len(refs)
        assert np.allclose(x.grad.numpy(), 2 * np.exp(2) * np.cos(np.exp(2)))
    finally:
        gc.enable()


# --- 3. ctx.saved_tensors returns the saved object inside a non-reentrant checkpoint ------

def test_saved_tensors_is_the_saved_object_inside_a_non_reentrant_checkpoint():
    """PyTorch: a saved tensor outside the graph comes back as the same object, with or
    without checkpoint (its recomputation keeps such tensors as they are)."""
    unpacked = []

    class SaveSecond(ag.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x * 1

        @staticmethod
        def backward(ctx, g):
            unpacked.append(ctx.saved_tensors[0])
            return g, None

    a = ag.tensor(2.0, requires_grad=True)
    b = ag.tensor(1.0)
    SaveSecond.apply(a, b).backward()
    checkpoint(SaveSecond.apply, a, b, use_reentrant=False).backward()
    assert [t is b for t in unpacked] == [True, True]
    assert a.grad.item() == 2.0


# --- 2. a recomputation that saves other metadata raises CheckpointError ------------------

def _changes_shape_when_recomputed():
    calls = []

    def fn(a):
        calls.append(1)
        b = a if len(calls) == 1 else a[:2]  # the recomputation saves a (2,) tensor for exp
        return b.exp().sum()

    return fn


def test_a_recomputed_tensor_of_another_shape_raises_checkpoint_error():
    from asyncgrad.utils.checkpoint import CheckpointError

    x = ag.ones(3, requires_grad=True)
    y = checkpoint(_changes_shape_when_recomputed(), x, use_reentrant=False)
    with pytest.raises(CheckpointError) as info:
        y.backward()
    assert isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert msg.startswith("asyncgrad.utils.checkpoint: Recomputed values for the following tensors have "
                          "different metadata than during the forward pass.\ntensor at position 0:\n"
                          "saved metadata: {'shape': (3,), 'dtype': dtype('float64'), 'device': device(type='cpu')}\n"
                          "recomputed metadata: {'shape': (2,), ")
    assert "pass `debug=True`" in msg
    assert x.grad is None


@pytest.mark.parametrize("how", ["argument", "context"])
def test_checkpoint_debug_shows_where_each_tensor_was_saved(how):
    from asyncgrad.utils.checkpoint import CheckpointError, set_checkpoint_debug_enabled

    x = ag.ones(3, requires_grad=True)
    if how == "argument":
        y = checkpoint(_changes_shape_when_recomputed(), x, use_reentrant=False, debug=True)
    else:
        with set_checkpoint_debug_enabled(True):  # overrides debug=False
            y = checkpoint(_changes_shape_when_recomputed(), x, use_reentrant=False, debug=False)
    with pytest.raises(CheckpointError) as info:
        y.backward()
    msg = str(info.value)
    assert "pass `debug=True`" not in msg
    forward, recomputed = msg.split("The tensors saved in the recomputation")
    assert "b = a if len(calls) == 1 else a[:2]" not in forward and "return b.exp().sum()" in forward
    assert "return b.exp().sum()" in recomputed


def test_set_checkpoint_debug_enabled_false_overrides_the_argument():
    from asyncgrad.utils.checkpoint import CheckpointError, set_checkpoint_debug_enabled

    with set_checkpoint_debug_enabled(False):
        y = checkpoint(_changes_shape_when_recomputed(), ag.ones(3, requires_grad=True),
                       use_reentrant=False, debug=True)
    with pytest.raises(CheckpointError, match="pass `debug=True`"):
        y.backward()


# --- 4. max()/min() of a tensor holding NaN split the gradient among the NaNs --------------

@pytest.mark.parametrize("reduce", ["max", "min"])
def test_the_gradient_of_a_nan_maximum_is_split_among_the_nans(reduce):
    import warnings

    x = ag.tensor([1.0, float("nan"), 3.0, float("nan")], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning either
        out = getattr(x, reduce)()
        out.backward()
    assert np.isnan(out.item())
    assert x.grad.tolist() == [0.0, 0.5, 0.0, 0.5]
    y = ag.tensor([1.0, 3.0, 3.0], requires_grad=True)  # ties without NaN: split as before
    getattr(y, reduce)().backward()
    assert y.grad.tolist() == ([0.0, 0.5, 0.5] if reduce == "max" else [1.0, 0.0, 0.0])


# --- 6. in-place ops through views of 0-d tensors are recorded ----------------------------

@pytest.mark.parametrize("make_view", [lambda a: a.view_as(a), lambda a: a.view(1), lambda a: a.view(1, 1),
                                       lambda a: a[...]], ids=["view_as", "view(1)", "view(1,1)", "ellipsis"])
def test_an_inplace_op_on_a_view_of_a_0d_tensor_is_recorded_on_its_base(make_view):
    x = ag.tensor(2.0, requires_grad=True)
    a = x * 1
    b = make_view(a)
    b.mul_(3)
    assert a.item() == 6.0 and a.grad_fn.name() == "CopySlices"
    (gx,) = ag.grad_sync(a * b.sum(), x, create_graph=True)  # a * a = 9 x**2
    assert gx.item() == 36.0
    (ggx,) = ag.grad_sync(gx, x)
    assert ggx.item() == 18.0


def test_an_inplace_op_with_a_grad_requiring_operand_on_a_view_of_a_plain_0d_tensor():
    w = ag.tensor(5.0, requires_grad=True)
    a = ag.tensor(2.0)
    a.view(1).mul_(w)
    a.backward()
    assert a.item() == 10.0 and w.grad.item() == 2.0


# --- 8-10. in-place ops through views whose creation forbids recording them ----------------

_MULTI = ("This view is the output of a function that returns multiple views. Such functions do not "
          "allow the output views to be modified inplace. You should replace the inplace operation by an "
          "out-of-place one.")
_CUSTOM = ("This view was created inside a custom Function (or because an input was returned as-is) and "
           "the autograd logic to handle view+inplace would override the custom backward associated with "
           "the custom Function, leading to incorrect gradients. This behavior is forbidden. You can fix "
           "this by cloning the output of the custom Function.")
_NO_GRAD = ("is being modified inplace with grad mode enabled. Given that this use case is ambiguous and "
            "error-prone, it is forbidden. You can clarify your code by moving both the view and the "
            "inplace either both inside the no_grad block (if you don't want the inplace to be tracked) or "
            "both outside (if you want the inplace to be tracked).")


def _refused(fn, message):
    with pytest.raises(RuntimeError) as info:
        fn()
    assert str(info.value) == message


@pytest.mark.parametrize("views", ["unbind", "split", "chunk"])
def test_an_inplace_op_through_a_view_of_one_of_several_views_is_refused(views):
    x = ag.ones(4, 2, requires_grad=True) * 1
    b = getattr(x, views)(2) if views != "unbind" else x.unbind(0)
    before = x.tolist()
    _refused(lambda: b[0].view_as(b[0]).mul_(2), f"Output 0 of View is a view and is being modified inplace. {_MULTI}")
    _refused(lambda: b[1][0:1].mul_(2), f"Output 0 of Slice is a view and is being modified inplace. {_MULTI}")
    assert x.tolist() == before


class _ViewOfInput(ag.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x[:2]

    @staticmethod
    def backward(ctx, g):
        return ag.cat([g, g]) * 10


class _InputAsIs(ag.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 10


@pytest.mark.parametrize("fn", [_ViewOfInput, _InputAsIs])
def test_an_inplace_op_on_a_view_returned_by_a_custom_function_is_refused(fn):
    x = ag.ones(4, requires_grad=True)
    y = fn.apply(x * 1)
    name = fn.__name__
    _refused(lambda: y.mul_(2), f"Output 0 of {name} is a view and is being modified inplace. {_CUSTOM}")
    _refused(lambda: y[:1].mul_(2), f"Output 0 of Slice is a view and is being modified inplace. {_CUSTOM}")
    assert y.grad_fn.name() == f"{name}Backward"  # the Function's backward is kept
    y.sum().backward()
    assert x.grad.tolist() == [10.0] * 4


@pytest.mark.parametrize("base", ["leaf", "non-leaf"])
def test_an_inplace_op_through_a_view_made_in_no_grad_mode_gets_pytorchs_message(base):
    x = ag.ones(4, 2, requires_grad=True)
    b = x if base == "leaf" else x * 1
    with ag.no_grad():
        v = b[0]
        s = b.split(2)[0]
        u = b.unbind(0)[1]
    plain = f"A view was created in no_grad mode and {_NO_GRAD}"
    _refused(lambda: v.mul_(2), plain)
    _refused(lambda: s.mul_(2), plain)
    _refused(lambda: u.mul_(2), plain)
    _refused(lambda: v.view_as(v).mul_(2),
             f"Output 0 of View is a view of a view which was created in no_grad mode and {_NO_GRAD}")
    w = b[1]
    with ag.no_grad():
        w = w.view_as(w)
    _refused(lambda: w.mul_(2), plain)
    with ag.no_grad():  # both inside no_grad: allowed, not tracked
        v.mul_(2)
    assert x.tolist()[0] == ([2.0, 2.0] if base == "leaf" else [1.0, 1.0])


def test_an_inplace_op_with_a_grad_requiring_operand_on_a_no_grad_view_of_a_plain_tensor_is_refused():
    a = ag.ones(3)
    with ag.no_grad():
        v = a[0:2]
    _refused(lambda: v.mul_(ag.ones(2, requires_grad=True)), f"A view was created in no_grad mode and {_NO_GRAD}")
    v.mul_(2)  # nothing requires grad: allowed
    assert a.tolist() == [2.0, 2.0, 1.0]


# --- 5. gradgradcheck runs fn with grad mode on, every time ---------------------------------

def test_gradgradcheck_runs_fn_with_grad_mode_on():
    modes = []

    def fn(x):
        modes.append(ag.is_grad_enabled())
        return x * x * x

    x = ag.randn(3, requires_grad=True)
    assert ag.autograd.gradgradcheck(fn, (x,))
    assert modes and all(modes)


# --- 12. gradcheck of a function without differentiable outputs ----------------------------

def test_gradcheck_without_differentiable_outputs_expects_a_zero_numerical_gradient():
    from asyncgrad.autograd import GradcheckError

    x = ag.randn(3, requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        ag.autograd.gradcheck(lambda x: (x * 2).detach(), (x,))
    assert str(info.value) == "Numerical gradient for function expected to be zero"
    assert ag.autograd.gradcheck(lambda x: (x * 2).detach(), (x,), raise_exception=False) is False
    assert ag.autograd.gradcheck(lambda x: (x > 0).double(), (x,))  # constant: passes


# --- 13. a failing undefined-gradient check warns first -------------------------------------

def test_a_failing_undefined_gradient_check_warns_as_pytorch():
    from asyncgrad.autograd import GradcheckError

    class OnesForUndefined(ag.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return ag.ones(3) if g is None else g * 2

    x = ag.randn(3, requires_grad=True)
    with pytest.warns(UserWarning, match="^Backwards compatibility: New undefined gradient support checking "
                      "feature is enabled by default, but it may break existing callers of this function. If "
                      'this is true for you, you can call this function with "check_undefined_grad=False" to '
                      "disable the feature$"):
        with pytest.raises(GradcheckError, match="Expected all input grads to be undefined or zero"):
            ag.autograd.gradcheck(OnesForUndefined.apply, (x,))
    assert ag.autograd.gradcheck(OnesForUndefined.apply, (x,), check_undefined_grad=False)


# --- 7. a saved_tensors_hooks object re-entered in its own unpack hook ---------------------

def test_saved_tensors_hooks_re_entered_in_its_unpack_hook_end_with_their_block():
    from asyncgrad import _context
    from asyncgrad.autograd.graph import saved_tensors_hooks

    packed = []

    def unpack(t):
        hooks.__enter__()  # confined to the backward (PyTorch restores its hooks after it)
        return t

    hooks = saved_tensors_hooks(lambda t: packed.append(1) or t, unpack)
    x = ag.ones(2, requires_grad=True)
    with hooks:
        y = x.exp()
        y.sum().backward()
        assert len(_context.saved_tensors_hooks.get()) == 1
    assert _context.saved_tensors_hooks.get() == ()
    x.exp()  # saved without the hooks
    assert len(packed) == 1
    assert np.allclose(x.grad.numpy(), np.e)


# --- 11. .data = an integer tensor on a tensor that requires grad -------------------------

def test_setting_data_to_an_integer_tensor_is_refused_when_grad_is_required():
    msg = "data set to a tensor that requires gradients must be floating point or complex dtype"
    a = ag.ones(2, requires_grad=True)
    for target in (a, a * 1):
        with pytest.raises(RuntimeError, match=f"^{msg}$"):
            target.data = ag.tensor([1, 2])
        assert target.dtype == np.float64 and target.tolist() == [1.0, 1.0]
    c = ag.ones(2)
    c.data = ag.tensor([1, 2])  # no grad required: allowed
    assert c.dtype == np.int64
    a.data = ag.ones(3, dtype=ag.float32)
    assert a.dtype == np.float32 and a.requires_grad


# --- 14. decorating a class with a grad mode warns ------------------------------------------

@pytest.mark.parametrize("mode", ["no_grad", "enable_grad"])
def test_decorating_a_class_with_a_grad_mode_gives_pytorchs_future_warning(mode):
    with pytest.warns(FutureWarning, match="^Decorating classes is deprecated and will be disabled in future "
                      "versions. You should only decorate functions or methods. To preserve the current "
                      "behavior of class decoration, you can directly decorate the `__init__` method and "
                      "nothing else.$") as record:
        @getattr(ag, mode)()
        class Model:
            def __init__(self):
                self.grad_enabled = ag.is_grad_enabled()
    assert record[0].filename == __file__
    with ag.set_grad_enabled(mode == "no_grad"):
        assert Model().grad_enabled is (mode == "enable_grad")  # constructed under the mode


# --- ctx._materialize_non_diff_grads (PyTorch's private flag) ------------------------------

@pytest.mark.parametrize("materialize", [None, False])
def test_materialize_non_diff_grads_false_passes_none_for_non_differentiable_outputs(materialize):
    seen = []

    class TwoOutputs(ag.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if materialize is not None:
                ctx._materialize_non_diff_grads = materialize
            a, b = x * 2, x * 3
            ctx.mark_non_differentiable(b)
            return a, b

        @staticmethod
        def backward(ctx, ga, gb):
            seen.append(gb)
            return ga * 2

    x = ag.ones(2, requires_grad=True)
    a, b = TwoOutputs.apply(x)
    a.sum().backward()
    if materialize is None:  # default: zeros, as before
        assert seen[0].tolist() == [0.0, 0.0]
    else:
        assert seen == [None]
    assert x.grad.tolist() == [2.0, 2.0]


# --- 18. a multi-output custom Function that marks a view input dirty ----------------------

class _DoublesItsInput(ag.autograd.Function):
    @staticmethod
    def forward(ctx, v):
        v.mul_(2)
        ctx.mark_dirty(v)
        return v, v * 3

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * 2 + g2 * 6


def test_a_function_with_several_outputs_that_marks_a_view_input_dirty_is_refused():
    x = ag.ones(4, requires_grad=True)
    b = x * 1
    with pytest.raises(RuntimeError) as info:
        _DoublesItsInput.apply(b[:2])
    assert str(info.value).startswith(
        "If your Function modifies inplace an input that is a view of another Tensor, your Function cannot "
        "return more than one Tensor. This is not supported by the current autograd engine.")
    assert b.tolist() == [2.0, 2.0, 1.0, 1.0]  # (forward ran before the check, as in PyTorch)
    with ag.no_grad():  # nothing recorded: allowed, as in PyTorch
        out = _DoublesItsInput.apply(b[:2])
    assert [o.tolist() for o in out] == [[4.0, 4.0], [12.0, 12.0]]
    c = x * 1  # a dirty input that is not a view: allowed
    o1, o2 = _DoublesItsInput.apply(c)
    (o1.sum() + o2.sum()).backward()
    assert x.grad.tolist() == [8.0] * 4


# --- 16. a second backward through advanced indexing needs retain_graph --------------------

@pytest.mark.parametrize("op", ["index", "index_put"])
def test_a_second_backward_through_advanced_indexing_raises_without_retain_graph(op):
    from asyncgrad.autograd.graph.saved import FREED_MESSAGE

    x = ag.ones(4, requires_grad=True)
    if op == "index":
        y = x[ag.tensor([0, 2])]
    else:
        y = ag.ones(4)
        y[ag.tensor([0, 2])] = x[1:3]  # IndexPutBackward0 on y; x reached through it
    y.sum().backward()
    with pytest.raises(RuntimeError, match="^" + FREED_MESSAGE.replace("(", r"\(").replace(")", r"\)")):
        y.sum().backward()
    z = x[ag.tensor([1, 3])]
    z.sum().backward(retain_graph=True)
    z.sum().backward()  # kept: works
    w = x[1:3]
    w.sum().backward()
    w.sum().backward()  # a basic index saves nothing: works, as in PyTorch
