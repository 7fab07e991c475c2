"""detect(): accelerators from the one PCI walk, links and fabric from recorded vendor answers."""

from __future__ import annotations

import json
import logging

import pynvml
import pytest

from nodefabric_devicemanager import distance, pci
from nodefabric_devicemanager.accelerators import Libraries, detect, failed_reading
from nodefabric_devicemanager.accelerators.ascend import AscendAnswer, NoAscend
from nodefabric_devicemanager.accelerators.detect import forget_reported
from nodefabric_devicemanager.accelerators.fabric import INVALID
from nodefabric_devicemanager.accelerators.nvidia import NoNvidia, Nvml
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import ACCELERATORS_ENUMERATED, DevicesStatus
from nodefabric_devicemanager.testing.accelerators import (
    HGX_GPUS,
    SWITCH,
    FakeAscend,
    FakeNvml,
    RecordedFabric,
    RecordedGpu,
    amd_gpu,
    gpu_function,
    kfd_topology,
    npu_function,
    nvml_bus_id,
    nvswitch_node,
    spod,
)
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_operator.console import main

UUID = bytes.fromhex("5b0e112233445566778899aabbccddef")
COMPLETED = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED


def run(b: SysfsBuilder, nvml=None, ascend=None):
    host = HostRoot.at(b.root)
    libs = Libraries(nvidia=nvml or NoNvidia(), ascend=ascend or NoAscend())
    if isinstance(libs.nvidia, FakeNvml):
        libs.nvidia = Nvml(libs.nvidia)
    return detect(host, pci.walk(host), libs)


def cond(reading, type_):
    return next(c for c in reading.conditions if c.type == type_)


@pytest.fixture
def b(tmp_path):
    return SysfsBuilder(tmp_path)


# --- NVIDIA ---------------------------------------------------------------------------------------------


def test_nvlink_clique_node(b):
    nvml = nvswitch_node(b, cluster_uuid=UUID, clique_id=3, state=COMPLETED)
    reading = run(b, nvml)
    [group] = reading.groups
    assert (group.id, group.manufacturer) == ("nvidia", "NVIDIA")
    assert [a.index for a in group.accelerators] == list(range(8))
    assert [a.topology.pci_bus_id for a in group.accelerators] == HGX_GPUS  # PCI bus order
    for acc in group.accelerators:
        assert acc.topology.fabric is not None
        assert acc.topology.fabric.wire() == {
            "kind": "nvlink",
            "id": "5b0e112233445566778899aabbccddef",
            "type": "",
            "cliqueId": 3,
            "memberCount": 0,
            "endpoints": [],
        }
        assert acc.topology.links == {str(p): "NV18" for p in range(8) if p != acc.index}
    assert cond(reading, "NvidiaFabricRead").status == "True"
    assert cond(reading, ACCELERATORS_ENUMERATED).status == "True"
    assert reading.failed == []
    assert nvml.initialized == 0  # every init was matched by a shutdown


def test_coordinates_compare_equal_with_the_interfaces_by_construction(b):
    nvswitch_node(b)
    host = HostRoot.at(b.root)
    walked = pci.walk(host)
    reading = detect(host, walked, Libraries(nvidia=NoNvidia(), ascend=NoAscend()))
    gpu0 = reading.groups[0].accelerators[0].topology
    fn = walked[HGX_GPUS[0]]
    assert (gpu0.pci_root_id, tuple(gpu0.pci_switches), gpu0.pci_host_bridge) == (
        fn.root_id,
        fn.switches,
        fn.host_bridge,
    )
    assert (gpu0.numa_affinity, gpu0.cpu_affinity) == ("0", "0-55")
    nic = walked["0000:1c:00.0"]  # the NIC behind GPU0's PCIe switch
    assert distance.distance(gpu0, distance.of(nic)).name == "PIX"


def test_single_board_without_fabric_still_reports_nvlinks(b):
    reading = run(b, nvswitch_node(b))
    for acc in reading.groups[0].accelerators:
        assert acc.topology.fabric is None
        assert set(acc.topology.links.values()) == {"NV18"}
    assert cond(reading, "NvidiaFabricRead").status == "True"


@pytest.mark.parametrize(
    ("fabric", "published"),
    [
        (RecordedFabric(state=COMPLETED, cluster_uuid=UUID), True),
        (RecordedFabric(state=pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, cluster_uuid=UUID), False),
        (RecordedFabric(state=pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, cluster_uuid=UUID), False),
        (RecordedFabric(state=pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED), False),
        (RecordedFabric(state=COMPLETED, status=pynvml.NVML_ERROR_UNKNOWN, cluster_uuid=UUID), False),
        (RecordedFabric(state=COMPLETED, cluster_uuid=bytes(16)), False),
        (None, False),  # nvmlDeviceGetGpuFabricInfoV answers NOT_SUPPORTED
    ],
)
def test_nvml_fabric_states_through_the_real_structs(b, fabric, published):
    gpu_function(b, "0000:17:00.0")
    nvml = FakeNvml([RecordedGpu("00000000:17:00.0", fabric=fabric)])
    reading = run(b, nvml)
    acc = reading.groups[0].accelerators[0]
    assert (acc.topology.fabric is not None) is published
    assert cond(reading, "NvidiaFabricRead").status == "True"  # every answer above is an answer
    assert "nvmlDeviceGetGpuFabricInfoV" in nvml.calls


def test_driver_without_the_v3_struct_is_asked_with_v2(b):
    gpu_function(b, "0000:17:00.0")
    fabric = RecordedFabric(state=COMPLETED, cluster_uuid=UUID, clique_id=9)
    reading = run(b, FakeNvml([RecordedGpu("00000000:17:00.0", fabric=fabric, only_v2=True)]))
    f = reading.groups[0].accelerators[0].topology.fabric
    assert f is not None
    assert (f.id, f.clique_id) == (UUID.hex(), 9)


def test_library_missing_lists_accelerators_without_fabric(b, caplog):
    forget_reported()  # an earlier test's identical problem would make this one's Warning a repeat
    nvswitch_node(b, cluster_uuid=UUID, state=COMPLETED)
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with caplog.at_level(logging.WARNING):
        reading = run(b, nvml)
    [group] = reading.groups
    assert len(group.accelerators) == 8
    assert all(a.topology.fabric is None for a in group.accelerators)
    # Links fall back to the bus: NVLink is unknown, the PCIe path is not.
    assert group.accelerators[0].topology.links["1"] == "NODE"
    assert group.accelerators[0].topology.links["4"] == "SYS"
    c = cond(reading, "NvidiaFabricRead")
    assert (c.status, c.reason) == ("False", "LibraryUnavailable")
    assert "Shared Library Not Found" in c.message
    assert reading.failed == ["nvidia"]
    assert cond(reading, ACCELERATORS_ENUMERATED).status == "True"
    assert "could not read the accelerator fabric" in caplog.text
    # The operator reads this as "could not read": fabric-label removal is skipped.
    assert DevicesStatus(conditions=reading.conditions).fabric_unread()


def test_pynvml_not_importable_is_library_unavailable(b):
    gpu_function(b, "0000:17:00.0")
    reading = run(b, NoNvidia())
    c = cond(reading, "NvidiaFabricRead")
    assert (c.status, c.reason) == ("False", "LibraryUnavailable")


def test_one_gpu_failing_its_fabric_query_is_a_partial_read(b):
    gpu_function(b, "0000:17:00.0")
    gpu_function(b, "0000:65:00.0", numa=1)
    good = RecordedFabric(state=COMPLETED, cluster_uuid=UUID)
    nvml = FakeNvml(
        [
            RecordedGpu("00000000:17:00.0", fabric=good),
            RecordedGpu("00000000:65:00.0", fabric=pynvml.NVML_ERROR_GPU_IS_LOST),
        ]
    )
    reading = run(b, nvml)
    a, c = reading.groups[0].accelerators
    assert a.topology.fabric is not None
    assert c.topology.fabric is None
    condition = cond(reading, "NvidiaFabricRead")
    assert (condition.status, condition.reason) == ("False", "ReadFailed")
    assert "0000:65:00.0" in condition.message
    assert reading.failed == ["nvidia"]


def test_gpu_nvml_does_not_see_is_a_partial_read(b):
    gpu_function(b, "0000:17:00.0")
    gpu_function(b, "0000:65:00.0", numa=1)
    reading = run(b, FakeNvml([RecordedGpu("00000000:17:00.0")]))
    condition = cond(reading, "NvidiaFabricRead")
    assert condition.status == "False"
    assert "0000:65:00.0: no answer from nvml" in condition.message


def test_nvlink_bridge_pairs_and_pcie_paths(b):
    # Four PCIe GPUs; 0+1 and 2+3 joined by NVLink bridges (4 links each), sockets 0 and 1.
    bus = ["0000:17:00.0", "0000:18:00.0", "0000:ca:00.0", "0000:cb:00.0"]
    for i, bid in enumerate(bus):
        gpu_function(b, bid, numa=0 if i < 2 else 1, device="20b5")
    gpus = [
        RecordedGpu(nvml_bus_id(bus[0]), links=[nvml_bus_id(bus[1])] * 4),
        RecordedGpu(nvml_bus_id(bus[1]), links=[nvml_bus_id(bus[0])] * 4 + [None] * 8),
        RecordedGpu(nvml_bus_id(bus[2]), links=[nvml_bus_id(bus[3])] * 4),
        RecordedGpu(nvml_bus_id(bus[3]), links=[nvml_bus_id(bus[2])] * 4),
    ]
    reading = run(b, FakeNvml(gpus))
    links = [a.topology.links for a in reading.groups[0].accelerators]
    assert links[0] == {"1": "NV4", "2": "SYS", "3": "SYS"}
    assert links[3] == {"0": "SYS", "1": "SYS", "2": "NV4"}


def test_pcie_gpus_without_nvlink_use_bus_distance(b):
    b.bridge("0000:16:01.0", host_bridge="pci0000:16")
    b.switch("0000:17:00.0", ["0000:18:00.0", "0000:18:01.0"], parent="0000:16:01.0")
    gpu_function(b, "0000:19:00.0", parent="0000:18:00.0")
    gpu_function(b, "0000:1a:00.0", parent="0000:18:01.0")
    gpu_function(b, "0000:ca:00.0", numa=1)
    reading = run(
        b, FakeNvml([RecordedGpu(nvml_bus_id(x)) for x in ("0000:19:00.0", "0000:1a:00.0", "0000:ca:00.0")])
    )
    links = [a.topology.links for a in reading.groups[0].accelerators]
    assert links[0] == {"1": "PIX", "2": "SYS"}


def test_audio_functions_bridges_and_virtual_functions_are_not_accelerators(b):
    gpu_function(b, "0000:17:00.0", audio=True, class_code="030000")
    b.function("0000:20:00.0", vendor="10de", device="22a3", class_code="068000")  # NVSwitch
    b.function("0000:21:00.0", vendor="10de", device="1ad8", class_code="060400")  # NVIDIA bridge
    b.function("0000:00:00.0", vendor="1d94", device="1450", class_code="060000")  # Hygon host bridge
    b.function("0000:3b:00.4", vendor="10de", device="2330", class_code="030200", attrs={})
    b.link("/sys/devices/pci0000:3b/0000:3b:00.4/physfn", "/sys/devices/pci0000:3b/0000:3b:00.0")
    b.function("0000:3b:00.0", vendor="10de", device="2330", class_code="030200")
    reading = run(b)
    [group] = reading.groups
    assert [a.id for a in group.accelerators] == ["0000:17:00.0", "0000:3b:00.0"]


def test_no_accelerators_is_an_enumerated_empty_reading(b):
    b.nic("0000:17:00.0", "ens1", rdma="mlx5_0")
    nvml = FakeNvml([])
    reading = run(b, nvml)
    assert reading.groups == []
    assert [c.type for c in reading.conditions] == [ACCELERATORS_ENUMERATED]
    assert nvml.calls == []  # no NVIDIA GPU on the bus: NVML is never opened


def test_failed_walk_reading_says_so():
    reading = failed_reading("/sys/bus/pci/devices: Permission denied")
    c = cond(reading, ACCELERATORS_ENUMERATED)
    assert (c.status, c.reason) == ("False", "ReadFailed")
    assert DevicesStatus(conditions=reading.conditions).fabric_unread()


# --- AMD ------------------------------------------------------------------------------------------------

MI300 = ["0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0"]
HIVE = 0x2D3C4B5A69788796


def test_amd_hive_from_kfd_counts_gpu_nodes_only(b):
    for i, bid in enumerate(MI300):
        amd_gpu(b, bid, numa=0 if i < 2 else 1)
    # The CPU nodes carry the hive id too (as on an APU); they are not members.
    kfd_topology(b, [(bid, HIVE) for bid in MI300], cpu_nodes=2, cpu_hive=HIVE)
    reading = run(b)
    [group] = reading.groups
    assert group.id == "amd"
    for acc in group.accelerators:
        assert acc.topology.fabric is not None
        assert acc.topology.fabric.wire() == {
            "kind": "xgmi",
            "id": str(HIVE),
            "type": "",
            "memberCount": 4,
            "endpoints": [],
        }
        assert set(acc.topology.links.values()) == {"LINK"}
    assert cond(reading, "AmdFabricRead").status == "True"


def test_amd_hive_zero_is_no_hive_and_links_fall_back_to_the_bus(b):
    amd_gpu(b, MI300[0])
    amd_gpu(b, MI300[1], numa=1)
    kfd_topology(b, [(MI300[0], 0), (MI300[1], 0)])
    reading = run(b)
    a0, _ = reading.groups[0].accelerators
    assert a0.topology.fabric is None
    assert a0.topology.links == {"1": "SYS"}
    assert cond(reading, "AmdFabricRead").status == "True"


def test_amd_without_kfd_reads_xgmi_hive_info(b):
    amd_gpu(b, MI300[0], hive=HIVE)
    amd_gpu(b, MI300[1], hive=HIVE)
    amd_gpu(b, MI300[2], hive=0)
    reading = run(b)
    fabrics = [a.topology.fabric for a in reading.groups[0].accelerators]
    assert [f.member_count if f else None for f in fabrics] == [2, 2, None]
    assert fabrics[0] is not None
    assert fabrics[0].id == str(HIVE)


def test_amd_without_any_source_is_library_unavailable(b):
    amd_gpu(b, MI300[0])
    reading = run(b)
    c = cond(reading, "AmdFabricRead")
    assert (c.status, c.reason) == ("False", "LibraryUnavailable")
    assert reading.failed == ["amd"]
    assert len(reading.groups[0].accelerators) == 1


def test_amd_unreadable_kfd_is_a_failed_read(b):
    amd_gpu(b, MI300[0])
    kfd_topology(b, [(MI300[0], HIVE)])
    (b.path("/sys/class/kfd/kfd/topology/nodes/2/properties")).unlink()
    b.mkdir("/sys/class/kfd/kfd/topology/nodes/2/properties")  # a directory where a file belongs
    reading = run(b)
    c = cond(reading, "AmdFabricRead")
    assert (c.status, c.reason) == ("False", "ReadFailed")
    assert reading.groups[0].accelerators[0].topology.fabric is None


# --- mixed vendors --------------------------------------------------------------------------------------


def test_mixed_nvidia_and_amd_node_yields_two_groups(b):
    gpu_function(b, "0000:17:00.0")
    gpu_function(b, "0000:65:00.0")
    amd_gpu(b, "0000:31:00.0", hive=HIVE)
    kfd_topology(b, [("0000:31:00.0", HIVE)])
    fabric = RecordedFabric(state=COMPLETED, cluster_uuid=UUID, clique_id=1)
    nvml = FakeNvml([RecordedGpu(nvml_bus_id(x), fabric=fabric) for x in ("0000:17:00.0", "0000:65:00.0")])
    reading = run(b, nvml)
    assert [g.id for g in reading.groups] == ["amd", "nvidia"]
    amd_group, nv_group = reading.groups
    assert [(a.index, a.id) for a in amd_group.accelerators] == [(0, "0000:31:00.0")]
    assert [(a.index, a.id) for a in nv_group.accelerators] == [(0, "0000:17:00.0"), (1, "0000:65:00.0")]
    assert amd_group.accelerators[0].topology.fabric.kind == "xgmi"
    assert nv_group.accelerators[1].topology.fabric.kind == "nvlink"
    assert {c.type for c in reading.conditions} == {
        ACCELERATORS_ENUMERATED,
        "AmdFabricRead",
        "NvidiaFabricRead",
    }


def test_mixed_nvidia_and_ascend_node_yields_two_groups(b):
    gpu_function(b, "0000:17:00.0")
    npu_function(b, "0000:c1:00.0", numa=1)
    eid = "000000000044030000100000df101500"
    ascend = FakeAscend(
        [AscendAnswer("0000:c1:00.0", mainboard_id=0x44, spod=spod(7, 384, 3, 2, 1), endpoints=[eid])]
    )
    reading = run(b, FakeNvml([RecordedGpu("00000000:17:00.0")]), ascend)
    assert [g.id for g in reading.groups] == ["ascend", "nvidia"]
    npu = reading.groups[0].accelerators[0]
    assert npu.topology.fabric is not None
    assert npu.topology.fabric.wire() == {
        "kind": "ub",
        "id": "7",
        "type": "pod-1d",
        "memberCount": 384,
        "nodeIndex": 3,
        "rackId": 2,
        "endpoints": [eid],
    }
    assert reading.failed == []


# --- Ascend ---------------------------------------------------------------------------------------------


def test_ascend_plain_server_publishes_no_domain(b):
    npu_function(b, "0000:c1:00.0")
    answer = AscendAnswer("0000:c1:00.0", mainboard_id=0x44, spod=spod(INVALID, INVALID, INVALID, INVALID, 0))
    reading = run(b, ascend=FakeAscend([answer]))
    f = reading.groups[0].accelerators[0].topology.fabric
    assert f is not None
    assert f.wire() == {"kind": "ub", "id": "", "type": "server-8p", "memberCount": 0, "endpoints": []}


def test_ascend_library_missing(b):
    npu_function(b, "0000:c1:00.0")
    reading = run(b, ascend=FakeAscend(unavailable="cannot load libdcmi.so"))
    c = cond(reading, "AscendFabricRead")
    assert (c.status, c.reason, c.message) == ("False", "LibraryUnavailable", "cannot load libdcmi.so")
    assert reading.groups[0].accelerators[0].topology.fabric is None


def test_ascend_partial_answer_is_a_partial_read(b):
    npu_function(b, "0000:c1:00.0")
    answer = AscendAnswer(
        "0000:c1:00.0", spod=spod(7, 384, 3, 2, 1), errors=["mainboard id: dcmi returned -8005"]
    )
    reading = run(b, ascend=FakeAscend([answer]))
    assert reading.groups[0].accelerators[0].topology.fabric.id == "7"
    assert cond(reading, "AscendFabricRead").status == "False"


# --- manufacturers without a fabric source --------------------------------------------------------------


def test_other_manufacturers_get_pci_coordinates_and_numa_only(b):
    b.function("0000:3d:00.0", vendor="cabc", device="0590", class_code="120000", numa=0, cpus="0-31")
    b.function("0000:3e:00.0", vendor="cabc", device="0590", class_code="120000", numa=1)
    reading = run(b)
    [group] = reading.groups
    assert (group.id, group.manufacturer) == ("cambricon", "Cambricon")
    a0 = group.accelerators[0].topology
    assert (a0.numa_affinity, a0.cpu_affinity, a0.fabric) == ("0", "0-31", None)
    assert a0.links == {"1": "SYS"}
    assert [c.type for c in reading.conditions] == [ACCELERATORS_ENUMERATED]


def test_blank_numa_stays_blank(b):
    b.function("0000:3d:00.0", vendor="1e3e", device="0001", class_code="030200", numa=None)
    b.function("0000:3e:00.0", vendor="1e3e", device="0001", class_code="030200", numa=None)
    reading = run(b)
    a0 = reading.groups[0].accelerators[0].topology
    assert a0.numa_affinity == ""
    assert a0.links == {"1": "UNK"}


def test_unknown_nvlink_peer_is_ignored(b):
    gpu_function(b, "0000:17:00.0")
    reading = run(b, FakeNvml([RecordedGpu("00000000:17:00.0", links=["00000000:99:00.0", SWITCH])]))
    assert reading.groups[0].accelerators[0].topology.links == {}


@pytest.mark.smoke
def test_this_machine():
    host = HostRoot.at("/")
    reading = detect(host, pci.walk(host))
    assert cond(reading, ACCELERATORS_ENUMERATED).status == "True"
    for group in reading.groups:
        assert [a.index for a in group.accelerators] == list(range(len(group.accelerators)))


def test_nvml_refusing_to_start_is_a_failed_read_not_a_missing_library(b):
    gpu_function(b, "0000:17:00.0")
    reading = run(b, FakeNvml([], init_error=pynvml.NVML_ERROR_NO_PERMISSION))
    c = cond(reading, "NvidiaFabricRead")
    assert (c.status, c.reason) == ("False", "ReadFailed")
    assert "Insufficient Permissions" in c.message


def test_driver_not_loaded_is_library_unavailable(b):
    gpu_function(b, "0000:17:00.0")
    reading = run(b, FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert cond(reading, "NvidiaFabricRead").reason == "LibraryUnavailable"


def test_amd_compute_partitions_count_once_per_gpu(b):
    amd_gpu(b, MI300[0])
    amd_gpu(b, MI300[1])
    # CPX mode: every GPU shows as several KFD nodes at one PCI address.
    kfd_topology(b, [(MI300[0], HIVE), (MI300[0], HIVE), (MI300[1], HIVE), (MI300[1], HIVE)])
    reading = run(b)
    assert [a.topology.fabric.member_count for a in reading.groups[0].accelerators] == [2, 2]


# --- AMD: a KFD node without its properties is a failed fabric read, not a crashed pass ------------------

PAIR = MI300[:2]
PAIR_HIVE = 0x5A5A5A5A12345678


def test_kfd_gpu_node_without_properties_is_a_failed_read(b):
    for bid in PAIR:
        amd_gpu(b, bid)
    kfd_topology(b, [(bid, PAIR_HIVE) for bid in PAIR])
    b.path("/sys/class/kfd/kfd/topology/nodes/3/properties").unlink()
    host = HostRoot.at(b.root)

    reading = detect(host, pci.walk(host), Libraries(nvidia=NoNvidia()))

    cond = next(c for c in reading.conditions if c.type == "AmdFabricRead")
    assert (cond.status, cond.reason) == ("False", "ReadFailed")
    assert "properties" in cond.message
    assert reading.failed == ["amd"]
    # The accelerators are still listed from the PCI walk; only the fabric is unknown.
    assert [a.id for a in reading.groups[0].accelerators] == PAIR
    assert all(a.topology.fabric is None for a in reading.groups[0].accelerators)


def test_inventory_command_survives_a_kfd_node_without_properties(b, capsys):
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0")
    amd_gpu(b, PAIR[0])
    kfd_topology(b, [(PAIR[0], PAIR_HIVE)])
    b.path("/sys/class/kfd/kfd/topology/nodes/2/properties").unlink()

    assert main(["inventory", "--root", str(b.root)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [i["name"] for i in doc["spec"]["interfaces"]] == ["ens1np0"]
    assert [a["id"] for g in doc["spec"]["groups"] for a in g["accelerators"]] == [PAIR[0]]
    conditions = {c["type"]: c for c in doc["status"]["conditions"]}
    assert conditions["InterfacesEnumerated"]["status"] == "True"
    assert conditions["AmdFabricRead"]["status"] == "False"
