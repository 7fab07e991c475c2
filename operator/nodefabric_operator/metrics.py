"""Prometheus metrics of the operator, on a registry of its own so tests and embedders never collide.

Counters carry no `_created` series (one more series per label set that no dashboard reads), and the
registry also carries the process's own figures (CPU, resident memory, open fds, GC), so the operator's
cost at scale is read from the same endpoint as its work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nodefabric_devicemanager import buildinfo

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _children: dict[tuple[int, tuple[str, ...]], Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        prometheus_client.ProcessCollector(registry=self.registry)
        prometheus_client.PlatformCollector(registry=self.registry)
        prometheus_client.GCCollector(registry=self.registry)
        buildinfo.register("operator", self.registry)
        self.reconciles = Counter(
            "nodefabric_operator_reconciles",
            "Reconciles of one node's labels, by outcome "
            "(unchanged, published, superseded, error, invalid, withdrawn)",
            ["outcome"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "nodefabric_operator_events_skipped",
            "Watch events skipped because the operator already handled that version or a newer one "
            "(replays after a relist, echoes of its own writes; for devices also a state replaced by a "
            "newer one before it was handled), by resource",
            ["resource"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "nodefabric_operator_api_requests",
            "API requests the operator made beyond kopf's lists and watches, by verb and resource",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.label_changes = Counter(
            "nodefabric_operator_label_changes",
            "Node label changes written to the sink, by change (added, changed, removed)",
            ["change"],
            registry=self.registry,
        )
        self.withheld = Counter(
            "nodefabric_operator_labels_withheld",
            "Label values withheld because they are not valid label values as computed",
            ["key"],
            registry=self.registry,
        )
        self.removals_skipped = Counter(
            "nodefabric_operator_removals_skipped",
            "Label removals skipped because the matching enumeration failed, by family (rdma, fabric)",
            ["family"],
            registry=self.registry,
        )
        self.events = Counter(
            "nodefabric_operator_events",
            "Events about Devices records, by action: created, counted (a repeat raised an existing "
            "Event's count), dropped (never posted: the spam filter's, 25 per record at once, then one "
            "per 5 min; or still queued for a worker thread when the operator stopped), failed",
            ["action"],
            registry=self.registry,
        )
        self.records = Gauge(
            "nodefabric_operator_records",
            "Devices records the operator holds labels for",
            registry=self.registry,
        )
        self.not_on_node = Gauge(
            "nodefabric_operator_labels_not_on_node",
            "Devices records whose published labels are not (all) on their Node (LabelsOnNode=False): "
            "nfd-master has not applied them, or a label no longer published is still there",
            registry=self.registry,
        )
        self.duration = Histogram(
            "nodefabric_operator_reconcile_duration_seconds",
            "Time to reconcile one node's labels, API calls included",
            registry=self.registry,
        )

        self.topology_violations = Gauge(
            "nodefabric_topology_level_violations",
            "Values of a topology level that span several values of a looser level (the level is left out "
            "of the Kueue, KAI and Volcano projections while above 0), by level",
            ["level"],
            registry=self.registry,
        )
        self.topology_writes = Counter(
            "nodefabric_topology_objects_written",
            "Projected topology objects written, by target (kueue, kai, volcano) and verb",
            ["target", "verb"],
            registry=self.registry,
        )
        self.topology_duration = Histogram(
            "nodefabric_topology_reconcile_duration_seconds",
            "Time of one topology pass: the nesting check, the projections and their writes",
            registry=self.registry,
        )

    def inc(self, counter: Counter, *values: str, amount: float = 1) -> None:
        """`counter.labels(*values).inc()`, each label set's child looked up once: `labels()` checks and
        joins its arguments on every call, and a first sync makes about ten of them per record."""
        key = (id(counter), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*values)
        child.inc(amount)

    def requested(self, verb: str, resource: str) -> None:
        """One more API request counted."""
        self.inc(self.api_requests, verb, resource)

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The registry in the format the scraper asked for (OpenMetrics or the text format)."""
        encoder, content_type = prometheus_client.exposition.choose_encoder(accept)
        return encoder(self.registry), content_type
