from __future__ import annotations

import os

import pytest

from nodefabric_devicemanager import inventory, pci
from nodefabric_devicemanager.hostroot import AttributeTooLarge, HostRoot, PathEscapesRoot, SysDir
from nodefabric_devicemanager.models import INTERFACES_ENUMERATED
from nodefabric_devicemanager.testing.scenarios import gpu8_gpus


def test_placement_reads_bridges_innermost_first_and_the_host_bridge():
    path = "/r/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:08.0/0000:1a:00.0"
    assert pci.placement(path) == ("pci0000:16", ("0000:18:08.0", "0000:17:00.0", "0000:16:01.0"))


def test_placement_of_a_function_directly_on_the_host_bridge_has_no_bridges():
    assert pci.placement("/sys/devices/pci0000:00/0000:00:03.0") == ("pci0000:00", ())


def test_placement_takes_the_last_host_bridge_and_skips_non_bdf_components():
    # A Hyper-V passthrough hierarchy hangs the host bridge below platform directories.
    path = "/sys/devices/LNXSYSTM:00/VMBUS:01/pci0000:00/abc-def/pci7870:00/7870:00:00.0"
    assert pci.placement(path) == ("pci7870:00", ())


def test_bus_key_orders_numerically_and_puts_non_pci_last():
    # A VMD domain has five hex digits: as strings "10000:..." would sort before "d000:...".
    ids = [
        "0000:3b:01.0",
        "0000:3b:00.7",
        "10000:e0:00.0",
        "d000:00:00.0",
        "0000:b7:00.0",
        "virtio2",
        "0000:3b:00.1",
    ]
    assert sorted(ids, key=pci.bus_key) == [
        "0000:3b:00.1",
        "0000:3b:00.7",
        "0000:3b:01.0",
        "0000:b7:00.0",
        "d000:00:00.0",
        "10000:e0:00.0",
        "virtio2",
    ]


def test_walk_gives_coordinates_of_gpus_and_nics_behind_switches(scenario):
    walked = pci.walk(scenario("gpu8"))
    gpu0 = walked[gpu8_gpus()[0]]
    assert gpu0.bus_id == "0000:18:00.0"
    assert gpu0.switches == ("0000:17:00.0", "0000:16:00.0", "0000:15:01.0")
    assert gpu0.root_id == "0000:15:01.0"
    assert gpu0.host_bridge == "pci0000:15"
    assert (gpu0.vendor, gpu0.device, gpu0.class_code) == ("10de", "26b9", "030200")
    assert (gpu0.numa, gpu0.cpus) == ("0", "0-55,112-167")
    assert gpu0.dir.name == "0000:18:00.0" and not gpu0.is_vf
    nic = walked["0000:9c:00.0"]
    assert nic.switches == ("0000:99:02.0", "0000:98:00.0", "0000:97:01.0")
    assert (nic.vendor, nic.device, nic.numa) == ("15b3", "1021", "1")
    # Bridges are functions too, keyed like every other; the root port hangs from the host bridge alone.
    assert walked["0000:15:01.0"].switches == () and walked["0000:15:01.0"].root_id == ""
    assert list(walked) == sorted(walked, key=pci.bus_key)


def test_walk_reads_a_vf_parent_and_shares_the_parents_bridge_path(scenario):
    walked = pci.walk(scenario("sriov"))
    pf, vf = walked["0000:3b:00.0"], walked["0000:3b:01.3"]
    assert vf.physfn == "0000:3b:00.0" and vf.is_vf and not pf.is_vf
    assert vf.switches == pf.switches == ("0000:3a:00.0",)
    assert vf.device == "101e"


def test_walk_reports_unknown_numa_and_missing_cpulist_as_blank(scenario):
    fn = pci.walk(scenario("numa-unknown"))["0000:17:00.0"]
    assert fn.numa == "" and fn.cpus == ""


def test_walk_of_a_host_without_a_pci_bus_says_it_was_not_read(host_root):
    # Not an empty bus: nothing can be said about what is on a bus nobody read.
    with pytest.raises(pci.PciBusAbsent, match="/sys/bus/pci is absent"):
        pci.walk(HostRoot.at(host_root))


def test_walk_refuses_a_bus_link_that_leaves_the_root(builder, host_root):
    builder.nic("0000:17:00.0", "ens1", host_bridge="pci0000:16")
    outside = host_root.parent / "elsewhere" / "0000:99:00.0"
    outside.mkdir(parents=True)
    os.symlink(
        os.path.relpath(outside, host_root / "sys/bus/pci/devices"),
        host_root / "sys/bus/pci/devices/0000:99:00.0",
    )
    with pytest.raises(PathEscapesRoot):
        pci.walk(HostRoot.at(host_root))


def test_walk_refuses_an_oversized_attribute_rather_than_truncating(scenario):
    with pytest.raises(AttributeTooLarge):
        pci.walk(scenario("big-attribute"))


def test_placement_of_a_vmd_domain():
    path = "/sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0"
    assert pci.placement(path) == ("pci10000:e0", ("10000:e0:1d.0",))


def test_read_function_strips_0x_and_lowercases_ids(builder, host_root):
    builder.function("0000:01:00.0", vendor="10DE", device="ABCD", attrs={"numa_node": "1"})
    fn = pci.read_function(HostRoot.at(host_root).dir("/sys/bus/pci/devices/0000:01:00.0"))
    assert (fn.vendor, fn.device, fn.numa, fn.host_bridge) == ("10de", "abcd", "1", "pci0000:01")


# --- a function or VF that vanishes between listing and reading is gone, not a failed walk ------------------

PHANTOM_FUNCTION = "0000:ff:1f.7"


def listing_with(monkeypatch, directory_suffix: str, phantom: str) -> None:
    """Make one directory's listing name an entry that is gone by the time it is read: the window between
    listdir and lstat that a real teardown opens."""
    real = SysDir.list

    def listing(self: SysDir) -> list[str]:
        names = real(self)
        return sorted([*names, phantom]) if self.path.endswith(directory_suffix) else names

    monkeypatch.setattr(SysDir, "list", listing)


def test_walk_skips_a_function_that_vanished_after_listing(scenario, monkeypatch):
    host = scenario("down-beside-working")
    listing_with(monkeypatch, "/sys/bus/pci/devices", PHANTOM_FUNCTION)

    functions = pci.walk(host)

    assert PHANTOM_FUNCTION not in functions
    assert sorted(functions) == ["0000:17:00.0", "0000:18:00.0"]


def test_pass_survives_a_function_that_vanished_after_listing(scenario, monkeypatch):
    host = scenario("down-beside-working")
    listing_with(monkeypatch, "/sys/bus/pci/devices", PHANTOM_FUNCTION)

    reading = inventory.read(host)

    assert reading.interfaces is not None
    assert [i.name for i in reading.interfaces] == ["ens1np0", "ens2np0"]
    assert next(c for c in reading.conditions if c.type == INTERFACES_ENUMERATED).status == "True"


def test_vf_torn_down_after_listing_is_left_out_not_a_failure(scenario, monkeypatch):
    host = scenario("sriov")
    pf = "0000:3b:00.0"
    # virtfn99 is listed on the PF but gone when read, and the walk never saw its function.
    listing_with(monkeypatch, f"/{pf}", "virtfn99")

    reading = inventory.read(host)

    assert reading.interfaces is not None
    (iface,) = [i for i in reading.interfaces if i.pci_bus_id == pf]
    assert len(iface.virtual_functions) == 16
    assert next(c for c in reading.conditions if c.type == INTERFACES_ENUMERATED).status == "True"
