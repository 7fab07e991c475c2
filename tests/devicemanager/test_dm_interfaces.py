from __future__ import annotations

import os
import re
import shutil

import pytest

from nodefabric_devicemanager import interfaces, pci, rdma
from nodefabric_devicemanager.hostroot import AttributeTooLarge, HostRoot, PathEscapesRoot, SysDir
from nodefabric_devicemanager.models import (
    DevicesSpec,
    LinkState,
)
from nodefabric_devicemanager.testing.scenarios import bench
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder


def read(host: HostRoot):
    return interfaces.read(host, pci.walk(host))


def by_name(ifaces):
    return {i.name: i for i in ifaces}


def test_pci_nic_carries_coordinates_ids_rdma_and_link(scenario):
    ifaces = by_name(read(scenario("gpu8")))
    nic = ifaces["ibp26s0"]
    assert nic.bus == "pci" and not nic.virtual
    assert nic.pci_bus_id == "0000:1a:00.0"
    assert nic.pci_switches == ["0000:17:02.0", "0000:16:00.0", "0000:15:01.0"]
    assert nic.pci_root_id == "0000:15:01.0" and nic.pci_host_bridge == "pci0000:15"
    assert (nic.pci_vendor, nic.pci_device) == ("15b3", "1021")
    assert (nic.numa_affinity, nic.cpu_affinity, nic.mtu, nic.up) == ("0", "0-55,112-167", 9000, True)
    assert nic.rdma and nic.rdma_device == "mlx5_0"
    assert nic.link is not None and nic.link.state is LinkState.OK
    assert not nic.sriov and nic.sriov_num_vfs == 0 and nic.virtual_functions == []


def test_published_list_is_sorted_by_name(scenario):
    names = [i.name for i in read(scenario("gpu8"))]
    assert names == sorted(names) == ["ens9np0", "ibp156s0", "ibp188s0", "ibp26s0", "ibp60s0", "lo"]


def test_vfs_nest_under_their_pf_in_bus_order_not_string_order(scenario):
    ifaces = read(scenario("sriov"))
    assert [i.name for i in ifaces] == ["ens2f0np0"]  # VF netdevs are not listed twice
    pf = ifaces[0]
    assert pf.sriov and pf.sriov_num_vfs == 16
    buses = [vf.pci_bus_id for vf in pf.virtual_functions]
    assert buses == sorted(buses, key=pci.bus_key) and len(buses) == 16
    assert [vf.name for vf in pf.virtual_functions][:3] == ["ens2f0v0", "ens2f0v1", "ens2f0v2"]
    assert pf.virtual_functions[10].name == "ens2f0v10"  # after ens2f0v9, as the bus says
    assert sorted(vf.name for vf in pf.virtual_functions) != [vf.name for vf in pf.virtual_functions]
    vf = pf.virtual_functions[0]
    assert (vf.pci_bus_id, vf.pci_device, vf.rdma_device) == ("0000:3b:00.1", "101e", "mlx5_2")
    assert vf.pci_switches == pf.pci_switches and vf.pci_root_id == pf.pci_root_id
    assert vf.link is not None and vf.link.state is LinkState.OK
    assert not vf.sriov


def test_vfs_of_one_pf_hold_one_copy_of_what_they_repeat(scenario):
    """The record is kept between walks: what every VF of a PF repeats (bridges, ids, NUMA node, CPUs,
    the PF's address) is one string object, not one per VF; what differs stays its own."""
    (pf,) = read(scenario("sriov"))
    first, second = pf.virtual_functions[0], pf.virtual_functions[1]
    for field in ("pci_root_id", "pci_host_bridge", "pci_vendor", "pci_device", "numa_affinity",
                  "cpu_affinity", "physical_function"):  # fmt: skip
        assert getattr(first, field) is getattr(second, field), field
    assert all(a is b for a, b in zip(first.pci_switches, second.pci_switches, strict=True))
    assert first.pci_switches is not second.pci_switches, "each VF has a list of its own to change"
    assert first.pci_bus_id != second.pci_bus_id


def test_a_readings_endpoints_share_one_fields_set_and_nothing_answers_differently(scenario):
    """pydantic's per-instance set of given field names is shared per class across a reading (a third of a
    big node's record); the wire form, equality, copies and assignment behave as before."""
    (pf,) = read(scenario("sriov"))
    first, second = pf.virtual_functions[0], pf.virtual_functions[1]
    assert first.model_fields_set is second.model_fields_set
    assert first.link is not None and second.link is not None
    assert first.link.model_fields_set is second.link.model_fields_set
    assert first.model_fields_set == set(type(first).model_fields)
    parsed = DevicesSpec.model_validate(DevicesSpec(interfaces=[pf]).wire())
    assert parsed.interfaces[0] == pf, "equal to the same record read back from its wire form"
    assert parsed.wire() == DevicesSpec(interfaces=[pf]).wire()
    copied = first.model_copy(update={"up": not first.up})
    assert copied.up != first.up and copied.model_fields_set is not first.model_fields_set
    assert second.up == first.up, "a copy's change touches no other endpoint"
    first.mtu = 1234
    assert first.model_fields_set == second.model_fields_set == set(type(first).model_fields)


def test_vf_only_rdma_node_still_shows_its_rdma_devices(scenario):
    (pf,) = read(scenario("vf-only-rdma"))
    assert not pf.rdma and pf.link is None
    assert [vf.name for vf in pf.virtual_functions] == ["", "", "", ""]
    assert [vf.rdma_device for vf in pf.virtual_functions] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert all(vf.numa_affinity == "1" for vf in pf.virtual_functions)


def test_a_vf_whose_pf_has_no_interface_stays_at_top_level(builder, host_root):
    builder.nic("0000:5e:00.0", None, host_bridge="pci0000:5d")  # PF bound to no netdev driver
    builder.sriov("0000:5e:00.0", vfs=2, netdev_prefix="ens3v")
    names = [i.name for i in read(HostRoot.at(host_root))]
    assert names == ["ens3v0", "ens3v1"]


def test_active_defer_port_fails_the_link(scenario):
    (nic,) = read(scenario("active-defer"))
    assert nic.rdma and nic.link is not None and nic.link.state is LinkState.FAILED
    assert "ACTIVE_DEFER" in nic.link.reason


def test_down_port_beside_working_nic(scenario):
    ifaces = by_name(read(scenario("down-beside-working")))
    down, up = ifaces["ens1np0"], ifaces["ens2np0"]
    assert down.link is not None and down.link.state is LinkState.FAILED and not down.up
    assert "'1: DOWN'" in down.link.reason and "'3: Disabled'" in down.link.reason
    assert up.link is not None and up.link.state is LinkState.OK


def test_unreadable_rdma_tree_is_unverified_without_a_device(scenario):
    ifaces = by_name(read(scenario("unreadable-rdma")))
    blind = ifaces["ens1np0"]
    assert not blind.rdma and blind.rdma_device == ""
    assert blind.link is not None and blind.link.state is LinkState.UNVERIFIED
    mixed = ifaces["ens2np0"]  # one unreadable port beside a DOWN one: "all down" is not established
    assert mixed.rdma_device == "mlx5_1"
    assert mixed.link is not None and mixed.link.state is LinkState.UNVERIFIED


def test_symlink_escaping_the_root_fails_enumeration(scenario):
    host = scenario("escaping-symlink")
    with pytest.raises(PathEscapesRoot, match="/sys/class/net/evil"):
        read(host)


def test_a_bridge_swapped_for_a_link_out_of_the_root_after_the_pci_walk_fails_enumeration(
    builder, host_root, tmp_path
):
    """The PCI walk resolved the function's directory; by the time /sys/class/net is read, a directory
    on the way there is a link to a copy outside the root. The interface's link, spelled through that
    path, lands outside: refused, never read from the copy (the walk's text shortcut for the link must
    not take the walk's old resolution for where the link lands now)."""
    builder.nic("0000:17:00.0", "ens1", host_bridge="pci0000:16")
    host = HostRoot.at(host_root)
    functions = pci.walk(host)
    bridge = builder.path("/sys/devices/pci0000:16")
    outside = tmp_path / "outside-bridge"
    shutil.copytree(bridge, outside, symlinks=True)
    (outside / "0000:17:00.0/net/ens1/mtu").write_text("4242\n")
    shutil.rmtree(bridge)
    os.symlink(outside, bridge)
    with pytest.raises(PathEscapesRoot, match=re.escape("/sys/class/net/ens1: resolves to ")):
        interfaces.read(host, functions)


def test_a_vf_netdev_swapped_for_a_link_out_of_the_root_after_enumeration_is_refused(
    host_root, tmp_path, monkeypatch
):
    """The interfaces were enumerated (the VF's netdev a real directory then); by the time the PF's VFs
    are read, the VF's netdev is a link to a copy outside the root. Refused, never read from the copy: a
    listing taken at enumeration is too old to stand in for the lstat when the VF is read."""
    bench(host_root, pfs=1, vfs=2)
    host = HostRoot.at(host_root)
    functions = pci.walk(host)
    netdev = host_root / "sys/devices/pci0000:10/0000:10:01.0/0000:11:00.1/net/ens0f0v0"
    outside = tmp_path / "outside-netdev"
    binding = rdma.binding

    def swap_then_bind(d: SysDir) -> rdma.Binding:
        # The VF's RDMA side is read just before its netdev: the moment to swap it.
        if d.name == "0000:11:00.1" and not netdev.is_symlink():
            shutil.copytree(netdev, outside, symlinks=True)
            (outside / "mtu").write_text("4242\n")
            shutil.rmtree(netdev)
            os.symlink(outside, netdev)
        return binding(d)

    monkeypatch.setattr(rdma, "binding", swap_then_bind)
    with pytest.raises(PathEscapesRoot, match=re.escape("0000:11:00.1/net/ens0f0v0: resolves to ")):
        interfaces.read(host, functions)
    assert netdev.is_symlink()


def test_an_oversized_netdev_attribute_fails_enumeration_rather_than_truncating(builder, host_root):
    builder.nic("0000:17:00.0", "ens1", host_bridge="pci0000:16")
    builder.write("/sys/devices/pci0000:16/0000:17:00.0/net/ens1/operstate", "u" * (70 * 1024))
    with pytest.raises(
        AttributeTooLarge, match=re.escape("/sys/devices/pci0000:16/0000:17:00.0/net/ens1/operstate")
    ):
        read(HostRoot.at(host_root))


def test_non_pci_interfaces_report_their_bus_and_empty_pci_fields(scenario):
    ifaces = by_name(read(scenario("non-pci")))
    eth0, end0, lo = ifaces["eth0"], ifaces["end0"], ifaces["lo"]
    assert (eth0.bus, eth0.mtu, eth0.up, eth0.virtual) == ("virtio", 1400, True, False)
    assert (end0.bus, end0.virtual) == ("platform", False)
    for i in (eth0, end0):
        assert (i.pci_bus_id, i.pci_root_id, i.pci_switches, i.pci_host_bridge) == ("", "", [], "")
        assert (i.pci_vendor, i.pci_device, i.numa_affinity, i.rdma) == ("", "", "", False)
    assert lo.virtual and lo.bus == "" and lo.up  # operstate "unknown" with IFF_UP


def test_virtual_interfaces_are_virtual_and_plain_files_are_skipped(scenario):
    ifaces = by_name(read(scenario("virtual-interfaces")))
    assert set(ifaces) == {"bond0", "bond0.100", "br0", "ens1f0", "ens1f1", "lo", "veth1a2b"}
    for name in ("bond0", "bond0.100", "br0", "veth1a2b", "lo"):
        assert ifaces[name].virtual and ifaces[name].pci_bus_id == ""
    assert ifaces["bond0"].up and ifaces["bond0"].mtu == 9000
    assert not ifaces["br0"].up and not ifaces["veth1a2b"].up
    assert not ifaces["ens1f0"].virtual and ifaces["ens1f0"].bus == "pci"


def test_numa_minus_one_reads_blank(scenario):
    (nic,) = read(scenario("numa-unknown"))
    assert nic.numa_affinity == "" and nic.cpu_affinity == ""


def test_missing_class_net_is_a_failure_not_an_empty_list(host_root):
    (host_root / "sys").mkdir()
    with pytest.raises(FileNotFoundError):
        interfaces.read(HostRoot.at(host_root), {})


def test_an_enumerated_empty_host_is_an_empty_list(builder, host_root):
    assert interfaces.read(HostRoot.at(host_root), {}) == []


@pytest.mark.parametrize(
    ("operstate", "flags", "up"),
    [
        ("up", "0x1002", True),
        ("unknown", "0x9", True),
        ("unknown", "0x1002", False),
        ("down", "0x1003", False),
        ("dormant", "0x1003", False),
        ("unknown", "junk", False),
        (None, None, False),
    ],
)
def test_is_up(operstate, flags, up):
    assert interfaces.is_up(operstate, flags) is up


def test_endpoints_lists_each_interface_then_its_vfs(scenario):
    eps = DevicesSpec(interfaces=read(scenario("sriov"))).endpoints()
    assert [e.name for e in eps][:3] == ["ens2f0np0", "ens2f0v0", "ens2f0v1"] and len(eps) == 17


# --- switchdev representors: listed, but the card is one RDMA endpoint --------------------------------------


def test_switchdev_representors_are_listed_but_the_card_is_one_rdma_endpoint(tmp_path):
    b = SysfsBuilder(tmp_path)
    b.nic("0000:17:00.0", "ens1f0np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0", verbs=0)
    b.write(b.functions["0000:17:00.0"] / "net/ens1f0np0/phys_port_name", "p0\n")
    for i in range(3):
        rep = b.netdev("0000:17:00.0", f"pf0vf{i}")
        b.write(rep / "phys_port_name", f"pf0vf{i}\n")
    host = HostRoot.at(tmp_path)
    found = {i.name: i for i in interfaces.read(host, pci.walk(host))}
    assert set(found) == {"ens1f0np0", "pf0vf0", "pf0vf1", "pf0vf2"}
    assert found["ens1f0np0"].rdma_device == "mlx5_0" and found["ens1f0np0"].link is not None
    for name in ("pf0vf0", "pf0vf1", "pf0vf2"):
        rep = found[name]
        assert (rep.bus, rep.pci_bus_id, rep.numa_affinity) == ("pci", "0000:17:00.0", "0")
        assert not rep.rdma and rep.rdma_device == "" and rep.link is None
    assert [e.rdma_device for e in DevicesSpec(interfaces=list(found.values())).endpoints() if e.rdma] == [
        "mlx5_0"
    ]


def test_a_port_name_the_driver_will_not_give_is_no_representor_and_no_failure(tmp_path):
    b = SysfsBuilder(tmp_path)
    b.nic("0000:17:00.0", "ens1f0np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0", verbs=0)
    # Reading phys_port_name fails (EOPNOTSUPP on a real node; a directory here): not a representor.
    b.mkdir("/sys/devices/pci0000:16/0000:17:00.0/net/ens1f0np0/phys_port_name")
    host = HostRoot.at(tmp_path)
    (iface,) = interfaces.read(host, pci.walk(host))
    assert iface.rdma_device == "mlx5_0"
