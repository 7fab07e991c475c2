"""An interface's `device` link read by its text (interfaces._device) answers exactly as the kernel's
resolution (child_link_opt) does, for every spelling a host can write there."""

from __future__ import annotations

import os

import pytest

from nodefabric_devicemanager import interfaces
from nodefabric_devicemanager import pci as pcimod
from nodefabric_devicemanager.hostroot import HostReadError
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

NIC = "/sys/devices/pci0000:16/0000:17:00.0"
OTHER = "/sys/devices/pci0000:16/0000:18:00.0"
NETDEV = f"{NIC}/net/ens1np0"

SPELLINGS = {
    "kernel": "../../../0000:17:00.0",  # what sysfs writes
    "fixture": "../..",  # what the fixture builder writes
    "another function": "../../../0000:18:00.0",
    "through a name and back": "../../../0000:18:00.0/../0000:17:00.0",
    "absolute": "/sys/devices/pci0000:16/0000:17:00.0",
    "dot": "../../.",
    "trailing slash": "../../../0000:17:00.0/",
    "a directory that is no function": "../../../../pci0000:16",
    "outside the root": "../../../../../../../outside",
    "dangling": "../../../0000:99:00.0",
    "loop": "device",
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_the_device_link_read_by_its_text_is_what_the_kernel_resolves(host_root, spelling):
    b = SysfsBuilder(host_root)
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0)
    b.nic("0000:18:00.0", "ens2np0", host_bridge="pci0000:16", numa=0)
    (host_root.parent / "outside").mkdir(exist_ok=True)
    link = b.path(f"{NETDEV}/device")
    link.unlink()
    os.symlink(SPELLINGS[spelling], link)
    host = b.host
    pci = pcimod.walk(host)
    netdev = host.dir("/sys/class/net/ens1np0")

    def answer(fn):
        try:
            found = fn()
        except HostReadError as exc:
            return type(exc), str(exc)
        return None if found is None else found.path

    assert answer(lambda: interfaces._device(netdev, pci)) == answer(lambda: netdev.child_link_opt("device"))


def test_the_text_is_taken_only_where_the_walk_resolved_that_function(host_root):
    b = SysfsBuilder(host_root)
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0)
    host = b.host
    netdev = host.dir("/sys/class/net/ens1np0")
    pci = pcimod.walk(host)
    assert interfaces._device(netdev, pci) is pci["0000:17:00.0"].dir  # taken from the walk
    assert interfaces._device(netdev, {}) == netdev.child_link_opt("device")  # resolved by the kernel
