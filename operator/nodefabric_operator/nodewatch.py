"""LabelsOnNode: whether the labels published for a node are on its Node object. With the Node sink the
sink's own view is the Nodes; with the NodeFeature sink the Nodes are watched for this alone (when the
operator may list them; otherwise LabelsOnNode is not said at all). A Node event costs a request only
when it changes the condition (nfd-master applied, removed, or failed to apply the labels)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kubernetes

from nodefabric_devicemanager import models
from nodefabric_operator import rawcall, sinks
from nodefabric_operator.ledger import Ledger
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.noderecord import Outcome, brief, node_snapshot, now, on_node_false
from nodefabric_operator.statuswriter import NOT_WATCHED, NotWatched, StatusWriter, Superseded
from nodefabric_operator.view import SinkObject, SinkView, at_or_below, part, version

log = logging.getLogger(__name__)


class LabelsOnNode:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        sink: sinks.Sink,
        *,
        view: SinkView,
        ledger: Ledger,
        status: StatusWriter,
        metrics: Metrics,
        domain: str,
    ) -> None:
        self.api = api
        self.sink = sink
        self.view = view  # the sink's objects: the Nodes themselves for the Node sink
        self.ledger = ledger
        self.status = status
        self.metrics = metrics
        self.domain = domain
        # Our keys on each Node. None: not watched (the Node sink's view already is the Nodes, or the
        # operator is not allowed to list them).
        self.nodes: SinkView | None = SinkView() if isinstance(sink, sinks.NodeFeatureSink) else None
        self.metrics.not_on_node.set_function(self._not_on_node)

    def _not_on_node(self) -> float:
        return float(sum(1 for r in self.ledger.records.values() if on_node_false(r.status)))

    async def prime(self) -> None:
        """The Nodes' labels before the first reconcile, for the same reason as the sink objects: a
        restart then finds LabelsOnNode as it left it and writes nothing."""
        if self.nodes is None:
            return
        try:
            for node in await asyncio.to_thread(self._node_labels):
                self.nodes.observe(node)
        except kubernetes.client.ApiException as err:
            if rawcall.status_of(err) != 403:
                raise
            log.warning(
                "cannot list Nodes, LabelsOnNode is not reported",
                extra={"error": f"HTTP 403 {err.reason or ''}".strip()},
            )
            self.nodes = None

    def _node_labels(self) -> list[SinkObject]:
        # Raw pages through rawcall, not CoreV1Api: importing it costs 0.4-0.5 s of CPU, a tenth of a
        # first sync's over 500 records, and nothing else on the NodeFeature sink's path needs it.
        listed = sinks.pages(self.metrics, "nodes", sinks.listing(self.api, "/api/v1/nodes"))
        return [node_snapshot(n, self.domain) for n in listed]

    def seen(self, name: str) -> SinkObject | NotWatched | None:
        """The Node as watched, taken before a write's requests are made (the views are the loop's)."""
        if isinstance(self.sink, sinks.NodeSink):
            return self.view.get(name)
        if self.nodes is None:
            return NOT_WATCHED
        return self.nodes.get(name)

    def echo(self, body: Mapping[str, Any]) -> bool:
        """Whether a Node event carries nothing newer than the Node held (the listing after the start's
        own, a replay): counted, and True; node_event would do nothing more with it."""
        if self.nodes is None:
            return False
        meta = part(body, "metadata")
        held, rv = self.nodes.get(str(meta.get("name", ""))), version(body)
        if held is None or rv is None or not at_or_below(rv, held.rv):
            return False
        self.metrics.inc(self.metrics.skipped, "nodes")
        return True

    async def node_event(self, body: Mapping[str, Any]) -> Outcome | None:
        if self.nodes is None:
            return None
        node = node_snapshot(body, self.domain)
        if not self.nodes.observe(node) and node.rv is not None:
            self.metrics.inc(self.metrics.skipped, "nodes")
            return None
        return await self._note(node.name)

    def node_deleted(self, body: Mapping[str, Any]) -> None:
        if self.nodes is not None:
            node = node_snapshot(body, self.domain)
            self.nodes.forget(node.name, node.rv, remember=False)

    async def _note(self, name: str) -> Outcome | None:
        """Write LabelsOnNode when what the Node now carries changes it; nothing otherwise."""
        ledger = self.ledger
        async with ledger.lock(name):
            record = ledger.records.get(name)
            node = self.seen(name)
            published = record.status.condition(models.LABELS_PUBLISHED) if record else None
            if (
                record is None
                or published is None
                or published.status != "True"
                or isinstance(node, NotWatched)
            ):
                return None  # nothing published (yet): the publish says it
            cond = self.status.on_node(name, record.status.labels, node)
            held = record.status.condition(models.LABELS_ON_NODE)
            if held is not None and (held.status, held.reason, held.message) == (
                cond.status,
                cond.reason,
                cond.message,
            ):
                return None
            new = record.status.model_copy(deep=True)
            new.conditions = models.set_condition(new.conditions, cond, now())
            try:
                after = await self.status.send(self.status.write(record, new))
            except (Superseded, sinks.RecordGone):
                return None  # a newer version (or the deletion) is on its way, and says it
            except Exception as err:
                # The next Node event (kubelet updates its Node every few minutes) tries again.
                log.warning(
                    "could not record whether the labels are on the node",
                    extra={"node": name, "error": brief(err)},
                )
                return None
            if after is None:
                return None
            was_handled = ledger.handled.get(name) == record.rv
            ledger.keep(record, after)
            if was_handled:
                ledger.handled[name] = after.rv  # our own write's echo is skipped, as a publish's is
            log.info(
                "labels on node" if cond.status == "True" else "labels not on node",
                extra={"node": name, "reason": cond.reason, "detail": cond.message},
            )
            return Outcome("unchanged", status_written=True)
