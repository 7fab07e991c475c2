"""The node labels one Devices record yields: a pure function of the whole record.

The whole node is reduced at once (every manufacturer's group, every endpoint and virtual function), so
two detectors writing one record can never delete each other's keys. Every value is published exactly
as computed or withheld with a reason; nothing here repairs a value, because a repaired value ("0,1"
sanitised to "01") reads as a different fact.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from nodefabric_devicemanager import models, numbers, vocabulary
from nodefabric_devicemanager.models import Devices, Endpoint
from nodefabric_devicemanager.summary import best_distance, node_fabric_domain, usable_endpoints

DEFAULT_DOMAIN = vocabulary.DOMAIN

RDMA_CAPABLE = vocabulary.RDMA_CAPABLE
RDMA_DISTANCE = vocabulary.RDMA_DISTANCE
RDMA_NUMA = vocabulary.RDMA_NUMA
FABRIC_DOMAIN = vocabulary.FABRIC_DOMAIN
FABRIC_MEMBERS = vocabulary.FABRIC_MEMBERS

# The families whose keys the operator owns; removal is scoped to them and skipped per family.
RDMA = vocabulary.RDMA
FABRIC = vocabulary.FABRIC
FAMILIES = vocabulary.FAMILIES

# Matched whole (fullmatch): `$` also matches before a trailing newline, so "7\n" would pass a `^...$`
# check here and make the API server refuse every label of the node in the same write.
_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?", re.ASCII)
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*", re.ASCII)
MAX_VALUE = 63


class InvalidDomain(ValueError):
    pass


def check_domain(domain: str) -> str:
    """The label domain, refused unless `feature.<domain>` is a valid label-key prefix (a DNS subdomain),
    and so is `nodefabric.<domain>`, the managed-labels annotation's (three characters longer)."""
    prefix = vocabulary.feature_subdomain(domain)
    if not domain or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
        raise InvalidDomain(f"label domain {domain!r} does not make a valid label prefix {prefix!r}")
    annotation = vocabulary.managed_labels_annotation(domain).split("/")[0]
    if len(annotation) > 253:
        raise InvalidDomain(f"label domain {domain!r} does not make a valid annotation prefix {annotation!r}")
    return domain


def is_dns_label(name: str) -> bool:
    """A DNS-1123 label (what a namespace name must be): 63 characters at most, [a-z0-9-] inside."""
    return len(name) <= 63 and re.fullmatch(_DNS_LABEL, name, re.ASCII) is not None


def prefix(domain: str) -> str:
    return vocabulary.feature_prefix(domain)


def key(domain: str, name: str) -> str:
    return vocabulary.feature_key(name, domain)


def family(label_key: str, domain: str) -> str | None:
    """The owned family ("rdma" or "fabric") of a label key of our domain, or None for any other key."""
    head = prefix(domain)
    if not label_key.startswith(head):
        return None
    name = label_key[len(head) :]
    return next((f for f in FAMILIES if name.startswith(f + ".")), None)


def value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value as written, or None when it is."""
    if len(value) > MAX_VALUE:
        return f"longer than {MAX_VALUE} characters"
    if not _VALUE.fullmatch(value):
        return "must be alphanumeric at both ends with only '-', '_' or '.' inside"
    return None


@dataclass(frozen=True)
class Withheld:
    key: str
    value: str
    reason: str


@dataclass(frozen=True)
class LabelSet:
    """The labels one record yields, what was withheld and why, and the status summaries."""

    labels: dict[str, str] = field(default_factory=dict)
    withheld: list[Withheld] = field(default_factory=list)
    rdma_endpoints: int = 0
    best_distance: str = ""
    fabric_domain: str = ""
    # The RDMA links the record says are down, each "ens1f0 (mlx5_0): <the kernel's port values>": what
    # an RdmaCapabilityLost Event names, so the person reading it knows which cable or port to look at.
    failed_links: tuple[str, ...] = ()


def _numa_members(endpoints: list[Endpoint]) -> tuple[list[str], list[str]]:
    """(valid NUMA node ids sorted numerically, values that are not a node id), read by the parser the
    device plugin's topology hints use, so a value gives a label exactly when it gives a hint. Blank and
    the kernel's "-1" are unknown and skipped: a member nobody read is never published, and normalising
    it to 0 would assert a node the kernel declined to give."""
    good: set[int] = set()
    bad: list[str] = []
    for ep in endpoints:
        text = ep.numa_affinity
        if not text:
            continue
        try:
            node = numbers.parse(text, numbers.NUMA_NODE)
        except numbers.BadNumber:
            bad.append(text)
            continue
        if node is not None:
            good.add(node)
    return [str(n) for n in sorted(good)], bad


def compute(devices: Devices, domain: str = DEFAULT_DOMAIN) -> LabelSet:
    """The label set for one node's whole record (every group, every endpoint)."""
    labels: dict[str, str] = {}
    withheld: list[Withheld] = []

    def offer(name: str, value: str) -> None:
        full = key(domain, name)
        problem = value_problem(value)
        if problem is None:
            labels[full] = value
            return
        withheld.append(Withheld(full, value, f"not a valid label value: {problem}"))

    endpoints = usable_endpoints(devices.spec)
    if endpoints:
        offer(RDMA_CAPABLE, "true")

    accelerators = [a for g in devices.spec.groups for a in g.accelerators]
    closest = best_distance(devices.spec, endpoints)
    best = closest.name if closest is not None else ""
    if best:
        offer(RDMA_DISTANCE, best)

    members, bad = _numa_members(endpoints)
    if bad:
        withheld.append(
            Withheld(key(domain, RDMA_NUMA), ",".join(bad), "an endpoint's NUMA affinity is not a node id")
        )
    elif members:
        offer(RDMA_NUMA, "_".join(members))  # never ",": not a label character, and sanitisers drop it

    fabric_domain = node_fabric_domain(devices.spec) or ""
    if fabric_domain:
        offer(FABRIC_DOMAIN, fabric_domain)
        counts = {a.topology.fabric.member_count if a.topology.fabric else 0 for a in accelerators}
        # The size of a domain we did not publish would describe nothing.
        if key(domain, FABRIC_DOMAIN) in labels and len(counts) == 1 and 0 not in counts:
            offer(FABRIC_MEMBERS, str(counts.pop()))
    if key(domain, FABRIC_DOMAIN) not in labels:
        fabric_domain = ""

    return LabelSet(
        labels=labels,
        withheld=withheld,
        rdma_endpoints=len(endpoints),
        best_distance=best,
        fabric_domain=fabric_domain,
        failed_links=failed_links(devices),
    )


SHOWN_REASON = 80  # characters of a link's reason quoted in an Event


def failed_links(devices: Devices) -> tuple[str, ...]:
    """Every endpoint whose RDMA link verdict is failed, named as a person finds it on the host."""
    out: list[str] = []
    for ep in devices.spec.endpoints():
        if ep.rdma_software or ep.link is None or ep.link.state != models.LinkState.FAILED:
            continue
        name = ep.name or ep.pci_bus_id or "?"
        device = f" ({ep.rdma_device})" if ep.rdma_device else ""
        reason = ep.link.reason.strip().replace("\n", " ")[:SHOWN_REASON]
        out.append(f"{name}{device}" + (f": {reason}" if reason else ""))
    return tuple(out)


def frozen_families(status: models.DevicesStatus) -> frozenset[str]:
    """Families whose removal is skipped: deleting on a failed (or Unknown) read claims what the read cannot
    support."""
    out: set[str] = set()
    if status.unread(models.INTERFACES_ENUMERATED):
        out.add(RDMA)
    if status.fabric_unread():
        out.add(FABRIC)
    return frozenset(out)


@dataclass(frozen=True)
class Change:
    key: str
    old: str | None  # None: added
    new: str | None  # None: removed

    @property
    def kind(self) -> str:
        return "added" if self.old is None else "removed" if self.new is None else "changed"

    def brief(self, domain: str) -> str:
        """One token for a log line, our prefix left out: `+rdma.numa=0`, `-rdma.capable(was true)`."""
        name = self.key.removeprefix(prefix(domain))
        if self.old is None:
            return f"+{name}={self.new}"
        if self.new is None:
            return f"-{name}(was {self.old})"
        return f"~{name}={self.old}->{self.new}"

    def describe(self) -> str:
        if self.old is None:
            return f"added {self.key}={self.new}"
        if self.new is None:
            return f"removed {self.key} (was {self.old})"
        return f"changed {self.key} from {self.old} to {self.new}"


@dataclass(frozen=True)
class Plan:
    """What our keys in a sink become. `managed` is every key of ours after the write (desired plus kept)."""

    managed: dict[str, str]
    changes: list[Change]
    kept: list[str]  # keys a failed enumeration kept from removal


def plan(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    *,
    domain: str,
    frozen: frozenset[str] = frozenset(),
    owned: frozenset[str] | None = None,
) -> Plan:
    """Our keys in a sink after publishing `desired` over `current`.

    A removal candidate is a key of our `rdma.`/`fabric.` families present in `current` and, when `owned`
    is given (the Node sink's record of what we wrote), listed there, so a hand-set label survives.
    Removal is skipped for a frozen family. Any other key is never touched.
    """
    managed = dict(desired)
    changes: list[Change] = []
    kept: list[str] = []
    for k, v in sorted(desired.items()):
        if current.get(k) != v:
            changes.append(Change(k, current.get(k), v))
    for k in sorted(current):
        fam = family(k, domain)
        if k in desired or fam is None or (owned is not None and k not in owned):
            continue
        if fam in frozen:
            managed[k] = current[k]
            kept.append(k)
        else:
            changes.append(Change(k, current[k], None))
    return Plan(managed=dict(sorted(managed.items())), changes=changes, kept=kept)
