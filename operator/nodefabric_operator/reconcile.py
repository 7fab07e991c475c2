"""One node's reconcile: Devices record -> label set -> sink -> Devices status, one Event, metrics.

Level-based: every pass recomputes from the whole record and compares with the sink object the watch
delivered (the view), so a repeated pass, a replayed event or an operator restart writes nothing when
nothing changed, and reads nothing either. What a first sync costs per record: the sink write, the status
write, one Event. Every Devices event at or below the resourceVersion already handled for that node (a
replay after a relist, the echo of our own status write) is skipped before the record is even parsed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import pydantic
import urllib3

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import Condition, Devices, DevicesStatus
from nodefabric_operator import events, labels, onnode, rawcall, sinks
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.recorder import Recorder
from nodefabric_operator.view import SinkObject, SinkView, at_or_below, items, part, version

log = logging.getLogger(__name__)

DEFAULT_BACKOFFS: tuple[float, ...] = (1, 2, 5, 10, 30, 60)
SHOWN = 80  # characters of a withheld value quoted in a log line
STATUS_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.PLURAL}/{{name}}/status"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def transient(err: BaseException) -> bool:
    """Worth retrying: the API was unreachable, overloaded or answered a server error, or the NodeFeature
    API is missing (NFD is being installed or upgraded): each ends without the record changing."""
    if isinstance(err, kubernetes.client.ApiException):
        return int(err.status or 0) in (429, 500, 502, 503, 504) or not err.status
    return isinstance(err, urllib3.exceptions.HTTPError | OSError | sinks.Conflict | sinks.NfdMissing)


class Superseded(Exception):
    """The status write met a newer version of the record: the watch delivers that version next, and
    its reconcile writes the status, so this one stops without reading anything back."""


@dataclass(frozen=True)
class Outcome:
    outcome: str  # unchanged | published | superseded | error | invalid | withdrawn | skipped
    changes: tuple[labels.Change, ...] = ()
    status_written: bool = False


@dataclass(frozen=True)
class NodeRecord:
    """What the operator keeps of one Devices record: its identity, the version handled, the label set
    and the status it yields. The record's spec is not kept; it can be 400 KiB on a node with many VFs."""

    owner: sinks.Owner
    rv: str | None
    result: labels.LabelSet
    frozen: frozenset[str]
    status: DevicesStatus

    @property
    def name(self) -> str:
        return self.owner.name

    def ref(self) -> dict[str, Any]:
        """The Devices object as an Event's involved object."""
        return {
            "apiVersion": models.API_VERSION,
            "kind": models.KIND,
            "name": self.name,
            "uid": self.owner.uid,
        }


def node_owner_uid(body: Mapping[str, Any]) -> str | None:
    """The uid of the record's own Node among its owners. An owner that is another Node (a hand edit, a
    record copied from another node) says nothing about whether this one exists."""
    name = part(body, "metadata").get("name")
    for ref in items(body, "metadata", "ownerReferences"):
        if ref.get("kind") == "Node" and ref.get("apiVersion") == "v1" and ref.get("name") == name:
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def prepare(body: Mapping[str, Any], domain: str) -> NodeRecord:
    """The record as the operator keeps it. Raises pydantic.ValidationError for a record it cannot read."""
    devices = Devices.from_wire(dict(body))
    owner = sinks.Owner(devices.metadata.name, devices.metadata.uid or "", node_owner_uid(body))
    return NodeRecord(
        owner=owner,
        rv=devices.metadata.resource_version,
        result=labels.compute(devices, domain),
        frozen=labels.frozen_families(devices.status),
        status=devices.status,
    )


def condition_for(
    published: sinks.Published | None, result: labels.LabelSet, frozen: frozenset[str], error: str | None
) -> Condition:
    """LabelsPublished, with the reason an operator reads first: failure, kept keys, withheld values."""
    if error is not None or published is None:
        return Condition(
            type=models.LABELS_PUBLISHED,
            status="False",
            reason=events.PUBLISH_FAILED,
            message=error or "not published",
        )
    notes: list[str] = []
    reason = "Published"
    if published.plan.kept:
        reason = "RemovalSkipped"
        families = ", ".join(f"{f}." for f in sorted(frozen))
        notes.append(
            f"enumeration failed: {families} labels kept as last published ({len(published.plan.kept)})"
        )
    if result.withheld:
        reason = reason if reason != "Published" else "ValuesWithheld"
        notes.append("withheld invalid values for " + ", ".join(sorted({w.key for w in result.withheld})))
    message = f"{len(published.plan.managed)} labels on {published.target}"
    return Condition(
        type=models.LABELS_PUBLISHED, status="True", reason=reason, message="; ".join([message, *notes])
    )


def failure_condition(sink: str, err: BaseException) -> Condition:
    if isinstance(err, sinks.NodeNotFound):
        reason, message = events.NODE_NOT_FOUND, f"{err}: labels are published once it does"
    else:
        reason, message = events.PUBLISH_FAILED, f"{sink} write failed: {_brief(err)}"
    return Condition(type=models.LABELS_PUBLISHED, status="False", reason=reason, message=message)


def next_status(
    current: DevicesStatus,
    result: labels.LabelSet,
    published: sinks.Published | None,
    condition: Condition,
    now: datetime,
    *,
    also: Sequence[Condition] = (),
) -> DevicesStatus:
    """The status we own merged into the current one; every other writer's conditions are kept as read."""
    new = current.model_copy(deep=True)
    for cond in (condition, *also):
        new.conditions = models.set_condition(new.conditions, cond, now)
    new.rdma_endpoints = result.rdma_endpoints
    new.best_distance = result.best_distance
    new.fabric_domain = result.fabric_domain
    if published is not None:
        new.labels = dict(published.plan.managed)
        if published.plan.changes or current.labels_published_time is None:
            new.labels_published_time = now
    return new


def status_patch(current: DevicesStatus, new: DevicesStatus) -> dict[str, Any] | None:
    """The merge patch from `current` to `new`, or None when they are equal (no write)."""
    old_wire, new_wire = current.wire(), new.wire()
    if old_wire == new_wire:
        return None
    body = dict(new_wire)
    body["labels"] = {k: None for k in current.labels if k not in new.labels} | dict(new.labels)
    return body


@dataclass(frozen=True)
class _Applied:
    published: sinks.Published
    record: NodeRecord  # with the status and version our status write left, when it wrote one
    status_written: bool
    superseded: bool


class Reconciler:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        sink: sinks.Sink,
        *,
        domain: str = labels.DEFAULT_DOMAIN,
        metrics: Metrics | None = None,
        recorder: Recorder | None = None,
        backoffs: Sequence[float] = DEFAULT_BACKOFFS,
    ) -> None:
        self.api = api
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.sink = sink
        self.domain = domain
        self.metrics = metrics or Metrics()
        self.recorder = recorder
        self.backoffs = tuple(backoffs)
        self.view = SinkView()
        self.records: dict[str, NodeRecord] = {}  # node -> the record as last prepared
        self.handled: dict[str, str | None] = {}  # node -> the record version fully handled
        self.known: dict[str, str] = {}  # node -> uid of every Devices record the watch has listed
        self._locks: dict[str, asyncio.Lock] = {}
        self._requeued: dict[str, asyncio.TimerHandle] = {}
        self._retries: set[asyncio.Future[Outcome]] = set()
        # Our keys on each Node, for LabelsOnNode. The Node sink's view already is the Nodes; a NodeFeature
        # sink watches Nodes for this alone (None: not allowed to list them, so LabelsOnNode is not said).
        self.nodes: SinkView | None = SinkView() if isinstance(sink, sinks.NodeFeatureSink) else None
        self.metrics.not_on_node.set_function(self._not_on_node)

    @property
    def watches_nodes(self) -> bool:
        """Whether Node events must reach node_event (the NodeFeature sink, allowed to list Nodes)."""
        return self.nodes is not None

    def _not_on_node(self) -> float:
        return float(sum(1 for r in self.records.values() if _on_node_false(r.status)))

    # --- what exists before the first reconcile -----------------------------------------------------------

    async def prime(self) -> None:
        """Read the sink objects once, page by page, before kopf starts: the first reconcile of each
        record then plans against what exists instead of reading its object back. kopf's own listing
        delivers the same versions afterwards, which the view recognises. A sink that withdraws labels
        itself (the Node's) also needs every record's name first, so that a Node carrying our labels
        is not taken for one whose record is gone merely because its record is listed later."""
        for obj in await asyncio.to_thread(lambda: list(self.sink.existing())):
            self.view.observe(obj)
        if self.sink.withdraws:
            self.known.update(await asyncio.to_thread(self._record_names))
        if self.nodes is not None:
            # The Nodes' labels before the first reconcile, for the same reason as the sink objects: a
            # restart then finds LabelsOnNode as it left it and writes nothing.
            try:
                for node in await asyncio.to_thread(self._node_labels):
                    self.nodes.observe(node)
            except kubernetes.client.ApiException as err:
                if sinks.status_of(err) != 403:
                    raise
                log.warning(
                    "cannot list Nodes, LabelsOnNode is not reported",
                    extra={"error": f"HTTP 403 {err.reason or ''}".strip()},
                )
                self.nodes = None
        log.info(
            "sink objects read",
            extra={
                "sink": self.sink.name,
                "objects": len(self.view),
                "records": len(self.known),
                "nodes": len(self.nodes) if self.nodes is not None else None,
            },
        )

    def _node_labels(self) -> list[SinkObject]:
        core = kubernetes.client.CoreV1Api(self.custom.api_client)
        return [
            node_snapshot(n, self.domain) for n in sinks._Calls(self.metrics).pages("nodes", core.list_node)
        ]

    def _record_names(self) -> dict[str, str]:
        found = sinks._Calls(self.metrics).pages(
            models.PLURAL, self.custom.list_cluster_custom_object, models.GROUP, models.VERSION, models.PLURAL
        )
        return {
            str(part(i, "metadata").get("name", "")): str(part(i, "metadata").get("uid", "")) for i in found
        }

    def note_devices(self, body: Mapping[str, Any]) -> None:
        meta = part(body, "metadata")
        self.known[str(meta.get("name", ""))] = str(meta.get("uid", ""))

    # --- the async shell kopf calls --------------------------------------------------------------------

    async def devices_event(self, body: Mapping[str, Any]) -> Outcome:
        name, rv = str(part(body, "metadata").get("name", "")), version(body)
        self.note_devices(body)
        if at_or_below(rv, self.handled.get(name)):
            self.metrics.skipped.labels(resource=models.PLURAL).inc()
            return Outcome("skipped")
        try:
            record = prepare(body, self.domain)
        except pydantic.ValidationError as err:
            # A record we cannot read says nothing about the node: publish nothing, remove nothing.
            log.error(
                "devices record is invalid, labels left as published",
                extra={"node": name, "error": _first_error(err)},
            )
            self.handled[name] = rv
            self.metrics.reconciles.labels(outcome="invalid").inc()
            return Outcome("invalid")
        for w in record.result.withheld:
            self.metrics.withheld.labels(key=w.key).inc()
            log.warning(
                "label withheld",
                extra={"node": name, "key": w.key, "value": w.value[:SHOWN], "reason": w.reason},
            )
        self.records[name] = record
        self.metrics.records.set(len(self.records))
        return await self._reconcile(name)

    async def devices_deleted(self, name: str) -> Outcome:
        """The Devices object is gone: withdraw what the sink holds for it (a NodeFeature is GC'd instead)."""
        for table in (self.known, self.records, self.handled):
            table.pop(name, None)
        self.view.clear_deleted(name)
        self.metrics.records.set(len(self.records))
        return await self._withdraw(name)

    async def sink_event(self, body: Mapping[str, Any]) -> Outcome | None:
        """A watched sink object changed: repair it only if it drifted from what the record yields (a hand
        edit, a deletion of our keys). A pure check against what is held: watching costs no requests."""
        snapshot = self.sink.snapshot(body)
        if not self.view.observe(snapshot) and snapshot.rv is not None:
            self.metrics.skipped.labels(resource=self.sink.name).inc()
        name = snapshot.name
        record = self.records.get(name)
        if record is None:
            if name not in self.known and (self.view.get(name) or snapshot).managed:
                # Labels we wrote on a Node whose record is gone (deleted while the operator was down).
                log.info("labels we wrote have no devices record, withdrawing them", extra={"node": name})
                return await self._withdraw(name)
            return None  # a record the watch listed is reconciled by its own event
        current = self.view.get(name)
        if not self.sink.drifted(record.owner, record.result.labels, record.frozen, current):
            return None
        log.info("labels drifted from the devices record, repairing", extra={"node": name})
        return await self._reconcile(name)

    async def sink_deleted(self, body: Mapping[str, Any]) -> Outcome | None:
        snapshot = self.sink.snapshot(body)
        name = snapshot.name
        dropped = self.view.forget(name, snapshot.rv, remember=name in self.known)
        if not dropped or name not in self.records:
            return None
        log.info(
            "sink object deleted while its devices record exists, publishing again", extra={"node": name}
        )
        return await self._reconcile(name)

    async def node_event(self, body: Mapping[str, Any]) -> Outcome | None:
        """A watched Node changed (NodeFeature sink): say whether the published labels reached it. Costs a
        request only when LabelsOnNode changes (nfd-master applied, removed, or failed to apply them)."""
        if self.nodes is None:
            return None
        node = node_snapshot(body, self.domain)
        if not self.nodes.observe(node) and node.rv is not None:
            self.metrics.skipped.labels(resource="nodes").inc()
            return None
        return await self._note_on_node(node.name)

    def node_deleted(self, body: Mapping[str, Any]) -> None:
        """A Node went: its record goes with it (owned by it), so nothing is written about it."""
        if self.nodes is not None:
            node = node_snapshot(body, self.domain)
            self.nodes.forget(node.name, node.rv, remember=False)

    def health(self) -> dict[str, int]:
        return {"nodes": len(self.records), "sinkObjects": len(self.view)}

    # --- the reconcile, one node at a time --------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _reconcile(self, name: str) -> Outcome:
        async with self._lock(name):
            delays = iter(self.backoffs)
            while True:
                record = self.records.get(name)
                if record is None:
                    return Outcome("unchanged")  # deleted while waiting for the lock
                started = time.perf_counter()
                try:
                    applied = await asyncio.to_thread(
                        self._apply,
                        record,
                        self.view.get(name),
                        self.view.was_deleted(name),
                        self._node_seen(name),
                    )
                except sinks.RecordGone as err:
                    # A late event for a deleted record: its own DELETED event follows and forgets it.
                    log.info(
                        "devices record is gone, nothing published", extra={"node": name, "why": str(err)}
                    )
                    return Outcome("unchanged")
                except Exception as err:
                    delay = next(delays, None) if transient(err) else None
                    if delay is None:
                        return await self._failed(record, err)
                    log.warning(
                        "label publish failed, retrying",
                        extra={"node": name, "error": _brief(err), "retry_in_s": delay},
                    )
                    await asyncio.sleep(delay)
                    continue
                finally:
                    self.metrics.duration.observe(time.perf_counter() - started)
                outcome = self._settle(record, applied)
                await self._event(
                    record,
                    events.for_changes(
                        applied.published.target, outcome.changes, self.domain, record.result.failed_links
                    ),
                )
                return outcome

    def _keep(self, before: NodeRecord, after: NodeRecord) -> None:
        """Hold the record as our status write left it, unless a newer version arrived meanwhile."""
        held = self.records.get(before.name)
        if held is not None and held.rv == before.rv:
            self.records[before.name] = after

    def _settle(self, before: NodeRecord, applied: _Applied) -> Outcome:
        """Record what a publish did (on the event loop: the view and tables are not shared with threads)."""
        published, record = applied.published, applied.record
        name = record.name
        if published.now is not None:
            self.view.observe(published.now)
        self._keep(before, record)
        if not applied.superseded:
            self.handled[name] = record.rv
        changes = tuple(published.plan.changes)
        for change in changes:
            self.metrics.label_changes.labels(change=change.kind).inc()
        for key in published.plan.kept:
            self.metrics.removals_skipped.labels(family=labels.family(key, self.domain) or "").inc()
        if published.plan.kept:
            log.warning(
                "enumeration failed, labels kept as published",
                extra={
                    "node": name,
                    "keys": ",".join(published.plan.kept),
                    "failed": ",".join(sorted(record.frozen)),
                },
            )
        outcome = "superseded" if applied.superseded else "published" if changes else "unchanged"
        self.metrics.reconciles.labels(outcome=outcome).inc()
        if published.wrote:
            log.info(
                "labels published",
                extra={
                    "node": name,
                    "target": published.target,
                    "changes": " ".join(c.brief(self.domain) for c in changes) or "ownership",
                },
            )
        return Outcome(outcome, changes, applied.status_written)

    async def _failed(self, record: NodeRecord, err: BaseException) -> Outcome:
        name = record.name
        condition = failure_condition(self.sink.name, err)
        log.error(
            "labels not published",
            extra={"node": name, "reason": condition.reason, "error": condition.message},
        )
        self.metrics.reconciles.labels(outcome="error").inc()
        if transient(err):
            # The API server is in trouble, not the record: try again later, and on any replay meanwhile.
            self._requeue(name)
        else:
            # This version cannot be published as it is; a replay of it is skipped. Writing the failure
            # makes a new version, whose event retries once (a missing Node may exist by then).
            self.handled[name] = record.rv
        try:
            after = await asyncio.to_thread(self._record_failure, record, condition)
            written = after is not None
            if after is not None:
                self._keep(record, after)
        except Exception as status_err:
            log.error(
                "could not record the failure in status", extra={"node": name, "error": _brief(status_err)}
            )
            written = True  # say it in an Event at least
        # A failure already in status was already announced: its echo retries quietly.
        if written:
            await self._event(record, events.for_failure(condition.reason, condition.message))
        return Outcome("error")

    def _requeue(self, name: str) -> None:
        """Reconcile `name` again after the longest backoff, once, unless a retry is already due."""
        if name in self._requeued:
            return
        delay = max(self.backoffs, default=DEFAULT_BACKOFFS[-1])
        self._requeued[name] = asyncio.get_running_loop().call_later(delay, self._retry, name)

    def _retry(self, name: str) -> None:
        self._requeued.pop(name, None)
        if name in self.records:
            task = asyncio.ensure_future(self._reconcile(name))
            self._retries.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self._retries.discard)

    def close(self) -> None:
        """Stop retries that are due later (the operator is stopping)."""
        for handle in self._requeued.values():
            handle.cancel()
        self._requeued.clear()

    async def _withdraw(self, name: str) -> Outcome:
        async with self._lock(name):
            published = await asyncio.to_thread(self.sink.withdraw, name, self.view.get(name))
        if name not in self.records and not self._lock(name).locked():
            self._locks.pop(name, None)  # nodes come and go: keep no lock for one that went
        changes = tuple(published.plan.changes) if published else ()
        if published is not None and published.now is not None:
            self.view.observe(published.now)
        for c in changes:
            self.metrics.label_changes.labels(change=c.kind).inc()
        if changes:
            log.info(
                "labels withdrawn with the devices record", extra={"node": name, "removed": len(changes)}
            )
        self.metrics.reconciles.labels(outcome="withdrawn").inc()
        return Outcome("withdrawn", changes)

    # --- LabelsOnNode ------------------------------------------------------------------------------------

    def _node_seen(self, name: str) -> SinkObject | _NotWatched | None:
        """The Node as watched, taken on the event loop for a worker thread (the views are the loop's)."""
        if isinstance(self.sink, sinks.NodeSink):
            return self.view.get(name)
        if self.nodes is None:
            return NOT_WATCHED
        return self.nodes.get(name)

    def _on_node(self, name: str, published: Mapping[str, str], node: SinkObject | None) -> Condition:
        via = "nfd-master" if isinstance(self.sink, sinks.NodeFeatureSink) else ""
        return onnode.condition(name, published, None if node is None else node.labels, self.domain, via)

    async def _note_on_node(self, name: str) -> Outcome | None:
        """Write LabelsOnNode when what the Node now carries changes it; nothing otherwise."""
        async with self._lock(name):
            record = self.records.get(name)
            node = self._node_seen(name)
            published = record.status.condition(models.LABELS_PUBLISHED) if record else None
            if (
                record is None
                or published is None
                or published.status != "True"
                or isinstance(node, _NotWatched)
            ):
                return None  # nothing published (yet): the publish says it
            cond = self._on_node(name, record.status.labels, node)
            held = record.status.condition(models.LABELS_ON_NODE)
            if held is not None and (held.status, held.reason, held.message) == (
                cond.status,
                cond.reason,
                cond.message,
            ):
                return None
            new = record.status.model_copy(deep=True)
            new.conditions = models.set_condition(new.conditions, cond, _now())
            try:
                after = await asyncio.to_thread(self._write_status, record, new)
            except (Superseded, sinks.RecordGone):
                return None  # a newer version (or the deletion) is on its way, and says it
            except Exception as err:
                # The next Node event (kubelet updates its Node every few minutes) tries again.
                log.warning(
                    "could not record whether the labels are on the node",
                    extra={"node": name, "error": _brief(err)},
                )
                return None
            if after is None:
                return None
            was_handled = self.handled.get(name) == record.rv
            self._keep(record, after)
            if was_handled:
                self.handled[name] = after.rv  # our own write's echo is skipped, as a publish's is
            log.info(
                "labels on node" if cond.status == "True" else "labels not on node",
                extra={"node": name, "reason": cond.reason, "detail": cond.message},
            )
            return Outcome("unchanged", status_written=True)

    async def _event(self, record: NodeRecord, notice: events.Notice | None) -> None:
        if self.recorder is not None and notice is not None:
            await asyncio.to_thread(self.recorder.post, record.ref(), notice)

    # --- the sync core (a worker thread): requests only, no shared state -------------------------------

    def _apply(
        self,
        record: NodeRecord,
        current: SinkObject | None,
        verify: bool,
        node: SinkObject | _NotWatched | None,
    ) -> _Applied:
        published = self.sink.publish(
            record.owner, record.result.labels, record.frozen, current, verify=verify
        )
        condition = condition_for(published, record.result, record.frozen, None)
        if isinstance(self.sink, sinks.NodeSink):
            node = published.now  # the Node as our write left it
        also = (
            ()
            if isinstance(node, _NotWatched)
            else (self._on_node(record.name, published.plan.managed, node),)
        )
        new = next_status(record.status, record.result, published, condition, _now(), also=also)
        try:
            after = self._write_status(record, new)
        except Superseded:
            return _Applied(published, record, status_written=False, superseded=True)
        if after is None:
            return _Applied(published, record, status_written=False, superseded=False)
        return _Applied(published, after, status_written=True, superseded=False)

    def _write_status(self, record: NodeRecord, new: DevicesStatus) -> NodeRecord | None:
        """Patch /status with the version the operator last saw as precondition; None when nothing changes.
        A 409 is not re-read: the newer version is on its way through the watch (Superseded)."""
        patch = status_patch(record.status, new)
        if patch is None:
            return None
        body = {"metadata": {"resourceVersion": record.rv}, "status": patch}
        self.metrics.api_requests.labels(verb="patch", resource="devices/status").inc()
        try:
            answer = rawcall.json_object(
                rawcall.send(
                    self.api,
                    "PATCH",
                    STATUS_PATH,
                    {"name": record.name},
                    body,
                    content_type=rawcall.MERGE_PATCH,
                )
            )
        except kubernetes.client.ApiException as err:
            if sinks.status_of(err) == 409:
                raise Superseded(record.name) from err
            if sinks.status_of(err) == 404:
                raise sinks.RecordGone(f"devices {record.name} is gone") from err
            raise
        try:
            status = DevicesStatus.model_validate(answer.get("status") or {})
        except pydantic.ValidationError:
            status = new  # another writer's field we cannot read: ours is what we just wrote
        rv = version(answer)
        return dataclasses.replace(record, rv=rv, status=status)

    def _record_failure(self, record: NodeRecord, condition: Condition) -> NodeRecord | None:
        new = next_status(record.status, record.result, None, condition, _now())
        try:
            return self._write_status(record, new)
        except (Superseded, sinks.RecordGone):
            return None


class _NotWatched:
    """Nodes are not watched (no right to list them): LabelsOnNode is not said at all."""


NOT_WATCHED = _NotWatched()


def node_snapshot(body: Mapping[str, Any], domain: str) -> SinkObject:
    """A Node as LabelsOnNode needs it: its name, version and our keys among its labels."""
    meta = part(body, "metadata")
    return SinkObject(
        name=str(meta.get("name", "")), rv=version(body), labels=sinks.ours(part(meta, "labels"), domain)
    )


def _on_node_false(status: DevicesStatus) -> bool:
    cond = status.condition(models.LABELS_ON_NODE)
    return cond is not None and cond.status == "False"


def _brief(err: BaseException) -> str:
    """A stable one-line reason (no response bodies), so a repeated failure does not rewrite status."""
    if isinstance(err, kubernetes.client.ApiException):
        return f"HTTP {err.status} {err.reason or ''}".strip()
    if isinstance(err, sinks.SinkError):
        return str(err)
    return type(err).__name__


def _first_error(err: pydantic.ValidationError) -> str:
    """The first validation error, located: a whole pydantic report on one log line helps nobody."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')} ({err.error_count()} errors)"
