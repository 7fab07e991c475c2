"""The interface inventory: one entry per kernel interface in /sys/class/net, VFs nested under their PF.

Enumeration starts at the interface, not the bus, so an interface that is not a PCI device still appears.
How each kind is recorded:
- PCI NIC: bus "pci", every PCI field from the one walk, its RDMA device and link verdict, SR-IOV facts,
  and its virtual functions (from the PF's virtfnN links, so a VF with no netdev still appears, name "").
- SR-IOV VF: `physicalFunction` names its PF (from `physfn`). Nested under its PF, not listed at top
  level (one card appears once), unless its PF has no interface of its own (the PF's netdev moved into a
  pod, or the PF bound to vfio), in which case the VF is listed at top level rather than lost.
- virtio-net (a VM's NIC): bus "virtio", PCI fields empty. Its `device` is the virtio device, whose parent
  is the PCI transport function of the hypervisor; that function's placement says nothing about a
  physical NIC, so it is not claimed as the interface's PCI placement.
- platform (SoC) NICs and other buses: bus from the device's `subsystem` link, PCI fields empty, and the
  RDMA device that hangs from the same device (`.../platform/<soc>/infiniband/hns_0` beside
  `.../net/end0`), with its verdict.
- software interfaces (lo, bond, vlan, bridge, veth, ...): virtual, bus "", PCI fields empty.
- switchdev representors (phys_port_name pf0vf3, pf0sf1): the PF's placement, but no RDMA device,
  verdict or VFs, which belong to the card's uplink interface.
- RDMA devices no interface's own device carries (software rxe/siw, split platform engines) are bound
  by name afterwards (rdmaclass.py); a software one is marked `rdmaSoftware`.
Entries of /sys/class/net that are not interfaces are skipped only when they are known to be files
(`bonding_masters`); any other entry that is not a directory, or a link that dangles or loops, fails
the enumeration: an interface that could not be read is not an interface that is not there.
Top-level entries are sorted by name and VFs by bus id (numerically) so passes compare equal.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from nodefabric_devicemanager import numbers, rdma, rdmaclass
from nodefabric_devicemanager import pci as pcimod
from nodefabric_devicemanager.hostroot import (
    HostReadError,
    HostRoot,
    NotADirectory,
    SysDir,
    recorded_name,
)
from nodefabric_devicemanager.models import Interface, VirtualFunction, share_fields_sets
from nodefabric_devicemanager.pci import PciFunction

log = logging.getLogger(__name__)

CLASS_NET = "/sys/class/net"
# Files the kernel itself puts in /sys/class/net beside the interfaces.
NOT_INTERFACES = frozenset({"bonding_masters"})
IFF_UP = 0x1
# phys_port_name of a VF or SF representor, optionally prefixed by the controller ("c1pf0vf2").
_REPRESENTOR = re.compile(r"(?:c[0-9]+)?pf[0-9]+(?:vf|sf)[0-9]+", re.ASCII)
_VIRTFN = re.compile(r"virtfn([0-9]+)", re.ASCII)


def is_up(operstate: str | None, flags: str | None) -> bool:
    """operstate "up" is up; "unknown" (lo, many virtual drivers never report) falls back to IFF_UP."""
    if operstate == "up":  # what nearly every interface says, as the kernel prints it
        return True
    state = (operstate or "").strip().lower()
    if state == "up":
        return True
    if state != "unknown":
        return False
    value = numbers.parse_hex_opt(flags, numbers.NET_FLAGS)
    return value is not None and bool(value & IFF_UP)


def _placement(fn: PciFunction) -> dict[str, Any]:
    # Interned: a PF's VFs repeat its bridges, ids, NUMA node and CPUs, and the record is kept between
    # walks; on 8 PFs x 128 VFs one copy of each instead of 1,024 is ~0.3 MiB.
    return {
        "bus": "pci",
        "pci_bus_id": fn.bus_id,
        "pci_root_id": sys.intern(fn.root_id),
        "pci_switches": [sys.intern(b) for b in fn.switches],
        "pci_host_bridge": sys.intern(fn.host_bridge),
        "pci_vendor": sys.intern(fn.vendor),
        "pci_device": sys.intern(fn.device),
        "numa_affinity": sys.intern(fn.numa),
        "cpu_affinity": sys.intern(fn.cpus),
        "physical_function": sys.intern(fn.physfn),
    }


def _rdma_fields(b: rdma.Binding) -> dict[str, Any]:
    return {"rdma": bool(b.device), "rdma_device": b.device, "rdma_software": b.software, "link": b.link}


def _virtfns(pf: SysDir) -> list[str]:
    """The PF's virtfnN link names, in VF-index order."""
    found = [
        (index, name)
        for name in pf.list()
        if (m := _VIRTFN.fullmatch(name)) and (index := numbers.parse_opt(m[1], numbers.VF_INDEX)) is not None
    ]
    return [name for _, name in sorted(found)]


def _num_vfs(pf: SysDir, links: list[str]) -> int:
    """VFs configured on a PF: `sriov_numvfs`, else (unreadable as a number) the virtfn links the kernel
    made for them, which are the same fact observed another way; never a stand-in 0."""
    raw = pf.value("sriov_numvfs")
    value = numbers.parse_opt(raw, numbers.VF_COUNT)
    if value is None and raw is not None:
        log.warning(
            "sriov_numvfs is not a VF count; counting the PF's virtfn links instead",
            extra={"path": f"{pf.shown}/sriov_numvfs", "vfs": len(links)},
        )
    return value if value is not None else len(links)


def is_representor(d: SysDir) -> bool:
    """A switchdev port representor (`pf0vf3`, `pf0sf1`): the e-switch's port for a VF or SF, hanging from
    the PF's own PCI function. It is a kernel interface and is listed, but no RDMA endpoint: the card's
    RDMA device and VFs are recorded once, on its uplink, or every representor would count as another."""
    try:
        name = d.value("phys_port_name")
    except HostReadError:
        return False  # most drivers answer EOPNOTSUPP: they have no port names, so no representors
    return bool(name and _REPRESENTOR.fullmatch(name.strip()))


def _netdev_fields(d: SysDir) -> dict[str, Any]:
    mtu, operstate, flags = d.values(_NETDEV_ATTRIBUTES)
    return {"mtu": _mtu(mtu), "up": is_up(operstate, flags)}


_NETDEV_ATTRIBUTES = ("mtu", "operstate", "flags")


@numbers.memo
def _mtu(raw: str | None) -> int | None:
    return numbers.parse_opt(raw, numbers.MTU)


def _function_of(device: SysDir, pci: Mapping[str, PciFunction]) -> PciFunction | None:
    """The PCI function a netdev's `device` link names: from the walk, read directly if the walk missed it."""
    name = device.name
    known = pci.get(name)
    # A name the walk keyed is a bus id already (the walk refuses any other): only another is asked.
    if (known is None and not pcimod.is_bus_id(name)) or device.link_name("subsystem") != "pci":
        return None
    return known or pcimod.read_function(device)


def _netdev_of(fn: PciFunction) -> tuple[SysDir, dict[str, Any]] | None:
    """A function's first netdev (`<function>/net/<netdev>`) and its `_netdev_fields`; None when it has
    none."""
    # Listed when the VF is read, not kept from the interface enumeration. The first entry's attributes
    # are read relative to the descriptor that listed it, through the entry opened without following a
    # link (`Listing`): a netdev swapped for a link out of the root since the listing is refused, not
    # read through.
    listing = fn.dir.child_listing_opt("net")
    if listing is None:
        return None
    try:
        if not listing.entries:
            return None
        netdev, (mtu, operstate, flags) = listing.values(*listing.entries[0], _NETDEV_ATTRIBUTES)
    finally:
        listing.close()
    return netdev, {"mtu": _mtu(mtu), "up": is_up(operstate, flags)}


def _virtual_function(vf: PciFunction) -> VirtualFunction:
    fields = _placement(vf)
    b = rdma.binding(vf.dir)
    fields["rdma"], fields["rdma_device"], fields["rdma_software"], fields["link"] = (
        bool(b.device),
        b.device,
        b.software,
        b.link,
    )
    found = _netdev_of(vf)
    if found is not None:
        fields["name"] = recorded_name(found[0].name)
        fields.update(found[1])
    # Validated from the dict itself, not spread into keyword arguments (one dict fewer per VF): the
    # same validation of every value, host-derived strings included.
    return VirtualFunction.model_validate(fields)


def _virtual_functions(
    pf: PciFunction, links: list[str], pci: Mapping[str, PciFunction]
) -> list[VirtualFunction]:
    out: list[VirtualFunction] = []
    for link in links:
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
    return "" if device is None else recorded_name(device.link_name("subsystem") or "")


def read_interface(
    d: SysDir, device: SysDir | None, fn: PciFunction | None, pci: Mapping[str, PciFunction]
) -> Interface:
    """One /sys/class/net entry (resolved), its `device` (None for software interfaces) and PCI function."""
    fields = {"name": recorded_name(d.name), **_netdev_fields(d)}
    if device is None:
        # No device link: a software interface, living under /sys/devices/virtual/net.
        return Interface(virtual=True, **fields)
    if fn is None:
        # Not on the PCI bus: its RDMA device, if any, hangs from the same (platform) device.
        return Interface(bus=_bus_of(device), **fields, **_rdma_fields(rdma.binding(device)))
    if is_representor(d):
        return Interface(**fields, **_placement(fn))
    fields.update(_placement(fn))
    fields.update(_rdma_fields(rdma.binding(fn.dir)))
    if not fn.dir.has("sriov_totalvfs"):
        return Interface(**fields)
    links = _virtfns(fn.dir)
    return Interface(
        **fields,
        sriov=True,
        sriov_num_vfs=_num_vfs(fn.dir, links),
        virtual_functions=_virtual_functions(fn, links, pci),
    )


class _Entry(NamedTuple):
    dir: SysDir
    device: SysDir | None
    fn: PciFunction | None


def _entries(net: SysDir, pci: Mapping[str, PciFunction]) -> list[_Entry]:
    found: list[_Entry] = []
    for name in net.list():
        try:
            d = net.child_link(name)
        except FileNotFoundError:
            # Removed between listing and reading (hot-unplug, a veth torn down): it is gone, not unreadable.
            log.debug("interface vanished during the pass", extra={"interface": recorded_name(name)})
            continue
        except NotADirectory:
            if name in NOT_INTERFACES:
                continue
            raise
        if d.name != name:
            raise HostReadError(
                f"{net.shown}/{recorded_name(name)}", f"links to {d.shown}, another interface"
            )
        device = _device(d, pci)
        found.append(_Entry(d, device, None if device is None else _function_of(device, pci)))
    return found


def _device(netdev: SysDir, pci: Mapping[str, PciFunction]) -> SysDir | None:
    """`netdev.child_link_opt("device")`, without asking the kernel to resolve the link when its text
    alone lands on a function directory the PCI walk already resolved and checked: only `..` steps up
    from the netdev's resolved directory (every component of which is a real directory, so `..` is its
    parent), then that function's address, spelling exactly the function's resolved path. Any other
    link, or none, takes child_link_opt for its exact answer and refusal."""
    target = netdev.link_target("device")
    if target is not None:
        parts = target.split("/")
        # Every component `..`, or every one but the last, which names the function: `ups` steps up.
        last = parts[-1]
        ups = len(parts) if last == ".." else len(parts) - 1
        if ups and parts.count("..") == ups and last not in ("", "."):
            base = netdev.path.rsplit("/", ups)[0]
            landed = base if last == ".." else f"{base}/{last}"
            fn = pci.get(landed.rpartition("/")[2])
            if fn is not None and fn.dir.path == landed:
                return fn.dir
    return netdev.child_link_opt("device")


def _bind_by_name(host: HostRoot, out: list[Interface], found: list[_Entry]) -> list[Interface]:
    """Interfaces with the RDMA devices no parent device carried (software, split platform engines)."""
    bound = {ep.rdma_device for iface in out for ep in (iface, *iface.virtual_functions) if ep.rdma_device}
    parents = {e.device.path for e in found if e.device is not None}
    # Only an interface that read no RDMA tree of its own can take one: an unreadable tree (unverified, no
    # device) is not overridden by a guess.
    free = {i.name for i in out if not i.rdma_device and i.link is None}
    by_name = rdmaclass.scan(host, bound=bound, parents=parents, netdevs=free)
    return [i.model_copy(update=_rdma_fields(by_name[i.name])) if i.name in by_name else i for i in out]


def read(host: HostRoot, pci: Mapping[str, PciFunction]) -> list[Interface]:
    """The inventory, sorted by name. Raises HostReadError (or FileNotFoundError when /sys/class/net is
    absent) when enumeration fails: a failed read is never an empty list."""
    if not host.present(CLASS_NET):
        raise FileNotFoundError(f"{CLASS_NET} is absent under {host.root}: the interfaces were not read")
    net = host.dir(CLASS_NET)
    if not net.is_dir():
        raise NotADirectory(net.shown, f"{net.not_a_directory()}: the interfaces were not read")
    found = _entries(net, pci)
    # A VF is nested under its PF; it stays at top level only if its PF has no interface of its own.
    listed_pfs = {e.fn.bus_id for e in found if e.fn is not None and not e.fn.physfn}
    out = [
        read_interface(e.dir, e.device, e.fn, pci)
        for e in found
        if e.fn is None or not e.fn.physfn or e.fn.physfn not in listed_pfs
    ]
    out = _bind_by_name(host, out, found)
    out.sort(key=lambda i: i.name)
    share_fields_sets(out)
    return out
