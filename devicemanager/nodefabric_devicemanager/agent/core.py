"""The agent: one pass (read the host, decide, write what changed) and the loop that schedules passes.

A pass never ends the process. API conflicts are re-read and decided again, outages and throttling are
retried with backoff inside the pass, and a pass that still fails is retried sooner than the interval
(with backoff) by the loop. A failed host read keeps the recorded data and says so in a condition.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.agent.kube import ApiFailure, Backoff, DevicesClient, owner_reference
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.serve import Probe
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import (
    ACCELERATORS_ENUMERATED,
    INTERFACES_ENUMERATED,
    AcceleratorGroup,
    Condition,
    DevicesSpec,
    Interface,
)

log = logging.getLogger(__name__)

Reader = Callable[[HostRoot], publish.ReadingLike]
RecordSink = Callable[[DevicesSpec], object]


def default_reader(host: HostRoot) -> publish.ReadingLike:
    from nodefabric_devicemanager import inventory

    return inventory.read(host)


@dataclass
class AgentConfig:
    node: str
    root: str = "/"
    interval: float = 60.0
    # Quiet time after a kernel event before the pass runs, so a burst (128 VFs appearing) is one pass.
    debounce: float = 2.0
    # A burst that never goes quiet still gets a pass this often.
    debounce_max: float = 15.0
    # Attempts per pass for conflicts and outages before the pass is declared failed.
    attempts: int = 6
    backoff: Backoff = field(default_factory=Backoff)


class Result(enum.StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Outcome:
    result: Result
    wrote: tuple[str, ...] = ()  # "create", "spec", "status", in order
    # Conditions reported False this pass (an enumeration that failed); the record is still published.
    degraded: tuple[str, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.result is not Result.FAILED


@dataclass
class _FailedReading:
    """Stands in for a reading when the inventory itself raised: nothing was read, so everything is kept."""

    failed_manufacturers: set[str]
    conditions: list[Condition]
    interfaces: list[Interface] | None = None
    groups: list[AcceleratorGroup] = field(default_factory=list)


def _failed_reading(error: str, stored: dict[str, Any] | None) -> _FailedReading:
    spec = publish.stored_spec(stored) if stored is not None else None
    manufacturers = {g.id for g in spec.groups} if spec is not None else set()
    message = f"the host could not be read ({error}); the recorded data is kept"
    return _FailedReading(
        failed_manufacturers=manufacturers,
        conditions=[
            Condition(type=INTERFACES_ENUMERATED, status="False", reason="InventoryError", message=message),
            Condition(type=ACCELERATORS_ENUMERATED, status="False", reason="InventoryError", message=message),
        ],
    )


def _now() -> datetime:
    # The API stores times at second precision; a finer local value would never compare equal to it.
    return datetime.now(UTC).replace(microsecond=0)


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
        self.reader = reader
        self.metrics = metrics or AgentMetrics()
        self.passes = 0
        self.last_outcome: Outcome | None = None
        self.record: DevicesSpec | None = None  # the record as last published (or found already published)
        self._sinks: list[RecordSink] = []
        self._wake = asyncio.Event()
        self._last_pass_started = time.monotonic()
        self._last_success: float | None = None

    # --- consumers of the record (the in-process device plugin) --------------------------------------

    def subscribe(self, sink: RecordSink) -> None:
        """Call `sink(spec)` with every record a pass publishes or confirms (also when nothing changed)."""
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
        self._deliver(publish.desired_spec(reading, self.record, _now()))

    # --- one pass ------------------------------------------------------------------------------------

    async def run_pass(self, stop: asyncio.Event | None = None) -> Outcome:
        self.passes += 1
        self._last_pass_started = time.monotonic()
        started = time.perf_counter()
        try:
            outcome = await self._pass(stop)
        except Exception as exc:  # a bug must cost one pass, never the DaemonSet pod
            log.exception("pass failed unexpectedly", extra={"node": self.config.node, "pass": self.passes})
            self.metrics.errors.labels(kind="internal").inc()
            outcome = Outcome(Result.FAILED, error=f"{type(exc).__name__}: {exc}")
        duration = time.perf_counter() - started
        self.metrics.pass_duration.observe(duration)
        self.metrics.passes.labels(result="ok" if outcome.ok else "failed").inc()
        if outcome.ok:
            self._last_success = time.monotonic()
            self.metrics.last_success.set_to_current_time()
        self.last_outcome = outcome
        fields = {
            "node": self.config.node,
            "pass": self.passes,
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

    async def _read_host(self) -> tuple[publish.ReadingLike | None, str]:
        try:
            return await asyncio.to_thread(self.reader, self.host), ""
        except Exception as exc:
            log.exception("reading the host failed", extra={"node": self.config.node, "root": self.host.root})
            return None, f"{type(exc).__name__}: {exc}"

    async def _pass(self, stop: asyncio.Event | None) -> Outcome:
        node = self.config.node
        reading, read_error = await self._read_host()
        degraded = self._report_degraded(
            reading if reading is not None else _failed_reading(read_error, None)
        )
        attempt = 0
        while True:
            try:
                stored = await asyncio.to_thread(self.client.get, node)
                current = reading if reading is not None else _failed_reading(read_error, stored)
                plan = publish.plan(stored, current, _now())
                wrote, final = await self._apply(stored, plan)
                # A record whose interfaces were never read says nothing about the endpoints: handing
                # it on would register zero devices as if that were a fact. Wait for a real reading.
                if final is not None and (
                    current.interfaces is not None or final.interfaces or self.record is not None
                ):
                    self._deliver(final)
                if not wrote:
                    return Outcome(Result.UNCHANGED, degraded=degraded)
                return Outcome(
                    Result.CREATED if "create" in wrote else Result.UPDATED, tuple(wrote), degraded
                )
            except ApiFailure as exc:
                self.metrics.errors.labels(kind=exc.kind).inc()
                attempt += 1
                if not exc.retryable or attempt >= self.config.attempts:
                    self._deliver_local(reading)
                    return Outcome(Result.FAILED, error=str(exc))
                # A conflict is answered by re-reading almost at once; an outage backs off.
                backoff = self.config.backoff
                delay = backoff.delay(0) / 10 if exc.kind == "conflict" else backoff.delay(attempt)
                log.warning(
                    "api request failed; retrying",
                    extra={
                        "node": node,
                        "pass": self.passes,
                        "kind": exc.kind,
                        "error": str(exc),
                        "attempt": attempt,
                        "retry_in_s": round(delay, 2),
                    },
                )
                if await _sleep(delay, stop):
                    return Outcome(Result.FAILED, error="stopped while retrying")

    def _report_degraded(self, reading: publish.ReadingLike) -> tuple[str, ...]:
        """Log every False condition of ours at Error, every pass it persists: the record is stale there."""
        degraded = []
        for cond in publish.reported_conditions(reading):
            if cond.status != "False":
                continue
            degraded.append(cond.type)
            kind = "interfaces" if cond.type == INTERFACES_ENUMERATED else "accelerators"
            self.metrics.errors.labels(kind=kind).inc()
            log.error(
                "could not read part of the host; keeping the recorded data",
                extra={
                    "node": self.config.node,
                    "pass": self.passes,
                    "condition": cond.type,
                    "reason": cond.reason,
                    "detail": cond.message,
                },
            )
        return tuple(degraded)

    async def _apply(
        self, stored: dict[str, Any] | None, plan: publish.Plan
    ) -> tuple[list[str], DevicesSpec | None]:
        """Write what the plan says; returns what was written and the spec the object now holds (None when
        the stored one does not parse and was left as it is)."""
        node = self.config.node
        wrote: list[str] = []
        final: DevicesSpec | None
        if stored is None:
            assert plan.spec is not None
            uid = await asyncio.to_thread(self.client.node_uid, node)
            obj = await asyncio.to_thread(
                self.client.create, node, plan.spec.wire(), owner_reference(node, uid)
            )
            self.metrics.api_writes.labels(kind="create").inc()
            wrote.append("create")
            final = plan.spec
        else:
            obj = stored
            owners = await self._owners(stored)
            if plan.spec is not None or owners is not None:
                spec_wire = plan.spec.wire() if plan.spec is not None else None
                obj = await asyncio.to_thread(self.client.patch_spec, node, _rv(obj), spec_wire, owners)
                self.metrics.api_writes.labels(kind="spec").inc()
                wrote.append("spec")
            final = plan.spec if plan.spec is not None else publish.stored_spec(stored)
        if plan.conditions is not None:
            # Status is written after spec, preconditioned on the version that write returned.
            await asyncio.to_thread(self.client.patch_status, node, _rv(obj), plan.conditions)
            self.metrics.api_writes.labels(kind="status").inc()
            wrote.append("status")
        return wrote, final

    async def _owners(self, stored: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The ownerReferences to write when the object has no Node owner (created by hand or by an older
        agent), so deleting the Node still removes it; None when it already has one."""
        owners = list((stored.get("metadata") or {}).get("ownerReferences") or [])
        if any(o.get("kind") == "Node" and o.get("apiVersion") == "v1" for o in owners):
            return None
        uid = await asyncio.to_thread(self.client.node_uid, self.config.node)
        return [*owners, owner_reference(self.config.node, uid)]

    # --- the loop ------------------------------------------------------------------------------------

    def trigger(self) -> None:
        """Ask for a pass soon (a kernel uevent); bursts are coalesced by the debounce."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until `stop` is set: every interval, after a debounced trigger, and sooner after a
        failed pass (backoff, capped at the interval)."""
        failures = 0
        while not stop.is_set():
            outcome = await self.run_pass(stop)
            failures = 0 if outcome.ok else failures + 1
            delay = (
                self.config.interval
                if not failures
                else min(self.config.interval, self.config.backoff.delay(failures))
            )
            if await self._wait_for_trigger(delay, stop):
                return

    async def _wait_for_trigger(self, delay: float, stop: asyncio.Event) -> bool:
        """Wait out `delay` or a trigger plus its debounce. True when stopping."""
        waiter = asyncio.ensure_future(self._wake.wait())
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({waiter, stopper}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            stopper.cancel()
        if stop.is_set():
            return True
        if not self._wake.is_set():
            return False
        burst_started = time.monotonic()
        while self._wake.is_set():
            self._wake.clear()
            remaining = self.config.debounce_max - (time.monotonic() - burst_started)
            if remaining <= 0:
                break
            if await _sleep(min(self.config.debounce, remaining), stop, self._wake):
                return True
        return stop.is_set()

    # --- probes --------------------------------------------------------------------------------------

    def liveness(self) -> Probe:
        """Alive while passes keep starting: a loop stuck for several intervals gets the pod restarted."""
        stalled = time.monotonic() - self._last_pass_started
        limit = 3 * self.config.interval + 60
        if stalled > limit:
            return Probe(False, f"no pass started for {stalled:.0f}s (limit {limit:.0f}s)")
        return Probe(True, "ok")

    def readiness(self) -> Probe:
        """Ready once a pass has brought the record in step with the host, and while the last one did."""
        if self._last_success is None:
            return Probe(False, "no pass has completed yet")
        if self.last_outcome is not None and not self.last_outcome.ok:
            return Probe(False, f"the last pass failed: {self.last_outcome.error}")
        return Probe(True, "ok")


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


async def _sleep(seconds: float, stop: asyncio.Event | None, wake: asyncio.Event | None = None) -> bool:
    """Sleep, cut short by `stop` (returns True) or by `wake` (returns False)."""
    events = [e for e in (stop, wake) if e is not None]
    if not events:
        await asyncio.sleep(seconds)
        return False
    futures = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(futures, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            f.cancel()
    return stop is not None and stop.is_set()
