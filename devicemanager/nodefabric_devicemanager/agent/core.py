"""The agent: passes (read the host, decide, write what changed), their consumers and the probes.

Three kinds of pass:
- walk: the whole host (PCI bus, interfaces, RDMA bindings, accelerators), on start, after kernel
  uevents (debounced) and every `walk_interval` as a safety net;
- refresh: every `interval`, only the files that change without a uevent (`refresh.py`): RDMA port state
  and netdev operstate;
- sync: no host read; the object changed under us (the watch saw someone else's write) and is decided
  again against what the host last read.

The agent keeps the object as it last wrote or saw it, so a pass whose reading did not change costs no
request at all; a 409 on a write, or the watch, tells it when someone else changed the object. A pass
never ends the process: conflicts are re-read and decided again, outages are retried with backoff, and a
failed pass is retried sooner than the interval. Host reads run on a daemon thread with a deadline: a
read stuck past it fails the pass, is reported (condition, log, metric) and never blocks a SIGTERM.

The agent is made of parts, one job each: `hostview.HostView` (the host as last read: walks and
refreshes), `liveobject.LiveObject` (the object as last seen, its watch and writes), `tell.Teller` (logs
and Events), `loop.Schedule` (when a pass runs). This module is one pass, its consumers and the probes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nodefabric_devicemanager import events
from nodefabric_devicemanager.agent import heap, publish
from nodefabric_devicemanager.agent.hostview import (
    INVENTORY_ERROR,
    READ_TIMEOUT,
    HostError,
    HostView,
    Observed,
    PassKind,
    Reader,
    default_reader,
    failed_reading,
    now,
)
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.agent.liveobject import API_DEADLINE_S, LiveObject
from nodefabric_devicemanager.agent.loop import Schedule, sleep
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.settings import AgentConfig, Outcome, Result
from nodefabric_devicemanager.agent.tell import Teller
from nodefabric_devicemanager.agent.watch import ObjectWatch
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.nodeclient import ApiFailure, resource_version
from nodefabric_devicemanager.shell.probe import Probe

__all__ = [
    "API_DEADLINE_S",
    "INVENTORY_ERROR",
    "READ_TIMEOUT",
    "Agent",
    "AgentConfig",
    "HostError",
    "Observed",
    "Outcome",
    "PassKind",
    "Reader",
    "RecordSink",
    "Result",
    "default_reader",
]

log = logging.getLogger(__name__)

RecordSink = Callable[[DevicesSpec], object]


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        client: DevicesClient,
        *,
        reader: Reader = default_reader,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.host = HostRoot.at(config.root)
        self.metrics = metrics or AgentMetrics()
        self.passes = 0
        self.last_outcome: Outcome | None = None
        self.record: DevicesSpec | None = None  # the record as last published (or found already published)
        self.view = HostView(config.node, self.host, reader, self.metrics, config.read_timeout)
        self.obj = LiveObject(client, config.node, self.metrics)
        self.teller = Teller(config.node, self.obj, self.metrics)
        self.schedule = Schedule(config, self.view, self.obj, self.metrics, self.run_pass)
        self._settled: tuple[int, str] | None = None  # (host generation, resourceVersion) last decided on
        self._sinks: list[RecordSink] = []
        self._last_pass_started = time.monotonic()
        self._last_success: float | None = None

    # The parts' handles a caller (and a test) may reach: the reader, the watch, the Events' budget.

    @property
    def reader(self) -> Reader:
        return self.view.reader

    @reader.setter
    def reader(self, reader: Reader) -> None:
        self.view.reader = reader

    @property
    def watch(self) -> ObjectWatch:
        return self.obj.watch

    @property
    def spam(self) -> events.Writer:
        return self.teller.spam

    @property
    def spam_clock(self) -> Callable[[], float]:
        return self.teller.spam_clock

    @spam_clock.setter
    def spam_clock(self, clock: Callable[[], float]) -> None:
        self.teller.spam_clock = clock

    @property
    def observed(self) -> Observed | None:
        return self.view.observed

    @property
    def live(self) -> dict[str, object] | None:
        return self.obj.live

    # --- consumers of the record (the in-process device plugin and DRA driver) -----------------------

    def subscribe(self, sink: RecordSink) -> None:
        """Call `sink(spec)` with every record a pass publishes or confirms."""
        self._sinks.append(sink)
        if self.record is not None:
            sink(self.record)

    def _deliver(self, spec: DevicesSpec) -> None:
        self.record = spec
        for sink in self._sinks:
            try:
                sink(spec)
            except Exception:
                log.exception("a record consumer failed", extra={"node": self.config.node})
        self.metrics.observe_record(spec)

    def _deliver_local(self, reading: publish.ReadingLike | None) -> None:
        """When the API cannot be written, consumers on this node still get what the host reads now:
        kubelet's allocations must not wait for the API server. A failed read with no earlier record
        delivers nothing, because a failed read is not an empty host."""
        if reading is None or (reading.interfaces is None and self.record is None):
            return
        self._deliver(publish.desired_spec(reading, self.record, now()))

    # --- one pass ------------------------------------------------------------------------------------

    async def run_pass(self, kind: PassKind = PassKind.WALK, stop: asyncio.Event | None = None) -> Outcome:
        self.passes += 1
        self._last_pass_started = time.monotonic()
        started = time.perf_counter()
        self.view.performed = kind
        try:
            outcome = await self._pass(kind, stop)
        except Exception as exc:  # a bug must cost one pass, never the DaemonSet pod
            log.exception("pass failed unexpectedly", extra={"node": self.config.node, "pass": self.passes})
            self.metrics.errors.labels(kind="internal").inc()
            outcome = Outcome(Result.FAILED, error=f"{type(exc).__name__}: {exc}")
        duration = time.perf_counter() - started
        kind = self.view.performed  # a refresh that found the topology changed walked instead
        self.metrics.pass_duration.labels(kind=kind.value).observe(duration)
        self.metrics.passes.labels(kind=kind.value, result="ok" if outcome.ok else "failed").inc()
        if outcome.ok:
            self._last_success = time.monotonic()
            self.metrics.last_success.set_to_current_time()
        self.last_outcome = outcome
        if kind is PassKind.WALK or outcome.wrote:
            # The walk's and the written object's garbage is freed by now: give its pages back (a few ms at
            # most, on a heap this size; once per walk or write).
            heap.release()
        fields = {
            "node": self.config.node,
            "pass": self.passes,
            "kind": kind.value,
            "duration_ms": round(duration * 1000, 1),
            "wrote": ",".join(outcome.wrote) or "nothing",
            "result": outcome.result.value,
        }
        if not outcome.ok:
            log.error(
                "pass failed; the record was not brought up to date", extra={**fields, "error": outcome.error}
            )
        elif outcome.wrote:
            log.info("published the devices record", extra=fields)
        else:
            log.debug("the devices record is up to date", extra=fields)
        return outcome

    async def _pass(self, kind: PassKind, stop: asyncio.Event | None) -> Outcome:
        host_error: HostError | None = None
        if kind is PassKind.WALK or self.view.walk_wanted:
            host_error = await self.view.walk()
        elif kind is PassKind.REFRESH:
            host_error = await self.view.refresh()
        if host_error:
            self.view.walk_wanted = True  # what was read before may be stale: the next pass reads everything
        attempt = 0
        while True:
            try:
                if not self.obj.known:
                    await self.obj.relist_or_raise()
                stored = self.obj.live
                reading: publish.ReadingLike | None
                parsed = self.obj.spec() if stored is not None else None
                if host_error:
                    reading = failed_reading(host_error.message, host_error.reason, parsed)
                else:
                    reading = self.view.observed
                if reading is None:  # no host read ever succeeded and this one failed: nothing to say
                    return Outcome(Result.FAILED, error="the host was never read")
                degraded = self.teller.tell(reading)
                key = (self.view.generation, resource_version(stored))
                if not host_error and self.obj.known and key == self._settled:
                    await self.teller.post_notices(reading)
                    return Outcome(Result.UNCHANGED, degraded=degraded)
                plan = publish.plan(stored, reading, now(), parsed)
                wrote, final = await self.obj.apply(stored, plan, parsed)
                if "spec" in wrote and parsed is not None and final is not None:
                    await self.teller.tell_links(parsed, final)
                if not host_error:
                    self._settled = (self.view.generation, self.obj.version())
                # A record whose interfaces were never read says nothing about the endpoints: handing
                # it on would register zero devices as if that were a fact. Wait for a real reading.
                deliverable = final is not None and (
                    reading.interfaces is not None or final.interfaces or self.record is not None
                )
                if deliverable and final is not None and final != self.record:
                    self._deliver(final)
                await self.teller.post_notices(reading)
                result = (
                    Result.UNCHANGED if not wrote else Result.CREATED if "create" in wrote else Result.UPDATED
                )
                if host_error:
                    return Outcome(Result.FAILED, tuple(wrote), degraded, error=host_error.message)
                return Outcome(result, tuple(wrote), degraded)
            except ApiFailure as exc:
                self.metrics.errors.labels(kind=exc.kind).inc()
                attempt += 1
                if exc.kind == "conflict":
                    self.obj.known = False  # someone else wrote: list it again and decide again
                if not exc.retryable or attempt >= self.config.attempts:
                    self._deliver_local(self.view.observed if not host_error else None)
                    return Outcome(Result.FAILED, error=str(exc))
                # A conflict is answered by re-reading almost at once; an outage backs off.
                backoff = self.config.backoff
                delay = backoff.delay(0) / 10 if exc.kind == "conflict" else backoff.delay(attempt)
                log.warning(
                    "api request failed; retrying",
                    extra={
                        "node": self.config.node,
                        "pass": self.passes,
                        "kind": exc.kind,
                        "error": str(exc),
                        "attempt": attempt,
                        "retry_in_s": round(delay, 2),
                    },
                )
                if await sleep(delay, stop):
                    return Outcome(Result.FAILED, error="stopped while retrying")

    # --- the loop and the probes -----------------------------------------------------------------------

    def trigger(self) -> None:
        """A kernel uevent: walk the host soon; bursts are coalesced by the debounce."""
        self.schedule.trigger()

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until `stop` is set (see `loop.Schedule`)."""
        await self.schedule.run(stop)

    def liveness(self) -> Probe:
        """Alive while passes keep starting and no host read is stuck for long: a stuck read gets the pod
        restarted (and its events say why) rather than serving an ever older record."""
        limit = 3 * self.config.interval + 60
        stalled = time.monotonic() - self._last_pass_started
        if stalled > limit:
            return Probe(False, f"no pass started for {stalled:.0f}s (limit {limit:.0f}s)")
        stuck = self.view.stuck_for()
        if stuck > max(limit, self.config.read_timeout):
            return Probe(False, f"a host read is stuck for {stuck:.0f}s (limit {limit:.0f}s)")
        return Probe(True, "ok")

    def readiness(self) -> Probe:
        """Ready once a pass has brought the record in step with the host, and while the last one did."""
        if self.last_outcome is not None and not self.last_outcome.ok:
            return Probe(False, f"the last pass failed: {self.last_outcome.error}")
        if self._last_success is None:
            return Probe(False, "no pass has completed yet")
        return Probe(True, "ok")
