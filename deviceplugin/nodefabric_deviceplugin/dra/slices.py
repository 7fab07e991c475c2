"""The node's ResourceSlices, and what to write to get from the live ones to them. Pure functions.

One pool per node, named after it, holding one device per allocatable RDMA endpoint. A device carries
the standard attributes (`resource.kubernetes.io/pcieRoot`, `pciBusID`, `numaNode`), so a claim can ask
for a NIC under the same PCIe root as a GPU of another driver, and our own (unqualified, i.e. under the
driver's name): rdmaDevice, interfaceName, linkLayer, linkState, functionType, physicalFunction,
pciVendor, pciDevice, fabricDomain, acceleratorDistance. An attribute whose value is unknown is absent.

The pool's generation grows only when its content changes, and nothing is written when the live slices
already say what the record says (the same rule as the Devices record: steady state costs no writes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager import distance, summary
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.dra.config import STANDARD_DOMAIN, DriverConfig
from nodefabric_deviceplugin.dra.devices import PoolDevice, Role, offered, pool_devices, published, selected
from nodefabric_deviceplugin.selection import HostFacts

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ResourceSlice"
PLURAL = "resourceslices"
# API limits (resource.k8s.io/v1 validation): a slice holds at most 128 devices, a string attribute at
# most 64 bytes. A larger pool is split over several slices; a longer value is left out, because
# the API server would refuse the whole slice for it.
MAX_DEVICES_PER_SLICE = 128
MAX_STRING = 64
MAX_NAME = 253

PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"

_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HEX_ID = re.compile(r"^[0-9a-f]{4}$")

Attribute = dict[str, Any]  # {"string": "..."} | {"int": n} | {"bool": b} | {"version": "..."}


def _string(attrs: dict[str, Attribute], name: str, value: str, device: str) -> None:
    if not value:
        return
    size = len(value.encode())  # the API server counts bytes, not characters
    if size > MAX_STRING:
        log.warning(
            "attribute value too long for a ResourceSlice; left out",
            extra={"device": device, "attribute": name, "bytes": size, "limit": MAX_STRING},
        )
        return
    attrs[name] = {"string": value}


def attributes(
    dev: PoolDevice, spec: DevicesSpec, link_layers: Mapping[str, str], fabric_domain: str | None
) -> dict[str, Attribute]:
    """A device's attributes. Standard ones only when the value has the standard's exact form."""
    ep = dev.endpoint
    attrs: dict[str, Attribute] = {}
    if _HOST_BRIDGE.match(ep.pci_host_bridge):
        attrs[PCIE_ROOT] = {"string": ep.pci_host_bridge}
    if _BUS_ID.match(ep.pci_bus_id):
        attrs[PCI_BUS_ID] = {"string": ep.pci_bus_id}
    if ep.numa is not None:  # a VF without its own NUMA node has its PF's (the device plugin's rule)
        attrs[NUMA_NODE] = {"int": ep.numa}
    _string(attrs, "rdmaDevice", ep.rdma_device, dev.name)
    _string(attrs, "interfaceName", ",".join(ep.netdevs), dev.name)
    _string(attrs, "linkLayer", link_layers.get(ep.rdma_device, ""), dev.name)
    if dev.record.link is not None:
        attrs["linkState"] = {"string": str(dev.record.link.state)}
    attrs["functionType"] = {"string": str(dev.role)}
    if dev.role is Role.VF and _BUS_ID.match(dev.parent):
        attrs["physicalFunction"] = {"string": dev.parent}
    if _HEX_ID.match(dev.record.pci_vendor):
        attrs["pciVendor"] = {"string": dev.record.pci_vendor}
    if _HEX_ID.match(dev.record.pci_device):
        attrs["pciDevice"] = {"string": dev.record.pci_device}
    _string(attrs, "fabricDomain", fabric_domain or "", dev.name)
    accelerators = [a.topology for g in spec.groups for a in g.accelerators]
    if accelerators:
        attrs["acceleratorDistance"] = {"string": distance.closest(accelerators, [ep]).name}
    return dict(sorted(attrs.items()))


def slice_device(
    dev: PoolDevice, spec: DevicesSpec, link_layers: Mapping[str, str], fabric_domain: str | None
) -> dict[str, Any]:
    return {"name": dev.name, "attributes": attributes(dev, spec, link_layers, fabric_domain)}


def slice_name(config: DriverConfig, index: int) -> str:
    """`<node>-<driver>-<index>`: deterministic, so a restart finds its own slices by name."""
    name = f"{config.node_name}-{config.driver}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(config.node_name.encode()).hexdigest()[:10]
    keep = MAX_NAME - len(f"-{digest}-{config.driver}-{index}")
    return f"{config.node_name[:keep].rstrip('.-')}-{digest}-{config.driver}-{index}"


@dataclass(frozen=True, slots=True)
class DesiredSlice:
    name: str
    spec: dict[str, Any]  # without pool.generation, which the plan decides


def desired_slices(
    spec: DevicesSpec | None,
    config: DriverConfig,
    link_layers: Mapping[str, str],
    host: HostFacts | None = None,
) -> list[DesiredSlice] | None:
    """The slices the record yields; [] for a node without allocatable endpoints; None without a record
    (a record not read yet is not an empty node, so nothing is written or deleted then)."""
    if spec is None:
        return None
    domain = summary.node_fabric_domain(spec)
    # The operator's selectors (`config.selection`, the device plugin's) decide which are offered, so the
    # DeviceClasses, which match what is published, follow the same selection.
    pool = published(selected(offered(pool_devices(spec), config.functions), config.selection, host))
    devices = [slice_device(d, spec, link_layers, domain) for d in pool]
    chunks = [devices[i : i + MAX_DEVICES_PER_SLICE] for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)]
    return [
        DesiredSlice(
            slice_name(config, i),
            {
                "driver": config.driver,
                "nodeName": config.node_name,
                "pool": {"name": config.pool, "resourceSliceCount": len(chunks)},
                "devices": chunk,
            },
        )
        for i, chunk in enumerate(chunks)
    ]


def resource_slice(
    desired: DesiredSlice, generation: int, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The full API object of one desired slice at a pool generation."""
    spec = {**desired.spec, "pool": {**desired.spec["pool"], "generation": generation}}
    meta: dict[str, Any] = {"name": desired.name}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


# --- from the live slices to the desired ones -------------------------------------------------------


def _empty(value: Any) -> bool:
    """A value the API server leaves out of what it returns (`omitempty`): the same as no field at all."""
    return value is None or value is False or (isinstance(value, dict | list | str) and not value)


def _canonical_device(device: Any) -> Any:
    if not isinstance(device, dict):
        return device
    # Every field of the device counts, not only the two we write: one added by hand to the published
    # slice (a taint, capacity, a node selector) is drift, and the update, which replaces the device list
    # whole, takes it out. An empty one reads as absent: the API server drops it, and a stored device
    # (we write none but `name` and `attributes`; the API defaults no other device field) must compare
    # equal to ours, or every sync would rewrite the slice.
    shape = {key: value for key, value in device.items() if not _empty(value)}
    shape["name"] = device.get("name")
    shape["attributes"] = device.get("attributes") or {}
    return shape


def canonical(spec: Any) -> Any:
    """The part of a slice spec that is ours to decide, generation excluded; garbage compares unequal."""
    if not isinstance(spec, dict) or not isinstance(spec.get("pool"), dict):
        return None
    devices = spec.get("devices") or []
    return {
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": {
            "name": spec["pool"].get("name"),
            "resourceSliceCount": spec["pool"].get("resourceSliceCount"),
        },
        "devices": [_canonical_device(d) for d in devices] if isinstance(devices, list) else None,
    }


def content(spec: Any) -> str | None:
    """A digest of `canonical(spec)`; None for garbage. The driver keeps its live slices as this: a big
    pool's slices are megabytes as dicts, and only their equality with the desired ones matters."""
    shape = canonical(spec)
    if shape is None:
        return None
    return hashlib.sha256(json.dumps(shape, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LiveSlice:
    name: str
    resource_version: str
    generation: int
    content: str | None  # `content(spec)`
    # `content` of the desired slice whose write of ours the API server answered with this very object
    # (None for one listed or watched): its own form of what we wrote. A field it sets on every write (a
    # default of a later release, a mutating webhook's) is then no drift, or every sync would rewrite the
    # slice at a new generation for ever; an edit after our write is a new object, and drift again.
    written_as: str | None = None

    def holds(self, wanted: str) -> bool:
        """Whether the slice says what the desired slice of content `wanted` says."""
        return self.content is not None and wanted in (self.content, self.written_as)


def live_slice(obj: Mapping[str, Any], *, digest: bool = True) -> LiveSlice | None:
    """A listed slice, or None for one without a name (nothing could be done with it). Without `digest`
    its content is left None, to be computed later (`content`; 2 ms for a slice of 128 devices)."""
    raw_meta = obj.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    spec = obj.get("spec")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    pool = spec.get("pool") if isinstance(spec, dict) else None
    generation = pool.get("generation") if isinstance(pool, dict) else None
    return LiveSlice(
        name=name,
        resource_version=str(meta.get("resourceVersion") or ""),
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        content=content(spec) if digest else None,
    )


# pool.generation is an int64 in the API.
MAX_GENERATION = 2**63 - 1


@dataclass(frozen=True, slots=True)
class SlicePlan:
    generation: int
    create: tuple[DesiredSlice, ...] = ()
    update: tuple[tuple[DesiredSlice, str], ...] = ()  # with the live resourceVersion to precondition on
    delete: tuple[tuple[str, str], ...] = ()  # (name, resourceVersion)

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


def plan(desired: Sequence[DesiredSlice], live: Sequence[LiveSlice]) -> SlicePlan:
    """Nothing when the live slices hold exactly the desired content at one generation; otherwise every
    desired slice at a generation above every live one (creates and updates), then the leftovers deleted.
    Consumers ignore a pool's older generations, so the new one counts as soon as it is written."""
    by_name = {s.name: s for s in live}
    generations = {s.generation for s in live}
    same = (
        set(by_name) == {d.name for d in desired}
        and len(generations) <= 1
        and all(by_name[d.name].holds(content(d.spec) or "") for d in desired)
    )
    if same:
        return SlicePlan(generation=next(iter(generations), 0))
    generation = max(generations, default=0) + 1
    if generation > MAX_GENERATION:
        # Someone set a generation at the int64 limit: the next one is a number no API server stores, and
        # every write of the pool would be refused forever. Start the pool over; every slice is rewritten.
        generation = 1
    wanted = {d.name for d in desired}
    return SlicePlan(
        generation=generation,
        create=tuple(d for d in desired if d.name not in by_name),
        update=tuple((d, by_name[d.name].resource_version) for d in desired if d.name in by_name),
        delete=tuple((s.name, s.resource_version) for s in live if s.name not in wanted),
    )
