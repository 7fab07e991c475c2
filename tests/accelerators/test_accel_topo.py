"""The `nvidia-smi topo -m` parser, on recorded outputs."""

from __future__ import annotations

import itertools
import tracemalloc

import pytest

from nodefabric_devicemanager.accelerators.topo import TopoParseError, parse


def test_dgx_h100_nvswitch_node_with_ansi_header_and_nic_legend(topo_text):
    m = parse(topo_text("topo_dgx_h100.txt"))
    assert m.gpus == list(range(8))
    assert all(link == "NV18" for g in m.gpus for link in m.links[g].values())
    assert set(m.links[3]) == {0, 1, 2, 4, 5, 6, 7}  # self is left out
    assert m.nics == {f"NIC{n}": f"mlx5_{n}" for n in range(10)}
    assert m.nic_links[0]["mlx5_0"] == "PXB"
    assert m.nic_links[0]["mlx5_9"] == "SYS"
    assert m.nic_links[7]["mlx5_8"] == "PXB"
    assert m.cpu_affinity[0] == "0-55,112-167"
    assert m.numa_affinity == {g: ("0" if g < 4 else "1") for g in range(8)}
    assert m.gpu_numa_id == {g: "" for g in range(8)}  # N/A is unknown, never a number
    assert m.wire_links(0) == {str(p): "NV18" for p in range(1, 8)}


def test_two_socket_pcie_server_with_nics(topo_text):
    m = parse(topo_text("topo_pcie_2socket.txt"))
    assert m.links[0] == {1: "PIX", 2: "NODE", 3: "NODE", 4: "SYS", 5: "SYS", 6: "SYS", 7: "SYS"}
    assert m.links[6][7] == "PIX"
    assert m.nic_links[6] == {"mlx5_0": "SYS", "mlx5_1": "PXB"}
    assert m.cpu_affinity[5] == "32-63,96-127"
    assert m.numa_affinity[5] == "1"


def test_four_gpu_phb_sys_box_without_gpu_numa_column(topo_text):
    m = parse(topo_text("topo_4gpu_phb_sys.txt"))
    assert m.links[0] == {1: "PHB", 2: "SYS", 3: "SYS"}
    assert m.links[3] == {0: "SYS", 1: "SYS", 2: "PHB"}
    assert m.nics == {}
    assert m.nic_links[0] == {}
    assert m.numa_affinity[2] == "1"
    assert m.gpu_numa_id[2] == ""


def test_text_around_the_matrix_is_ignored():
    text = "+----+\n| nvidia-smi table |\n\n\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    text += "GPU0\t X \tNV4\t0-23\t0\t\tN/A\nGPU1\tNV4\t X \t0-23\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
    m = parse(text)
    assert m.links == {0: {1: "NV4"}, 1: {0: "NV4"}}


def test_single_gpu_and_older_names():
    m = parse("\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-31\t0\t\tN/A\n")
    assert m.gpus == [0]
    assert m.links == {0: {}}
    old = parse("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t0-7\n")
    assert old.links[0][1] == "SYS"
    assert old.numa_affinity[0] == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no matrix here\n", "no matrix header"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNV1\t X \n", "'NVX' is not a link"),
        ("\tGPU0\tGPU1\nGPU0\t X \n", "GPU0 has 1 cells, the header names 2"),
        ("\tGPU0\tGPU1\nGPU0\tNV1\tNV1\nGPU1\tNV1\t X \n", "its own cell is 'NV1'"),
        ("\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\tNV1\t X \n", "X marks a device's own cell only"),
        ("\tGPU0\tGPU1\tPower\nGPU0\t X \tNV1\t1\n", "unexpected header column"),
        ("\tGPU0\tNIC0\nNIC0\tPIX\t X \n", "no GPU rows"),
        # A row repeated (a million times, or once): which one holds the links is a guess, so neither.
        ("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV1\t X \nGPU0\t X \tSYS\n", "line 4: a second row for GPU0"),
        ("\tGPU0\tGPU0\nGPU0\t X \tNV1\n", r"column\(s\) \['GPU0'\] named twice"),
    ],
)
def test_bad_input_is_refused_with_the_place(text, message):
    with pytest.raises(TopoParseError, match=message):
        parse(text)


# A two-socket 4-GPU NVLink box with two ConnectX ports, as drivers of the CUDA 11 era print it: no NICn
# aliases and no legend, the RDMA device names are the column and row labels, SOC still spelled out.


def test_topo_parses_nic_columns_named_by_rdma_device(topo_text):
    m = parse(topo_text("topo_old_driver_nic_names.txt"))
    assert m.gpus == [0, 1, 2, 3]
    assert m.links[0] == {1: "NV4", 2: "NV4", 3: "NV4"}
    assert m.nic_links[0] == {"mlx5_0": "PXB", "mlx5_1": "SYS"}
    assert m.nic_links[3] == {"mlx5_0": "SYS", "mlx5_1": "PXB"}
    assert (m.cpu_affinity[2], m.numa_affinity[2]) == ("16-31", "1")


def test_topo_still_refuses_an_unknown_trailing_column(topo_text):
    text = topo_text("topo_old_driver_nic_names.txt").replace(
        "NUMA Affinity\n", "NUMA Affinity\tFuture Column\n", 1
    )
    with pytest.raises(TopoParseError, match="unexpected header column"):
        parse(text)


def _vf_nics(nics: int, bad: tuple[int, int, str] | None = None) -> str:
    """8 NVSwitch GPUs beside `nics` VF NICs; `bad` puts a cell spelled `bad[2]` at row, column."""
    names = [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(nics)]
    lines = ["\t" + "\t".join(names)]
    for r, row in enumerate(names):
        cells = [
            "X" if c == r else "NV18" if r < 8 and c < 8 else " SYS " if c % 2 else "sys"
            for c in range(len(names))
        ]
        if bad is not None and bad[0] == r:
            cells[bad[1]] = bad[2]
        lines.append(row + "\t" + "\t".join(cells))
    return "\n".join(lines) + "\n"


def test_a_matrix_of_hundreds_of_vf_nics_reads_each_cell_as_spelled():
    """Each spelling of a cell is judged once and looked up after: every cell still reads as its own
    (spelled two ways, ` SYS ` and `sys`, both SYS), the GPU rows' NIC links included."""
    m = parse(_vf_nics(300))
    assert m.links[0] == {p: "NV18" for p in range(1, 8)}
    assert m.nic_links[3] == {f"NIC{n}": "SYS" for n in range(300)}


@pytest.mark.parametrize(("row", "col"), [(200, 9), (3, 150), (299, 307)])
def test_a_bad_cell_after_a_hundred_thousand_good_ones_is_refused_at_its_place(row, col):
    """A spelling first met deep in the matrix (a NIC row's cell, a GPU row's NIC cell) is judged there:
    the refusal names its line and cell, as when every cell was judged."""
    names = [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(300)]
    with pytest.raises(TopoParseError, match=rf"^line {row + 2}, {names[row]}/{names[col]}: 'PIXX' is not"):
        parse(_vf_nics(300, (row, col, "PIXX")))


def _spelled_apart(nics: int) -> str:
    """8 GPUs beside `nics` NICs, every link cell spelled its own way (case, and padding the parser
    strips: spaces and the ASCII unit separator)."""
    pads = ["".join(p) for n in range(5) for p in itertools.product(" \x1f", repeat=n)]
    spellings = (
        f"{a}{v}{n}{b}" for a in pads for b in pads for n in range(1, 1000) for v in ("NV", "nv", "Nv", "nV")
    )
    names = [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(nics)]
    rows = [row + "\t" + "\t".join("X" if c == row else next(spellings) for c in names) for row in names]
    return "\t" + "\t".join(names) + "\n" + "\n".join(rows) + "\n"


def test_a_matrix_of_a_spelling_per_cell_costs_no_more_memory_than_its_cells():
    """Spellings are remembered up to a bound: a file spelling each of its cells its own way (each
    stripped and upper-cased to a link) holds no dict of every spelling beside the matrix, which took
    2.4 times the memory of reading each cell alone (268 MiB over a 16.9 MiB file, not 112 MiB)."""
    text = _spelled_apart(292)  # about a MiB
    tracemalloc.start()
    try:
        m = parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(m.nic_links[0]) == 292 and all(link.startswith("NV") for link in m.nic_links[7].values())
    assert peak < 12 * len(text), (peak, len(text))
