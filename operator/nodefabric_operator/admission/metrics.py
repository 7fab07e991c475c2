"""The placement process's Prometheus metrics."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nodefabric_operator.admission.model import PHASES


class PlacementMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.groups = Gauge(
            "nodefabric_placement_groups",
            "PlacementGroups by phase, as this process last wrote or read them.",
            ["phase"],
            registry=self.registry,
        )
        self.admission = Histogram(
            "nodefabric_placement_admission_duration_seconds",
            "From the creation of a group's last member to the removal of its gates.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.evictions = Counter(
            "nodefabric_placement_evictions",
            "Pods evicted because their group was not bound and Ready in time.",
            registry=self.registry,
        )
        self.decisions = Counter(
            "nodefabric_placement_decisions",
            "Admission decisions made: a waiting group is decided again only when its pods, the capacity "
            "it could use or its owner's count changed.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "nodefabric_placement_leader",
            "1 while this replica holds the Lease and admits.",
            registry=self.registry,
        )
        for phase in PHASES:
            self.groups.labels(phase).set(0)

    def count_phases(self, phases: Iterable[str]) -> None:
        counts = dict.fromkeys(PHASES, 0)
        for p in phases:
            if p in counts:
                counts[p] += 1
        for phase, n in counts.items():
            self.groups.labels(phase).set(n)
