"""The NodeFeature namespace (--namespace) found missing: one fact about the operator, waited for once.

A mistyped --namespace made every record's create fail with the same 404 and retried each on its own,
through the backoffs and then again 60 s after each round: 5,000 records sent 187 creates a second for
nothing (measured against the embedded API), with a WARNING line per retry and an ERROR line per record
per round. Now the first 404 that names the namespace (details kind "namespaces", as the API server
answers a create in a namespace that does not exist) is logged once as an ERROR naming it; every record
that needs a create waits here instead of sending one, its LabelsPublished condition written once (and
again only when it changes); and ONE waiting record's publish is tried at a time, on a growing backoff
capped at PROBE_CAP_FACTOR times the longest retry backoff (5 min by default), as the probe: it needs no
right beyond creating NodeFeatures, and when it lands the namespace exists, so every waiting record is
published at once.

The NodeFeature API not served (NFD's CRD not installed, or deleted under the running operator: NFD
uninstalled or reinstalled) is waited for the same way: every record's create answered the same 404,
retried through the backoffs and requeued every 60 s, a WARNING per retry and an ERROR and Event per
record (2,000 records sent 132 requests a second over the first 2 minutes, and still 63 a second after
them, with a log line per request: hack/bench_operator.py --crd-missing). The create's 404 says which is
missing (sinks.missing_namespace, sinks.missing_api), and the ERROR line says that one.

Only the event loop touches it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence

from nodefabric_operator import sinks
from nodefabric_operator.noderecord import Outcome

log = logging.getLogger(__name__)

PROBE_CAP_FACTOR = 5  # the longest probe delay, in longest retry backoffs: 5 min with the default 60 s

# What is said of each missing fact: the ERROR line, the fix, the probe's DEBUG line, the INFO line once
# it exists.
SAID = {
    "namespace": (
        "the namespace for NodeFeatures does not exist: nothing is published until it does",
        "create it, or run with --namespace naming one that exists",
        "the namespace for NodeFeatures is still missing",
        "the namespace for NodeFeatures exists now, publishing the records that waited",
    ),
    "api": (
        "the NodeFeature API is not served (NFD's CRD is not installed): nothing is published until it is",
        "install NFD (its NodeFeature CRD), or run with --sink node",
        "the NodeFeature API is still not served",
        "the NodeFeature API is served now, publishing the records that waited",
    ),
}


def _steps(backoffs: Sequence[float]) -> list[float]:
    return [b for b in backoffs if b > 0] or [1.0]


def cap(backoffs: Sequence[float]) -> float:
    """The longest delay between two probes."""
    return PROBE_CAP_FACTOR * max(_steps(backoffs))


def delays(backoffs: Sequence[float]) -> Iterator[float]:
    """The probe's delays: the retry backoffs, then doubling, up to the cap, which then repeats."""
    steps = _steps(backoffs)
    yield from steps
    delay = steps[-1]
    while True:
        delay = min(delay * 2, cap(backoffs))
        yield delay


class NamespaceWait:
    def __init__(
        self,
        namespace: str,
        backoffs: Sequence[float],
        publish: Callable[[str], Awaitable[Outcome]],
        wanted: Callable[[str], bool],
        cheap: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self.namespace = namespace
        self.backoffs = tuple(backoffs)
        self.publish = publish  # the reconcile of one record
        self.wanted = wanted  # whether the record still exists to publish
        self.cheap = cheap  # whether its publish is one request (a create only): preferred as the probe
        self.missing = False
        self.cause: sinks.Unpublishable = sinks.namespace_missing(namespace)  # what is missing, as said
        self.probing: str | None = None  # the record whose publish is the probe now: it may send
        self._waiting: dict[str, None] = {}  # records waiting, in the order they came
        self._round = 0  # a new round of missing: a sleeping probe of an older one stops
        self._tasks: set[asyncio.Future[object]] = set()  # held until done: the loop keeps weak refs
        self._probe_task: asyncio.Future[object] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._waiting)

    def holds(self, name: str) -> bool:
        """Whether `name`'s create must wait (and now does): the namespace is missing and this is not
        the probe."""
        if not self.missing or name == self.probing:
            return False
        self._waiting[name] = None
        return True

    def absent(self, name: str, cause: sinks.Unpublishable | None = None) -> None:
        """A create for `name` was answered: namespace not found (or being deleted), or the NodeFeature
        API not served (`cause`). The first says so, once, and starts the probe; `name` waits with the
        others. A probe answered with the other fact (the namespace created, NFD still missing) says
        that one, once, and goes on probing."""
        self._waiting[name] = None
        if cause is not None and (cause.fact != self.cause.fact or not self.missing):
            self.cause = cause
            if self.missing:
                self._say()
        if self.missing:
            return
        self.missing = True
        self._round += 1
        self._say()
        if not self._closed:  # a publish that ended after the stop must not start probing again
            self._probe_task = self._spawn(self._probe(self._round))

    def _say(self) -> None:
        line, fix = SAID[self.cause.fact][:2]
        extra = {"namespace": self.namespace, "fix": fix, "probe_max_s": cap(self.backoffs)}
        log.error(line, extra={**extra, "said": str(self.cause)})

    def present(self) -> None:
        """A write into the namespace landed: it exists. Every record that waited is published."""
        if not self.missing:
            return
        if self._closed:
            # A publish left to end as the operator stops (the probe's) landed after the stop: publishing
            # the waiting records now would start writes in tasks kopf neither waits for nor cancels, sent
            # through its stop and the lease's release. They wait for kopf's next start (reopen's probe).
            return
        self.missing = False
        names = [n for n in self._waiting if self.wanted(n)]
        self._waiting.clear()
        log.info(
            SAID[self.cause.fact][3],
            extra={"namespace": self.namespace, "records": len(names)},
        )
        for name in names:
            self._spawn(self.publish(name))

    def forget(self, name: str) -> None:
        self._waiting.pop(name, None)

    async def _probe(self, round_: int) -> None:
        for delay in delays(self.backoffs):
            await asyncio.sleep(delay)
            if round_ != self._round or not self.missing:
                return
            name = self._next()
            if name is None:
                # Nobody waits any more: the next record to need a create tries it, and says so again.
                self.missing = False
                return
            self._waiting.pop(name, None)
            self.probing = name
            try:
                await self.publish(name)
            finally:
                # Only our own: a publish that outlived its round (its retries) must not clear the probe of
                # the round after, whose record would then be held instead of sent.
                if self.probing == name:
                    self.probing = None
            if self.missing:
                log.debug(
                    SAID[self.cause.fact][2],
                    extra={"namespace": self.namespace, "waiting": len(self._waiting)},
                )

    def _next(self) -> str | None:
        """The record to probe with: one whose publish is a single create, if any still waits."""
        for name in [n for n in self._waiting if not self.wanted(n)]:
            self._waiting.pop(name, None)
        return next((n for n in self._waiting if self.cheap(n)), next(iter(self._waiting), None))

    def _spawn(self, work: Awaitable[object]) -> asyncio.Future[object]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def close(self) -> None:
        """The operator is stopping: no more probes (a publish under way ends as any other does)."""
        self._closed = True
        self._round += 1
        if self._probe_task is not None and self.probing is None:
            self._probe_task.cancel()

    def reopen(self) -> None:
        """kopf started again in the same operator (a watched resource's 404 restarts it: cli._kopf, NFD's
        CRD deleted under its watch) after its stop closed the wait. The waiting records count as
        handled, so the relist brings none back: without a probe of a new round they waited for good,
        the API served again or not."""
        if not self._closed:
            return
        self._closed = False
        if self.missing:
            self._round += 1  # a probe of the closed round still in its publish ends after it
            self._probe_task = self._spawn(self._probe(self._round))
