"""Await a ``concurrent.futures.Future`` resolved on another thread, on any event loop.

The communication thread must never wait for the loop, so it does not use
``anyio.from_thread.run_sync`` (which blocks until the loop ran the call). Instead the
future's done-callback schedules ``Event.set`` on the loop through the loop's own
thread-safe entry point: ``call_soon_threadsafe`` on asyncio, ``run_sync_soon`` on trio.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel


def _call_soon_threadsafe() -> Callable[[Callable[[], object]], object]:
    native: Any = anyio.lowlevel.current_token().native_token
    schedule = getattr(native, "call_soon_threadsafe", None)  # an asyncio loop
    if schedule is None:
        schedule = native.run_sync_soon  # a trio token
    return schedule  # type: ignore[no-any-return]


async def wait_future(future: concurrent.futures.Future[Any]) -> Any:
    """The future's result (or exception), without blocking the loop.

    Cancellation: the wait ends at once; the future (and the MPI work behind it) is left
    to complete on the communication thread."""
    if future.done():
        await anyio.lowlevel.checkpoint()
        return future.result()
    event = anyio.Event()
    schedule = _call_soon_threadsafe()

    def wake(_: concurrent.futures.Future[Any]) -> None:
        try:
            schedule(event.set)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
            pass

    future.add_done_callback(wake)
    await event.wait()
    return future.result()
