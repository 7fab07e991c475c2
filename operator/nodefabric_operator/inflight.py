"""A write made in a worker thread that a stopping operator waits for (an Event's post, and every write
when the loop's client cannot reproduce the client configuration: aioclient.Driver; apicall.arun keeps
the same promise for the writes sent on the loop).

kopf cancels every task of its loop when it stops, and the lanes are closed (intake.py). A cancelled
`await asyncio.to_thread(...)` ends the wait but not the thread: the request goes out after the operator
stopped, after the lease was released to a standby that is already publishing. `writing` waits through
the cancel: the stop goes on once the request in flight is answered, and nothing is written after it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def writing(call: Callable[..., T], *args: Any, stopping: threading.Event | None = None) -> T:
    """`call(*args)` in a worker thread, its end awaited even when the caller is cancelled (then
    re-raised once the call returned or failed; what it ended with does not matter to a stopping
    operator). `stopping` is set at the cancel, for a call of several requests to send no more."""
    loop = asyncio.get_running_loop()
    done = loop.run_in_executor(None, functools.partial(contextvars.copy_context().run, call, *args))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        if stopping is not None:
            stopping.set()
        await settled(done)
        raise


async def settled(done: asyncio.Future[Any]) -> None:
    """Wait for `done` to end, through any further cancel of this task (the caller re-raises its own).

    A stop cancels a reconcile more than once: the lanes cancel the one in hand and wait for it, then
    kopf's sweep cancels every task again (gather passes that on to the lane). Ending the wait at the
    second cancel would let the stop go on, closing the connections and releasing the lease, while the
    write is still on its way; the write's own timeouts bound this wait."""
    while not done.done():
        try:
            await asyncio.wait([done])
        except asyncio.CancelledError:
            continue  # cancelled again: still waiting (see above)
    if not done.cancelled():
        done.exception()  # retrieved, so asyncio does not log it as never retrieved
