"""Prometheus metrics of the operator, on a registry of its own so tests and embedders never collide."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.reconciles = Counter(
            "nodefabric_operator_reconciles",
            "Reconciles of one node's labels, by outcome (unchanged, published, error, invalid, withdrawn)",
            ["outcome"],
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
        self.duration = Histogram(
            "nodefabric_operator_reconcile_duration_seconds",
            "Time to reconcile one node's labels, API calls included",
            registry=self.registry,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on a background thread (prometheus_client's own server); returns the server."""
        server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        return server
