"""Our distance matrix held against `nvidia-smi topo -m` recorded for the same PCIe layouts."""

from __future__ import annotations

import random
import re

import pytest

from nodefabric_devicemanager import distance, inventory, pci
from nodefabric_devicemanager.distance import BusCoordinates
from nodefabric_devicemanager.models import AcceleratorTopology, Distance, Endpoint
from nodefabric_devicemanager.testing.scenarios import gpu8_gpus

# `nvidia-smi topo -m` on an 8x L40S server (PCIe only, so GPU pairs show PCIe levels, not NV#) with
# four ConnectX-7 behind the GPU switches and a fifth on its own root port of host bridge pci0000:15.
GPU8_TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tNIC4\t"
    "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tSYS\tSYS\tPHB\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tPIX\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tSYS\tSYS\tPHB\t0-55,112-167\t0\t\tN/A\n"
    "GPU2\tNODE\tNODE\t X \tPIX\tSYS\tSYS\tSYS\tSYS\tNODE\tPIX\tSYS\tSYS\tNODE\t0-55,112-167\t0\t\tN/A\n"
    "GPU3\tNODE\tNODE\tPIX\t X \tSYS\tSYS\tSYS\tSYS\tNODE\tPIX\tSYS\tSYS\tNODE\t0-55,112-167\t0\t\tN/A\n"
    "GPU4\tSYS\tSYS\tSYS\tSYS\t X \tPIX\tNODE\tNODE\tSYS\tSYS\tPIX\tNODE\tSYS\t56-111,168-223\t1\t\tN/A\n"
    "GPU5\tSYS\tSYS\tSYS\tSYS\tPIX\t X \tNODE\tNODE\tSYS\tSYS\tPIX\tNODE\tSYS\t56-111,168-223\t1\t\tN/A\n"
    "GPU6\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\t X \tPIX\tSYS\tSYS\tNODE\tPIX\tSYS\t56-111,168-223\t1\t\tN/A\n"
    "GPU7\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPIX\t X \tSYS\tSYS\tNODE\tPIX\tSYS\t56-111,168-223\t1\t\tN/A\n"
    "NIC0\tPIX\tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tSYS\tSYS\tPHB\t\t\t\t\n"
    "NIC1\tNODE\tNODE\tPIX\tPIX\tSYS\tSYS\tSYS\tSYS\tNODE\t X \tSYS\tSYS\tNODE\t\t\t\t\n"
    "NIC2\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tNODE\tNODE\tSYS\tSYS\t X \tNODE\tSYS\t\t\t\t\n"
    "NIC3\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPIX\tPIX\tSYS\tSYS\tNODE\t X \tSYS\t\t\t\t\n"
    "NIC4\tPHB\tPHB\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tPHB\tNODE\tSYS\tSYS\t X \t\t\t\t\n"
    "\n"
    "Legend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\n"
    "NIC Legend:\n\n"
    "  NIC0: mlx5_0\n  NIC1: mlx5_1\n  NIC2: mlx5_2\n  NIC3: mlx5_3\n  NIC4: mlx5_4\n"
)

# The same tool on a DGX-style two-level switch tree: GPU and NIC on sibling ports of the lower switch
# read PIX; anything meeting only at the upper switch crosses several bridges, PXB.
TWO_LEVEL_TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tPXB\tPIX\tPXB\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tPXB\t X \tPXB\tPIX\t0-55,112-167\t0\t\tN/A\n"
    "NIC0\tPIX\tPXB\t X \tPXB\t\t\t\t\n"
    "NIC1\tPXB\tPIX\tPXB\t X \t\t\t\t\n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n"
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo(text: str) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """(cell per (row, column) device pair, NIC legend NICn -> RDMA device) of `nvidia-smi topo -m`."""
    lines = _ANSI.sub("", text).splitlines()
    header = [h.strip() for h in lines[0].split("\t")[1:]]
    devices = [h for h in header if re.fullmatch(r"(GPU|NIC)\d+", h)]
    cells: dict[tuple[str, str], str] = {}
    for line in lines[1:]:
        parts = line.split("\t")
        if not parts or not re.fullmatch(r"(GPU|NIC)\d+", parts[0]):
            continue
        for col, value in zip(devices, parts[1:], strict=False):
            cells[(parts[0], col)] = value.strip()
    legend = dict(re.findall(r"^\s+(NIC\d+): (\S+)$", _ANSI.sub("", text), re.MULTILINE))
    return cells, legend


def coordinates_by_name(host, gpu_bus_ids: list[str]) -> dict[str, distance.Coordinates]:
    """GPUn from the walk, NICn through the inventory's endpoint carrying the legend's RDMA device."""
    reading = inventory.read(host)
    out: dict[str, distance.Coordinates] = {
        f"GPU{i}": distance.of(reading.pci[bus]) for i, bus in enumerate(gpu_bus_ids)
    }
    by_rdma = {
        e.rdma_device: e for i in reading.interfaces or [] for e in [i, *i.virtual_functions] if e.rdma
    }
    out.update({f"RDMA:{name}": ep for name, ep in by_rdma.items()})
    return out


@pytest.mark.parametrize(
    ("name", "topo", "gpus"),
    [
        ("gpu8", GPU8_TOPO, gpu8_gpus()),
        ("two-level", TWO_LEVEL_TOPO, ["0000:05:00.0", "0000:09:00.0"]),
    ],
)
def test_matrix_matches_nvidia_smi_topo_for_the_same_layout(scenario, name, topo, gpus):
    cells, legend = parse_topo(topo)
    coords = coordinates_by_name(scenario(name), gpus)
    resolve = {**{k: v for k, v in coords.items() if k.startswith("GPU")}}
    resolve.update({nic: coords[f"RDMA:{dev}"] for nic, dev in legend.items()})
    assert cells, "the recorded matrix parsed to nothing"
    mismatches = {
        (row, col): (distance.distance(resolve[row], resolve[col]).name, want)
        for (row, col), want in cells.items()
        if row != col
    }
    assert {k: v for k, v in mismatches.items() if v[0] != v[1]} == {}
    # Every level the layout shows was exercised, and the diagonal is never produced from bus coordinates.
    assert {want for (row, col), want in cells.items() if row != col} <= {"PIX", "PXB", "PHB", "NODE", "SYS"}


def test_the_matrix_covers_every_bus_level():
    cells, _ = parse_topo(GPU8_TOPO)
    cells2, _ = parse_topo(TWO_LEVEL_TOPO)
    assert {v for v in [*cells.values(), *cells2.values()]} >= {"PIX", "PXB", "PHB", "NODE", "SYS"}


def c(bus: str, switches: tuple[str, ...] = (), host: str = "", numa: str = "") -> BusCoordinates:
    return BusCoordinates(bus, switches, host, numa)


def test_missing_bus_id_is_unk():
    assert distance.distance(c(""), c("0000:01:00.0", numa="0")) is Distance.UNK


def test_never_self_or_link_even_for_the_same_function():
    a = c("0000:18:00.0", ("0000:17:00.0", "0000:16:00.0", "0000:15:01.0"), "pci0000:15", "0")
    assert distance.distance(a, a) is Distance.PIX


def test_without_host_bridges_phb_and_node_are_indistinguishable_so_node():
    a, b = c("0000:18:00.0", ("0000:15:01.0",), numa="0"), c("0000:1b:00.0", ("0000:15:02.0",), numa="0")
    assert distance.distance(a, b) is Distance.NODE
    a2 = c("0000:18:00.0", ("0000:15:01.0",), "pci0000:15", "0")
    b2 = c("0000:1b:00.0", ("0000:15:02.0",), "pci0000:15", "0")
    assert distance.distance(a2, b2) is Distance.PHB


def test_blank_numa_across_host_bridges_is_unk_never_node_zero():
    a = c("0000:18:00.0", ("0000:15:01.0",), "pci0000:15", "")
    b = c("0000:3a:00.0", ("0000:37:01.0",), "pci0000:37", "0")
    assert distance.distance(a, b) is Distance.UNK


def test_shared_root_port_alone_is_pxb():
    # Two devices meeting only at the root port cross more than one bridge and never the host bridge.
    a = c("0000:03:00.0", ("0000:02:00.0", "0000:00:01.0"), "pci0000:00", "0")
    b = c("0000:04:00.0", ("0000:02:01.0", "0000:00:01.0"), "pci0000:00", "0")
    assert distance.distance(a, b) is Distance.PXB


def test_endpoint_and_accelerator_topology_are_coordinates():
    gpu = AcceleratorTopology(
        pci_bus_id="0000:18:00.0",
        pci_switches=["0000:17:00.0", "0000:16:00.0", "0000:15:01.0"],
        pci_host_bridge="pci0000:15",
        numa_affinity="0",
    )
    nic = Endpoint(
        pci_bus_id="0000:1a:00.0",
        pci_switches=["0000:17:02.0", "0000:16:00.0", "0000:15:01.0"],
        pci_host_bridge="pci0000:15",
        numa_affinity="0",
    )
    assert distance.distance(gpu, nic) is Distance.PIX
    assert distance.closest([gpu], [nic, Endpoint()]) is Distance.PIX
    assert distance.closest([], [nic]) is Distance.UNK
    # Sharing only the outermost bridge (the root port) is not a switch: PXB.
    root_only = Endpoint(
        pci_bus_id="0000:1a:00.0", pci_switches=["0000:16:02.0", "0000:15:01.0"], numa_affinity="0"
    )
    assert distance.distance(gpu, root_only) is Distance.PXB


def test_walked_function_coordinates(scenario):
    walked = pci.walk(scenario("gpu8"))
    coords = distance.of(walked["0000:18:00.0"])
    assert coords.pci_host_bridge == "pci0000:15" and coords.numa_affinity == "0"


def test_closest_is_the_minimum_over_every_pair_on_random_layouts():
    # `closest` answers per level by set intersection instead of visiting pairs; this holds it to the
    # pairwise definition on layouts drawn from a small alphabet, so shared bridges, host bridges and
    # NUMA nodes (and blanks) are frequent, at every depth.
    rnd = random.Random(20261201)
    bridges, roots, numas = ["a", "b", "c"], ["", "pci0000:00", "pci0000:80"], ["", "0", "1"]

    def coords() -> BusCoordinates:
        path = tuple(rnd.choice(bridges) for _ in range(rnd.randint(0, 4)))
        bus = rnd.choice(["", "0000:01:00.0", "0000:02:00.0"])
        return BusCoordinates(bus, path, rnd.choice(roots), rnd.choice(numas))

    seen: set[Distance] = set()
    for _ in range(3000):
        left = [coords() for _ in range(rnd.randint(0, 3))]
        right = [coords() for _ in range(rnd.randint(0, 3))]
        want = min((distance.distance(a, b) for a in left for b in right), default=Distance.UNK)
        assert distance.closest(left, right) is want, (left, right)
        seen.add(want)
    assert seen == {Distance.PIX, Distance.PXB, Distance.PHB, Distance.NODE, Distance.SYS, Distance.UNK}


def test_closest_over_thousands_of_distinct_paths_does_not_visit_the_pairs(monkeypatch):
    # A schema-valid record can hold thousands of NICs and accelerators, each behind its own bridges.
    # The answer must not cost a comparison per pair (25 million here): `distance` is never called.
    def pairwise(a: object, b: object) -> Distance:
        raise AssertionError("closest compared a pair")

    monkeypatch.setattr(distance, "distance", pairwise)
    gpus = [BusCoordinates(f"0001:{i:05x}", (f"g{i}", f"r{i}"), f"pci{i}", "0") for i in range(5000)]
    nics = [BusCoordinates(f"0002:{i:05x}", (f"n{i}", f"s{i}"), f"pci-{i}", "1") for i in range(5000)]
    assert distance.closest(gpus, nics) is Distance.SYS
    nics.append(BusCoordinates("0002:fffff", ("x", "r4999"), "", "1"))  # meets one GPU at its root port
    assert distance.closest(gpus, nics) is Distance.PXB


def test_flat_root_bus_without_bridges_is_unk_not_phb():
    # A VM's flat bus: both devices directly on the root bus of one host bridge, no bridge recorded above
    # either. pciRootId is the missing coordinate, so the seed's answer is UNK, never a distance.
    gpu = c("0000:00:05.0", (), "pci0000:00", "0")
    nic = c("0000:00:06.0", (), "pci0000:00", "0")
    assert distance.distance(gpu, nic) is Distance.UNK
    assert distance.closest([gpu], [nic]) is Distance.UNK
    # One side rooted, the other flat: still a missing coordinate.
    rooted = c("0000:01:00.0", ("0000:00:01.0",), "pci0000:00", "0")
    assert distance.distance(rooted, nic) is Distance.UNK
    assert distance.closest([rooted, gpu], [nic]) is Distance.UNK
    # NUMA nodes that differ are SYS whatever the bus shows: the far level claims no closeness.
    far = c("0000:00:07.0", (), "pci0000:00", "1")
    assert distance.distance(gpu, far) is Distance.SYS
    assert distance.closest([gpu], [nic, far]) is Distance.SYS


def test_one_host_bridge_across_numa_nodes_is_sys_not_phb():
    gpu = c("0000:18:00.0", ("0000:15:01.0",), "pci0000:15", "0")
    nic = c("0000:1b:00.0", ("0000:15:02.0",), "pci0000:15", "1")
    assert distance.distance(gpu, nic) is Distance.SYS
    assert distance.closest([gpu], [nic]) is Distance.SYS
    # The same host bridge with NUMA unread on one side cannot be PHB either: the seed's UNK.
    blank = c("0000:1b:00.0", ("0000:15:02.0",), "pci0000:15", "")
    assert distance.distance(gpu, blank) is Distance.UNK
    assert distance.closest([gpu], [blank]) is Distance.UNK
    # Both facts read and agreeing: the one PHB kept beyond the seed.
    same = c("0000:1b:00.0", ("0000:15:02.0",), "pci0000:15", "0")
    assert distance.distance(gpu, same) is Distance.PHB
    assert distance.closest([gpu], [nic, same]) is Distance.PHB
