"""A Devices record as the operator keeps it, and the status it yields. Pure functions.

The record's spec is not kept (it can be 400 KiB on a node with many VFs): only its identity, the version
handled, the label set it yields and its status. The status the operator writes is merged into the one
read, every other writer's conditions kept as read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import pydantic

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import Condition, Devices, DevicesStatus
from nodefabric_operator import events, labels, sinks
from nodefabric_operator.view import SinkObject, items, part, version


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclass(frozen=True)
class Outcome:
    """What one event's handling did."""

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
    elif isinstance(err, sinks.Unpublishable):
        reason, message = err.reason, str(err)
    else:
        reason, message = events.PUBLISH_FAILED, f"{sink} write failed: {brief(err)}"
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
    """The status we own merged into the current one; every other writer's conditions are kept as read.
    A shallow copy: each field we own is replaced whole below, and what is shared is never changed in
    place (a deep copy of each status was 5% of a first sync's CPU)."""
    new = current.model_copy(update={"labels": dict(current.labels)})
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


def status_patch(
    current: DevicesStatus, new: DevicesStatus, new_wire: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The merge patch from `current` to `new` (`new_wire`: new.wire(), when the caller has it), or None
    when they are equal (no write)."""
    old_wire = current.wire()
    new_wire = new.wire() if new_wire is None else new_wire
    if old_wire == new_wire:
        return None
    body = dict(new_wire)
    body["labels"] = {k: None for k in current.labels if k not in new.labels} | dict(new.labels)
    return body


def node_snapshot(body: Mapping[str, Any], domain: str) -> SinkObject:
    """A Node as LabelsOnNode needs it: its name, version and our keys among its labels."""
    meta = part(body, "metadata")
    return SinkObject(
        name=str(meta.get("name", "")), rv=version(body), labels=sinks.ours(part(meta, "labels"), domain)
    )


def on_node_false(status: DevicesStatus) -> bool:
    cond = status.condition(models.LABELS_ON_NODE)
    return cond is not None and cond.status == "False"


def brief(err: BaseException) -> str:
    """A stable one-line reason (no response bodies), so a repeated failure does not rewrite status."""
    if isinstance(err, kubernetes.client.ApiException):
        return f"HTTP {err.status} {err.reason or ''}".strip()
    if isinstance(err, sinks.SinkError):
        return str(err)
    return type(err).__name__


def first_error(err: pydantic.ValidationError) -> str:
    """The first validation error, located: a whole pydantic report on one log line helps nobody."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')} ({err.error_count()} errors)"
