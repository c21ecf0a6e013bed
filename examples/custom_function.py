"""Custom autograd Functions, sync and async, checked with gradcheck.

    python examples/custom_function.py

``Exp`` is the example of the Custom Functions guide (``docs/guides/custom_functions.md``).
``RemoteScale`` has an ``async def backward`` that awaits something slow (standing in for a
call to another service): the engine keeps running the other ready nodes meanwhile, and the
event loop stays free.
"""

from __future__ import annotations

import time

import anyio
import numpy as np

import asyncgrad as ag


class Exp(ag.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[no-untyped-def]
        (y,) = ctx.saved_tensors
        return grad_out * y


class RemoteScale(ag.autograd.Function):
    """``x * scale``, whose backward "asks a remote service" for the scale (a sleep)."""

    @staticmethod
    def forward(ctx, x, scale, delay):  # type: ignore[no-untyped-def]
        ctx.scale, ctx.delay = scale, delay
        return x * scale

    @staticmethod
    async def backward(ctx, grad_out):  # type: ignore[no-untyped-def]
        await anyio.sleep(ctx.delay)  # any awaitable: an HTTP call, a database, a queue
        return grad_out * ctx.scale, None, None


async def main() -> None:
    ag.set_default_dtype(np.float64)
    x = ag.randn(5, requires_grad=True)

    y = Exp.apply(x)
    await ag.backward(y.sum())
    print("Exp: grad equals exp(x):", np.allclose(x.grad.numpy(), np.exp(x.numpy())))  # type: ignore[union-attr]
    print("Exp: node name:", y.grad_fn.name())  # type: ignore[union-attr]

    # ten backward calls whose async nodes each wait 0.2 s: they overlap
    delay, n = 0.2, 10
    xs = [ag.randn(4, requires_grad=True) for _ in range(n)]
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for xi in xs:
            tg.start_soon(ag.backward, RemoteScale.apply(xi, 3.0, delay).sum())
    elapsed = time.perf_counter() - t0
    ok = all(np.allclose(xi.grad.numpy(), 3.0) for xi in xs)  # type: ignore[union-attr]
    print(f"RemoteScale: {n} backward calls with a {delay:.1f} s async node each took {elapsed:.2f} s "
          f"(not {n * delay:.1f} s); gradients correct: {ok}")


if __name__ == "__main__":
    ag.set_default_dtype(np.float64)  # gradcheck wants float64
    print("Exp: gradcheck:", ag.autograd.gradcheck(Exp.apply, (ag.randn(3, requires_grad=True),)))
    anyio.run(main)
