"""The one PCI walk: every function's bus coordinates, read the same way for NICs and accelerators.

The coordinates come from where a function's directory sits under `/sys/devices`:

    /sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:08.0/0000:1a:00.0
                 host bridge  root port     switch up     switch down   the device

`switches` is every BDF-named directory between the host bridge and the device, innermost first;
`root_id` is the outermost of them (the root port in the example, NOT the root complex). Interfaces and
accelerator detectors both take their coordinates from here so the values compare equal by construction.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import NamedTuple

from nodefabric_devicemanager import numbers
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot, SysDir

log = logging.getLogger(__name__)

PCI_BUS = "/sys/bus/pci"
PCI_DEVICES = f"{PCI_BUS}/devices"

# fullmatch throughout: `$` would also accept a name with a trailing newline.
_BDF = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", re.ASCII)
_HOST_BRIDGE = re.compile(r"pci[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}", re.ASCII)


class PciBusAbsent(FileNotFoundError):
    """The root has no /sys/bus/pci: the bus was not read (a container without /sys mounted whole, or a
    kernel without PCI). Not an empty bus: nothing can be said about what is on it."""


class PciFunction(NamedTuple):
    """One function as the walk read it. A named tuple, not a frozen dataclass: the walk makes one per
    function (1,040 on 8 PFs x 128 VFs), and a frozen dataclass's __init__ (object.__setattr__ per field)
    cost three times as much."""

    bus_id: str  # "0000:17:00.0"
    root_id: str  # outermost PCI bridge above the device ("" when directly on the host bridge)
    switches: tuple[str, ...]  # full upstream bridge path, innermost first
    host_bridge: str  # "pci0000:00": the host-bridge directory the path hangs from
    vendor: str  # "15b3" (lowercase hex, no 0x); "" when unknown
    device: str  # "1021"
    class_code: str  # "020000" (no 0x)
    numa: str  # "" when the kernel says -1 or nothing, or something that is not a NUMA node
    cpus: str  # local_cpulist, "" when absent or not a cpulist
    dir: SysDir  # the resolved function directory
    physfn: str = ""  # parent PF bus id for a VF

    @property
    def is_vf(self) -> bool:
        return bool(self.physfn)


def is_bus_id(name: str) -> bool:
    return _BDF.fullmatch(name) is not None


# Asked twice per function a pass (the walk's order, then a PF's VFs'); bounded, so a host with many odd
# names cannot grow it.
@functools.lru_cache(maxsize=8192)
def bus_key(bus_id: str) -> tuple[int, int, int, int]:
    """Numeric order of a bus id, so 0000:17:01.1 sorts after 0000:17:00.7 and 0000:1a:... after 0000:9:..."""
    m = _BDF.fullmatch(bus_id)
    if m is None:
        # Non-PCI entries sort after every real address, in a stable order among themselves.
        return (1 << 32, 0, 0, 0)
    return (int(m[1], 16), int(m[2], 16), int(m[3], 16), int(m[4], 16))


def placement(path: str) -> tuple[str, tuple[str, ...]]:
    """(host bridge, bridges innermost first) of a resolved function directory path.

    The last `pciDDDD:BB` component is the host bridge (a VM's passthrough hierarchy may hang it below
    other platform directories); BDF-named components after it and before the device are bridges.
    """
    return _placement_above(path.rpartition("/")[0])


# Every VF of a PF (and every function of a card) hangs from the same parent: one answer per parent.
@functools.lru_cache(maxsize=256)
def _placement_above(parent: str) -> tuple[str, tuple[str, ...]]:
    parts = parent.split("/")
    host_at = -1
    for i in range(len(parts) - 1, -1, -1):
        if _HOST_BRIDGE.fullmatch(parts[i]):
            host_at = i
            break
    if host_at < 0:
        return "", ()
    bridges = [p for p in parts[host_at + 1 :] if _BDF.fullmatch(p)]
    bridges.reverse()
    return parts[host_at], tuple(bridges)


def _hex_id(raw: str | None, quantity: numbers.Quantity, width: int) -> str:
    """A config-space id as the record spells it ("15b3"): from the kernel's "0x15b3", else unknown."""
    value = numbers.parse_hex_opt(raw, quantity)
    return "" if value is None else f"{value:0{width}x}"


@numbers.memo
def _pci_id(raw: str | None) -> str:
    return _hex_id(raw, numbers.PCI_ID, 4)


@numbers.memo
def _pci_class(raw: str | None) -> str:
    return _hex_id(raw, numbers.PCI_CLASS, 6)


@numbers.memo
def _numa(raw: str | None) -> str:
    # The kernel prints -1 when it does not know; blank means unknown throughout the record.
    value = numbers.numa_node(raw)
    return "" if value is None else str(value)


def physfn_of(d: SysDir) -> str:
    """The PF bus id a VF's `physfn` link names; "" for a function that is not a VF. A link whose target
    is not a PCI address is refused: it cannot name the parent it claims to."""
    return _physfn(d, d.link_name("physfn"))


def _physfn(d: SysDir, target: str | None) -> str:
    """`physfn_of` from the last component of the link's target (`link_name`), already read."""
    if target is None:
        return ""
    if not is_bus_id(target):
        raise HostReadError(f"{d.shown}/physfn", f"points at {target!r}, not a PCI function")
    return target


_FUNCTION_ATTRIBUTES = ("vendor", "device", "class", "numa_node", "local_cpulist")


def read_function(d: SysDir) -> PciFunction:
    """Coordinates and identity of one function, from its resolved /sys/devices/pci.../<bdf> directory."""
    return _function(d, d.values(_FUNCTION_ATTRIBUTES), d.link_name("physfn"))


def _function(d: SysDir, values: list[str | None], physfn: str | None) -> PciFunction:
    """`read_function` from what it reads: the `_FUNCTION_ATTRIBUTES` values and `physfn`'s link name."""
    parent, _, bus_id = d.path.rpartition("/")
    host_bridge, switches = _placement_above(parent)
    vendor, device, class_code, numa, cpus = values
    return PciFunction(
        bus_id,
        switches[-1] if switches else "",
        switches,
        host_bridge,
        _pci_id(vendor),
        _pci_id(device),
        _pci_class(class_code),
        _numa(numa),
        numbers.cpu_list(cpus) or "",
        d,
        _physfn(d, physfn),
    )


def walk(host: HostRoot) -> dict[str, PciFunction]:
    """Every function under /sys/bus/pci/devices, keyed by bus id, in bus order.

    Raises PciBusAbsent when the root has no PCI bus directory at all (nothing was read, which is not an
    empty bus), and HostReadError when the bus or an entry cannot be read: an entry that is not a PCI
    address, a link that dangles, loops or leaves the root, or one whose target is another function.
    """
    if not host.present(PCI_BUS):
        log.warning("no pci bus directory under the host root", extra={"path": PCI_BUS, "root": host.root})
        raise PciBusAbsent(f"{PCI_BUS} is absent under {host.root}: the pci bus was not read")
    bus = host.dir(PCI_DEVICES)
    out: dict[str, PciFunction] = {}
    for name in sorted(bus.list(), key=bus_key):
        if not is_bus_id(name):
            raise HostReadError(f"{bus.shown}/{name!r}", "not a PCI address")
        try:
            # Resolved, and its attributes and `physfn` read through the descriptor that resolved it.
            d, values, physfn = bus.child_link_read(name, _FUNCTION_ATTRIBUTES, "physfn")
        except FileNotFoundError:
            # Removed between listing and reading (hot-unplug, VFs torn down): gone, not unreadable.
            log.debug("pci function vanished during the walk", extra={"pci_bus_id": name})
            continue
        if values is None:  # it landed on a directory of another name, and nothing of it was read
            raise HostReadError(f"{bus.shown}/{name}", f"links to {d.shown}, another function's directory")
        fn = _function(d, values, physfn)
        out[fn.bus_id] = fn
    return out
