"""One pass over the host: the PCI walk, the interface inventory with RDMA verdicts, and accelerators.

A part that could not be read is None/False-conditioned, never empty: the agent keeps the stored value
for it and `inventory`/`preflight` say what failed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nodefabric_devicemanager import interfaces as interfacesmod
from nodefabric_devicemanager import pci as pcimod
from nodefabric_devicemanager import summary
from nodefabric_devicemanager.accelerators import Libraries, detect, failed_reading
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot
from nodefabric_devicemanager.models import (
    ACCELERATORS_ENUMERATED,
    INTERFACES_ENUMERATED,
    AcceleratorGroup,
    Condition,
    DevicesSpec,
    DevicesStatus,
    Interface,
)
from nodefabric_devicemanager.pci import PciFunction

log = logging.getLogger(__name__)

# AcceleratorsEnumerated reason when the root has no /sys/bus/pci at all.
PCI_BUS_ABSENT = "PciBusAbsent"


class ReadingLike(Protocol):
    """What one pass yields: a `Reading`, or the agent's observation (the last walk, links refreshed)."""

    @property
    def interfaces(self) -> list[Interface] | None: ...  # None: enumeration FAILED, not an empty host

    @property
    def groups(self) -> list[AcceleratorGroup]: ...

    @property
    def failed_manufacturers(self) -> set[str]: ...  # group ids ("nvidia"): their recorded groups are kept

    @property
    def conditions(self) -> list[Condition]: ...


def keep_recorded(
    reading: ReadingLike, recorded: DevicesSpec | None, *, interfaces: Sequence[Interface] | None = None
) -> DevicesSpec:
    """The record a reading yields. A failed read keeps what is recorded: the interface list when
    enumeration failed, a failed manufacturer's groups, and every recorded group when the accelerators
    were not enumerated at all (no /sys/bus/pci, a failed walk); a pass that enumerated and found nothing
    yields []. Groups are sorted by manufacturer and id, interfaces by name.

    `interfaces` stands in for the reading's own when they were read (the agent's, each failed link's
    first-seen time carried from the record). Used by the agent and by the DRA driver's standalone reader.
    """
    # No record: nothing was ever read (`DevicesSpec()` has neither list set).
    recorded = recorded or DevicesSpec()
    if reading.interfaces is None:
        fresh = list(recorded.interfaces)
    else:
        fresh = list(reading.interfaces if interfaces is None else interfaces)
    # Manufacturers are named by group id (their key, "nvidia"), as the accelerator reading names them.
    unread = any(c.type == ACCELERATORS_ENUMERATED and c.status == "False" for c in reading.conditions)
    failed = reading.failed_manufacturers
    kept = {g.id: g for g in recorded.groups if unread or g.id in failed}
    # A failed manufacturer the host still lists keeps its recorded group; with none recorded yet, the
    # group as read (accelerators without what could not be read) is better than no group at all.
    groups = [kept.pop(g.id, g) for g in reading.groups]
    groups += kept.values()
    # A list no pass has read yet (not read now, not in the record) stays out of the spec, so it is not
    # written as an empty list: the one built here leaves it unset and `wire()` drops it.
    parts: dict[str, Any] = {}
    if reading.interfaces is not None or recorded.has("interfaces"):
        parts["interfaces"] = sorted(fresh, key=lambda i: i.name)
    if not unread or recorded.has("groups") or groups:
        parts["groups"] = sorted(groups, key=lambda g: (g.manufacturer, g.id))
    return DevicesSpec(**parts)


@dataclass
class Reading:
    interfaces: list[Interface] | None  # None = enumeration failed (NOT empty)
    groups: list[AcceleratorGroup] = field(default_factory=list)
    # Manufacturer keys (group ids) whose accelerators or fabric could not be read: their stored groups
    # are kept. Every manufacturer when the PCI walk itself failed.
    failed_manufacturers: set[str] = field(default_factory=set)
    conditions: list[Condition] = field(default_factory=list)
    pci: dict[str, PciFunction] = field(default_factory=dict)  # the one walk, reused by accelerators

    @property
    def ok(self) -> bool:
        return all(c.status == "True" for c in self.conditions)

    def spec(self) -> DevicesSpec:
        """The spec this pass would publish; a failed part is empty HERE, so publishers must merge."""
        return DevicesSpec(interfaces=self.interfaces or [], groups=self.groups)

    def status(self) -> DevicesStatus:
        """The conditions, and the summaries `kubectl get devices` shows, as the operator computes them."""
        spec = self.spec()
        endpoints = summary.usable_endpoints(spec)
        best = summary.best_distance(spec, endpoints)
        return DevicesStatus(
            conditions=sorted(self.conditions, key=lambda c: c.type),
            rdma_endpoints=len(endpoints),
            best_distance=best.name if best is not None else "",
            fabric_domain=summary.node_fabric_domain(spec) or "",
        )


def _condition(ok: bool, reason: str, message: str) -> Condition:
    return Condition(
        type=INTERFACES_ENUMERATED, status="True" if ok else "False", reason=reason, message=message
    )


def _read_interfaces(host: HostRoot, reading: Reading) -> Reading:
    try:
        reading.interfaces = interfacesmod.read(host, reading.pci)
        reading.conditions.append(
            _condition(True, "Enumerated", f"{len(reading.interfaces)} interfaces read from /sys/class/net")
        )
    except (HostReadError, FileNotFoundError) as exc:
        log.error("could not enumerate network interfaces", extra={"root": host.root, "error": str(exc)})
        reading.conditions.append(_condition(False, "EnumerationFailed", str(exc)))
    return reading


def read(host: HostRoot, *, libraries: Libraries | None = None, driver_root: str | None = None) -> Reading:
    """One full pass. Never raises for host trouble: failures become False conditions and None parts.

    `libraries` are the vendor-library boundaries the accelerator part asks (tests pass recorded ones);
    without them, NVML is loaded from `driver_root` (else $NVIDIA_DRIVER_ROOT) when one is configured.
    A root without a PCI bus directory still has its interfaces read (a platform NIC needs no bus), but
    its accelerators were not: every manufacturer is failed, so the agent keeps the recorded groups.
    """
    try:
        pci = pcimod.walk(host)
    except pcimod.PciBusAbsent as exc:
        reading = _read_interfaces(host, Reading(interfaces=None))
        acc = failed_reading(str(exc), reason=PCI_BUS_ABSENT)
        reading.failed_manufacturers = set(acc.failed)
        reading.conditions.extend(acc.conditions)
        return reading
    except (HostReadError, FileNotFoundError) as exc:
        log.error("could not walk the pci bus", extra={"root": host.root, "error": str(exc)})
        message = f"pci walk failed: {exc}"
        acc = failed_reading(message)
        return Reading(
            interfaces=None,
            failed_manufacturers=set(acc.failed),
            conditions=[_condition(False, "PciWalkFailed", message), *acc.conditions],
        )

    reading = _read_interfaces(host, Reading(interfaces=None, pci=pci))
    # The single call site for accelerator detection; the accelerators part owns the function.
    acc = detect(host, pci, libraries or Libraries(nvidia=Nvml(driver_root=driver_root)))
    reading.groups = list(acc.groups)
    reading.failed_manufacturers = set(acc.failed)
    reading.conditions.extend(acc.conditions)
    return reading
