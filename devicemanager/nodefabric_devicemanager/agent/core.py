"""The agent: passes (read the host, decide, write what changed) and the loop that schedules them.

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
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodefabric_devicemanager import events, refresh
from nodefabric_devicemanager.agent import heap, kube, notices, publish, workers
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.serve import Probe
from nodefabric_devicemanager.agent.watch import ObjectWatch
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import (
    ACCELERATORS_ENUMERATED,
    INTERFACES_ENUMERATED,
    AcceleratorGroup,
    Condition,
    DevicesSpec,
    Interface,
)
from nodefabric_devicemanager.nodeclient import (
    ApiFailure,
    Backoff,
    metadata,
    owner_reference,
    resource_version,
)

log = logging.getLogger(__name__)

Reader = Callable[[HostRoot], publish.ReadingLike]
RecordSink = Callable[[DevicesSpec], object]
# One request answers within its socket timeout (10 s); the deadline only bounds a thread that hangs anyway.
API_DEADLINE_S = 30.0


def default_reader(host: HostRoot) -> publish.ReadingLike:
    from nodefabric_devicemanager import inventory

    return inventory.read(host)


class PassKind(enum.StrEnum):
    WALK = "walk"
    REFRESH = "refresh"
    SYNC = "sync"


@dataclass
class AgentConfig:
    node: str
    root: str = "/"
    # Seconds between link refreshes (port state, operstate).
    interval: float = 60.0
    # Seconds between full walks when no uevent asked for one: the safety net for a missed event.
    walk_interval: float = 600.0
    # Quiet time after a kernel event before the walk, so a burst (128 VFs appearing) is one walk.
    debounce: float = 2.0
    # A burst that never goes quiet still gets a walk this often.
    debounce_max: float = 15.0
    # The host read's budget: a walk or refresh still running after it fails the pass.
    read_timeout: float = 60.0
    # Attempts per pass for conflicts and outages before the pass is declared failed.
    attempts: int = 6
    backoff: Backoff = field(default_factory=Backoff)
    # Follow the object with a watch (the long-running agent); `--once` and unit tests do without.
    watch: bool = True


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
        return self.result is not Result.FAILED and not self.error


@dataclass
class Observed:
    """What the host read as, kept between passes: the last walk, with refreshed link facts."""

    interfaces: list[Interface] | None
    groups: list[AcceleratorGroup] = field(default_factory=list)
    failed_manufacturers: set[str] = field(default_factory=set)
    conditions: list[Condition] = field(default_factory=list)


READ_TIMEOUT = "ReadTimeout"
INVENTORY_ERROR = "InventoryError"


@dataclass(frozen=True, slots=True)
class HostError:
    """Why this pass has no reading of the host: the message for the condition, and its reason."""

    message: str
    reason: str


def _failed_reading(error: str, reason: str, spec: DevicesSpec | None) -> Observed:
    """Stands in for a reading when the host read raised or timed out: nothing was read, so everything
    recorded is kept."""
    manufacturers = {g.id for g in spec.groups} if spec is not None else set()
    message = f"the host could not be read ({error}); the recorded data is kept"
    return Observed(
        interfaces=None,
        failed_manufacturers=manufacturers,
        conditions=[
            Condition(type=INTERFACES_ENUMERATED, status="False", reason=reason, message=message),
            Condition(type=ACCELERATORS_ENUMERATED, status="False", reason=reason, message=message),
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
        self.observed: Observed | None = None
        self._generation = 0  # grows whenever `observed` changes
        self._plan: refresh.Plan | None = None
        self._snapshot: refresh.Snapshot | None = None
        # The object as last written or seen; `_live_known` False means it must be listed first.
        self.live: dict[str, Any] | None = None
        self._live_known = False
        self._parsed: tuple[str, DevicesSpec | None] | None = None  # (resourceVersion, its spec)
        # Versions of the object this agent wrote or listed: their watch events, arriving after a later write
        # of ours, are old news (resourceVersions are opaque: they are matched, never ordered).
        self._versions: collections.deque[str] = collections.deque(maxlen=16)
        self._writing = False
        self._held: list[dict[str, Any]] = []
        self._settled: tuple[int, str] | None = None  # (generation, resourceVersion) last decided on
        self._told: dict[str, tuple[str, str]] = {}  # conditions last logged
        self._posted: dict[str, tuple[str, str]] = {}  # conditions last posted as Events
        # A condition that flaps posts 25 Events at once, then one per 5 minutes (the shared spam filter).
        # spam_clock is read at each decision, not bound now: a test (or a caller) may replace it later.
        self.spam = events.Writer(kube.COMPONENT, clock=lambda: self.spam_clock())  # noqa: PLW0108
        self.spam_clock: Callable[[], float] = time.monotonic  # the budget's clock (seconds)
        self._sinks: list[RecordSink] = []
        self._walk_wanted = True
        self._last_walk: float | None = None
        self._uevent = asyncio.Event()
        self._synced = asyncio.Event()
        self._host_lane = workers.Lane("host-read")
        self._api_lane = workers.Lane("api")
        self._api_turn = asyncio.Lock()
        self._last_pass_started = time.monotonic()
        self._last_success: float | None = None
        self._performed = PassKind.WALK
        self.watch = ObjectWatch(client, config.node, self._on_watch_event, self._relist)

    # --- consumers of the record (the in-process device plugin) --------------------------------------

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
        self._deliver(publish.desired_spec(reading, self.record, _now()))

    # --- reading the host ----------------------------------------------------------------------------

    def _observe(self, observed: Observed) -> None:
        self.observed = observed
        self._generation += 1

    def _walk_blocking(self) -> tuple[Observed, refresh.Plan | None, refresh.Snapshot | None]:
        reading = self.reader(self.host)
        observed = Observed(
            interfaces=reading.interfaces,
            groups=list(reading.groups),
            failed_manufacturers=set(reading.failed_manufacturers),
            conditions=list(reading.conditions),
        )
        if reading.interfaces is None:
            return observed, None, None
        plan = refresh.plan(self.host, reading.interfaces)
        snap = refresh.snapshot(plan)
        # Judge every link again from the snapshot's moment, so a change between the walk's read and the
        # snapshot cannot hide until the next walk.
        observed.interfaces = refresh.apply(reading.interfaces, refresh.judge(plan, None, snap))
        return observed, plan, snap

    def _refresh_blocking(
        self, plan: refresh.Plan, before: refresh.Snapshot
    ) -> tuple[refresh.Snapshot, refresh.Changes]:
        after = refresh.snapshot(plan)
        if after == before:
            return after, refresh.Changes()
        return after, refresh.judge(plan, before, after)

    def _overdue(self, what: str, exc: workers.Overdue) -> HostError:
        self.metrics.errors.labels(kind="host_timeout").inc()
        log.error(
            "the host read is stuck; failing the pass",
            extra={
                "node": self.config.node,
                "read": what,
                "stuck_s": round(self._host_lane.stuck_for(), 1),
                "budget_s": self.config.read_timeout,
                "detail": str(exc),
            },
        )
        # Stable text: the condition message must not change while the same read stays stuck.
        return HostError(f"the host read did not finish within {self.config.read_timeout:g}s", READ_TIMEOUT)

    async def _walk(self) -> HostError | None:
        """A full host read; returns what went wrong when it failed (the observation then stays as it was)."""
        observed_at = _now()
        try:
            observed, plan, snap = await self._host_lane.call(
                self._walk_blocking, deadline=self.config.read_timeout
            )
        except workers.Overdue as exc:
            return self._overdue("walk", exc)
        except Exception as exc:
            log.exception("reading the host failed", extra={"node": self.config.node, "root": self.host.root})
            return HostError(f"{type(exc).__name__}: {exc}", INVENTORY_ERROR)
        self._walk_wanted = False
        self._last_walk = time.monotonic()
        self._plan, self._snapshot = plan, snap
        previous = self.observed.interfaces if self.observed is not None else None
        if observed.interfaces is not None:
            observed.interfaces = publish.carry_first_seen(observed.interfaces, previous or [], observed_at)
        self._observe(observed)
        self._performed = PassKind.WALK
        return None

    async def _refresh(self) -> HostError | None:
        """Re-read link state only; falls back to a walk when there is nothing planned or a file vanished."""
        plan, before, observed = self._plan, self._snapshot, self.observed
        if plan is None or before is None or observed is None or observed.interfaces is None:
            return await self._walk()
        observed_at = _now()
        try:
            after, changes = await self._host_lane.call(
                self._refresh_blocking, plan, before, deadline=self.config.read_timeout
            )
        except workers.Overdue as exc:
            return self._overdue("refresh", exc)
        except Exception as exc:
            log.exception("refreshing link state failed", extra={"node": self.config.node})
            return HostError(f"{type(exc).__name__}: {exc}", INVENTORY_ERROR)
        if after.gone:
            log.info(
                "a watched interface or rdma device is gone; walking the host",
                extra={"node": self.config.node},
            )
            return await self._walk()
        self._snapshot = after
        interfaces = refresh.apply(observed.interfaces, changes)
        if interfaces is not observed.interfaces:
            interfaces = publish.carry_first_seen(interfaces, observed.interfaces, observed_at)
            self._observe(
                Observed(interfaces, observed.groups, observed.failed_manufacturers, observed.conditions)
            )
        return None

    # --- the API side --------------------------------------------------------------------------------

    async def _api(self, fn: Callable[..., Any], *args: Any) -> Any:
        # The pass, the watch's list and the Events take turns on the one API thread.
        async with self._api_turn:
            try:
                return await self._api_lane.call(fn, *args, deadline=API_DEADLINE_S)
            except workers.Overdue as exc:
                raise ApiFailure("unavailable", str(exc)) from exc

    def _set_live(self, obj: dict[str, Any] | None, spec: DevicesSpec | None = None) -> None:
        """Keep the object a write returned; `spec` is the spec it holds when we just wrote or kept it."""
        self.live = obj
        self._live_known = True
        self.watch.resume_from(resource_version(obj))
        self._versions.append(resource_version(obj))
        if obj is not None and spec is not None:
            self._parsed = (resource_version(obj), spec)
            obj.pop("spec", None)  # the parsed copy is the one kept: a big node's spec is megabytes as dicts

    def _live_spec(self) -> DevicesSpec | None:
        """The live object's spec, parsed once per resourceVersion (None when absent or unparseable)."""
        version = resource_version(self.live)
        if self._parsed is None or self._parsed[0] != version:
            spec = publish.stored_spec(self.live) if self.live is not None else None
            self._parsed = (version, spec)
            if self.live is not None and spec is not None:
                self.live.pop("spec", None)
        return self._parsed[1]

    async def _relist(self) -> None:
        """List the object (one request): where the watch resumes from, and the object as it is."""
        try:
            obj, list_version = await self._api(self.client.list_one, self.config.node)
        except ApiFailure as exc:
            self.metrics.errors.labels(kind=exc.kind).inc()
            log.warning(
                "could not list the devices object", extra={"node": self.config.node, "error": str(exc)}
            )
            self.watch.since = ""
            return
        self.watch.since = list_version or resource_version(obj)
        if self._live_known and (
            resource_version(obj) in (resource_version(self.live), *self._versions)
            or (obj is None and self.live is None)
        ):
            return  # nothing we have not seen (a write of ours may even be newer than this list)
        self.live, self._live_known = obj, True
        self._versions.append(resource_version(obj))
        self._synced.set()

    def _on_watch_event(self, event: dict[str, Any]) -> None:
        """Someone changed the object (or our own write came back): keep it, and decide again if it is new."""
        if self._writing:
            # Our write's own event can arrive before its answer does: judge it once the answer is in.
            self._held.append(event)
            return
        obj = event.get("object") or {}
        if event.get("type") == "DELETED":
            if self.live is None and self._live_known:
                return
            log.warning("the devices object was deleted; recreating it", extra={"node": self.config.node})
            self.live, self._live_known = None, True
        else:
            if self._live_known and resource_version(obj) in (resource_version(self.live), *self._versions):
                return
            self.live, self._live_known = obj, True
        self.metrics.watch_events.inc()
        self._synced.set()

    # --- one pass ------------------------------------------------------------------------------------

    async def run_pass(self, kind: PassKind = PassKind.WALK, stop: asyncio.Event | None = None) -> Outcome:
        self.passes += 1
        self._last_pass_started = time.monotonic()
        started = time.perf_counter()
        self._performed = kind
        try:
            outcome = await self._pass(kind, stop)
        except Exception as exc:  # a bug must cost one pass, never the DaemonSet pod
            log.exception("pass failed unexpectedly", extra={"node": self.config.node, "pass": self.passes})
            self.metrics.errors.labels(kind="internal").inc()
            outcome = Outcome(Result.FAILED, error=f"{type(exc).__name__}: {exc}")
        duration = time.perf_counter() - started
        kind = self._performed  # a refresh that found the topology changed walked instead
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
        if kind is PassKind.WALK or self._walk_wanted:
            host_error = await self._walk()
        elif kind is PassKind.REFRESH:
            host_error = await self._refresh()
        if host_error:
            self._walk_wanted = True  # what was read before may be stale: the next pass reads everything
        attempt = 0
        while True:
            try:
                if not self._live_known:
                    await self._relist_or_raise()
                stored = self.live
                reading: publish.ReadingLike | None
                parsed = self._live_spec() if stored is not None else None
                if host_error:
                    reading = _failed_reading(host_error.message, host_error.reason, parsed)
                else:
                    reading = self.observed
                if reading is None:  # no host read ever succeeded and this one failed: nothing to say
                    return Outcome(Result.FAILED, error="the host was never read")
                degraded = self._tell(reading)
                key = (self._generation, resource_version(stored))
                if not host_error and self._live_known and key == self._settled:
                    await self._post_notices(reading)
                    return Outcome(Result.UNCHANGED, degraded=degraded)
                plan = publish.plan(stored, reading, _now(), parsed)
                wrote, final = await self._apply(stored, plan, parsed)
                if "spec" in wrote and parsed is not None and final is not None:
                    await self._tell_links(parsed, final)
                if not host_error:
                    self._settled = (self._generation, resource_version(self.live))
                # A record whose interfaces were never read says nothing about the endpoints: handing
                # it on would register zero devices as if that were a fact. Wait for a real reading.
                deliverable = final is not None and (
                    reading.interfaces is not None or final.interfaces or self.record is not None
                )
                if deliverable and final is not None and final != self.record:
                    self._deliver(final)
                await self._post_notices(reading)
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
                    self._live_known = False  # someone else wrote: list it again and decide again
                if not exc.retryable or attempt >= self.config.attempts:
                    self._deliver_local(self.observed if not host_error else None)
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
                if await _sleep(delay, stop):
                    return Outcome(Result.FAILED, error="stopped while retrying")

    async def _relist_or_raise(self) -> None:
        obj, list_version = await self._api(self.client.list_one, self.config.node)
        self.live, self._live_known = obj, True
        self._versions.append(resource_version(obj))
        self.watch.since = list_version or resource_version(obj)

    def _tell(self, reading: publish.ReadingLike) -> tuple[str, ...]:
        """Log each of our conditions that changed since last told (False: why, and what to do)."""
        reported = publish.reported_conditions(reading)
        degraded = tuple(c.type for c in reported if c.status == "False")
        for cond in reported:
            if cond.status == "False":
                kind = {INTERFACES_ENUMERATED: "interfaces"}.get(cond.type, "accelerators")
                if self._told.get(cond.type) != (cond.status, cond.reason):
                    self.metrics.errors.labels(kind=kind).inc()
        for notice in notices.notices(self._told, reported):
            log.log(
                notice.level,
                "could not read part of the host; keeping the recorded data"
                if notice.event_type == "Warning"
                else "part of the host is read again",
                extra={
                    "node": self.config.node,
                    "condition": notice.condition,
                    "reason": notice.reason,
                    "detail": notice.message,
                },
            )
        self._told = notices.remember(self._told, reported)
        return degraded

    async def _tell_links(self, before: DevicesSpec, after: DevicesSpec) -> None:
        """A log line and an Event for each RDMA link the written record says failed or recovered."""
        for notice in notices.link_notices(before, after, _now()):
            failed = notice.reason == notices.LINK_FAILED
            log.log(
                notice.level,
                "an RDMA link failed" if failed else "an RDMA link recovered",
                extra={
                    "node": self.config.node,
                    "endpoint": notice.condition.removeprefix("link/"),
                    "detail": notice.message,
                },
            )
            await self._post_notice(notice)

    async def _post_notices(self, reading: publish.ReadingLike) -> None:
        """One Event per condition change on the Devices object. A change is remembered as told only once
        its Event is in the API: one dropped by the budget or refused by the API is posted by a later
        pass (the budget refilled, the API back) if the condition still differs from the last Event."""
        if self.live is None:
            return
        for cond in publish.reported_conditions(reading):
            if all([await self._post_notice(notice) for notice in notices.notices(self._posted, [cond])]):
                self._posted = notices.remember(self._posted, [cond])

    async def _post_notice(self, notice: notices.Notice) -> bool:
        """Whether the Event is posted."""
        if not self.spam.admit(self.config.node):
            self.metrics.events_dropped.inc()
            log.debug(
                "event dropped: this record's Events are over budget",
                extra={"node": self.config.node, "reason": notice.reason},
            )
            return False
        try:
            await self._api(
                self.client.post_event,
                self.config.node,
                self.live,
                notice.event_type,
                notice.reason,
                notice.message,
            )
        except ApiFailure as exc:
            log.warning(
                "could not post an event; trying again on the next pass",
                extra={"node": self.config.node, "reason": notice.reason, "error": str(exc)},
            )
            return False
        self.metrics.events.labels(type=notice.event_type).inc()
        return True

    async def _apply(
        self, stored: dict[str, Any] | None, plan: publish.Plan, parsed: DevicesSpec | None
    ) -> tuple[list[str], DevicesSpec | None]:
        """Write what the plan says; returns what was written and the spec the object now holds (None when
        the stored one does not parse and was left as it is). Every write's answer becomes `live`."""
        if not plan.writes and (stored is None or _has_node_owner(stored)):
            if plan.desired is not None and stored is not None:
                # Equal to what is stored: keep the fresh copy (the one consumers hold), drop the parsed one.
                self._parsed = (resource_version(stored), plan.desired)
                return [], plan.desired
            return [], parsed
        self._writing = True
        try:
            return await self._write(stored, plan, parsed)
        finally:
            self._writing = False
            held, self._held = self._held, []
            for event in held:
                self._on_watch_event(event)

    async def _write(
        self, stored: dict[str, Any] | None, plan: publish.Plan, parsed: DevicesSpec | None
    ) -> tuple[list[str], DevicesSpec | None]:
        node = self.config.node
        wrote: list[str] = []
        final: DevicesSpec | None
        if stored is None:
            assert plan.spec is not None
            uid = await self._api(self.client.node_uid, node)
            obj = await self._api(self.client.create, node, plan.spec.wire(), owner_reference(node, uid))
            self._set_live(obj, plan.spec)
            self.metrics.api_writes.labels(kind="create").inc()
            wrote.append("create")
            final = plan.spec
        else:
            obj = stored
            owners = await self._owners(stored)
            final = plan.spec or plan.desired or parsed
            if plan.spec is not None or owners is not None:
                spec_wire = plan.spec.wire() if plan.spec is not None else None
                obj = await self._api(self.client.patch_spec, node, resource_version(obj), spec_wire, owners)
                self._set_live(obj, final)
                self.metrics.api_writes.labels(kind="spec").inc()
                wrote.append("spec")
        if plan.conditions is not None or plan.summary is not None:
            # Status is written after spec, preconditioned on the version that write returned.
            obj = await self._api(
                self.client.patch_status, node, resource_version(obj), plan.conditions, plan.summary
            )
            self._set_live(obj, final)
            self.metrics.api_writes.labels(kind="status").inc()
            wrote.append("status")
        return wrote, final

    async def _owners(self, stored: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The ownerReferences to write when the object has no Node owner (created by hand or by an older
        agent), so deleting the Node still removes it; None when it already has one."""
        if _has_node_owner(stored):
            return None
        owners = [o for o in _owner_references(stored) if isinstance(o, dict)]
        uid = await self._api(self.client.node_uid, self.config.node)
        return [*owners, owner_reference(self.config.node, uid)]

    # --- the loop ------------------------------------------------------------------------------------

    def trigger(self) -> None:
        """A kernel uevent: walk the host soon; bursts are coalesced by the debounce."""
        self._uevent.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until `stop` is set: a walk first, refreshes every interval, walks after a debounced
        uevent and every walk interval, a sync when the watch saw a change, and sooner after a failure."""
        watcher: asyncio.Task[None] | None = None
        try:
            failures = 0
            kind = PassKind.WALK
            while not stop.is_set():
                outcome = await self._pass_or_stop(kind, stop)
                if outcome is None:
                    return
                if watcher is None and self.config.watch:
                    # After the first pass, which listed the object: the watch resumes from that list.
                    watcher = asyncio.create_task(self.watch.run(stop), name="devices-watch")
                failures = 0 if outcome.ok else failures + 1
                delay = (
                    self.config.interval
                    if not failures
                    else min(self.config.interval, self.config.backoff.delay(failures))
                )
                next_kind = await self._wait(delay, stop)
                if next_kind is None:
                    return
                kind = next_kind
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    async def _pass_or_stop(self, kind: PassKind, stop: asyncio.Event) -> Outcome | None:
        """A pass, abandoned when `stop` is set: a request or read it waits on may take its full deadline,
        and a stopping agent has no use for its answer. None when stopped."""
        running = asyncio.ensure_future(self.run_pass(kind, stop))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({running, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            return None
        return running.result()

    def _walk_due(self) -> bool:
        return (
            self._walk_wanted
            or self._last_walk is None
            or time.monotonic() - self._last_walk >= self.config.walk_interval
        )

    async def _wait(self, delay: float, stop: asyncio.Event) -> PassKind | None:
        """Wait out `delay`, a uevent burst (then walk) or a watch change (then sync). None when stopping."""
        waiters = [asyncio.ensure_future(e.wait()) for e in (self._uevent, self._synced, stop)]
        try:
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if stop.is_set():
            return None
        if self._uevent.is_set():
            if await self._debounce(stop):
                return None
            self._synced.clear()
            return PassKind.WALK
        if self._synced.is_set():
            self._synced.clear()
            return PassKind.WALK if self._walk_wanted else PassKind.SYNC
        return PassKind.WALK if self._walk_due() else PassKind.REFRESH

    async def _debounce(self, stop: asyncio.Event) -> bool:
        """Wait until the uevents go quiet (at most debounce_max). True when stopping."""
        self.metrics.uevent_bursts.inc()
        log.info("kernel uevents; walking the host", extra={"node": self.config.node})
        burst_started = time.monotonic()
        while self._uevent.is_set():
            self._uevent.clear()
            remaining = self.config.debounce_max - (time.monotonic() - burst_started)
            if remaining <= 0:
                break
            if await _sleep(min(self.config.debounce, remaining), stop, self._uevent):
                return True
        self._walk_wanted = True
        return stop.is_set()

    # --- probes --------------------------------------------------------------------------------------

    def liveness(self) -> Probe:
        """Alive while passes keep starting and no host read is stuck for long: a stuck read gets the pod
        restarted (and its events say why) rather than serving an ever older record."""
        limit = 3 * self.config.interval + 60
        stalled = time.monotonic() - self._last_pass_started
        if stalled > limit:
            return Probe(False, f"no pass started for {stalled:.0f}s (limit {limit:.0f}s)")
        stuck = self._host_lane.stuck_for()
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


def _owner_references(obj: dict[str, Any]) -> list[Any]:
    owners = metadata(obj).get("ownerReferences")
    return owners if isinstance(owners, list) else []


def _has_node_owner(obj: dict[str, Any]) -> bool:
    owners = _owner_references(obj)
    return any(
        isinstance(o, dict) and o.get("kind") == "Node" and o.get("apiVersion") == "v1" for o in owners
    )


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
