from __future__ import annotations

import json
from datetime import UTC, datetime

import pynvml
import yaml

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.accelerators import Libraries, vendors
from nodefabric_devicemanager.accelerators.library import LibraryUnavailable
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.commands.inventory import document
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import (
    INTERFACES_ENUMERATED,
    Accelerator,
    AcceleratorGroup,
    Devices,
    DevicesSpec,
    LinkState,
)
from nodefabric_devicemanager.testing.accelerators import RecordedFabric, nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_operator import console


class NoNvml:
    """The NVML boundary on a host without the library: every call says it is unavailable."""

    def __getattr__(self, name):
        def unavailable(*args, **kwargs):
            raise LibraryUnavailable("nvml: not installed")

        return unavailable


def condition(reading, type_):
    return next(c for c in reading.conditions if c.type == type_)


def test_a_good_pass_enumerates_and_says_so(scenario):
    r = inventory.read(scenario("sriov"))
    assert r.interfaces is not None and len(r.interfaces) == 1
    cond = condition(r, INTERFACES_ENUMERATED)
    assert cond.status == "True" and cond.message == "1 interfaces read from /sys/class/net"
    assert "0000:3b:00.0" in r.pci and r.groups == []


def test_failed_enumeration_is_none_and_a_false_condition(scenario):
    r = inventory.read(scenario("escaping-symlink"))
    assert r.interfaces is None
    cond = condition(r, INTERFACES_ENUMERATED)
    assert (
        cond.status == "False"
        and cond.reason == "EnumerationFailed"
        and "/sys/class/net/evil" in cond.message
    )
    assert not r.ok


def test_failed_pci_walk_fails_interfaces_and_accelerators(scenario):
    r = inventory.read(scenario("big-attribute"))
    assert r.interfaces is None and r.pci == {}
    assert condition(r, INTERFACES_ENUMERATED).reason == "PciWalkFailed"
    assert condition(r, "AcceleratorsEnumerated").status == "False"


def test_accelerators_are_read_from_the_same_walk(scenario):
    r = inventory.read(scenario("gpu8"), libraries=Libraries(nvidia=NoNvml()))
    gpus = [a for g in r.groups for a in g.accelerators]
    assert len(gpus) == 8
    by_bus = {a.topology.pci_bus_id: a.topology for a in gpus}
    assert by_bus["0000:18:00.0"].pci_switches == list(r.pci["0000:18:00.0"].switches)
    assert r.status().best_distance == "PIX"


def test_status_counts_usable_rdma_endpoints(scenario):
    r = inventory.read(scenario("down-beside-working"))
    assert r.status().rdma_endpoints == 1  # the failed one is not usable


def test_status_counts_unverified_endpoints_with_or_without_a_device(scenario):
    assert inventory.read(scenario("unreadable-rdma")).status().rdma_endpoints == 2


def run(capsys, *argv):
    code = console.main(list(argv))
    out = capsys.readouterr().out
    return code, out


def test_inventory_json_is_spec_and_status_that_round_trip(scenario, host_root, capsys):
    scenario("sriov")
    code, out = run(capsys, "inventory", "--root", str(host_root), "--output", "json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"spec", "status"}
    assert doc["spec"]["interfaces"][0]["pciBusId"] == "0000:3b:00.0"
    assert doc["spec"]["interfaces"][0]["virtualFunctions"][0]["rdmaDevice"] == "mlx5_2"
    devices = Devices.from_wire({"metadata": {"name": "n1"}, **doc})
    assert devices.spec.interfaces[0].virtual_functions[15].pci_bus_id == "0000:3b:02.0"
    assert devices.status.condition(INTERFACES_ENUMERATED) is not None


def test_inventory_yaml(scenario, host_root, capsys):
    scenario("non-pci")
    code, out = run(capsys, "inventory", "--root", str(host_root), "-o", "yaml")
    assert code == 0
    doc = yaml.safe_load(out)
    assert [i["name"] for i in doc["spec"]["interfaces"]] == ["end0", "eth0", "lo"]
    assert doc["spec"]["interfaces"][1]["bus"] == "virtio"


def test_inventory_table_nests_vfs(scenario, host_root, capsys):
    scenario("vf-only-rdma")
    code, out = run(capsys, "inventory", "--root", str(host_root), "--output", "table")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["NAME", "BUS", "PCI"]
    assert lines[1].startswith("ens3f0 ")
    assert "(no netdev)" in lines[2] and "mlx5_0" in lines[2] and "ok" in lines[2]


def test_inventory_exits_nonzero_when_the_pass_failed(scenario, host_root, capsys):
    scenario("escaping-symlink")
    code, out = run(capsys, "inventory", "--root", str(host_root))
    assert code == 1
    doc = json.loads(out)
    assert "interfaces" not in doc["spec"]  # not read is not empty
    conditions = {c["type"]: c for c in doc["status"]["conditions"]}
    assert conditions[INTERFACES_ENUMERATED]["status"] == "False"


def test_preflight_prints_a_row_per_rdma_endpoint_and_a_summary(scenario, host_root, capsys):
    scenario("down-beside-working")
    code, out = run(capsys, "preflight", "--root", str(host_root))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "PCI", "RDMA", "VERDICT", "REASON"]
    assert lines[1].split()[:4] == ["ens1np0", "0000:17:00.0", "mlx5_0", "failed"]
    assert "mlx5_0: port 1 state '1: DOWN' phys_state '3: Disabled'" in lines[1]
    assert lines[2].split()[:4] == ["ens2np0", "0000:18:00.0", "mlx5_1", "ok"]
    assert lines[-1] == "2 rdma endpoints: 1 ok, 0 unverified, 1 failed; node is rdma capable"


def test_preflight_lists_unreadable_trees_and_vfs(scenario, host_root, capsys):
    scenario("unreadable-rdma")
    code, out = run(capsys, "preflight", "--root", str(host_root))
    assert code == 0
    assert "ens1np0  0000:17:00.0  -       unverified" in out
    assert out.splitlines()[-1] == "2 rdma endpoints: 0 ok, 2 unverified, 0 failed; node is rdma capable"


def test_preflight_on_a_node_where_every_link_failed(scenario, host_root, capsys):
    scenario("active-defer")
    code, out = run(capsys, "preflight", "--root", str(host_root))
    assert code == 0 and out.splitlines()[-1].endswith("node is not rdma capable")


def test_preflight_exits_one_when_the_pass_failed(scenario, host_root, capsys):
    scenario("big-attribute")
    code, out = run(capsys, "preflight", "--root", str(host_root))
    assert code == 1 and "the pass failed" in out and "larger than 65536 bytes" in out


def test_preflight_rows_carry_the_verdict_of_the_reading(scenario):
    r = inventory.read(scenario("vf-only-rdma"))
    from nodefabric_devicemanager.commands import preflight

    rows = preflight.rows(r)
    assert [row.rdma_device for row in rows] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert {row.verdict for row in rows} == {LinkState.OK.value}


def test_hostroot_default_is_the_real_root():
    assert HostRoot.at("/").root == "/"


# --- the node's fabric domain in the printed status; a failed walk keeps every recorded group ---------------

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
