"""The resource manager: which RDMA endpoints each resource key serves, their token ids, health and hints.

Pure functions of a `DevicesSpec`; nothing here reads the host or remembers an allocation, so every
ListAndWatch message and every Allocate is rebuilt from the latest record (see the seed's "The RDMA
resource keys").
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from nodefabric_devicemanager.models import DevicesSpec, Endpoint, Interface, LinkState
from nodefabric_devicemanager.pci import bus_key

DEFAULT_DOMAIN = "gpustack.ai"
DEFAULT_SHARED_COUNT = 64
MAX_ID_LENGTH = 63  # kubelet's limit on a device ID
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Amazon's PCI vendor: the only RDMA device bound to one of its functions is EFA, which AWS's own plugin
# allocates under vpc.amazonaws.com/efa; advertising it here too would hand one adapter out twice.
AMAZON_VENDOR = "1d0f"


class Family(StrEnum):
    """The three resource families; the value is the resource name after `device.<domain>/`."""

    EXCLUSIVE = "rdma"
    SHARED = "rdma.shared"
    PARTITIONED = "rdma.partitioned"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    domain: str = DEFAULT_DOMAIN
    shared_count: int = DEFAULT_SHARED_COUNT
    shared: bool = True
    partitioned: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.shared_count <= 100_000:
            raise ValueError(f"the shared count must be between 1 and 100000, got {self.shared_count}")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", self.domain):
            raise ValueError(f"the domain must be a DNS subdomain such as gpustack.ai, got {self.domain!r}")

    def families(self) -> list[Family]:
        """Exclusive is always served; --no-shared and --no-partitioned drop the other two."""
        out = [Family.EXCLUSIVE]
        if self.shared:
            out.append(Family.SHARED)
        if self.partitioned:
            out.append(Family.PARTITIONED)
        return out

    def resource_name(self, family: Family) -> str:
        return f"device.{self.domain}/{family.value}"


@dataclass(frozen=True, slots=True)
class RdmaEndpoint:
    """One allocatable RDMA endpoint: one bound RDMA device, the unit a verbs device is handed out for.

    Carries the bus coordinates `nodefabric_devicemanager.distance` reads, so two endpoints compare
    the same way a NIC and an accelerator do.
    """

    key: str  # the stable id stem: PCI bus id, else "rdma-<device>" (clamped to fit a token)
    rdma_device: str
    netdevs: tuple[str, ...]  # empty for a VF with no netdev of its own
    pci_bus_id: str
    pci_switches: tuple[str, ...]
    pci_host_bridge: str
    numa_affinity: str  # "" when neither the endpoint nor, for a VF, its parent answered
    healthy: bool
    reason: str  # why unhealthy, from the link verdict; "" when healthy

    @property
    def numa(self) -> int | None:
        return int(self.numa_affinity) if self.numa_affinity else None


@dataclass(frozen=True, slots=True)
class Token:
    id: str
    endpoint: RdmaEndpoint
    order: int  # position in the family's listing; "lowest ids" means lowest order


@dataclass(frozen=True, slots=True)
class FamilyView:
    """Everything one family advertises from one record."""

    family: Family
    endpoints: tuple[RdmaEndpoint, ...]
    tokens: tuple[Token, ...]
    by_id: dict[str, Token] = field(compare=False)


def numa_of(ep: Endpoint, parent: Endpoint | None = None) -> int | None:
    """The endpoint's own NUMA node; a VF falls back to its parent's; None when neither is known."""
    for candidate in (ep, parent):
        if candidate is None:
            continue
        text = candidate.numa_affinity.strip()
        # Blank (and a stray "-1") is the kernel declining to answer: a stand-in 0 would decide admission.
        if text.isdigit():
            return int(text)
    return None


def is_healthy(ep: Endpoint) -> bool:
    """ok, unverified and no verdict at all are Healthy; only a failed link is not."""
    return ep.link is None or ep.link.state != LinkState.FAILED


def partitioned(iface: Interface) -> bool:
    """A PF with VFs configured serves only the partitioned family. Both facts are read."""
    return iface.sriov and iface.sriov_num_vfs > 0


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p)


def _stem(pci_bus_id: str, rdma_device: str) -> str:
    stem = pci_bus_id or f"rdma-{rdma_device}"
    # Room for "-<shared index>"; an RDMA device name may be up to 64 characters, so long names are
    # shortened with a digest of the whole name to stay unique and stable.
    budget = MAX_ID_LENGTH - 7
    if len(stem) > budget:
        digest = hashlib.sha256(stem.encode()).hexdigest()[:10]
        stem = f"{stem[: budget - 11]}-{digest}"
    return stem


def _endpoints(members: Iterable[tuple[Endpoint, Endpoint | None]]) -> list[RdmaEndpoint]:
    """Group by RDMA device (two netdevs can share one, e.g. a bond over a LAG), one endpoint each."""
    groups: dict[str, list[tuple[Endpoint, Endpoint | None]]] = {}
    for ep, parent in members:
        # Without a device name there is nothing an allocation could hand over.
        if ep.rdma_device and ep.pci_vendor != AMAZON_VENDOR:
            groups.setdefault(ep.rdma_device, []).append((ep, parent))
    out: list[RdmaEndpoint] = []
    for device, eps in groups.items():
        pci = min((e.pci_bus_id for e, _ in eps if e.pci_bus_id), default="")
        first = next((e for e, _ in eps if e.pci_bus_id == pci), eps[0][0])
        healthy = any(is_healthy(e) for e, _ in eps)
        reasons = sorted({e.link.reason for e, _ in eps if e.link is not None and e.link.reason})
        numa = next((n for e, p in eps if (n := numa_of(e, p)) is not None), None)
        out.append(
            RdmaEndpoint(
                key=_stem(pci, device),
                rdma_device=device,
                netdevs=tuple(sorted(e.name for e, _ in eps if e.name)),
                pci_bus_id=pci,
                pci_switches=tuple(first.pci_switches),
                pci_host_bridge=first.pci_host_bridge,
                numa_affinity="" if numa is None else str(numa),
                healthy=healthy,
                reason="" if healthy else "; ".join(reasons) or "link failed",
            )
        )
    # Two devices on one PCI function would collide on the bus id: name both by device as well.
    counts = Counter(r.key for r in out)
    out = [
        r if counts[r.key] == 1 else replace(r, key=_stem("", f"{r.pci_bus_id}-{r.rdma_device}")) for r in out
    ]
    # PCI order for functions (hex, so not a natural sort), then the rest by device name.
    return sorted(
        out, key=lambda e: (0, bus_key(e.pci_bus_id), ()) if e.pci_bus_id else (1, (), natural_key(e.key))
    )


def whole_function_endpoints(spec: DevicesSpec | None) -> list[RdmaEndpoint]:
    """Endpoints served whole (exclusive and shared): every interface not partitioned into VFs."""
    if spec is None:
        return []
    return _endpoints((iface, None) for iface in spec.interfaces if not partitioned(iface))


def partition_endpoints(spec: DevicesSpec | None) -> list[RdmaEndpoint]:
    """Endpoints served as partitions: the VFs of every PF with VFs configured."""
    if spec is None:
        return []
    return _endpoints(
        (vf, iface) for iface in spec.interfaces if partitioned(iface) for vf in iface.virtual_functions
    )


def shared_token_id(endpoint: RdmaEndpoint, index: int) -> str:
    return f"{endpoint.key}-{index}"


def view(spec: DevicesSpec | None, family: Family, shared_count: int = DEFAULT_SHARED_COUNT) -> FamilyView:
    """The tokens one family advertises from one record, in listing order (lowest ids first)."""
    pick = partition_endpoints if family is Family.PARTITIONED else whole_function_endpoints
    endpoints = pick(spec)
    tokens: list[Token] = []
    for ep in endpoints:
        base = len(tokens)
        if family is Family.SHARED:
            tokens.extend(Token(shared_token_id(ep, i), ep, base + i) for i in range(shared_count))
        else:
            tokens.append(Token(ep.key, ep, base))
    return FamilyView(family, tuple(endpoints), tuple(tokens), {t.id: t for t in tokens})
