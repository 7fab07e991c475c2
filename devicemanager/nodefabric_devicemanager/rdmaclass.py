"""RDMA devices that no interface's own device carries, bound to the interfaces they ride on by name.

Most RDMA devices hang from the same device as their netdev (a PCI function, a platform device such as
`/sys/devices/platform/<soc>/infiniband/hns_0` beside `.../net/end0`), and interfaces.py binds them
through that shared parent. Two kinds do not:
- software RDMA (`rxe` over an Ethernet netdev, `siw` over any TCP one) lives under
  `/sys/devices/virtual/infiniband` with no parent device at all;
- a platform RDMA engine whose netdevs are other platform devices (HiSilicon hip06/hip07: `hns_0` under
  one platform device, its ports' netdevs under others).
They are bound through what the kernel says they ride on: the device's `parent` attribute (rxe names
its netdev there), else, per port, the first populated entry of `ports/<n>/gid_attrs/ndevs/` in index
order (index 0 is the default GID, which belongs to the port's own netdev). Each interface's verdict is
taken over the ports that ride on it.

An RDMA device on a PCI function is never bound here: its netdev is that function's, and a function
whose netdev is not in this network namespace (a PF netdev moved into a pod) must not be matched to a
local interface that happens to carry the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from nodefabric_devicemanager import numbers, rdma
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot, Refused, SysDir, recorded_name

log = logging.getLogger(__name__)

RDMA_CLASS = "/sys/class/infiniband"
CLASS_NET = "/sys/class/net"
# GID entries tried per port before giving up: unpopulated entries answer EINVAL, and a RoCE port's
# table is 256 entries long; its own netdev owns the first populated one.
GID_ENTRIES_TRIED = 16


def _gid_netdev(port: SysDir) -> str | None:
    """The netdev of a port's first populated GID entry; None when it has none (an InfiniBand port)."""
    attrs = port.child_opt("gid_attrs")
    ndevs = attrs.child_opt("ndevs") if attrs is not None else None
    if ndevs is None:
        return None
    indexes = sorted(
        (i, n) for n in ndevs.list() if (i := numbers.parse_opt(n, numbers.GID_INDEX)) is not None
    )
    for _, name in indexes[:GID_ENTRIES_TRIED]:
        try:
            netdev = ndevs.value(name)
        except Refused:
            raise
        except HostReadError:
            continue  # an unpopulated entry: the kernel answers EINVAL
        if netdev:
            return netdev
    return None


def _riding(device: SysDir, netdevs: Collection[str], *, software: bool) -> dict[str, set[str]]:
    """Listed interface -> the device's ports that ride on it."""
    ports = device.child_opt("ports")
    names = ports.list() if ports is not None else []
    # Only a software device names its netdev in `parent`; a hardware one's ports say it.
    parent = device.value("parent") if software else None
    if parent is not None:
        return {parent: set(names)} if parent in netdevs else {}
    out: dict[str, set[str]] = {}
    for name in names:
        assert ports is not None
        try:
            netdev = _gid_netdev(ports.child(name))
        except FileNotFoundError:
            continue  # the port went away while being read
        if netdev is not None and netdev in netdevs:
            out.setdefault(netdev, set()).add(name)
    return out


def ports_on(host: HostRoot, device: str, netdev: str) -> set[str] | None:
    """The ports of RDMA device `device` whose verdict counts for interface `netdev`: those riding on it
    when the device is bound by name (software, or a platform engine split across netdevs), None when
    every port counts (bound through the shared parent, as `scan` leaves such a device to it). For a link
    refresh between passes, which must judge an endpoint over the same ports the pass did."""
    d = host.dir(RDMA_CLASS).child(device)
    parent = d.child_opt("device")
    if parent is not None and parent.link_name("subsystem") == "pci":
        return None
    if parent is not None and netdev:
        own = host.dir(CLASS_NET).child(netdev).child_opt("device")
        if own is not None and own.path == parent.path:
            return None
    riding = _riding(d, {netdev}, software=parent is None)
    return riding.get(netdev)


def scan(
    host: HostRoot, *, bound: Collection[str], parents: Collection[str], netdevs: Collection[str]
) -> dict[str, rdma.Binding]:
    """Interface name -> the RDMA device riding on it, for devices `bound` (names) and `parents` (resolved
    device directories of listed interfaces) do not already account for. `netdevs` are the interfaces
    that may take one. No RDMA class (no RDMA driver loaded) is none; a class that cannot be read, or an
    entry of it that is refused, raises HostReadError: RDMA that was not read is not absent."""
    if not netdevs or not host.present(RDMA_CLASS):
        return {}  # nothing could take a device, or no RDMA driver is loaded
    devices = host.dir(RDMA_CLASS)
    found: dict[str, rdma.Binding] = {}
    for name in devices.list():
        shown = recorded_name(name)
        if shown in bound:
            continue
        try:
            d = devices.child(name)
        except FileNotFoundError:
            continue  # removed while being listed
        parent = d.child_opt("device")
        if parent is not None and (parent.path in parents or parent.link_name("subsystem") == "pci"):
            continue
        software = parent is None
        for netdev, ports in sorted(_riding(d, netdevs, software=software).items()):
            b = rdma.Binding(shown, rdma.check(d, ports), software)
            held = found.get(netdev)
            if held is None or (held.software and not software):
                found[netdev] = b
            else:
                # A hardware device beats a software one on the same netdev; otherwise the first by name.
                log.warning(
                    "several rdma devices ride on one interface; one is recorded",
                    extra={"interface": netdev, "recorded": held.device, "ignored": shown},
                )
    return found
