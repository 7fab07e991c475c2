"""The agent's Prometheus metrics, on a registry of their own (one agent, one registry; tests run several)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from nodefabric_devicemanager.models import DevicesSpec, LinkState

# Every verdict is always exported (0 when none), so a dashboard never reads a missing series as "fine".
VERDICTS = ("ok", "unverified", "failed", "none")


class _ApiCounts(Protocol):
    requests: int
    bytes_received: int


class _ApiCollector:
    """What the agent costs the API server, read from the connections' own counters at scrape time (the
    agent's, and the in-process DRA driver's)."""

    def __init__(self) -> None:
        self.apis: list[_ApiCounts] = []

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "nodefabric_agent_api_requests", "Requests sent to the API server (a watch counts once).",
            value=sum(api.requests for api in self.apis),
        )  # fmt: skip
        yield CounterMetricFamily(
            "nodefabric_agent_api_response_bytes",
            "Bytes of API response bodies and watch events received.",
            value=sum(api.bytes_received for api in self.apis),
        )


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._api: _ApiCollector | None = None
        r = self.registry
        self.passes = Counter(
            "nodefabric_agent_passes",
            "Passes, by kind (walk: the whole host; refresh: link state only; sync: no host read, the object "
            "changed) and result (ok, failed).",
            ["kind", "result"],
            registry=r,
        )
        self.pass_duration = Histogram(
            "nodefabric_agent_pass_duration_seconds",
            "Time one pass took, by kind: host read and any API requests.",
            ["kind"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.watch_events = Counter(
            "nodefabric_agent_watch_events",
            "Changes to the Devices object made by someone else, seen on the watch.",
            registry=r,
        )
        self.uevent_bursts = Counter(
            "nodefabric_agent_uevent_bursts",
            "Bursts of kernel uevents (net, infiniband, pci) that led to a walk of the host.",
            registry=r,
        )
        self.events = Counter(
            "nodefabric_agent_events_posted",
            "Kubernetes Events posted on the Devices object, by type (Warning, Normal).",
            ["type"],
            registry=r,
        )
        self.events_dropped = Counter(
            "nodefabric_agent_events_dropped",
            "Events not posted: a flapping condition spent the record's budget (25, then 1 per 5 min).",
            registry=r,
        )
        self.api_writes = Counter(
            "nodefabric_agent_api_writes",
            "Writes to the Devices object (create, spec, status).",
            ["kind"],
            registry=r,
        )
        self.errors = Counter(
            "nodefabric_agent_errors",
            "Errors by kind: interfaces, accelerators (a read that failed; counted when it starts), "
            "host_timeout (a host read past its budget), conflict, unavailable, rejected, gone, node_missing "
            "(API), internal.",
            ["kind"],
            registry=r,
        )
        self.endpoints = Gauge(
            "nodefabric_agent_endpoints",
            "RDMA endpoints (interfaces and virtual functions) in the published record, by link verdict.",
            ["verdict"],
            registry=r,
        )
        self.accelerators = Gauge(
            "nodefabric_agent_accelerators",
            "Accelerators in the published record, by manufacturer.",
            ["manufacturer"],
            registry=r,
        )
        self.last_success = Gauge(
            "nodefabric_agent_last_success_timestamp_seconds",
            "When a pass last finished with the record in step with the host.",
            registry=r,
        )
        for verdict in VERDICTS:
            self.endpoints.labels(verdict=verdict)
        for kind in ("walk", "refresh", "sync"):
            for result in ("ok", "failed"):
                self.passes.labels(kind=kind, result=result)

    def count_api(self, api: _ApiCounts) -> None:
        """Export what `api` costs the API server, added to the connections counted before."""
        if self._api is None:
            self._api = _ApiCollector()
            self.registry.register(self._api)  # type: ignore[arg-type]
        self._api.apis.append(api)

    def observe_record(self, spec: DevicesSpec) -> None:
        counts = dict.fromkeys(VERDICTS, 0)
        for iface in spec.interfaces:
            for ep in (iface, *iface.virtual_functions):
                if ep.link is not None:
                    counts[LinkState(ep.link.state).value] += 1
                elif ep.rdma:
                    counts["none"] += 1
        for verdict, n in counts.items():
            self.endpoints.labels(verdict=verdict).set(n)
        per_vendor: dict[str, int] = {}
        for group in spec.groups:
            per_vendor[group.manufacturer] = per_vendor.get(group.manufacturer, 0) + len(group.accelerators)
        self.accelerators.clear()  # a manufacturer that left the record must not linger at its last count
        for manufacturer, n in per_vendor.items():
            self.accelerators.labels(manufacturer=manufacturer).set(n)
