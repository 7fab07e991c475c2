from __future__ import annotations

import pytest

from nodefabric_devicemanager import rdma
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import LinkState
from nodefabric_devicemanager.rdma import PortReading
from nodefabric_devicemanager.testing.sysfs import Port


def port(n: str, state: str, phys: str) -> PortReading:
    return PortReading(port=n, state=state, phys_state=phys)


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("4: ACTIVE", "ACTIVE"),
        ("5: ACTIVE_DEFER", "ACTIVE_DEFER"),
        ("7: Phy Test", "Phy Test"),
        ("5:LinkUp", "LinkUp"),
    ],
)
def test_enum_name_is_the_whole_name(raw, name):
    assert rdma.enum_name(raw) == name


@pytest.mark.parametrize("raw", ["ACTIVE", "", "x: ACTIVE", None])
def test_enum_name_refuses_text_not_in_the_kernels_form(raw):
    assert rdma.enum_name(raw) is None


def test_one_active_linkup_port_is_ok():
    v = rdma.verdict("mlx5_0", [port("1", "1: DOWN", "3: Disabled"), port("2", "4: ACTIVE", "5: LinkUp")])
    assert v.state is LinkState.OK and "port 2" in v.reason


def test_active_defer_is_failed_never_active():
    v = rdma.verdict("mlx5_0", [port("1", "5: ACTIVE_DEFER", "5: LinkUp")])
    assert v.state is LinkState.FAILED
    assert "'5: ACTIVE_DEFER'" in v.reason and "'5: LinkUp'" in v.reason


def test_active_without_physical_link_is_failed():
    v = rdma.verdict("mlx5_0", [port("1", "4: ACTIVE", "2: Polling")])
    assert v.state is LinkState.FAILED


def test_failed_reason_carries_every_port_verbatim():
    v = rdma.verdict(
        "mlx5_3", [port("1", "1: DOWN", "3: Disabled"), port("2", "2: INIT", "4: PortConfigurationTraining")]
    )
    assert v.reason == (
        "mlx5_3: port 1 state '1: DOWN' phys_state '3: Disabled'; "
        "port 2 state '2: INIT' phys_state '4: PortConfigurationTraining'"
    )


def test_an_unreadable_port_beside_down_ones_is_unverified_not_failed():
    v = rdma.verdict(
        "mlx5_0", [port("1", "1: DOWN", "3: Disabled"), PortReading(port="2", error="Is a directory")]
    )
    assert v.state is LinkState.UNVERIFIED and "port 2 unreadable: Is a directory" in v.reason


def test_a_working_port_wins_over_an_unreadable_one():
    v = rdma.verdict("mlx5_0", [PortReading(port="1", error="boom"), port("2", "4: ACTIVE", "5: LinkUp")])
    assert v.state is LinkState.OK


def test_garbage_state_text_is_unverified():
    v = rdma.verdict("mlx5_0", [port("1", "ACTIVE", "5: LinkUp")])
    assert v.state is LinkState.UNVERIFIED and "not in the kernel's form" in v.reason


def test_no_ports_is_unverified():
    assert rdma.verdict("mlx5_0", []).state is LinkState.UNVERIFIED


def test_binding_reads_the_device_and_every_port_from_the_tree(builder, host_root):
    builder.nic(
        "0000:17:00.0",
        "ens1",
        host_bridge="pci0000:16",
        rdma="mlx5_7",
        ports=[Port(state="DOWN", phys_state="Disabled"), Port(state="ACTIVE_DEFER")],
    )
    fn = HostRoot.at(host_root).dir("/sys/bus/pci/devices/0000:17:00.0")
    b = rdma.binding(fn)
    assert b.device == "mlx5_7"
    assert b.link is not None and b.link.state is LinkState.FAILED
    assert "port 1 state '1: DOWN'" in b.link.reason and "port 2 state '5: ACTIVE_DEFER'" in b.link.reason


def test_binding_of_an_unreadable_tree_has_no_device_and_is_unverified(builder, host_root):
    builder.nic("0000:17:00.0", "ens1", host_bridge="pci0000:16")
    builder.unreadable_rdma("0000:17:00.0")
    b = rdma.binding(HostRoot.at(host_root).dir("/sys/bus/pci/devices/0000:17:00.0"))
    assert b.device == ""
    assert b.link is not None and b.link.state is LinkState.UNVERIFIED
    assert "/sys/devices/pci0000:16/0000:17:00.0/infiniband" in b.link.reason


def test_binding_of_a_function_without_rdma_is_empty(builder, host_root):
    builder.nic("0000:17:00.0", "ens1", host_bridge="pci0000:16")
    b = rdma.binding(HostRoot.at(host_root).dir("/sys/bus/pci/devices/0000:17:00.0"))
    assert (b.device, b.link) == ("", None)


def test_a_port_missing_its_phys_state_is_unverified(builder, host_root):
    builder.nic("0000:17:00.0", "ens1", host_bridge="pci0000:16", rdma="mlx5_0")
    (builder.functions["0000:17:00.0"] / "infiniband/mlx5_0/ports/1/phys_state").unlink()
    b = rdma.binding(HostRoot.at(host_root).dir("/sys/bus/pci/devices/0000:17:00.0"))
    assert b.link is not None and b.link.state is LinkState.UNVERIFIED
    assert "phys_state is missing" in b.link.reason
