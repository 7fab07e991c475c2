"""Prometheus metrics of the device-plugin servers (process-wide, on prometheus_client's default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from nodefabric_devicemanager import buildinfo

ALLOCATIONS = Counter(
    "nodefabric_deviceplugin_allocations_total",
    "Allocate calls per container, by resource family and outcome "
    "(granted, unknown_device, unresolvable_verbs, host_read_timeout, list_not_built).",
    ["family", "outcome"],
)
PREFERRED_ALLOCATIONS = Counter(
    "nodefabric_deviceplugin_preferred_allocations_total",
    "GetPreferredAllocation answers per container, by resource family.",
    ["family"],
)
REGISTRATIONS = Counter(
    "nodefabric_deviceplugin_registrations_total",
    "Registrations with kubelet, by resource family and outcome (ok, failed).",
    ["family", "outcome"],
)
DEVICES = Gauge(
    "nodefabric_deviceplugin_devices",
    "Tokens last advertised to kubelet, by resource family and health.",
    ["family", "health"],
)

buildinfo.register("deviceplugin")
