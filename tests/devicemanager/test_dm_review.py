"""Review fixes. A PCI function or virtual function that disappears while a pass reads the host (hot-unplug,
`sriov_numvfs` lowered) is gone, not a failed enumeration that would freeze the whole record.
`inventory` prints the node's fabric domain as `kubectl get devices` shows it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pynvml

from nodefabric_devicemanager import interfaces, inventory, pci
from nodefabric_devicemanager.accelerators import Libraries, vendors
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.commands.inventory import document
from nodefabric_devicemanager.hostroot import HostRoot, SysDir
from nodefabric_devicemanager.models import INTERFACES_ENUMERATED, Accelerator, AcceleratorGroup, DevicesSpec
from nodefabric_devicemanager.testing.accelerators import RecordedFabric, nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

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


UUID = bytes.fromhex("5b0e112233445566778899aabbccddef")


def test_inventory_status_prints_the_node_fabric_domain(builder: SysfsBuilder) -> None:
    nvml = nvswitch_node(
        builder, cluster_uuid=UUID, clique_id=3, state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    )

    reading = inventory.read(HostRoot.at(builder.root), libraries=Libraries(nvidia=Nvml(nvml)))

    doc = json.loads(json.dumps(document(reading)))
    assert doc["status"]["fabricDomain"] == "nvlink-5b0e112233445566778899aabbccddef-3"


def test_inventory_status_names_no_domain_when_accelerators_disagree(builder: SysfsBuilder) -> None:
    nvml = nvswitch_node(
        builder, cluster_uuid=UUID, clique_id=3, state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    )
    # One GPU in another clique of the same cluster: the node has no single domain.
    nvml.gpus[7].fabric = RecordedFabric(cluster_uuid=UUID, clique_id=4)

    reading = inventory.read(HostRoot.at(builder.root), libraries=Libraries(nvidia=Nvml(nvml)))

    assert reading.status().fabric_domain == ""


def test_failed_walk_marks_every_manufacturer_failed(scenario) -> None:
    # The walk read nothing, so no manufacturer's recorded groups may be replaced by this reading's [].
    reading = inventory.read(scenario("big-attribute"))

    assert reading.groups == []
    assert reading.failed_manufacturers == {m.key for m in vendors.MANUFACTURERS}
    assert {"nvidia", "amd", "ascend"} <= reading.failed_manufacturers


def test_failed_walk_keeps_the_recorded_groups_when_published(scenario) -> None:
    recorded = DevicesSpec(
        groups=[
            AcceleratorGroup(
                id="nvidia",
                manufacturer="NVIDIA",
                accelerators=[Accelerator(id="0000:17:00.0", index=0)],
            )
        ]
    )
    reading = inventory.read(scenario("big-attribute"))

    published = publish.desired_spec(reading, recorded, datetime.now(UTC))

    assert published.groups == recorded.groups


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
