"""The resource manager: which RDMA endpoints each resource key serves, their token ids, health and hints.

Pure functions of a `DevicesSpec`; nothing here reads the host or remembers an allocation, so every
ListAndWatch message and every Allocate is rebuilt from the latest record (see the seed's "The RDMA
resource keys").

A record is read back defensively: one endpoint with a bad value (a NUMA node of `²`, a 23-digit number,
a garbage bus id, a device name NCCL could not parse) is served without the bad fact or as Unhealthy,
and never stops the rest of its family from being served.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import chain

from nodefabric_devicemanager import names, vocabulary
from nodefabric_devicemanager.models import DevicesSpec, Endpoint, LinkState
from nodefabric_devicemanager.numbers import numa_node
from nodefabric_devicemanager.pci import bus_key, is_bus_id
from nodefabric_devicemanager.summary import partitioned, servable, usable
from nodefabric_devicemanager.summary import top_level_vf as _top_level_vf
from nodefabric_deviceplugin.limits import MAX_ID_LENGTH, Shape, check_shared_count, fitting_shared_count
from nodefabric_deviceplugin.selection import EndpointFacts, HostFacts, Selection

DEFAULT_DOMAIN = vocabulary.DOMAIN
DEFAULT_SHARED_COUNT = 64
# Room for "-<shared index>" (up to 6 digits) after a stem.
STEM_BUDGET = MAX_ID_LENGTH - 7
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class Family(StrEnum):
    """The three resource families; the value is the resource name after `device.<domain>/`."""

    EXCLUSIVE = vocabulary.RESOURCE_RDMA
    SHARED = vocabulary.RESOURCE_RDMA_SHARED
    PARTITIONED = vocabulary.RESOURCE_RDMA_PARTITIONED


@dataclass(frozen=True, slots=True)
class PluginConfig:
    domain: str = DEFAULT_DOMAIN
    shared_count: int = DEFAULT_SHARED_COUNT
    shared: bool = True
    partitioned: bool = True
    # Which endpoints each family serves (`--rdma-selectors`); the default serves every whole function
    # in both exclusive and shared, every VF in partitioned.
    selection: Selection = field(default_factory=Selection)

    def __post_init__(self) -> None:
        if self.shared:
            check_shared_count(self.shared_count)
        # The resource name's prefix, device.<domain>, must be a DNS subdomain (253 characters at most).
        if not names.dns_subdomain(vocabulary.resource_prefix(self.domain)):
            raise ValueError(
                f"the domain must be a DNS subdomain such as {vocabulary.DOMAIN}, got {self.domain!r}"
            )

    def families(self) -> list[Family]:
        """Exclusive is always served; --no-shared and --no-partitioned drop the other two."""
        out = [Family.EXCLUSIVE]
        if self.shared:
            out.append(Family.SHARED)
        if self.partitioned:
            out.append(Family.PARTITIONED)
        return out

    def resource_name(self, family: Family) -> str:
        return vocabulary.resource_name(family.value, self.domain)


@dataclass(frozen=True, slots=True)
class RdmaEndpoint:
    """One allocatable RDMA endpoint: one bound RDMA device, the unit a verbs device is handed out for.

    Carries the bus coordinates `nodefabric_devicemanager.distance` reads, so two endpoints compare
    the same way a NIC and an accelerator do.
    """

    key: str  # the stable id stem: PCI bus id, else "rdma-<device>" (see token_stem)
    rdma_device: str
    netdevs: tuple[str, ...]  # empty for a VF with no netdev of its own
    pci_bus_id: str  # "" unless the record holds a well-formed PCI bus id
    pci_switches: tuple[str, ...]
    pci_host_bridge: str
    numa: int | None  # None when neither the endpoint nor, for a VF, its parent gave a valid node
    healthy: bool
    reason: str  # why unhealthy; "" when healthy
    # What an operator's selectors match (selection.py): the PCI ids, and the PF's netdev (a whole
    # function's own).
    pci_vendor: str = ""
    pci_device: str = ""
    pf_name: str = ""

    def facts(self, host: HostFacts | None = None) -> EndpointFacts:
        return EndpointFacts(
            vendor=self.pci_vendor,
            device=self.pci_device,
            if_names=self.netdevs,
            pf_name=self.pf_name,
            rdma_device=self.rdma_device,
            driver=host.drivers.get(self.rdma_device, "") if host is not None else "",
            link_layer=host.link_layers.get(self.rdma_device, "") if host is not None else "",
        )

    @property
    def numa_affinity(self) -> str:
        """The NUMA node as the record spells it, for `distance` (which compares the text)."""
        return "" if self.numa is None else str(self.numa)


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
    # rdma.shared: the tokens per endpoint actually served, below the configured count when the list
    # would not fit kubelet's message limit (limits.py); the configured count otherwise.
    shared_count: int = 0


# What the kernel allows in an RDMA device name and NCCL_IB_HCA can carry: no ",", ":", "=", "^" or
# whitespace, which NCCL reads as syntax, and at most IB_DEVICE_NAME_MAX - 1 characters.
_RDMA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", re.ASCII)
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]", re.ASCII)


def valid_rdma_device(name: str) -> bool:
    return _RDMA_NAME.fullmatch(name) is not None


def numa_of(ep: Endpoint, parent: Endpoint | None = None) -> int | None:
    """The endpoint's own NUMA node; a VF falls back to its parent's; None when neither is known.

    The operator's parser (`numbers.numa_node`): blank, "-1", "²", "01" or a 23-digit value are all
    unknown, so the hint and the `rdma.numa` label can never disagree.
    """
    for candidate in (ep, parent):
        if candidate is not None and (node := numa_node(candidate.numa_affinity)) is not None:
            return node
    return None


def is_healthy(ep: Endpoint) -> bool:
    """The operator's definition of usable (`summary.usable`): only a failed link, or a record that
    says no RDMA without a verdict, is not."""
    return usable(ep)


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"([0-9]+)", text) if p)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


def token_stem(pci_bus_id: str, rdma_device: str) -> str:
    """The id stem of an endpoint: its PCI bus id, else "rdma-<device name>".

    A platform endpoint (an SoC's NIC, `hns_0`) or a software one (`rxe0`) has no bus id; its RDMA device
    name is what the kernel and `rdma link` call it, stable across restarts. Characters outside
    [A-Za-z0-9_.:-] become "-" and a name too long for a 63-character id is shortened; either way a digest
    of the whole name is appended, so two names never map to one id.
    """
    if pci_bus_id:
        return pci_bus_id
    stem = f"rdma-{rdma_device}"
    safe = _ID_UNSAFE.sub("-", stem)
    if safe != stem or len(safe) > STEM_BUDGET:
        safe = f"{safe[: STEM_BUDGET - 11]}-{_digest(stem)}"
    return safe


def _bus_id(text: str) -> bool:
    # isprintable: a trailing newline would otherwise pass the pattern's "$" and reach kubelet in an id.
    return is_bus_id(text) and text.isprintable()


def _unhealthy_reason(eps: list[tuple[Endpoint, Endpoint | None]], device: str) -> str:
    if not valid_rdma_device(device):
        # A name NCCL_IB_HCA cannot carry, or no kernel would give, cannot be handed out correctly.
        return f"RDMA device name {device[:70]!r} is not a kernel device name"
    reasons = sorted({e.link.reason for e, _ in eps if e.link is not None and e.link.reason})
    if any(e.link is not None and e.link.state == LinkState.FAILED for e, _ in eps):
        return "; ".join(reasons) or "link failed"
    return "the record says the endpoint has no RDMA"


def _endpoints(members: Iterable[tuple[Endpoint, Endpoint | None]]) -> list[RdmaEndpoint]:
    """Group by RDMA device (two netdevs can share one, e.g. a bond over a LAG), one endpoint each."""
    groups: dict[str, list[tuple[Endpoint, Endpoint | None]]] = {}
    for ep, parent in members:
        if servable(ep):
            groups.setdefault(ep.rdma_device, []).append((ep, parent))
    out: list[RdmaEndpoint] = []
    for device, eps in groups.items():
        # A bus id that is not one (hand-edited, garbage) is a bad fact: left out, never made an id of.
        pci = min((e.pci_bus_id for e, _ in eps if _bus_id(e.pci_bus_id)), default="")
        first = next((e for e, _ in eps if e.pci_bus_id == pci), eps[0][0])
        healthy = valid_rdma_device(device) and any(is_healthy(e) for e, _ in eps)
        numa = next((n for e, p in eps if (n := numa_of(e, p)) is not None), None)
        out.append(
            RdmaEndpoint(
                key=token_stem(pci, device),
                rdma_device=device,
                netdevs=tuple(sorted(e.name for e, _ in eps if e.name)),
                pci_bus_id=pci,
                pci_switches=tuple(first.pci_switches) if pci else (),
                pci_host_bridge=first.pci_host_bridge if pci else "",
                numa=numa,
                healthy=healthy,
                reason="" if healthy else _unhealthy_reason(eps, device),
                pci_vendor=first.pci_vendor,
                pci_device=first.pci_device,
                # A VF's PF netdev (none when the record does not hold its PF); a whole function's own.
                pf_name=next((p.name for e, p in eps if p is not None and p.name), "")
                or ("" if first.physical_function else first.name),
            )
        )
    # Two devices on one PCI function would collide on the bus id: name both by device as well.
    counts = Counter(r.key for r in out)
    out = [
        r if counts[r.key] == 1 else replace(r, key=token_stem("", f"{r.pci_bus_id}-{r.rdma_device}"))
        for r in out
    ]
    # PCI order for functions (hex, so not a natural sort), then the rest by device name.
    return sorted(
        out, key=lambda e: (0, bus_key(e.pci_bus_id), ()) if e.pci_bus_id else (1, (), natural_key(e.key))
    )


def whole_function_endpoints(spec: DevicesSpec | None) -> list[RdmaEndpoint]:
    """Endpoints served whole (exclusive and shared): every interface that is neither partitioned into
    VFs nor itself a VF. A VF is never handed out as a whole function, wherever the record lists it."""
    if spec is None:
        return []
    return _endpoints(
        (iface, None) for iface in spec.interfaces if not partitioned(iface) and not _top_level_vf(iface)
    )


def partition_endpoints(spec: DevicesSpec | None) -> list[RdmaEndpoint]:
    """Endpoints served as partitions: the VFs of every PF with VFs configured, and every VF listed at
    top level (its NUMA falls back to its PF's when the record holds the PF)."""
    if spec is None:
        return []
    by_bus = {iface.pci_bus_id: iface for iface in spec.interfaces if iface.pci_bus_id}
    nested = (
        (vf, iface) for iface in spec.interfaces if partitioned(iface) for vf in iface.virtual_functions
    )
    top = ((iface, by_bus.get(iface.physical_function)) for iface in spec.interfaces if _top_level_vf(iface))
    return _endpoints(chain(nested, top))


def shared_token_id(endpoint: RdmaEndpoint, index: int) -> str:
    return f"{endpoint.key}-{index}"


def served_shared_count(endpoints: Iterable[RdmaEndpoint], wanted: int) -> int:
    """The configured shared count, or less when that many tokens would not fit kubelet's message limit."""
    shapes = [Shape(len(e.key), e.numa, len(HEALTHY if e.healthy else UNHEALTHY)) for e in endpoints]
    return fitting_shared_count(shapes, wanted)


_SELECTION_NAMES = {
    Family.EXCLUSIVE: "exclusive",
    Family.SHARED: "shared",
    Family.PARTITIONED: "partitioned",
}


def view(
    spec: DevicesSpec | None,
    family: Family,
    shared_count: int = DEFAULT_SHARED_COUNT,
    selection: Selection | None = None,
    host: HostFacts | None = None,
) -> FamilyView:
    """The tokens one family advertises from one record, in listing order (lowest ids first): the
    endpoints `selection` gives the family (all of its kind by default), `host` the facts it may name."""
    pick = partition_endpoints if family is Family.PARTITIONED else whole_function_endpoints
    endpoints = pick(spec)
    counts: dict[str, int] = {}
    if selection is not None and not selection.default:
        name = _SELECTION_NAMES[family]
        endpoints = [e for e in endpoints if selection.serves(name, e.facts(host))]
        if family is Family.SHARED:
            counts = {e.key: selection.shared_count(e.facts(host), shared_count) for e in endpoints}
    count = 1
    if family is Family.SHARED:
        # Fitted to kubelet's message limit at the largest count asked; no endpoint gets more than that.
        wanted = max([shared_count, *counts.values()])
        count = served_shared_count(endpoints, wanted)
    tokens: list[Token] = []
    for ep in endpoints:
        base = len(tokens)
        if family is Family.SHARED:
            own = min(counts.get(ep.key, shared_count), count)
            tokens.extend(Token(shared_token_id(ep, i), ep, base + i) for i in range(own))
        else:
            tokens.append(Token(ep.key, ep, base))
    return FamilyView(family, tuple(endpoints), tuple(tokens), {t.id: t for t in tokens}, count)
