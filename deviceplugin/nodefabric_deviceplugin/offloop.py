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
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from nodefabric_devicemanager.backoff import Backoff

T = TypeVar("T")
log = logging.getLogger(__name__)


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

    def hand_over(result: T | None, error: BaseException | None) -> None:
        # The loop may close between any check and the call (the process stopping): nobody is left
        # to hand the outcome to, and the thread ends quietly rather than print a traceback.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, fut, result, error)

    def body() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting side, whatever it is
            hand_over(None, exc)
        else:
            hand_over(result, None)

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


# A failed build is tried again while its record is unchanged: 1 s, doubling, at most a minute apart.
BUILD_RETRY = Backoff(base=1.0, cap=60.0, jitter=False)
# How long a kubelet call (an Allocate, a prepare) waits for a build at most: some 300 times what the
# largest build costs, within kubelet's 45 s per DRA call, and an answer where kubelet sets no deadline
# (its Allocate): a build that never ends (a bug looping in it) must not hold a pod's start for ever.
BUILD_WAIT_S = 10.0


class BuildFailed(Exception):
    """A build of a record version failed (`cause`); it is tried again in `retry_in` seconds at the
    earliest, or at once for another version."""

    def __init__(self, what: str, version: int, retry_in: float, cause: BaseException) -> None:
        super().__init__(f"building {what} of record version {version} failed: {cause!r}")
        self.version = version
        self.retry_in = retry_in
        self.cause = cause


class BuildTimeout(Exception):
    """A caller waited `budget` seconds for a build of a record version, and it has not ended. It goes on
    running in its thread: the next caller shares it (no second build is started on top of it)."""

    def __init__(self, what: str, version: int, budget: float, running_for: float) -> None:
        super().__init__(
            f"building {what} of record version {version} did not finish within {budget:g} s (running"
            f" for {running_for:.1f} s); it is used once it ends"
        )
        self.version = version
        self.budget = budget


class VersionedBuild(Generic[T]):
    """A value derived from a record version, built on a thread of its own: one build at a time, callers
    of one version share it, and a caller of another version waits for the one running, then builds the
    latest record (a record changing while builds run, a link flapping, must not start a thread per
    version, each costing up to seconds of CPU for a record already replaced). The caller caches what it
    gets. A failed build is kept for its version only until `retry` says try again (a failure left cached
    until the record changed left the resource failed for good on a node whose record no longer
    changes); each failure streak is logged once, with its first failure, and its end once. A streak is
    one record's: another record's failure starts the backoff (and its Error) afresh, since it may fail
    otherwise, and waiting out the old record's 60 s for it would leave a new record unserved a minute.
    Once `close`d (its owner stopped) a build that ends is neither counted nor logged."""

    def __init__(
        self, what: str, retry: Backoff = BUILD_RETRY, *, thread: str = "", **fields: object
    ) -> None:
        """`what`: the value, as the logs name it; `thread`: its builds' thread name (default `what`);
        `fields`: said in every log."""
        self.what = what
        self.thread = thread or what
        self.retry = retry
        self.fields = fields
        self.started = 0  # builds started so far
        self.failures = 0  # consecutive failed builds (the streak; 0 after a success)
        self._building: tuple[int, asyncio.Future[T]] | None = None
        self._next_try = 0.0
        self._counted: asyncio.Future[T] | None = None
        self._failed_version = 0  # the record version of the streak's failures
        self._since = 0.0  # when the build in flight started
        self.closed = False

    def close(self) -> None:
        """The owner stopped: a build still running is left to end in its thread, unlogged."""
        self.closed = True

    @property
    def running_for(self) -> float:
        """Seconds the build in flight has been running; 0 when none is."""
        building = self._building
        return 0.0 if building is None or building[1].done() else time.monotonic() - self._since

    @property
    def retry_in(self) -> float:
        """Seconds until a failed build may be tried again (0 when it may now)."""
        return max(0.0, self._next_try - time.monotonic()) if self.failures else 0.0

    async def other_ended(self, version: int) -> bool:
        """Wait for a build of another version still running; whether there was one."""
        building = self._building
        if building is None or building[0] == version or building[1].done():
            return False
        await asyncio.wait([building[1]])  # never cancels the build, whoever stops waiting
        return True

    async def build(self, version: int, make: Callable[[], T]) -> T | None:
        """What `make` builds for `version`, shared with every caller of that version. None, once it has
        ended, when another version's build was running (the caller looks at the latest record again).
        Raises BuildFailed."""
        if await self.other_ended(version):
            return None
        building = self._building
        if building is None or building[0] != version or self._retry_due(version, building[1]):
            building = self._building = (version, self._start(version, make))
            self._since = time.monotonic()
        try:
            return await asyncio.shield(building[1])
        except Exception as exc:
            self._ended(version, building[1])  # counted here if its callback has not run yet
            raise BuildFailed(self.what, version, self.retry_in, exc) from exc

    def _retry_due(self, version: int, fut: asyncio.Future[T]) -> bool:
        if not fut.done() or fut.cancelled() or fut.exception() is None:
            return False
        self._ended(version, fut)  # counted before its callback runs: the backoff starts at the failure
        return time.monotonic() >= self._next_try

    def _start(self, version: int, make: Callable[[], T]) -> asyncio.Future[T]:
        try:
            fut = start(make, self.thread)
        except RuntimeError:  # no thread to be had (the process at its limit): built here all the same
            fut = asyncio.get_running_loop().create_future()
            try:
                fut.set_result(make())
            except Exception as exc:
                fut.set_exception(exc)
        self.started += 1
        fut.add_done_callback(_consume)  # a build every caller walked away from logs nothing more
        fut.add_done_callback(lambda done: self._ended(version, done))
        return fut

    def _ended(self, version: int, fut: asyncio.Future[T]) -> None:
        """Count a build's outcome once: a failure extends the streak (and its backoff), a success ends it."""
        if fut is self._counted or fut.cancelled() or self.closed:
            return
        self._counted = fut
        exc = fut.exception()
        if exc is None:
            if self.failures:
                log.info(
                    f"built {self.what} after failed tries",
                    extra={**self.fields, "version": version, "failed_tries": self.failures},
                )
            self.failures = 0
            return
        if self.failures and version != self._failed_version:
            self.failures = 0  # another record's failure: a streak of its own
        self._failed_version = version
        self.failures += 1
        delay = self.retry.ceiling(self.failures - 1)
        self._next_try = time.monotonic() + delay
        if self.failures == 1:
            log.error(
                f"could not build {self.what}; trying again with backoff ({self.retry.base:g} s doubling to"
                f" {self.retry.cap:g} s) while the record is unchanged, at once when it changes",
                exc_info=exc,
                extra={**self.fields, "version": version, "retry_in_s": delay},
            )
