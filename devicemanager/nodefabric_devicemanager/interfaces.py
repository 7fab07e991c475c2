"""The interface inventory: one entry per kernel interface in /sys/class/net, VFs nested under their PF.

Enumeration starts at the interface, not the bus, so an interface that is not a PCI device still appears.
How each kind is recorded:
- PCI NIC: bus "pci", every PCI field from the one walk, its RDMA device and link verdict, SR-IOV facts,
  and its virtual functions (from the PF's virtfnN links, so a VF with no netdev still appears, name "").
- SR-IOV VF with a netdev: nested under its PF, not listed at top level (one card appears once), unless
  its PF has no interface of its own, in which case the VF is listed at top level rather than lost.
- virtio-net (a VM's NIC): bus "virtio", PCI fields empty. Its `device` is the virtio device, whose parent
  is the PCI transport function of the hypervisor; that function's placement says nothing about a
  physical NIC, so it is not claimed as the interface's PCI placement.
- platform (SoC) NICs and other buses: bus from the device's `subsystem` link, PCI fields empty.
- software interfaces (lo, bond, vlan, bridge, veth, ...): virtual, bus "", PCI fields empty.
- switchdev representors (phys_port_name pf0vf3, pf0sf1): the PF's placement, but no RDMA device,
  verdict or VFs, which belong to the card's uplink interface.
Entries of /sys/class/net that are not directories (e.g. `bonding_masters`) are skipped.
Top-level entries are sorted by name and VFs by bus id (numerically) so passes compare equal.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from nodefabric_devicemanager import pci as pcimod
from nodefabric_devicemanager import rdma
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot, SysDir
from nodefabric_devicemanager.models import Interface, VirtualFunction
from nodefabric_devicemanager.pci import PciFunction

log = logging.getLogger(__name__)

CLASS_NET = "/sys/class/net"
IFF_UP = 0x1
# phys_port_name of a VF or SF representor, optionally prefixed by the controller ("c1pf0vf2").
_REPRESENTOR = re.compile(r"^(?:c\d+)?pf\d+(?:vf|sf)\d+$")


def is_up(operstate: str | None, flags: str | None) -> bool:
    """operstate "up" is up; "unknown" (lo, many virtual drivers never report) falls back to IFF_UP."""
    state = (operstate or "").strip().lower()
    if state == "up":
        return True
    if state != "unknown" or not flags:
        return False
    try:
        return bool(int(flags, 0) & IFF_UP)
    except ValueError:
        return False


def _int(raw: str | None) -> int:
    try:
        return int((raw or "0").strip() or "0")
    except ValueError:
        return 0


def _placement(fn: PciFunction) -> dict[str, Any]:
    return {
        "bus": "pci",
        "pci_bus_id": fn.bus_id,
        "pci_root_id": fn.root_id,
        "pci_switches": list(fn.switches),
        "pci_host_bridge": fn.host_bridge,
        "pci_vendor": fn.vendor,
        "pci_device": fn.device,
        "numa_affinity": fn.numa,
        "cpu_affinity": fn.cpus,
    }


def _pci_fields(fn: PciFunction) -> dict[str, Any]:
    b = rdma.binding(fn.dir)
    return {
        **_placement(fn),
        "rdma": bool(b.device),
        "rdma_device": b.device,
        "link": b.link,
        "sriov": fn.dir.has("sriov_totalvfs"),
        "sriov_num_vfs": _int(fn.dir.read_opt("sriov_numvfs")),
    }


def is_representor(d: SysDir) -> bool:
    """A switchdev port representor (`pf0vf3`, `pf0sf1`): the e-switch's port for a VF or SF, hanging from
    the PF's own PCI function. It is a kernel interface and is listed, but no RDMA endpoint: the card's
    RDMA device and VFs are recorded once, on its uplink, or every representor would count as another."""
    try:
        name = d.read_opt("phys_port_name")
    except HostReadError:
        return False  # most drivers answer EOPNOTSUPP: they have no port names, so no representors
    return bool(name and _REPRESENTOR.match(name.strip()))


def _netdev_fields(d: SysDir) -> dict[str, Any]:
    return {"mtu": _int(d.read_opt("mtu")), "up": is_up(d.read_opt("operstate"), d.read_opt("flags"))}


def _function_of(device: SysDir, pci: Mapping[str, PciFunction]) -> PciFunction | None:
    """The PCI function a netdev's `device` link names: from the walk, read directly if the walk missed it."""
    if not pcimod.is_bus_id(device.name) or device.link_name("subsystem") != "pci":
        return None
    return pci.get(device.name) or pcimod.read_function(device)


def _virtual_function(vf: PciFunction) -> VirtualFunction:
    fields = _pci_fields(vf)
    name = ""
    net = vf.dir.child_opt("net")
    names = net.list() if net is not None else []
    if net is not None and names:
        name = names[0]
        fields.update(_netdev_fields(net.child(name)))
    return VirtualFunction(name=name, **fields)


def _virtual_functions(pf: PciFunction, pci: Mapping[str, PciFunction]) -> list[VirtualFunction]:
    out: list[VirtualFunction] = []
    for link in pf.dir.list():
        if link.startswith("virtfn") and link[6:].isdigit():
            # The walk already resolved and checked every VF; only one it missed is resolved here.
            known = pci.get(pf.dir.link_name(link) or "")
            if known is None:
                vf_dir = pf.dir.child_opt(link)
                if vf_dir is None:
                    continue  # torn down between listing and reading (sriov_numvfs lowered): gone
                known = pcimod.read_function(vf_dir)
            out.append(_virtual_function(known))
    out.sort(key=lambda v: pcimod.bus_key(v.pci_bus_id))
    return out


def _bus_of(device: SysDir | None) -> str:
    return "" if device is None else device.link_name("subsystem") or ""


def read_interface(
    d: SysDir, device: SysDir | None, fn: PciFunction | None, pci: Mapping[str, PciFunction]
) -> Interface:
    """One /sys/class/net entry (resolved), its `device` (None for software interfaces) and PCI function."""
    fields = _netdev_fields(d)
    if device is None:
        # No device link: a software interface, living under /sys/devices/virtual/net.
        return Interface(name=d.name, virtual=True, **fields)
    if fn is None:
        return Interface(name=d.name, bus=_bus_of(device), **fields)
    if is_representor(d):
        return Interface(name=d.name, **fields, **_placement(fn))
    fields.update(_pci_fields(fn))
    vfs = _virtual_functions(fn, pci) if fields["sriov"] else []
    return Interface(name=d.name, virtual_functions=vfs, **fields)


def read(host: HostRoot, pci: Mapping[str, PciFunction]) -> list[Interface]:
    """The inventory, sorted by name. Raises HostReadError (or FileNotFoundError when /sys/class/net is
    absent) when enumeration fails: a failed read is never an empty list."""
    net = host.dir(CLASS_NET)
    if not net.is_dir():
        raise FileNotFoundError(f"{net.shown} is not a directory")
    found: list[tuple[SysDir, SysDir | None, PciFunction | None]] = []
    for name in net.list():
        try:
            d = net.child(name)
        except FileNotFoundError:
            # Removed between listing and reading (hot-unplug, a veth torn down): it is gone, not unreadable.
            log.debug("interface vanished during the pass", extra={"interface": name})
            continue
        if not d.is_dir():
            continue
        device = d.child_opt("device")
        found.append((d, device, None if device is None else _function_of(device, pci)))
    # A VF is nested under its PF; it stays at top level only if its PF has no interface of its own.
    listed_pfs = {fn.bus_id for _, _, fn in found if fn is not None and not fn.physfn}
    out = [
        read_interface(d, device, fn, pci)
        for d, device, fn in found
        if fn is None or not fn.physfn or fn.physfn not in listed_pfs
    ]
    out.sort(key=lambda i: i.name)
    return out
