"""The Devices record: one cluster-scoped object per node, named after the node.

Field names follow the seed's system (camelCase on the wire) so consumers written against it read ours.
Blank means unknown throughout: a NUMA affinity the kernel did not give is "", never "0" or "-1".
"""

from __future__ import annotations

from datetime import datetime
from enum import IntEnum, StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "worker.gpustack.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Devices"
PLURAL = "devices"
SINGULAR = "devices"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        """The JSON shape stored in the API: camelCase keys, unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Distance(IntEnum):
    """The product's proximity vocabulary; smaller is closer. See distance.py for how bus coordinates map."""

    SELF = 0
    LINK = 1
    PIX = 2
    PXB = 3
    PHB = 4
    NODE = 5
    SYS = 6
    UNK = 7


class LinkState(StrEnum):
    OK = "ok"
    UNVERIFIED = "unverified"
    FAILED = "failed"


class LinkVerdict(_Model):
    """Whether an RDMA endpoint's link really works, not merely whether a device is bound."""

    state: LinkState
    reason: str = ""
    # Set only for failed; carried from the stored object so it stays stable while the failure lasts.
    first_seen_time: datetime | None = None


class Endpoint(_Model):
    """One network endpoint: a kernel interface, or an SR-IOV virtual function nested under its parent."""

    name: str = ""  # "" for a VF that has no netdev of its own
    bus: str = ""  # "pci", "platform", "virtio", "" for a purely virtual interface
    pci_bus_id: str = ""
    pci_root_id: str = ""  # outermost bridge above the device: NOT the root complex
    pci_switches: list[str] = Field(default_factory=list)  # upstream bridge path, innermost first
    pci_host_bridge: str = ""  # the pci<domain>:<bus> host bridge the path hangs from
    pci_vendor: str = ""
    pci_device: str = ""
    numa_affinity: str = ""
    cpu_affinity: str = ""
    mtu: int = 0
    up: bool = False
    virtual: bool = False
    rdma: bool = False
    rdma_device: str = ""
    sriov: bool = False  # this function is an SR-IOV physical function (sriov_totalvfs present)
    sriov_num_vfs: int = 0  # virtual functions configured on it (sriov_numvfs); a separate fact
    # Set on every SR-IOV virtual function (from `physfn`): its PF's PCI bus id. A VF listed at top
    # level, because its PF has no host netdev, is still a VF and is served as one.
    physical_function: str = ""
    link: LinkVerdict | None = None


class VirtualFunction(Endpoint):
    pass


class Interface(Endpoint):
    virtual_functions: list[VirtualFunction] = Field(default_factory=list)


class FabricKind(StrEnum):
    NVLINK = "nvlink"
    XGMI = "xgmi"
    UB = "ub"


class Fabric(_Model):
    """An accelerator's scale-up fabric membership. Domain = accelerators sharing (kind, id)."""

    kind: FabricKind
    id: str = ""
    type: str = ""
    clique_id: int | None = None
    member_count: int = 0  # 0 means unreported
    node_index: int | None = None
    rack_id: int | None = None
    endpoints: list[str] = Field(default_factory=list)


class AcceleratorTopology(_Model):
    pci_bus_id: str = ""
    pci_root_id: str = ""
    pci_switches: list[str] = Field(default_factory=list)
    pci_host_bridge: str = ""
    numa_affinity: str = ""
    cpu_affinity: str = ""
    # peer accelerator index -> link in the distance vocabulary ("NV18", "PIX", ... "SYS")
    links: dict[str, str] = Field(default_factory=dict)
    fabric: Fabric | None = None


class Accelerator(_Model):
    id: str
    index: int
    topology: AcceleratorTopology = Field(default_factory=AcceleratorTopology)


class AcceleratorGroup(_Model):
    """All accelerators of one manufacturer on the node."""

    id: str
    manufacturer: str
    name: str = ""
    accelerators: list[Accelerator] = Field(default_factory=list)


class DevicesSpec(_Model):
    interfaces: list[Interface] = Field(default_factory=list)
    groups: list[AcceleratorGroup] = Field(default_factory=list)

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint: each interface followed by its virtual functions."""
        out: list[Endpoint] = []
        for iface in self.interfaces:
            out.append(iface)
            out.extend(iface.virtual_functions)
        return out


# Condition types. A False condition means the matching part of the spec is the last good reading,
# kept because a failed read is not an empty host.
INTERFACES_ENUMERATED = "InterfacesEnumerated"
ACCELERATORS_ENUMERATED = "AcceleratorsEnumerated"
FABRIC_READ_SUFFIX = "FabricRead"  # one per manufacturer: "NvidiaFabricRead", "AmdFabricRead", ...
LABELS_PUBLISHED = "LabelsPublished"


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None


class DevicesStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list)
    # What the operator last published for this node, and when.
    labels: dict[str, str] = Field(default_factory=dict)
    labels_published_time: datetime | None = None
    # Summaries shown by `kubectl get devices` (printer columns read these).
    rdma_endpoints: int = 0
    best_distance: str = ""
    fabric_domain: str = ""

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def failed(self, type_: str) -> bool:
        cond = self.condition(type_)
        return cond is not None and cond.status == "False"

    def fabric_read_failed(self) -> bool:
        return self.failed(ACCELERATORS_ENUMERATED) or any(
            c.type.endswith(FABRIC_READ_SUFFIX) and c.status == "False" for c in self.conditions
        )


class ObjectMeta(_Model):
    name: str
    resource_version: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[dict[str, Any]] = Field(default_factory=list)
    creation_timestamp: datetime | None = None


class Devices(_Model):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: DevicesSpec = Field(default_factory=DevicesSpec)
    status: DevicesStatus = Field(default_factory=DevicesStatus)

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Devices:
        return cls.model_validate(obj)


def set_condition(conditions: list[Condition], new: Condition, now: datetime) -> list[Condition]:
    """Conditions with `new` merged in by type. lastTransitionTime moves only when the status changes,
    so re-asserting the same state is not a change (and costs no API write)."""
    out: list[Condition] = []
    replaced = False
    for cond in conditions:
        if cond.type != new.type:
            out.append(cond)
            continue
        replaced = True
        keep_time = cond.status == new.status and cond.last_transition_time is not None
        out.append(
            new.model_copy(update={"last_transition_time": cond.last_transition_time if keep_time else now})
        )
    if not replaced:
        out.append(new.model_copy(update={"last_transition_time": now}))
    return sorted(out, key=lambda c: c.type)
