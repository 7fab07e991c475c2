"""The one PCI walk: every function's bus coordinates, read the same way for NICs and accelerators.

The coordinates come from where a function's directory sits under `/sys/devices`:

    /sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:08.0/0000:1a:00.0
                 host bridge  root port     switch up     switch down   the device

`switches` is every BDF-named directory between the host bridge and the device, innermost first;
`root_id` is the outermost of them (the root port in the example, NOT the root complex). Interfaces and
accelerator detectors both take their coordinates from here so the values compare equal by construction.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from nodefabric_devicemanager.hostroot import HostRoot, SysDir

log = logging.getLogger(__name__)

PCI_DEVICES = "/sys/bus/pci/devices"

_BDF = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}$")


@dataclass(frozen=True, slots=True)
class PciFunction:
    bus_id: str  # "0000:17:00.0"
    root_id: str  # outermost PCI bridge above the device ("" when directly on the host bridge)
    switches: tuple[str, ...]  # full upstream bridge path, innermost first
    host_bridge: str  # "pci0000:00": the host-bridge directory the path hangs from
    vendor: str  # "15b3" (lowercase hex, no 0x)
    device: str  # "1021"
    class_code: str  # "020000" (no 0x)
    numa: str  # "" when the kernel says -1 or nothing
    cpus: str  # local_cpulist, "" when absent
    dir: SysDir  # the resolved function directory
    physfn: str = ""  # parent PF bus id for a VF

    @property
    def is_vf(self) -> bool:
        return bool(self.physfn)


def is_bus_id(name: str) -> bool:
    return _BDF.match(name) is not None


def bus_key(bus_id: str) -> tuple[int, int, int, int]:
    """Numeric order of a bus id, so 0000:17:01.1 sorts after 0000:17:00.7 and 0000:1a:... after 0000:9:..."""
    m = _BDF.match(bus_id)
    if m is None:
        # Non-PCI entries sort after every real address, in a stable order among themselves.
        return (1 << 32, 0, 0, 0)
    return (int(m[1], 16), int(m[2], 16), int(m[3], 16), int(m[4], 16))


def placement(path: str) -> tuple[str, tuple[str, ...]]:
    """(host bridge, bridges innermost first) of a resolved function directory path.

    The last `pciDDDD:BB` component is the host bridge (a VM's passthrough hierarchy may hang it below
    other platform directories); BDF-named components after it and before the device are bridges.
    """
    parts = path.split("/")
    host_at = -1
    for i in range(len(parts) - 2, -1, -1):
        if _HOST_BRIDGE.match(parts[i]):
            host_at = i
            break
    if host_at < 0:
        return "", ()
    bridges = [p for p in parts[host_at + 1 : -1] if _BDF.match(p)]
    bridges.reverse()
    return parts[host_at], tuple(bridges)


def _hex_id(raw: str | None) -> str:
    if raw is None:
        return ""
    value = raw.strip().lower()
    return value[2:] if value.startswith("0x") else value


def _numa(raw: str | None) -> str:
    # The kernel prints -1 when it does not know; blank means unknown throughout the record.
    if raw is None:
        return ""
    value = raw.strip()
    return "" if not value or value.startswith("-") else value


def read_function(d: SysDir) -> PciFunction:
    """Coordinates and identity of one function, from its resolved /sys/devices/pci.../<bdf> directory."""
    host_bridge, switches = placement(d.path)
    return PciFunction(
        bus_id=d.name,
        root_id=switches[-1] if switches else "",
        switches=switches,
        host_bridge=host_bridge,
        vendor=_hex_id(d.read_opt("vendor")),
        device=_hex_id(d.read_opt("device")),
        class_code=_hex_id(d.read_opt("class")),
        numa=_numa(d.read_opt("numa_node")),
        cpus=(d.read_opt("local_cpulist") or "").strip(),
        dir=d,
        physfn=d.link_name("physfn") or "",
    )


def walk(host: HostRoot) -> dict[str, PciFunction]:
    """Every function under /sys/bus/pci/devices, keyed by bus id, in bus order.

    A host without a PCI bus (some platform systems, a container without /sys/bus) is an empty dict; a
    directory that exists but cannot be read, or a link that leaves the root, raises HostReadError.
    """
    bus = host.dir(PCI_DEVICES)
    if not bus.is_dir():
        log.info("no pci bus on this host", extra={"path": bus.shown})
        return {}
    out: dict[str, PciFunction] = {}
    for name in sorted(bus.list(), key=bus_key):
        try:
            d = bus.child(name)
        except FileNotFoundError:
            # Removed between listing and reading (hot-unplug, VFs torn down): gone, not unreadable.
            log.debug("pci function vanished during the walk", extra={"pci_bus_id": name})
            continue
        fn = read_function(d)
        out[fn.bus_id] = fn
    return out
