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

from nodefabric_devicemanager import vocabulary

GROUP = vocabulary.DEVICES_GROUP
VERSION = vocabulary.VERSION
API_VERSION = f"{GROUP}/{VERSION}"
KIND = vocabulary.DEVICES_KIND
PLURAL = vocabulary.DEVICES_PLURAL
SINGULAR = vocabulary.DEVICES_SINGULAR


class _Model(BaseModel):
    # Built at import, not deferred (defer_build): `nodefabric inventory` and the agent use every model
    # but ObjectMeta and Devices, and a deferred build only moved the same time into the walk (issue 24).
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


# Bounds the API server enforces through the CRD. Integers stay inside int64 by construction; the host
# reader (numbers.py) only ever produces values inside them, so a write that violates one is a bug here.
U8 = 0xFF
U16 = 0xFFFF
U32 = 2**32 - 1
INT32 = 2**31 - 1
# A NUMA node as the record spells it: "" (unknown) or 0..1023 in plain decimal. Declared for the API
# server only (json_schema_extra): readers of the record stay tolerant of a hand-edited value and parse it
# with numbers.numa_node, so one bad object never stops a reader. The API server matches with RE2, where
# `$` is the end of the text (not, as in Python, also before a final newline).
NUMA_PATTERN = r"^(|0|[1-9][0-9]{0,2}|10[01][0-9]|102[0-3])$"
CPU_LIST_PATTERN = r"^([0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)?$"


def _numa_field(what: str) -> Any:
    return Field(
        default="",
        description=f"NUMA node of {what}, in decimal; empty when the kernel gave none (never 0 or -1).",
        json_schema_extra={"pattern": NUMA_PATTERN},
    )


def _cpus_field(what: str) -> Any:
    return Field(
        default="",
        description=f"CPUs local to {what}, as the kernel's cpulist (e.g. 0-55,112-167); empty when unknown.",
        json_schema_extra={"pattern": CPU_LIST_PATTERN},
    )


class LinkState(StrEnum):
    """ok: a port is ACTIVE with phys_state LinkUp. failed: every port was read and none is. unverified:
    nothing is ok and something could not be read or parsed."""

    OK = "ok"
    UNVERIFIED = "unverified"
    FAILED = "failed"


class LinkVerdict(_Model):
    """Whether an RDMA endpoint's link really works, not merely whether a device is bound."""

    state: LinkState = Field(description="ok, unverified or failed.")
    reason: str = Field(
        default="", description="Why: the port values as the kernel printed them, or what could not be read."
    )
    # Set only for failed; carried from the stored object so it stays stable while the failure lasts.
    first_seen_time: datetime | None = Field(
        default=None,
        description="When a pass first observed this failure (failed only); stable while it lasts.",
    )


class Endpoint(_Model):
    """One network endpoint: a kernel interface, or an SR-IOV virtual function nested under its parent."""

    name: str = Field(
        default="",
        description="Kernel interface name; empty for a virtual function without a netdev of its own.",
    )
    bus: str = Field(
        default="",
        description="Bus of the interface's device: pci, platform, virtio, ...; empty for a software "
        "interface (lo, bond, vlan, bridge, veth).",
    )
    pci_bus_id: str = Field(
        default="", description="PCI address (0000:17:00.0); empty when the interface is not a PCI function."
    )
    pci_root_id: str = Field(
        default="",
        description="Outermost PCI bridge above the device (not the root complex); empty when the device "
        "sits directly on its host bridge.",
    )
    pci_switches: list[str] = Field(
        default_factory=list,
        description="Every PCI bridge between the host bridge and the device, innermost first.",
    )
    pci_host_bridge: str = Field(
        default="", description="The PCI host bridge (pciDDDD:BB) the device's bridge path hangs from."
    )
    pci_vendor: str = Field(default="", description="PCI vendor id, 4 lowercase hex digits (15b3).")
    pci_device: str = Field(default="", description="PCI device id, 4 lowercase hex digits (1021).")
    numa_affinity: str = _numa_field("the device")
    cpu_affinity: str = _cpus_field("the device")
    mtu: int | None = Field(
        default=None, ge=0, le=INT32, description="MTU in bytes; absent when the kernel's value is unknown."
    )
    up: bool = Field(default=False, description="The interface is up (operstate up, or IFF_UP when unknown).")
    virtual: bool = Field(default=False, description="A software interface with no device under it.")
    rdma: bool = Field(
        default=False,
        description="An RDMA device is bound. Says nothing about the link: see link.",
    )
    rdma_device: str = Field(
        default="", description="Name of the bound RDMA device (mlx5_0, hns_0, rxe0); empty when none."
    )
    rdma_software: bool = Field(
        default=False,
        description="The bound RDMA device is emulated by the kernel (rxe, siw), not the NIC's own: it is "
        "recorded, but does not make the endpoint usable for rdma.capable.",
    )
    sriov: bool = Field(
        default=False, description="This function is an SR-IOV physical function (sriov_totalvfs present)."
    )
    sriov_num_vfs: int = Field(
        default=0, ge=0, le=U16, description="Virtual functions configured on this physical function."
    )
    physical_function: str = Field(
        default="",
        description="Set on every SR-IOV virtual function (from physfn): its physical function's PCI "
        "address. A VF listed at top level, because its PF has no host netdev, is still a VF.",
    )
    link: LinkVerdict | None = Field(
        default=None,
        description="The RDMA link verdict; absent when no RDMA device is bound and none could be looked "
        "for.",
    )


class VirtualFunction(Endpoint):
    """An SR-IOV virtual function, nested under its physical function's interface."""


class Interface(Endpoint):
    """One kernel network interface of the node."""

    virtual_functions: list[VirtualFunction] = Field(
        default_factory=list,
        description="The SR-IOV virtual functions of this physical function, in PCI bus order.",
    )


class FabricKind(StrEnum):
    """nvlink (NVIDIA), xgmi (AMD), ub (Huawei Ascend)."""

    NVLINK = "nvlink"
    XGMI = "xgmi"
    UB = "ub"


class Fabric(_Model):
    """An accelerator's scale-up fabric membership. Domain = accelerators sharing (kind, id)."""

    kind: FabricKind = Field(description="Which fabric: nvlink, xgmi or ub.")
    id: str = Field(
        default="",
        description="The domain id (NVLink cluster uuid, XGMI hive id, Ascend super pod id); empty when "
        "the accelerator is in no identified domain.",
    )
    type: str = Field(default="", description="The product shape (Ascend: server-8p, pod-1d, ...).")
    clique_id: int | None = Field(
        default=None, ge=0, le=U32, description="NVLink clique inside the cluster (NVIDIA)."
    )
    member_count: int = Field(
        default=0, ge=0, le=U32, description="Accelerators in the domain; 0 means not reported."
    )
    node_index: int | None = Field(
        default=None, ge=0, le=U32, description="This machine's index in the super pod (Ascend)."
    )
    rack_id: int | None = Field(default=None, ge=0, le=U32, description="The rack (chassis) id (Ascend).")
    endpoints: list[str] = Field(
        default_factory=list,
        description="UB endpoint ids, 32 lowercase hex characters each, unparsed (Ascend).",
    )


class AcceleratorTopology(_Model):
    """Where an accelerator sits: its PCI placement, NUMA node, links to its peers, and fabric."""

    pci_bus_id: str = Field(default="", description="PCI address of the accelerator.")
    pci_root_id: str = Field(default="", description="Outermost PCI bridge above it (not the root complex).")
    pci_switches: list[str] = Field(
        default_factory=list, description="Every PCI bridge above it, innermost first."
    )
    pci_host_bridge: str = Field(default="", description="The PCI host bridge (pciDDDD:BB) above it.")
    numa_affinity: str = _numa_field("the accelerator")
    cpu_affinity: str = _cpus_field("the accelerator")
    # peer accelerator index -> link in the distance vocabulary ("NV18", "PIX", ... "SYS")
    links: dict[str, str] = Field(
        default_factory=dict,
        description="Peer accelerator index -> link: NV<n> (n NVLinks), LINK (XGMI), or the bus distance "
        "PIX, PXB, PHB, NODE, SYS, UNK.",
    )
    fabric: Fabric | None = Field(
        default=None, description="Scale-up fabric membership; absent when the vendor reported none."
    )


class Accelerator(_Model):
    """One accelerator (GPU, NPU, ...)."""

    id: str = Field(description="The accelerator's PCI address.")
    index: int = Field(ge=0, le=INT32, description="Index within its manufacturer's group, in PCI bus order.")
    topology: AcceleratorTopology = Field(
        default_factory=AcceleratorTopology, description="Placement, links and fabric."
    )


class AcceleratorGroup(_Model):
    """All accelerators of one manufacturer on the node."""

    id: str = Field(description="Manufacturer key: nvidia, amd, ascend, ...")
    manufacturer: str = Field(description="Manufacturer name as it writes it (NVIDIA, AMD, Huawei Ascend).")
    name: str = Field(default="", description="Human-readable group name (NVIDIA GPU).")
    accelerators: list[Accelerator] = Field(
        default_factory=list, description="The accelerators, in PCI bus order."
    )


class DevicesSpec(_Model):
    """What the node agent read from the host."""

    interfaces: list[Interface] = Field(
        default_factory=list,
        description="One entry per kernel network interface, sorted by name; VFs nested under their PF.",
    )
    groups: list[AcceleratorGroup] = Field(
        default_factory=list, description="One group per accelerator manufacturer on the node."
    )

    def wire(self) -> dict[str, Any]:
        """As stored, except that a list never read is left out rather than written empty: one that was
        neither given when this spec was built nor present in the stored object it was parsed from. A
        failure to enumerate is not an empty inventory, so a new node whose first pass could not read
        its interfaces (or has no /sys/bus/pci) gets no `interfaces` (`groups`) key until a pass reads it;
        a merge patch without the key leaves whatever is stored."""
        out = super().wire()
        for key in ("interfaces", "groups"):
            if key not in self.model_fields_set:
                out.pop(key, None)
        return out

    def has(self, key: str) -> bool:
        """Whether `key` ("interfaces", "groups") was read, i.e. is part of this spec's wire form."""
        return key in self.model_fields_set

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint: each interface followed by its virtual functions."""
        out: list[Endpoint] = []
        for iface in self.interfaces:
            out.append(iface)
            out.extend(iface.virtual_functions)
        return out


def share_fields_sets(interfaces: list[Interface]) -> None:
    """Give every endpoint (and link verdict) of a reading one set of field names per class, in place.

    pydantic keeps per instance the names of the fields set at construction: 728 bytes for an endpoint,
    more than its values, and a third of a big node's record, which the agent keeps between walks.
    Nothing here asks which fields were set (no exclude_unset: the wire leaves out None), a copy gets a
    set of its own, and an assignment adds a name the shared set already holds, so sharing changes no
    answer. Each set names every field: as if each were given.
    """
    shared: dict[type[BaseModel], set[str]] = {}
    setattr_ = object.__setattr__  # one call per endpoint of a big node: no helper frame around it

    def names(model: BaseModel) -> set[str]:
        found = shared.get(type(model))
        if found is None:
            found = shared[type(model)] = set(type(model).model_fields)
        return found

    for iface in interfaces:
        for ep in (iface, *iface.virtual_functions):
            setattr_(ep, "__pydantic_fields_set__", shared.get(type(ep)) or names(ep))
            if ep.link is not None:
                setattr_(ep.link, "__pydantic_fields_set__", shared.get(type(ep.link)) or names(ep.link))


# Condition types. A False condition means the matching part of the spec is the last good reading,
# kept because a failed read is not an empty host.
INTERFACES_ENUMERATED = "InterfacesEnumerated"
ACCELERATORS_ENUMERATED = "AcceleratorsEnumerated"
FABRIC_READ_SUFFIX = "FabricRead"  # one per manufacturer: "NvidiaFabricRead", "AmdFabricRead", ...
LABELS_PUBLISHED = "LabelsPublished"
LABELS_ON_NODE = "LabelsOnNode"  # the published labels are on the Node itself (NFD applied them)
# The agent's roll-up: True when every part of the host was read and the record holding it is published,
# so `kubectl wait devices/<node> --for=condition=Ready` waits for a complete record.
READY = "Ready"


class Condition(_Model):
    """What could and could not be read or published. False: that part of the record is the last good
    reading, kept because a failed read is not an empty host."""

    type: str = Field(
        description="InterfacesEnumerated, AcceleratorsEnumerated, <Vendor>FabricRead, Ready (the agent's "
        "roll-up: every part read and the record published), LabelsPublished, LabelsOnNode (the operator's: "
        "the published labels are on the Node)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="One CamelCase word saying why.")
    message: str = Field(default="", description="What happened, for a person.")
    last_transition_time: datetime | None = Field(default=None, description="When the status last changed.")


class DevicesStatus(_Model):
    """What the agent and the operator report about the record."""

    conditions: list[Condition] = Field(
        default_factory=list, description="One per type: what could and could not be read or published."
    )
    # What the operator last published for this node, and when.
    labels: dict[str, str] = Field(
        default_factory=dict, description="The node labels the operator last published from this record."
    )
    labels_published_time: datetime | None = Field(
        default=None, description="When the operator last published them."
    )
    # Summaries shown by `kubectl get devices` (printer columns read these).
    rdma_endpoints: int = Field(
        default=0, ge=0, le=INT32, description="Usable RDMA endpoints (virtual functions included)."
    )
    best_distance: str = Field(
        default="", description="Closest accelerator-to-usable-RDMA-endpoint distance (PIX ... SYS, UNK)."
    )
    fabric_domain: str = Field(
        default="", description="The scale-up fabric domain every accelerator shares, if any."
    )
    # Written by the agent with its conditions (the three above are the operator's).
    rdma_served: int = Field(
        default=0,
        ge=0,
        le=INT32,
        description="RDMA endpoints the device plugin serves: whole functions (not a PF with VFs "
        "configured) and VFs, each with a bound RDMA device; what kubelet's RDMA keys draw on.",
    )
    failed_links: int = Field(
        default=0, ge=0, le=INT32, description="Endpoints (VFs included) whose RDMA link verdict is Failed."
    )
    not_read: str = Field(
        default="",
        max_length=1024,
        description="The parts of the host the last pass could not read, comma-joined (interfaces, "
        "accelerators, <vendor>-fabric); empty when every part was read.",
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def unread(self, type_: str) -> bool:
        """The part was not read (False) or its reader cannot say (Unknown): what is recorded of it is
        no news of absence. No condition at all is a record from before conditions, read whole."""
        cond = self.condition(type_)
        return cond is not None and cond.status != "True"

    def fabric_unread(self) -> bool:
        return self.unread(ACCELERATORS_ENUMERATED) or any(
            c.type.endswith(FABRIC_READ_SUFFIX) and c.status != "True" for c in self.conditions
        )


class ObjectMeta(_Model):
    # Built when first used: `nodefabric inventory` never builds the object around the spec and status.
    model_config = ConfigDict(defer_build=True)

    name: str
    resource_version: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[dict[str, Any]] = Field(default_factory=list)
    creation_timestamp: datetime | None = None


class Devices(_Model):
    model_config = ConfigDict(defer_build=True)  # as ObjectMeta: inventory never builds one

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
