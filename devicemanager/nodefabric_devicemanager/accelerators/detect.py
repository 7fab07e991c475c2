"""One pass over the accelerators of a node: found on the PCI bus, fabric and links from each vendor.

Accelerators are listed from the PCI walk whatever the vendor libraries say, so a node whose library is
missing still reports its accelerators with their coordinates; only the fabric is then unknown, and a
`<Manufacturer>FabricRead` condition with status False says why.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from nodefabric_devicemanager import numbers
from nodefabric_devicemanager.accelerators import vendors
from nodefabric_devicemanager.accelerators.library import LibraryError, LibraryUnavailable, normalize_bus_id
from nodefabric_devicemanager.accelerators.links import build as build_links
from nodefabric_devicemanager.accelerators.nvidia import NvidiaLibrary, Nvml, nvlink_width
from nodefabric_devicemanager.accelerators.vendors import Manufacturer
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot
from nodefabric_devicemanager.models import (
    ACCELERATORS_ENUMERATED,
    Accelerator,
    AcceleratorGroup,
    AcceleratorTopology,
    Condition,
    Fabric,
)
from nodefabric_devicemanager.pci import PciFunction, bus_key

if TYPE_CHECKING:
    from nodefabric_devicemanager.accelerators.ascend import AscendAnswer, AscendLibrary, Dcmi

# The modules one manufacturer needs (amd, ascend with its ctypes structures, fabric) are imported where
# that manufacturer is read, not at the top: `nodefabric inventory` on a node without them (a NIC-only
# node, every uevent) would pay for each at start-up.

log = logging.getLogger(__name__)

# Condition reasons. LibraryUnavailable is a status False like ReadFailed, so the operator treats it as
# "could not read" and keeps the node's fabric labels: a library that is missing for a moment (driver
# upgrade, a container started without the driver mounted) cannot establish that the node left its domain.
READ = "Read"
ENUMERATED = "Enumerated"
LIBRARY_UNAVAILABLE = "LibraryUnavailable"
READ_FAILED = "ReadFailed"


class _Dcmi:
    """ascend.Dcmi, made when first asked: a node without Ascend NPUs never imports ascend.py."""

    def __init__(self) -> None:
        self._dcmi: Dcmi | None = None

    def read(self) -> list[AscendAnswer]:
        if self._dcmi is None:
            from nodefabric_devicemanager.accelerators.ascend import Dcmi

            self._dcmi = Dcmi()
        return self._dcmi.read()


@dataclass
class Libraries:
    """The vendor-library boundaries a pass asks. Each is only asked when its manufacturer is present."""

    nvidia: NvidiaLibrary = field(default_factory=Nvml)
    ascend: AscendLibrary = field(default_factory=_Dcmi)


@dataclass
class AcceleratorReading:
    groups: list[AcceleratorGroup] = field(default_factory=list)
    # Manufacturer keys whose fabric could not be read (library missing or failing): their fabric
    # fields are unknown, not absent, and fabric labels must not be removed on this reading.
    failed: list[str] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)


def failed_reading(message: str, *, reason: str = READ_FAILED) -> AcceleratorReading:
    """The reading of a pass whose PCI walk failed (or found no bus to walk): nothing listed, and a
    condition saying so.

    Every manufacturer is failed, not none: nothing was read for any of them, so each one's recorded
    groups must be kept rather than replaced by the empty list this reading holds.
    """
    return AcceleratorReading(
        failed=[m.key for m in vendors.MANUFACTURERS],
        conditions=[Condition(type=ACCELERATORS_ENUMERATED, status="False", reason=reason, message=message)],
    )


@dataclass
class _Group:
    maker: Manufacturer
    functions: list[PciFunction]
    fabrics: list[Fabric | None]
    links: list[dict[str, str]]
    condition: Condition | None = None


def accelerator_functions(pci: Mapping[str, PciFunction]) -> dict[Manufacturer, list[PciFunction]]:
    """Accelerator functions per manufacturer, in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    found: dict[Manufacturer, list[PciFunction]] = {}
    for fn in sorted(pci.values(), key=lambda f: bus_key(f.bus_id)):
        # An SR-IOV virtual function of a GPU is a slice handed to VMs, not another accelerator here.
        if fn.is_vf:
            continue
        maker = vendors.manufacturer_of(fn.vendor, fn.class_code)
        if maker is not None:
            found.setdefault(maker, []).append(fn)
    return found


def detect(
    host: HostRoot, pci: Mapping[str, PciFunction], libraries: Libraries | None = None
) -> AcceleratorReading:
    """Every accelerator on the walked bus, grouped per manufacturer, with links and fabric."""
    libs = libraries or Libraries()
    found = accelerator_functions(pci)
    reading = AcceleratorReading()
    for maker in sorted(found, key=lambda m: m.key):
        functions = found[maker]
        if maker is vendors.NVIDIA:
            group = _nvidia(maker, functions, libs.nvidia)
        elif maker is vendors.AMD:
            group = _amd(maker, functions, host)
        elif maker is vendors.ASCEND:
            group = _ascend(maker, functions, libs.ascend)
        else:
            group = _Group(maker, functions, [None] * len(functions), build_links(functions))
        reading.groups.append(_record(group))
        _report(maker, group.condition)
        if group.condition is not None:
            reading.conditions.append(group.condition)
            if group.condition.status == "False":
                reading.failed.append(maker.key)
    total = sum(len(g.accelerators) for g in reading.groups)
    reading.conditions.insert(
        0,
        Condition(
            type=ACCELERATORS_ENUMERATED,
            status="True",
            reason=ENUMERATED,
            message=f"{total} accelerator(s) of {len(reading.groups)} manufacturer(s) on the pci bus",
        ),
    )
    return reading


def _record(group: _Group) -> AcceleratorGroup:
    return AcceleratorGroup(
        id=group.maker.key,
        manufacturer=group.maker.name,
        name=f"{group.maker.name} {group.maker.group_name}",
        accelerators=[
            Accelerator(
                id=fn.bus_id,
                index=i,
                topology=AcceleratorTopology(
                    pci_bus_id=fn.bus_id,
                    pci_root_id=fn.root_id,
                    pci_switches=list(fn.switches),
                    pci_host_bridge=fn.host_bridge,
                    numa_affinity=fn.numa,
                    cpu_affinity=fn.cpus,
                    links=group.links[i],
                    fabric=group.fabrics[i],
                ),
            )
            for i, fn in enumerate(group.functions)
        ],
    )


def _condition(maker: Manufacturer, ok: bool, reason: str, message: str) -> Condition:
    return Condition(
        type=maker.fabric_condition, status="True" if ok else "False", reason=reason, message=message
    )


# Manufacturer -> the fabric problem last logged at Warning. A problem that lasts is one Warning line, not
# one per pass: the condition carries it the whole time, and a missing library is not news every minute.
_reported: dict[str, str] = {}


def forget_reported() -> None:
    """Forget which problems were logged, so the next pass logs each as new (a fresh process would)."""
    _reported.clear()


def _report(maker: Manufacturer, condition: Condition | None) -> None:
    if condition is None or condition.status == "True":
        if _reported.pop(maker.key, None) is not None:
            log.info("the accelerator fabric is readable again", extra={"manufacturer": maker.key})
        return
    problem = f"{condition.reason}: {condition.message}"
    if _reported.get(maker.key) == problem:
        log.debug("the accelerator fabric is still unreadable", extra={"manufacturer": maker.key})
        return
    _reported[maker.key] = problem
    log.warning(
        "could not read the accelerator fabric; accelerators are listed without it",
        extra={"manufacturer": maker.key, "reason": condition.reason, "error": condition.message},
    )


def _unreadable(maker: Manufacturer, functions: list[PciFunction], reason: str, message: str) -> _Group:
    return _Group(
        maker,
        functions,
        [None] * len(functions),
        build_links(functions),
        _condition(maker, False, reason, message),
    )


def _key(bus_id: str) -> tuple[int, int, int, int]:
    return bus_key(normalize_bus_id(bus_id))


# --- NVIDIA --------------------------------------------------------------------------------------------


class _Answer(Protocol):
    @property
    def bus_id(self) -> str: ...

    @property
    def errors(self) -> list[str]: ...


_A = TypeVar("_A", bound=_Answer)


@dataclass
class _Matched(Generic[_A]):
    """A vendor library's answers matched to the accelerators on the bus, and what is missing or wrong."""

    by_bus: dict[tuple[int, int, int, int], _A]
    mine: list[_A | None]
    problems: list[str]


def _match(functions: list[PciFunction], answers: Sequence[_A], tool: str) -> _Matched[_A]:
    by_bus = {_key(a.bus_id): a for a in answers}
    mine = [by_bus.get(bus_key(fn.bus_id)) for fn in functions]
    problems = [
        f"{fn.bus_id}: no answer from {tool}" for fn, a in zip(functions, mine, strict=True) if a is None
    ]
    problems += [f"{a.bus_id}: {e}" for a in mine if a is not None for e in a.errors]
    return _Matched(by_bus, mine, problems)


def _ask(
    maker: Manufacturer, functions: list[PciFunction], read: Callable[[], Sequence[_A]]
) -> Sequence[_A] | _Group:
    """The library's answers, or the group listed without fabric when the library cannot be asked."""
    try:
        return read()
    except LibraryUnavailable as exc:
        return _unreadable(maker, functions, LIBRARY_UNAVAILABLE, str(exc))
    except LibraryError as exc:
        return _unreadable(maker, functions, READ_FAILED, str(exc))


def _nvidia(maker: Manufacturer, functions: list[PciFunction], library: NvidiaLibrary) -> _Group:
    from nodefabric_devicemanager.accelerators import fabric

    answers = _ask(maker, functions, library.read)
    if isinstance(answers, _Group):
        return answers
    matched = _match(functions, answers, "nvml")
    by_bus, mine, problems = matched.by_bus, matched.mine, matched.problems

    def fabric_link(a: PciFunction, b: PciFunction) -> str | None:
        width = nvlink_width(by_bus.get(bus_key(a.bus_id)), by_bus.get(bus_key(b.bus_id)))
        return f"NV{width}" if width > 0 else None

    fabrics = [fabric.nvlink_fabric(a.fabric) if a is not None else None for a in mine]
    return _Group(
        maker, functions, fabrics, build_links(functions, fabric_link), _verdict(maker, functions, problems)
    )


def _verdict(maker: Manufacturer, functions: list[PciFunction], problems: list[str]) -> Condition:
    if problems:
        return _condition(maker, False, READ_FAILED, "; ".join(problems)[:1024])
    return _condition(maker, True, READ, f"fabric read for {len(functions)} accelerator(s)")


# --- AMD -----------------------------------------------------------------------------------------------


def _amd(maker: Manufacturer, functions: list[PciFunction], host: HostRoot) -> _Group:
    from nodefabric_devicemanager.accelerators import amd, fabric

    try:
        kfd = amd.read_kfd(host)
        pci_hives = {fn.bus_id: amd.xgmi_hive_from_pci(fn.dir) for fn in functions}
    except (HostReadError, FileNotFoundError, numbers.BadNumber) as exc:
        # A KFD node without its properties (or one that vanished mid-read, or a number that is not one)
        # is a failed read of the fabric, never an exception out of the pass that would also cost the
        # interface inventory.
        return _unreadable(maker, functions, READ_FAILED, str(exc))
    if kfd is None and all(h is None for h in pci_hives.values()):
        return _unreadable(
            maker, functions, LIBRARY_UNAVAILABLE, "no KFD topology and no xgmi_hive_info: is amdgpu loaded?"
        )
    by_bus = {bus_key(g.bus_id): g for g in kfd or []}
    hives: list[int | None] = []
    for fn in functions:
        node = by_bus.get(bus_key(fn.bus_id))
        hives.append(node.hive_id if node is not None else pci_hives[fn.bus_id])
    # Members are GPUs sharing the hive: KFD's GPU nodes when it answered (one per device, as a
    # compute-partitioned GPU shows several nodes at one address), else the GPUs listed here.
    members: Counter[int] = (
        Counter(g.hive_id for g in by_bus.values()) if kfd is not None else Counter(h for h in hives if h)
    )
    fabrics = [fabric.xgmi_fabric(h, members[h] if h else 0) for h in hives]

    def fabric_link(a: PciFunction, b: PciFunction) -> str | None:
        na, nb = by_bus.get(bus_key(a.bus_id)), by_bus.get(bus_key(b.bus_id))
        if na is None or nb is None:
            return None
        return "LINK" if na.xgmi_peers.get(nb.node) or nb.xgmi_peers.get(na.node) else None

    return _Group(
        maker,
        functions,
        fabrics,
        build_links(functions, fabric_link),
        _condition(maker, True, READ, f"xgmi hive read for {len(functions)} accelerator(s)"),
    )


# --- Ascend --------------------------------------------------------------------------------------------


def _ascend(maker: Manufacturer, functions: list[PciFunction], library: AscendLibrary) -> _Group:
    from nodefabric_devicemanager.accelerators import fabric

    answers = _ask(maker, functions, library.read)
    if isinstance(answers, _Group):
        return answers
    matched = _match(functions, answers, "dcmi")
    mine, problems = matched.mine, matched.problems
    fabrics: list[Fabric | None] = []
    for a in mine:
        if a is None:
            fabrics.append(None)
            continue
        shape = fabric.ascend_shape(a.mainboard_id, a.spod)
        fabrics.append(fabric.ub_fabric(shape, a.spod, a.endpoints))
    return _Group(maker, functions, fabrics, build_links(functions), _verdict(maker, functions, problems))
