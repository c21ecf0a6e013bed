"""gradcheck / gradgradcheck failing usefully (the per-op passes live in test_ops_gradcheck)."""

import asyncio
import re

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.autograd import GradcheckError, gradgradcheck
from asyncgrad.autograd import gradcheck


class WrongExp(ag.autograd.Function):
    """exp whose backward forgets nothing but doubles the gradient: a wrong rule."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return 2 * g * y


class RightMul(ag.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


class WrongSecondInput(ag.autograd.Function):
    """x * y whose gradient for y is wrong in one element only."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        bump = ag.tensor([0.0, 0.0, 1.0])
        return g * y, g * (x + bump)


class AsyncSquare(ag.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    async def backward(ctx, g):
        await asyncio.sleep(0)
        (x,) = ctx.saved_tensors
        return 2 * g * x


def _scaled_by_hook(x):
    """sin(x) whose gradient a tensor hook doubles: wrong by a factor of 2."""
    h = x * 1.0
    if h.requires_grad:  # finite differences run under no_grad
        h.register_hook(lambda g: g * 2)
    return h.sin()


def test_wrong_custom_function_fails_naming_input_and_showing_jacobians():
    x = ag.tensor([0.1, -0.5, 1.0], requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        gradcheck(WrongExp.apply, (x,))
    message = str(info.value)
    assert message.startswith("Jacobian mismatch for output 0 with respect to input 0,")
    assert "numerical:" in message and "analytical:" in message
    assert "They differ at 3 of 9 entries" in message
    e = np.exp(0.1)
    assert re.search(rf"\[0, 0\]: {e:.6g} vs {2 * e:.6g}", message), message
    assert isinstance(info.value, RuntimeError)


def test_wrong_gradient_of_second_input_names_input_1_and_the_entry():
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = ag.tensor([4.0, 5.0, 6.0], requires_grad=True)
    assert gradcheck(RightMul.apply, (x, y))
    with pytest.raises(GradcheckError, match="with respect to input 1,") as info:
        gradcheck(WrongSecondInput.apply, (x, y))
    message = str(info.value)
    assert "They differ at 1 of 9 entries" in message
    assert "[2, 2]: 3 vs 4" in message  # d out[2] / d y[2]: x[2] = 3, the rule says 4


def test_wrong_gradient_from_a_tensor_hook():
    x = ag.tensor([0.3, 0.7], requires_grad=True)
    with pytest.raises(GradcheckError, match="with respect to input 0"):
        gradcheck(_scaled_by_hook, (x,))
    assert gradcheck(_scaled_by_hook, (x,), raise_exception=False) is False
    assert gradcheck(lambda t: (t * 1.0).sin(), (x,)) is True


def test_only_inputs_that_require_grad_are_checked_and_indices_are_positions():
    c = ag.tensor([1.0, 2.0, 3.0])  # no grad: skipped, but it keeps its index
    y = ag.tensor([4.0, 5.0, 6.0], requires_grad=True)
    with pytest.raises(GradcheckError, match="with respect to input 1,"):
        gradcheck(lambda a, b: WrongExp.apply(a * b), (c, y))


def test_long_mismatch_lists_are_cut():
    x = ag.randn(20, requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        gradcheck(WrongExp.apply, (x,))
    assert "They differ at 20 of 400 entries" in str(info.value)
    assert "... and 10 more" in str(info.value)


async def test_gradcheck_inside_a_running_loop_and_with_async_backward():
    x = ag.tensor([0.5, -1.5], requires_grad=True)
    assert gradcheck(AsyncSquare.apply, (x,))
    assert gradcheck(WrongExp.apply, (x,), raise_exception=False) is False


def test_gradgradcheck_passes_and_catches_a_wrong_double_backward():
    x = ag.tensor([0.2, 0.9], requires_grad=True)
    assert gradgradcheck(lambda t: (t * t).sin(), (x,))

    def right_value_wrong_graph(t):
        # the hook returns a gradient equal in value to g but whose graph counts g twice, so
        # first derivatives are right and the derivatives of the vector-Jacobian product not
        h = t * 1.0
        if h.requires_grad:
            # (None-safe: gradcheck's check_undefined_grad sends an undefined gradient)
            h.register_hook(lambda g: None if g is None else g + (g - g.detach()))
        return h.sin()

    assert gradcheck(right_value_wrong_graph, (x,))
    with pytest.raises(GradcheckError, match="with respect to input 0,") as info:
        gradgradcheck(right_value_wrong_graph, (x,))
    assert "They differ at 2 of 4 entries" in str(info.value)
    assert gradgradcheck(right_value_wrong_graph, (x,), raise_exception=False) is False
