"""Blocking work off the event loop, on daemon threads, with a deadline.

asyncio's own executor threads are joined when the process exits, so one thread stuck in a read (a
hung NVML call, a sysfs attribute whose driver never answers, an API server that accepted the
connection and went silent) would keep a SIGTERM'd agent alive forever. Threads here are daemon
threads: the process ends whatever they are stuck in, and the caller stops waiting at the deadline.

A `Lane` runs one call at a time: while a call is stuck past its deadline, the next call fails at once
instead of piling up another stuck thread, and `stuck_for()` tells the liveness probe how long.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Overdue(Exception):
    """A call did not finish within its deadline (it may still be running on its thread)."""


def _post(
    loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], result: Any, exc: BaseException | None
) -> None:
    def settle() -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop closed while the thread was stuck: nobody waits
        loop.call_soon_threadsafe(settle)


def start(fn: Callable[..., T], *args: Any, name: str) -> asyncio.Future[T]:
    """Run `fn(*args)` on a new daemon thread; the future settles on the calling loop."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, which decides
            _post(loop, fut, None, exc)
        else:
            _post(loop, fut, result, None)

    threading.Thread(target=target, name=name, daemon=True).start()
    fut.add_done_callback(_consume)
    return fut


def _consume(fut: asyncio.Future[Any]) -> None:
    # A call abandoned at its deadline may fail later with nobody awaiting it: that is not worth a warning.
    if not fut.cancelled():
        fut.exception()


async def call(fn: Callable[..., T], *args: Any, deadline: float, name: str) -> T:
    """`fn(*args)` on a daemon thread; Overdue after `deadline` seconds (the thread is left behind)."""
    fut = start(fn, *args, name=name)
    try:
        return await asyncio.wait_for(asyncio.shield(fut), deadline)
    except TimeoutError:
        raise Overdue(f"{name} did not finish within {deadline:g}s") from None


class Lane:
    """One blocking call at a time, each with a deadline, on one long-lived daemon thread.

    One thread, not one per call: the memory a walk allocates is then reused by the next walk rather than
    left in another thread's malloc arena."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._busy_since: float | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def stuck_for(self) -> float:
        """Seconds the current call has been running (0 when idle)."""
        return 0.0 if self._busy_since is None else time.monotonic() - self._busy_since

    def _serve(self) -> None:
        while True:
            fn, args, fut = self._jobs.get()
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting task, which decides
                _post(fut.get_loop(), fut, None, exc)
            else:
                _post(fut.get_loop(), fut, result, None)

    async def call(self, fn: Callable[..., T], *args: Any, deadline: float) -> T:
        if self._busy_since is not None:
            raise Overdue(f"{self.name} is still stuck in an earlier call, for {self.stuck_for():.0f}s")
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._busy_since = time.monotonic()

        def idle(done: asyncio.Future[T]) -> None:
            self._busy_since = None
            _consume(done)

        fut.add_done_callback(idle)
        self._jobs.put((fn, args, fut))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), deadline)
        except TimeoutError:
            raise Overdue(f"{self.name} did not finish within {deadline:g}s") from None
