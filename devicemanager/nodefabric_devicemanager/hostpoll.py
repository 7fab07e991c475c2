"""Reading the host off the event loop with a deadline, and the standalone servers' polling loop.

A sysfs or NVML read can block for a long time (a driver holding its lock through a firmware reset) or
forever (a FIFO where an attribute should be, a hung mount). The agent and the standalone readers of the
device plugin and the DRA driver all read through `HostReads`: one read at a time, on one daemon thread
(`workers.Lane`), each waited for at most its deadline. A read stuck past it fails that read; while it
stays stuck the next read fails at once rather than piling up another stuck thread; and a SIGTERM never
waits for it (the thread is a daemon). What a failed read means is the caller's: the agent fails the
pass and keeps the record (conditions, events); the standalone readers serve the last record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from nodefabric_devicemanager.workers import Lane, Overdue

T = TypeVar("T")

# A standalone reader's deadline: a whole inventory pass takes well under a second on a healthy host.
DEFAULT_DEADLINE_S = 30.0

__all__ = ["DEFAULT_DEADLINE_S", "HostReads", "Overdue", "poll", "serve_beside"]


class HostReads:
    """One host read at a time, each with a deadline. Raises `Overdue` for a read past it."""

    def __init__(self, deadline: float = DEFAULT_DEADLINE_S, name: str = "host-read") -> None:
        self.deadline = _deadline(deadline)
        self._lane = Lane(name)

    def stuck_for(self) -> float:
        """Seconds the read in flight has been running (0 when none is): for a liveness probe."""
        return self._lane.stuck_for()

    async def read(self, fn: Callable[..., T], *args: Any, deadline: float | None = None) -> T:
        return await self._lane.call(
            fn, *args, deadline=self.deadline if deadline is None else _deadline(deadline)
        )


def _deadline(value: object) -> float:
    """A read's deadline: a positive, finite number of seconds. 0 or less failed every read at once, NaN or
    infinity waited on a stuck read forever: neither is a deadline. Raises ValueError naming the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a host read's deadline must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"a host read's deadline must be positive and finite, got {value!r}")
    return float(value)


async def poll(
    read: Callable[[], T],
    feed: Callable[[T], None],
    *,
    root: str,
    interval: float,
    stop: asyncio.Event,
    log: logging.Logger,
    deadline: float = DEFAULT_DEADLINE_S,
) -> None:
    """`read()` every `interval` seconds, each reading handed to `feed`, until `stop` is set. A read that
    raises or passes its deadline, or a reading `feed` refuses by raising, changes nothing (the last
    record is served) and is logged, a stuck read once until a read succeeds again; `stop` is never kept
    waiting by a read stuck in its thread."""
    reads = HostReads(deadline)
    stopped = asyncio.ensure_future(stop.wait())
    stuck = False
    try:
        while not stop.is_set():
            pending = asyncio.ensure_future(reads.read(read))
            await asyncio.wait({pending, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
                break
            try:
                reading = pending.result()
            except Overdue as exc:
                if not stuck:
                    log.error(
                        "reading the host is taking too long; serving the last record",
                        extra={"root": root, "why": str(exc)},
                    )
                stuck = True
            except Exception:
                log.exception("reading the host failed; serving the last record", extra={"root": root})
            else:
                if stuck:
                    log.info("the host is read again", extra={"root": root})
                stuck = False
                try:
                    feed(reading)
                except Exception:  # garbage from the host (a record the model refuses) costs one reading
                    log.exception("a host reading was refused; serving the last record", extra={"root": root})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(stopped), timeout=interval)
    finally:
        stopped.cancel()


async def serve_beside(polling: Coroutine[Any, Any, None], serving: Awaitable[T], stop: asyncio.Event) -> T:
    """Run a standalone server (`serving`) with its host poll (`polling`, a `poll` on `stop`) beside it:
    when the server ends, however it ends, the poll is stopped and waited for, so no read outlives the
    command's clean-up and a poll's own failure is not lost."""
    poller = asyncio.ensure_future(polling)
    try:
        return await serving
    finally:
        stop.set()
        await poller
