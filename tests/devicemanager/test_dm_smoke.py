"""The inventory on the real /sys of the machine running the suite."""

from __future__ import annotations

import os

import pytest

from nodefabric_devicemanager import inventory, pci
from nodefabric_devicemanager.hostroot import HostRoot

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(not os.path.isdir("/sys/class/net"), reason="no /sys/class/net on this machine"),
]


def test_real_host_reads_without_error_and_lo_is_virtual():
    r = inventory.read(HostRoot.at("/"))
    assert r.interfaces is not None, r.conditions
    by_name = {i.name: i for i in r.interfaces}
    assert by_name["lo"].virtual and by_name["lo"].bus == "" and by_name["lo"].pci_bus_id == ""
    assert [i.name for i in r.interfaces] == sorted(by_name)


def test_real_host_interfaces_agree_with_their_device_links():
    host = HostRoot.at("/")
    r = inventory.read(host)
    for iface in r.interfaces or []:
        device = f"/sys/class/net/{iface.name}/device"
        if not os.path.exists(device):
            assert iface.virtual
            continue
        target = os.path.realpath(device)
        if pci.is_bus_id(os.path.basename(target)):
            assert iface.bus == "pci" and iface.pci_bus_id == os.path.basename(target)
            assert iface.pci_bus_id in r.pci
        else:
            # virtio-net and platform NICs: their own bus, no PCI placement claimed.
            assert iface.bus == os.path.basename(os.readlink(os.path.join(target, "subsystem")))
            assert iface.pci_bus_id == "" and iface.pci_switches == []


def test_real_pci_walk_matches_the_bus_directory():
    walked = pci.walk(HostRoot.at("/"))
    listed = os.listdir("/sys/bus/pci/devices") if os.path.isdir("/sys/bus/pci/devices") else []
    assert sorted(walked) == sorted(listed)
    for fn in walked.values():
        assert fn.host_bridge.startswith("pci") and fn.vendor and "0x" not in fn.vendor
        assert fn.numa != "-1"
