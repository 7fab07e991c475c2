"""The node's pool: which RDMA endpoints of a record are DRA devices, and their stable names.

The set is the device plugin's own (`resources.whole_function_endpoints` and `partition_endpoints`), so
the two kubelet-facing servers can never disagree about what an endpoint is: a PF with VFs configured is
offered only as its VFs, an endpoint without an RDMA device name is not offered, two netdevs on one RDMA
device are one device. Pure functions of the record.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum

from nodefabric_devicemanager.models import DevicesSpec, Endpoint
from nodefabric_devicemanager.summary import partitioned
from nodefabric_deviceplugin.resources import RdmaEndpoint, partition_endpoints, whole_function_endpoints
from nodefabric_deviceplugin.selection import HostFacts, Selection

_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
MAX_LABEL = 63


class Role(StrEnum):
    PF = "pf"  # a whole PCI function (SR-IOV capable or not)
    VF = "vf"  # an SR-IOV virtual function


@dataclass(frozen=True, slots=True)
class PoolDevice:
    """One RDMA endpoint as a DRA device: its name in the pool, and the facts its attributes come from."""

    name: str
    endpoint: RdmaEndpoint  # coordinates, RDMA device, health: the device plugin's view of it
    record: Endpoint  # the record's own entry (vendor, device ids, link verdict)
    role: Role
    parent: str  # the PF's PCI bus id for a VF; "" for a PF

    @property
    def allocatable(self) -> bool:
        """A failed link leaves the pool; ok, unverified and no verdict stay (the device plugin's Healthy)."""
        return self.endpoint.healthy


def device_name(ep: RdmaEndpoint) -> str:
    """A DNS label, stable across restarts: `pci-0000-19-00-0` from the PCI bus id, else `rdma-<device>`.

    A name that had to be changed to fit (upper case, `_`, too long) carries a digest of the original, so
    two endpoints can never be folded onto one name.
    """
    if _BUS_ID.match(ep.key):
        return "pci-" + ep.key.replace(":", "-").replace(".", "-")
    raw = ep.key if ep.key.startswith("rdma-") else f"rdma-{ep.key}"
    label = _NOT_LABEL.sub("-", raw.lower()).strip("-")
    if label == raw and len(label) <= MAX_LABEL:
        return label
    digest = hashlib.sha256(ep.key.encode()).hexdigest()[:8]
    return f"{label[: MAX_LABEL - 9].rstrip('-')}-{digest}"


def _records(spec: DevicesSpec) -> dict[tuple[str, str], tuple[Endpoint, Role, str]]:
    """Every offered endpoint of the record by (RDMA device, PCI bus id), with its role and parent."""
    out: dict[tuple[str, str], tuple[Endpoint, Role, str]] = {}
    for iface in spec.interfaces:
        if partitioned(iface):
            for vf in iface.virtual_functions:
                out.setdefault((vf.rdma_device, vf.pci_bus_id), (vf, Role.VF, iface.pci_bus_id))
        elif iface.physical_function:
            # A VF listed at top level because its PF has no netdev of its own is still a VF.
            out.setdefault((iface.rdma_device, iface.pci_bus_id), (iface, Role.VF, iface.physical_function))
        else:
            out.setdefault((iface.rdma_device, iface.pci_bus_id), (iface, Role.PF, ""))
    return out


def pool_devices(spec: DevicesSpec | None) -> list[PoolDevice]:
    """Every RDMA endpoint of the record as a device, failed links included (prepare resolves from these;
    `published` says which are offered), in the device plugin's order: PCI bus order, then by name."""
    if spec is None:
        return []
    records = _records(spec)
    out: list[PoolDevice] = []
    for ep in [*whole_function_endpoints(spec), *partition_endpoints(spec)]:
        # The endpoint's representative entry has its PCI bus id (the lowest of the device's functions).
        found = records.get((ep.rdma_device, ep.pci_bus_id)) or next(
            (v for (dev, _), v in records.items() if dev == ep.rdma_device), None
        )
        if found is not None:
            record, role, parent = found
            out.append(PoolDevice(device_name(ep), ep, record, role, parent))
    return out


def offered(devices: list[PoolDevice], functions: tuple[str, ...]) -> list[PoolDevice]:
    """The devices of the function types this driver offers (all of them unless it runs beside the
    device plugin); a device of another type is the device plugin's and is neither published nor prepared."""
    return [d for d in devices if d.role.value in functions]


def published(devices: list[PoolDevice]) -> list[PoolDevice]:
    return [d for d in devices if d.allocatable]


def device_plugin_share(spec: DevicesSpec | None) -> DevicesSpec | None:
    """The record the device plugin serves beside a DRA driver that offers the whole functions: the SR-IOV
    VFs only (a PF with VFs configured keeps them; a VF listed at top level stays), so the device plugin's
    exclusive and shared families are empty and its partitioned family is unchanged."""
    if spec is None:
        return None
    kept = [i for i in spec.interfaces if partitioned(i) or i.physical_function or not i.rdma_device]
    return spec.model_copy(update={"interfaces": kept})


def selected(
    devices: list[PoolDevice], selection: Selection, host: HostFacts | None = None
) -> list[PoolDevice]:
    """The devices the operator's selectors offer: whole functions as the device plugin's exclusive family
    selects them, VFs as its partitioned family does (`selection.py`); every one by default."""
    if selection.default:
        return devices
    return [
        d
        for d in devices
        if selection.serves("exclusive" if d.role is Role.PF else "partitioned", d.endpoint.facts(host))
    ]
