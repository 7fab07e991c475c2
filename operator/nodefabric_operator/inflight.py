"""A write made in a worker thread that a stopping operator waits for (an Event's post, and every write
when the loop's client cannot reproduce the client configuration: aioclient.Driver; apicall.arun keeps
the same promise for the writes sent on the loop).

kopf cancels every task of its loop when it stops, and the lanes are closed (intake.py). A cancelled
`await asyncio.to_thread(...)` ends the wait but not the thread: the request goes out after the operator
stopped, after the lease was released to a standby that is already publishing. `writing` waits through
the cancel: the stop goes on once the request in flight is answered, and nothing is written after it.
A call still queued for a worker thread at the cancel (every thread busy: a burst of Event posts) is
dropped there and never starts; how many were, per call, is logged once for the stop.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

log = logging.getLogger(__name__)

T = TypeVar("T")

QUEUED, STARTED, DROPPED = "queued", "started", "dropped"


class _Turn:
    """A call handed to the worker threads: started by its thread, or dropped by a cancel first, never
    both (the two sides race: a lock decides)."""

    def __init__(self) -> None:
        self.state = QUEUED
        self._lock = threading.Lock()

    def take(self, state: str) -> bool:
        with self._lock:
            if self.state != QUEUED:
                return False
            self.state = state
            return True


_dropped: collections.Counter[str] = collections.Counter()


async def writing(
    call: Callable[..., T],
    *args: Any,
    stopping: threading.Event | None = None,
    dropped: Callable[[], None] | None = None,
) -> T:
    """`call(*args)` in a worker thread, its end awaited even when the caller is cancelled (then
    re-raised once the call returned or failed; what it ended with does not matter to a stopping
    operator). `stopping` is set at the cancel, for a call of several requests to send no more. A call
    not started by a worker thread at the cancel never starts (see the module's note); `dropped` is
    then called, on the loop (the caller's count of it)."""
    loop = asyncio.get_running_loop()
    turn, context = _Turn(), contextvars.copy_context()

    def started() -> T:
        if not turn.take(STARTED):
            return cast(T, None)  # dropped at a cancel: no one waits for it any more
        return context.run(call, *args)

    done = loop.run_in_executor(None, started)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        if stopping is not None:
            stopping.set()
        if turn.take(DROPPED):
            _note_dropped(loop, getattr(call, "__qualname__", type(call).__name__))
            if dropped is not None:
                dropped()
        else:
            await settled(done)
        raise


def _note_dropped(loop: asyncio.AbstractEventLoop, what: str) -> None:
    # A stop cancels every reconcile in one pass of the loop (intake's lanes, kopf's sweep): the count is
    # logged after that pass, once, not a line per dropped call.
    if not _dropped:
        loop.call_soon(_report_dropped)
    _dropped[what] += 1


def _report_dropped() -> None:
    for what, count in sorted(_dropped.items()):
        log.warning(
            "calls queued for a worker thread were dropped at the stop, never sent",
            extra={"call": what, "dropped": count},
        )
    _dropped.clear()


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
