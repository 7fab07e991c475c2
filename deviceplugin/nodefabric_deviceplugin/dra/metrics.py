"""Prometheus metrics of the DRA driver (process-wide, on prometheus_client's default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from nodefabric_devicemanager import buildinfo

PREPARES = Counter(
    "nodefabric_dra_prepares_total",
    "NodePrepareResources outcomes per claim "
    "(prepared, repeated, resolved_again, no_devices, failed, dropped).",
    ["outcome"],
)
UNPREPARES = Counter(
    "nodefabric_dra_unprepares_total",
    "NodeUnprepareResources outcomes per claim (removed, absent, failed, dropped).",
    ["outcome"],
)
PREPARED_CLAIMS = Gauge("nodefabric_dra_prepared_claims", "Claims currently prepared on this node.")
UNSYNCED_CLAIMS = Gauge(
    "nodefabric_dra_unsynced_claims",
    "Prepared claims answered to kubelet whose checkpoint entry is written but not yet synced to disk.",
)
CHECKPOINT_SYNC_FAILURES = Counter(
    "nodefabric_dra_checkpoint_sync_failures_total",
    "Checkpoint entries of prepared claims that could not be synced to disk after kubelet was answered.",
)
REGISTRATIONS = Counter(
    "nodefabric_dra_registrations_total",
    "Registration answers from kubelet's plugin watcher (ok, failed).",
    ["outcome"],
)
SLICE_WRITES = Counter(
    "nodefabric_dra_slice_writes_total",
    "ResourceSlice writes, by verb (create, update, delete).",
    ["verb"],
)
SLICE_SYNCS = Counter(
    "nodefabric_dra_slice_syncs_total",
    "ResourceSlice syncs, by outcome (unchanged, written, failed, skipped).",
    ["outcome"],
)
POOL_DEVICES = Gauge(
    "nodefabric_dra_pool_devices",
    "Devices of this node's pool, by state (published, left_out: a failed link).",
    ["state"],
)
SLICE_EVENTS = Counter(
    "nodefabric_dra_slice_changes_total",
    "Changes to this node's ResourceSlices by someone else (kubelet, a human), seen on the watch.",
)

buildinfo.register("dra")
