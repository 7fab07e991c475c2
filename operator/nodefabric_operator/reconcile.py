"""One node's reconcile: Devices record -> label set -> sink -> Devices status, Events and metrics.

Level-based: every pass recomputes from the whole record and compares with the live objects, so a
repeated pass, a replayed event or an operator restart writes nothing when nothing changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kubernetes
import pydantic
import urllib3

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import Condition, Devices, DevicesStatus
from nodefabric_operator import labels, sinks
from nodefabric_operator.metrics import Metrics

log = logging.getLogger(__name__)

# (devices body, type, reason, message): posts one Event on the Devices object.
EventPoster = Callable[[Mapping[str, Any], str, str, str], None]
DEFAULT_BACKOFFS: tuple[float, ...] = (1, 2, 5, 10, 30, 60)
STATUS_RETRIES = 5


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def transient(err: BaseException) -> bool:
    """Worth retrying: the API was unreachable, overloaded or answered a server error."""
    if isinstance(err, kubernetes.client.ApiException):
        return int(err.status or 0) in (429, 500, 502, 503, 504) or not err.status
    return isinstance(err, urllib3.exceptions.HTTPError | OSError | sinks.Conflict)


@dataclass(frozen=True)
class Outcome:
    outcome: str  # unchanged | published | error | invalid | withdrawn
    changes: tuple[labels.Change, ...] = ()
    status_written: bool = False


def condition_for(
    published: sinks.Published | None, result: labels.LabelSet, frozen: frozenset[str], error: str | None
) -> Condition:
    """LabelsPublished, with the reason an operator reads first: failure, kept keys, withheld values."""
    if error is not None or published is None:
        return Condition(
            type=models.LABELS_PUBLISHED,
            status="False",
            reason="PublishFailed",
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


def next_status(
    current: DevicesStatus,
    result: labels.LabelSet,
    published: sinks.Published | None,
    condition: Condition,
    now: datetime,
) -> DevicesStatus:
    """The status we own merged into the current one; every other writer's conditions are kept as read."""
    new = current.model_copy(deep=True)
    new.conditions = models.set_condition(current.conditions, condition, now)
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


class Reconciler:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        sink: sinks.Sink,
        *,
        domain: str = labels.DEFAULT_DOMAIN,
        metrics: Metrics | None = None,
        post_event: EventPoster | None = None,
        backoffs: Sequence[float] = DEFAULT_BACKOFFS,
    ) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.sink = sink
        self.domain = domain
        self.metrics = metrics or Metrics()
        self.post_event = post_event
        self.backoffs = tuple(backoffs)
        self.latest: dict[str, Mapping[str, Any]] = {}  # node -> last Devices body seen, for drift checks
        self._locks: dict[str, asyncio.Lock] = {}

    # --- the async shell kopf calls --------------------------------------------------------------------

    async def reconcile(self, body: Mapping[str, Any]) -> Outcome:
        name = str((body.get("metadata") or {}).get("name", ""))
        self.latest[name] = body
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            return await self._with_retries(name, body)

    async def refresh(self, name: str) -> Outcome:
        """Reconcile from a fresh read of the record: a sink event can race the record's own deletion,
        and recreating a NodeFeature for a record that is gone would leave it to the garbage collector."""
        try:
            body = await asyncio.to_thread(self._read, name)
        except kubernetes.client.ApiException as err:
            if int(err.status or 0) != 404:
                raise
            return await self.forget(name)
        return await self.reconcile(body)

    async def forget(self, name: str) -> Outcome:
        """The Devices object is gone: withdraw what the sink holds for it (a NodeFeature is GC'd instead)."""
        self.latest.pop(name, None)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            published = await asyncio.to_thread(self.sink.withdraw, name)
        changes = tuple(published.plan.changes) if published else ()
        for c in changes:
            self.metrics.label_changes.labels(change=c.kind).inc()
        if changes:
            log.info(
                "labels withdrawn with the devices record", extra={"node": name, "removed": len(changes)}
            )
        self.metrics.reconciles.labels(outcome="withdrawn").inc()
        return Outcome("withdrawn", changes)

    def drifted(self, name: str, sink_object: Mapping[str, Any]) -> bool:
        """Whether the sink object no longer carries what the last seen record yields (a hand edit, a
        deletion): a pure check on the watched object, so watching the sink costs no API calls."""
        body = self.latest.get(name)
        if body is None:
            return False
        try:
            devices = Devices.from_wire(dict(body))
        except pydantic.ValidationError:
            return False
        current, owned = self.sink.current(sink_object)
        desired = labels.compute(devices, self.domain).labels
        frozen = labels.frozen_families(devices.status)
        return bool(labels.plan(current, desired, domain=self.domain, frozen=frozen, owned=owned).changes)

    async def _with_retries(self, name: str, body: Mapping[str, Any]) -> Outcome:
        delays = iter(self.backoffs)
        while True:
            started = time.perf_counter()
            try:
                outcome = await asyncio.to_thread(self._reconcile_sync, body)
            except sinks.RecordGone as err:
                # A late event for a deleted record: its own DELETED event follows and forgets the node.
                log.info("devices record is gone, nothing published", extra={"node": name, "why": str(err)})
                return Outcome("unchanged")
            except Exception as err:
                delay = next(delays, None) if transient(err) else None
                if delay is None:
                    return await self._failed(name, body, err)
                log.warning(
                    "label publish failed, retrying",
                    extra={"node": name, "error": str(err), "retry_in_s": delay},
                )
                await asyncio.sleep(delay)
                body = self.latest.get(name, body)
                continue
            finally:
                self.metrics.duration.observe(time.perf_counter() - started)
            self.metrics.reconciles.labels(outcome=outcome.outcome).inc()
            for change in outcome.changes:
                self.metrics.label_changes.labels(change=change.kind).inc()
                self._event(body, "Normal", f"Label{change.kind.capitalize()}", change.describe())
            return outcome

    async def _failed(self, name: str, body: Mapping[str, Any], err: BaseException) -> Outcome:
        log.error("labels not published", extra={"node": name, "error": str(err), "sink": self.sink.name})
        self.metrics.reconciles.labels(outcome="error").inc()
        reason = f"{self.sink.name} write failed: {_brief(err)}"
        self._event(body, "Warning", "PublishFailed", reason)
        try:
            await asyncio.to_thread(self._record_failure, name, body, reason)
        except Exception as status_err:
            log.error(
                "could not record the failure in status", extra={"node": name, "error": str(status_err)}
            )
        return Outcome("error")

    def _event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        if self.post_event is None:
            return
        try:
            self.post_event(body, type_, reason, message)
        except Exception as err:  # an Event is a courtesy: never let it fail a reconcile
            log.warning("could not post event", extra={"reason": reason, "error": str(err)})

    # --- the sync core (a worker thread) ---------------------------------------------------------------

    def _read(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_cluster_custom_object(models.GROUP, models.VERSION, models.PLURAL, name)
        return cast(dict[str, Any], obj)

    def _reconcile_sync(self, body: Mapping[str, Any]) -> Outcome:
        name = str((body.get("metadata") or {}).get("name", ""))
        try:
            devices = Devices.from_wire(dict(body))
        except pydantic.ValidationError as err:
            # A record we cannot read says nothing about the node: publish nothing, remove nothing.
            log.error(
                "devices record is invalid, labels left as published", extra={"node": name, "error": str(err)}
            )
            return Outcome("invalid")
        result = labels.compute(devices, self.domain)
        for w in result.withheld:
            self.metrics.withheld.labels(key=w.key).inc()
            log.warning(
                "label withheld", extra={"node": name, "key": w.key, "value": w.value, "reason": w.reason}
            )
        frozen = labels.frozen_families(devices.status)
        published = self.sink.publish(devices, result.labels, frozen)
        for k in published.plan.kept:
            self.metrics.removals_skipped.labels(family=labels.family(k, self.domain) or "").inc()
        if published.plan.kept:
            log.warning(
                "enumeration failed, labels kept as published",
                extra={
                    "node": name,
                    "keys": ",".join(published.plan.kept),
                    "failed": ",".join(sorted(frozen)),
                },
            )
        if published.wrote:
            log.info(
                "labels published",
                extra={"node": name, "target": published.target, "changes": len(published.plan.changes)},
            )
        condition = condition_for(published, result, frozen, None)
        written = self._write_status(
            devices, lambda d: next_status(d.status, result, published, condition, _now())
        )
        changed = bool(published.plan.changes)
        return Outcome("published" if changed else "unchanged", tuple(published.plan.changes), written)

    def _write_status(self, devices: Devices, build: Callable[[Devices], DevicesStatus]) -> bool:
        """Patch /status with resourceVersion as precondition; on 409 re-read and merge again, so another
        writer's conditions are never dropped."""
        for _ in range(STATUS_RETRIES):
            patch = status_patch(devices.status, build(devices))
            if patch is None:
                return False
            body = {"metadata": {"resourceVersion": devices.metadata.resource_version}, "status": patch}
            try:
                self.custom.patch_cluster_custom_object_status(
                    models.GROUP, models.VERSION, models.PLURAL, devices.metadata.name, body
                )
                return True
            except kubernetes.client.ApiException as err:
                if int(err.status or 0) != 409:
                    raise
                devices = Devices.from_wire(self._read(devices.metadata.name))
        raise sinks.Conflict(f"devices {devices.metadata.name} status kept changing while being written")

    def _record_failure(self, name: str, body: Mapping[str, Any], reason: str) -> None:
        try:
            devices = Devices.from_wire(dict(body))
        except pydantic.ValidationError:
            return
        result = labels.compute(devices, self.domain)
        condition = condition_for(None, result, frozenset(), reason)
        self._write_status(devices, lambda d: next_status(d.status, result, None, condition, _now()))


def _brief(err: BaseException) -> str:
    """A stable one-line reason (no response bodies), so a repeated failure does not rewrite status."""
    if isinstance(err, kubernetes.client.ApiException):
        return f"HTTP {err.status} {err.reason or ''}".strip()
    if isinstance(err, sinks.SinkError):
        return str(err)
    return type(err).__name__
