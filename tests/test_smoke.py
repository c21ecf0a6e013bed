import numpy as np

import asyncgrad as ag


async def test_backward_matches_hand_derivative():
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = ag.tensor([0.5, -1.0, 2.0], requires_grad=True)
    y = (x * w).exp().sum()
    await ag.backward(y)
    np.testing.assert_allclose(x.grad.numpy(), np.exp(x.data * w.data) * w.data)
    np.testing.assert_allclose(w.grad.numpy(), np.exp(x.data * w.data) * x.data)


def test_sync_backward_outside_loop():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])
