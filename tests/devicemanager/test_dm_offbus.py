"""RDMA off the PCI bus (seed 004, issue 13): platform RDMA engines, software RDMA, and VFs whose PF has
no host netdev, each through `nodefabric inventory` / `preflight` / `labels` on a fixture tree."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.scenarios import SCENARIOS
from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder
from nodefabric_operator.console import main

CAPABLE = "feature.gpustack.ai/rdma.capable"


def inventory(capsys, root):
    code = main(["inventory", "--root", str(root)])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def by_name(doc):
    return {i["name"]: i for i in doc["spec"]["interfaces"]}


def labels(capsys, monkeypatch, doc):
    """The operator's own label set for this record, through `nodefabric labels -f -`."""
    record = {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "Devices",
        "metadata": {"name": "n"},
        **doc,
    }
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(record)))
    assert main(["labels", "-f", "-", "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_platform_nic_records_the_rdma_device_beside_it(host_root, capsys, monkeypatch):
    SCENARIOS["platform-rdma"](host_root)
    doc = inventory(capsys, host_root)
    end0 = by_name(doc)["end0"]
    assert (end0["bus"], end0["pciBusId"], end0["rdma"], end0["rdmaDevice"]) == (
        "platform",
        "",
        True,
        "hns_0",
    )
    assert end0["link"]["state"] == "ok" and end0["rdmaSoftware"] is False
    assert doc["status"]["rdmaEndpoints"] == 1
    assert labels(capsys, monkeypatch, doc)[CAPABLE] == "true"


def test_the_device_plugin_serves_a_platform_endpoint_from_the_record(host_root, capsys):
    from nodefabric_deviceplugin import resources, verbs

    SCENARIOS["platform-rdma"](host_root)
    spec = DevicesSpec.model_validate(inventory(capsys, host_root)["spec"])
    for family in (resources.Family.EXCLUSIVE, resources.Family.SHARED):
        view = resources.view(spec, family, 2)
        assert [(e.rdma_device, e.healthy) for e in view.endpoints] == [("hns_0", True)]
    # What an Allocate resolves the endpoint to: its own verbs device, found through the class.
    assert verbs.resolve_uverbs(HostRoot.at(host_root), "hns_0") == "/dev/infiniband/uverbs0"


def test_a_split_platform_engine_binds_each_port_to_its_own_interface(host_root, capsys):
    SCENARIOS["split-platform-rdma"](host_root)
    doc = inventory(capsys, host_root)
    eth0, eth1 = by_name(doc)["eth0"], by_name(doc)["eth1"]
    assert eth0["rdmaDevice"] == eth1["rdmaDevice"] == "hns_0"
    # Each interface's verdict is over the ports that ride on it.
    assert eth0["link"] == {"state": "ok", "reason": "hns_0: port 1 ACTIVE LinkUp"}
    assert eth1["link"]["state"] == "failed" and "port 2 state '1: DOWN'" in eth1["link"]["reason"]
    assert "port 1" not in eth1["link"]["reason"]
    assert doc["status"]["rdmaEndpoints"] == 1


def test_a_software_rdma_device_is_recorded_but_makes_no_node_capable(host_root, capsys, monkeypatch):
    SCENARIOS["soft-rdma"](host_root)
    doc = inventory(capsys, host_root)
    eth0 = by_name(doc)["eth0"]
    assert (eth0["bus"], eth0["rdma"], eth0["rdmaDevice"], eth0["rdmaSoftware"]) == (
        "virtio",
        True,
        "rxe0",
        True,
    )
    assert eth0["link"]["state"] == "ok"
    assert doc["status"]["rdmaEndpoints"] == 0
    assert CAPABLE not in labels(capsys, monkeypatch, doc)
    assert main(["preflight", "--root", str(host_root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:4] == ["eth0", "-", "rxe0", "(software)"]
    summary = "1 rdma endpoints (1 software, not counted): 1 ok, 0 unverified, 0 failed"
    assert out[-1] == f"{summary}; node is not rdma capable"


def test_a_software_device_without_a_parent_attribute_binds_through_its_gid_netdev(
    builder, host_root, capsys
):
    builder.virtio("eth0", "0000:00:03.0")
    builder.soft_rdma("siw0", None, ports=[Port(gid_netdevs=(None, "eth0"))])
    eth0 = by_name(inventory(capsys, host_root))["eth0"]
    assert (eth0["rdmaDevice"], eth0["rdmaSoftware"], eth0["link"]["state"]) == ("siw0", True, "ok")


def test_a_hardware_binding_wins_over_a_software_device_on_the_same_interface(builder, host_root, capsys):
    builder.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", rdma="mlx5_0")
    builder.soft_rdma("rxe0", "ens1np0")
    nic = by_name(inventory(capsys, host_root))["ens1np0"]
    assert (nic["rdmaDevice"], nic["rdmaSoftware"]) == ("mlx5_0", False)


def test_a_device_riding_on_an_interface_that_is_not_here_is_not_bound(builder, host_root, capsys):
    builder.virtio("eth0", "0000:00:03.0")
    builder.soft_rdma("rxe0", "eth7")  # eth7 is in another network namespace
    # A PF whose netdev moved into a pod: its RDMA device names a netdev that shares a local name.
    builder.nic(
        "0000:17:00.0", None, host_bridge="pci0000:16", rdma="mlx5_0", ports=[Port(gid_netdevs=("eth0",))]
    )
    eth0 = by_name(inventory(capsys, host_root))["eth0"]
    assert not eth0["rdma"] and "link" not in eth0


def test_an_unreadable_rdma_class_fails_enumeration_rather_than_losing_the_engine(host_root, capsys):
    SCENARIOS["split-platform-rdma"](host_root)
    cls = host_root / "sys/class/infiniband"
    outside = host_root.parent / "elsewhere"
    outside.mkdir()
    for entry in cls.iterdir():
        entry.unlink()
    cls.rmdir()
    os.symlink(os.path.relpath(outside, cls.parent), cls)
    assert main(["inventory", "--root", str(host_root)]) == 1
    doc = json.loads(capsys.readouterr().out)
    cond = {c["type"]: c for c in doc["status"]["conditions"]}["InterfacesEnumerated"]
    assert cond["status"] == "False" and "/sys/class/infiniband" in cond["message"]


def test_vfs_whose_pf_has_no_netdev_are_listed_and_still_vfs(host_root, capsys, monkeypatch):
    SCENARIOS["pf-without-netdev"](host_root)
    doc = inventory(capsys, host_root)
    vfs = doc["spec"]["interfaces"]
    assert [(v["name"], v["pciBusId"], v["physicalFunction"]) for v in vfs] == [
        ("ens3f0v0", "0000:5e:00.1", "0000:5e:00.0"),
        ("ens3f0v1", "0000:5e:00.2", "0000:5e:00.0"),
    ]
    assert [v["rdmaDevice"] for v in vfs] == ["mlx5_0", "mlx5_1"]
    assert labels(capsys, monkeypatch, doc)[CAPABLE] == "true"


def test_nested_vfs_name_their_pf_too_and_a_pf_names_none(host_root, capsys):
    SCENARIOS["sriov"](host_root)
    [pf] = inventory(capsys, host_root)["spec"]["interfaces"]
    assert pf["physicalFunction"] == ""
    assert {vf["physicalFunction"] for vf in pf["virtualFunctions"]} == {"0000:3b:00.0"}


def test_a_physfn_link_that_names_no_pci_function_fails_the_walk(host_root, capsys):
    b = SysfsBuilder(host_root)
    b.nic("0000:5e:00.0", "ens3f0", host_bridge="pci0000:5d")
    [vf] = b.sriov("0000:5e:00.0", vfs=1)
    target = b.path("/sys/devices/platform/evil")
    target.mkdir(parents=True)
    b.link(b.functions[vf] / "physfn", target)
    assert main(["inventory", "--root", str(host_root)]) == 1
    doc = json.loads(capsys.readouterr().out)
    message = {c["type"]: c for c in doc["status"]["conditions"]}["InterfacesEnumerated"]["message"]
    assert "physfn: points at 'evil', not a PCI function" in message


@pytest.mark.parametrize(
    "scenario", ["platform-rdma", "split-platform-rdma", "soft-rdma", "pf-without-netdev"]
)
def test_off_bus_scenarios_read_the_same_twice(host_root, capsys, scenario):
    # Sorted and stable: the agent compares passes, so a second pass must equal the first.
    SCENARIOS[scenario](host_root)
    assert inventory(capsys, host_root)["spec"] == inventory(capsys, host_root)["spec"]


def test_a_refresh_can_judge_a_split_engine_over_the_ports_the_pass_used(host_root):
    from nodefabric_devicemanager import rdma, rdmaclass

    SCENARIOS["split-platform-rdma"](host_root)
    host = HostRoot.at(host_root)
    assert rdmaclass.ports_on(host, "hns_0", "eth0") == {"1"}
    assert rdmaclass.ports_on(host, "hns_0", "eth1") == {"2"}
    device = host.dir("/sys/class/infiniband/hns_0")
    assert rdma.check(device, rdmaclass.ports_on(host, "hns_0", "eth1")).state.value == "failed"


def test_every_port_counts_for_a_device_bound_through_its_parent(host_root):
    from nodefabric_devicemanager import rdmaclass

    SCENARIOS["platform-rdma"](host_root)
    assert rdmaclass.ports_on(HostRoot.at(host_root), "hns_0", "end0") is None
    SCENARIOS["sriov"](host_root)
    assert rdmaclass.ports_on(HostRoot.at(host_root), "mlx5_0", "ens2f0np0") is None
