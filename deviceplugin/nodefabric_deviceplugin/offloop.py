"""Blocking host reads off the event loop, each with a time budget.

A sysfs read can block for a long time (a driver holding its lock through a firmware reset) or forever
(a FIFO where an attribute should be, a hung mount). Every gRPC answer and the health endpoints share
one event loop, so such a read runs in a thread of its own and the caller waits at most its budget.

Not an asyncio executor: its threads are joined at interpreter exit, so one read stuck in open() would
keep SIGTERM from ever ending the process, and each stuck read would hold a pool slot for good. A daemon
thread per read costs about 50 us, paid only when a read is needed at all (callers cache); callers that
may ask again while a read is stuck share the read in flight (`SingleFlight`) rather than start another.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadTimeout(Exception):
    """A host read that did not finish within its budget. It may still be running in its thread."""

    def __init__(self, what: str, budget: float, running_for: float) -> None:
        super().__init__(
            f"reading {what} did not finish within {budget:g} s (running for {running_for:.1f} s); "
            "a sysfs attribute may be blocking (a driver reset in progress, or a file that is not a "
            "regular file)"
        )
        self.what = what
        self.budget = budget


def _settle(fut: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)  # type: ignore[arg-type]


def start(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Run `fn` in a daemon thread; the future settles on the calling loop when it returns or raises."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def body() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting side, whatever it is
            if not loop.is_closed():
                loop.call_soon_threadsafe(_settle, fut, None, exc)
        else:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_settle, fut, result, None)

    threading.Thread(target=body, name=name, daemon=True).start()
    return fut


class SingleFlight(Generic[T]):
    """At most one read of a kind in flight; callers share it, each waiting at most `budget` seconds.

    A read that outlives every caller's budget stays the read in flight until it returns: asking again
    while it is stuck starts no second thread, and the first caller after it returns starts a fresh one.
    """

    def __init__(self, what: str, budget: float) -> None:
        self.what = what
        self.budget = budget
        self._inflight: asyncio.Future[T] | None = None
        self._started = 0.0
        self.started = 0  # reads started so far

    @property
    def stuck_for(self) -> float:
        """Seconds the read in flight has been running; 0 when none is."""
        if self._inflight is None or self._inflight.done():
            return 0.0
        return time.monotonic() - self._started

    async def run(self, fn: Callable[[], T]) -> T:
        fut = self._inflight
        if fut is None or fut.done():
            fut = start(fn, f"read {self.what}")
            # A result nobody awaits any more (every caller timed out) must not log "never retrieved".
            fut.add_done_callback(_consume)
            self._inflight, self._started = fut, time.monotonic()
            self.started += 1
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.budget)
        except TimeoutError:
            raise ReadTimeout(self.what, self.budget, self.stuck_for) from None


def _consume(fut: asyncio.Future[T]) -> None:
    if not fut.cancelled():
        fut.exception()
