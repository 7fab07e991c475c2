"""Review fixes: bad input to `nodefabric pick` and vendor-side trouble never escape as a traceback."""

from __future__ import annotations

import json

import pytest

from nodefabric_devicemanager import inventory, pci
from nodefabric_devicemanager.accelerators import Libraries, detect, topo
from nodefabric_devicemanager.accelerators.ascend import Dcmi
from nodefabric_devicemanager.accelerators.library import LibraryUnavailable
from nodefabric_devicemanager.accelerators.nvidia import NoNvidia
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.accelerators import amd_gpu, kfd_topology, npu_function
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_operator.console import main

HIVE = 0x5A5A5A5A12345678
MI300 = ["0000:0c:00.0", "0000:22:00.0"]


@pytest.fixture
def b(tmp_path):
    return SysfsBuilder(tmp_path / "root")


# --- nodefabric pick: every bad input is a message and exit 2 ---------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # A Devices object whose group lacks its id and manufacturer (pydantic refuses it).
        (
            json.dumps({"spec": {"groups": [{"accelerators": [{"id": "a"}]}]}}).encode(),
            "validation error",
        ),
        (b"\xff\xfe{not text", "can't decode byte 0xff"),
        (json.dumps({"-1": {"0": "NV1"}, "0": {"-1": "NV1"}}).encode(), "never negative"),
    ],
    ids=["malformed-devices-object", "not-utf8", "negative-index"],
)
def test_pick_refuses_bad_input_with_a_message(tmp_path, capsys, content, message):
    f = tmp_path / "links"
    f.write_bytes(content)
    assert main(["pick", "--links", str(f), "--count", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("nodefabric pick: ")
    assert message in captured.err


# --- AMD: a KFD node without its properties is a failed fabric read, not a crashed pass ------------------


def test_kfd_gpu_node_without_properties_is_a_failed_read(b):
    for bid in MI300:
        amd_gpu(b, bid)
    kfd_topology(b, [(bid, HIVE) for bid in MI300])
    b.path("/sys/class/kfd/kfd/topology/nodes/3/properties").unlink()
    host = HostRoot.at(b.root)

    reading = detect(host, pci.walk(host), Libraries(nvidia=NoNvidia()))

    cond = next(c for c in reading.conditions if c.type == "AmdFabricRead")
    assert (cond.status, cond.reason) == ("False", "ReadFailed")
    assert "properties" in cond.message
    assert reading.failed == ["amd"]
    # The accelerators are still listed from the PCI walk; only the fabric is unknown.
    assert [a.id for a in reading.groups[0].accelerators] == MI300
    assert all(a.topology.fabric is None for a in reading.groups[0].accelerators)


def test_inventory_command_survives_a_kfd_node_without_properties(b, capsys):
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0")
    amd_gpu(b, MI300[0])
    kfd_topology(b, [(MI300[0], HIVE)])
    b.path("/sys/class/kfd/kfd/topology/nodes/2/properties").unlink()

    assert main(["inventory", "--root", str(b.root)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [i["name"] for i in doc["spec"]["interfaces"]] == ["ens1np0"]
    assert [a["id"] for g in doc["spec"]["groups"] for a in g["accelerators"]] == [MI300[0]]
    conditions = {c["type"]: c for c in doc["status"]["conditions"]}
    assert conditions["InterfacesEnumerated"]["status"] == "True"
    assert conditions["AmdFabricRead"]["status"] == "False"


# --- Ascend: a libdcmi without an entry point we call is an unavailable library ---------------------------


class OldDcmi:
    """A driver's libdcmi as ctypes exposes it, from before dcmi_get_mainboard_id: that attribute is
    missing, exactly as a CDLL raises AttributeError for a symbol the library does not export."""

    def dcmi_init(self) -> int:
        return 0

    def dcmi_get_card_list(self, count, cards, length) -> int:
        count._obj.value = 1
        cards[0] = 0
        return 0

    def dcmi_get_device_num_in_card(self, card, num) -> int:
        num._obj.value = 1
        return 0

    def dcmi_get_device_pcie_info_v2(self, card, device, info) -> int:
        pcie = info._obj
        pcie.domain, pcie.bdf_busid, pcie.bdf_deviceid, pcie.bdf_funcid = 0, 0xC1, 0, 0
        return 0


def test_dcmi_missing_an_entry_point_is_library_unavailable():
    with pytest.raises(LibraryUnavailable, match="dcmi_get_mainboard_id"):
        Dcmi(OldDcmi()).read()


def test_old_dcmi_still_lists_the_npus_and_the_interfaces(b):
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0")
    npu_function(b, "0000:c1:00.0", numa=1)

    reading = inventory.read(
        HostRoot.at(b.root), libraries=Libraries(nvidia=NoNvidia(), ascend=Dcmi(OldDcmi()))
    )

    assert reading.interfaces is not None and [i.name for i in reading.interfaces] == ["ens1np0"]
    (group,) = reading.groups
    assert [a.id for a in group.accelerators] == ["0000:c1:00.0"]
    cond = next(c for c in reading.conditions if c.type == "AscendFabricRead")
    assert (cond.status, cond.reason) == ("False", "LibraryUnavailable")


# --- nvidia-smi topo -m from drivers before the NIC legend: NIC columns and rows named mlx5_N -------------

# A two-socket 4-GPU NVLink box with two ConnectX ports, as drivers of the CUDA 11 era print it: no NICn
# aliases and no legend, the RDMA device names are the column and row labels, SOC still spelled out.
OLD_DRIVER_TOPO = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tmlx5_0\tmlx5_1\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tNV4\tNV4\tNV4\tPXB\tSOC\t0-15\t0\n"
    "GPU1\tNV4\t X \tNV4\tNV4\tPXB\tSOC\t0-15\t0\n"
    "GPU2\tNV4\tNV4\t X \tNV4\tSOC\tPXB\t16-31\t1\n"
    "GPU3\tNV4\tNV4\tNV4\t X \tSOC\tPXB\t16-31\t1\n"
    "mlx5_0\tPXB\tPXB\tSOC\tSOC\t X \tSOC\t\t\n"
    "mlx5_1\tSOC\tSOC\tPXB\tPXB\tSOC\t X \t\t\n"
    "\n"
    "Legend:\n\n"
    "  X    = Self\n"
    "  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)\n"
    "  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


def test_topo_parses_nic_columns_named_by_rdma_device():
    m = topo.parse(OLD_DRIVER_TOPO)
    assert m.gpus == [0, 1, 2, 3]
    assert m.links[0] == {1: "NV4", 2: "NV4", 3: "NV4"}
    assert m.nic_links[0] == {"mlx5_0": "PXB", "mlx5_1": "SYS"}
    assert m.nic_links[3] == {"mlx5_0": "SYS", "mlx5_1": "PXB"}
    assert (m.cpu_affinity[2], m.numa_affinity[2]) == ("16-31", "1")


def test_pick_reads_an_old_driver_matrix(tmp_path, capsys):
    f = tmp_path / "topo.txt"
    f.write_text(OLD_DRIVER_TOPO)
    assert main(["pick", "--links", str(f), "--free", "1,2,3", "--count", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1,2"


def test_topo_still_refuses_an_unknown_trailing_column():
    text = OLD_DRIVER_TOPO.replace("NUMA Affinity\n", "NUMA Affinity\tFuture Column\n", 1)
    with pytest.raises(topo.TopoParseError, match="unexpected header column"):
        topo.parse(text)
