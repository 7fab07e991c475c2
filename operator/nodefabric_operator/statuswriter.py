"""The requests of a reconcile: the labels published through the sink, then the Devices status written
with the version the operator last saw as precondition. Generators of requests (apicall.Calls), sent by
the driver given (aioclient.Driver: on the event loop, or in a worker thread); they hold no state shared
with the loop (the caller takes what it needs from the views first and settles after).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import kubernetes
import pydantic

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import Condition, DevicesStatus
from nodefabric_operator import onnode, rawcall, sinks
from nodefabric_operator.aioclient import Driver
from nodefabric_operator.apicall import Calls, Request
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.noderecord import NodeRecord, condition_for, next_status, now, status_patch
from nodefabric_operator.view import SinkObject, version

log = logging.getLogger(__name__)

STATUS_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.PLURAL}/{{name}}/status"


class Superseded(Exception):
    """The status write met a newer version of the record: the watch delivers that version next, and
    its reconcile writes the status, so this one stops without reading anything back."""


class StatusUnreadable(sinks.SinkError):
    """The status write was answered 2xx with something that is not the record (not a JSON object): the
    labels are written, whether the status was is unknown. A failed status write, retried as a 503 on
    the status write is (reconcile.transient), not a failed publication."""


class NotWatched:
    """Nodes are not watched (no right to list them): LabelsOnNode is not said at all."""


NOT_WATCHED = NotWatched()


@dataclass(frozen=True)
class Applied:
    published: sinks.Published
    record: NodeRecord  # with the status and version our status write left, when it wrote one
    status_written: bool
    superseded: bool


class StatusWriter:
    def __init__(
        self, api: kubernetes.client.ApiClient, sink: sinks.Sink, domain: str, metrics: Metrics
    ) -> None:
        self.api = api
        self.sink = sink
        self.domain = domain
        self.metrics = metrics
        self.send = Driver(api, metrics)  # `await self.send(calls)`: the requests of one write, sent

    def on_node(self, name: str, published: Mapping[str, str], node: SinkObject | None) -> Condition:
        """LabelsOnNode: whether the labels published are on the Node as watched."""
        via = "nfd-master" if isinstance(self.sink, sinks.NodeFeatureSink) else ""
        return onnode.condition(name, published, None if node is None else node.labels, self.domain, via)

    def apply(
        self,
        record: NodeRecord,
        current: SinkObject | None,
        verify: bool,
        node: SinkObject | NotWatched | None,
        landed: list[sinks.Published] | None = None,
    ) -> Calls[Applied]:
        """The sink's write, then the status write. What the sink's write did is appended to `landed`
        before the status write is sent: when that write then fails, the caller knows the labels are on
        the sink (its final line says so) and holds the sink object as the write left it."""
        published = yield from self.sink.publishing(
            record.owner, record.result.labels, record.frozen, current, verify=verify
        )
        if landed is not None:
            landed.append(published)
        condition = condition_for(published, record.result, record.frozen, None)
        if isinstance(self.sink, sinks.NodeSink):
            node = published.now  # the Node as our write left it
        also = (
            () if isinstance(node, NotWatched) else (self.on_node(record.name, published.plan.managed, node),)
        )
        new = next_status(record.status, record.result, published, condition, now(), also=also)
        try:
            after = yield from self.write(record, new)
        except Superseded:
            return Applied(published, record, status_written=False, superseded=True)
        if after is None:
            return Applied(published, record, status_written=False, superseded=False)
        return Applied(published, after, status_written=True, superseded=False)

    def write(self, record: NodeRecord, new: DevicesStatus) -> Calls[NodeRecord | None]:
        """Patch /status with the version the operator last saw as precondition; None when nothing changes.
        A 409 is not re-read: the newer version is on its way through the watch (Superseded)."""
        wire = new.wire()
        patch = status_patch(record.status, new, wire)
        if patch is None:
            return None
        body = {"metadata": {"resourceVersion": record.rv}, "status": patch}
        request = Request(
            "patch", "devices/status", "PATCH", STATUS_PATH, {"name": record.name}, body, rawcall.MERGE_PATCH
        )
        try:
            data = yield request
        except kubernetes.client.ApiException as err:
            if rawcall.status_of(err) == 409:
                raise Superseded(record.name) from err
            if rawcall.status_of(err) == 404:
                raise sinks.RecordGone(f"devices {record.name} is gone") from err
            raise
        try:
            answer = rawcall.json_object(data)
        except ValueError as err:
            # Not "labels not published": they were (the sink's write came before and succeeded).
            log.warning(
                "labels written, but the status write's answer is unreadable",
                extra={"node": record.name, "error": str(err), "answer_bytes": len(data)},
            )
            raise StatusUnreadable(f"status write answered with no readable object: {err}") from err
        got = answer.get("status") or {}
        if got == wire:
            status = new  # as written (the usual answer): not parsed again
        else:
            try:
                status = DevicesStatus.model_validate(got)
            except pydantic.ValidationError:
                status = new  # another writer's field we cannot read: ours is what we just wrote
        return dataclasses.replace(record, rv=version(answer), status=status)

    def record_failure(self, record: NodeRecord, condition: Condition) -> Calls[NodeRecord | None]:
        new = next_status(record.status, record.result, None, condition, now())
        try:
            return (yield from self.write(record, new))
        except (Superseded, sinks.RecordGone):
            return None
