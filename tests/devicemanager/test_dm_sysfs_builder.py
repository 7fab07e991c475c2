"""The fixture builder lays trees out the way the kernel does: relative links that stay inside the root."""

from __future__ import annotations

import os

import pytest

from nodefabric_devicemanager.testing.scenarios import SCENARIOS
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - {"escaping-symlink"}))
def test_every_link_is_relative_and_resolves_inside_the_root(host_root, name):
    SCENARIOS[name](host_root)
    links = 0
    for dirpath, dirnames, filenames in os.walk(host_root):
        for entry in dirnames + filenames:
            path = os.path.join(dirpath, entry)
            if os.path.islink(path):
                links += 1
                assert not os.readlink(path).startswith("/"), path
                assert os.path.realpath(path).startswith(str(host_root) + os.sep), path
    assert links > 0


def test_function_layout_matches_the_kernels(builder, host_root):
    builder.bridge("0000:16:01.0", host_bridge="pci0000:16")
    builder.nic("0000:17:00.0", "ens1", parent="0000:16:01.0", numa=1, rdma="mlx5_0", verbs=3)
    fn = host_root / "sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0"
    assert (fn / "vendor").read_text() == "0x15b3\n" and (fn / "numa_node").read_text() == "1\n"
    assert os.readlink(host_root / "sys/bus/pci/devices/0000:17:00.0") == (
        "../../../devices/pci0000:16/0000:16:01.0/0000:17:00.0"
    )
    assert os.path.realpath(host_root / "sys/class/net/ens1/device") == str(fn)
    assert (fn / "infiniband/mlx5_0/ports/1/state").read_text() == "4: ACTIVE\n"
    assert (fn / "infiniband/mlx5_0/ports/1/phys_state").read_text() == "5: LinkUp\n"
    assert os.path.realpath(host_root / "sys/class/infiniband/mlx5_0") == str(fn / "infiniband/mlx5_0")
    assert (host_root / "sys/class/infiniband_verbs/uverbs3/ibdev").read_text() == "mlx5_0\n"
    assert (fn / "infiniband_verbs/uverbs3/ibdev").read_text() == "mlx5_0\n"
    assert (host_root / "dev/infiniband/uverbs3").is_file()


@pytest.mark.parametrize(
    ("layout", "in_class", "under_device"), [("class", True, False), ("device", False, True)]
)
def test_verbs_layouts(builder, host_root, layout, in_class, under_device):
    builder.nic("0000:17:00.0", "ens1", host_bridge="pci0000:16", rdma="mlx5_0")
    builder.verbs("0000:17:00.0", "mlx5_0", 5, layout=layout)
    fn = builder.functions["0000:17:00.0"]
    assert (host_root / "sys/class/infiniband_verbs/uverbs5/ibdev").exists() is in_class
    assert (fn / "infiniband_verbs/uverbs5/ibdev").exists() is under_device
    if in_class:
        assert not (host_root / "sys/class/infiniband_verbs/uverbs5").is_symlink()


def test_sriov_links_both_ways(builder):
    builder.nic("0000:3b:00.0", "ens2", host_bridge="pci0000:3a")
    vfs = builder.sriov("0000:3b:00.0", vfs=9)
    assert vfs[-1] == "0000:3b:01.1"
    pf = builder.functions["0000:3b:00.0"]
    assert os.readlink(pf / "virtfn8") == "../0000:3b:01.1"
    assert os.readlink(builder.functions["0000:3b:01.1"] / "physfn") == "../0000:3b:00.0"
    assert (pf / "sriov_numvfs").read_text() == "9\n"


def test_arbitrary_function_with_extra_attributes(builder, host_root):
    d = builder.function(
        "0000:c1:00.0",
        vendor="1002",
        device="74a1",
        class_code="038000",
        attrs={"current_link_width": "16", "blob": b"\x00\x01"},
    )
    assert (d / "class").read_text() == "0x038000\n" and (d / "current_link_width").read_text() == "16\n"
    assert (d / "blob").read_bytes() == b"\x00\x01"
    assert d.parent.name == "pci0000:c1"


def test_a_second_builder_on_the_same_root_adds_to_it(host_root):
    SysfsBuilder(host_root).nic("0000:17:00.0", "ens1", host_bridge="pci0000:16")
    SysfsBuilder(host_root).virtual("bond0")
    assert sorted(os.listdir(host_root / "sys/class/net")) == ["bond0", "ens1"]


def test_the_module_docstring_example_runs_and_reads_back(tmp_path):
    from pathlib import Path

    from nodefabric_devicemanager import interfaces, pci
    from nodefabric_devicemanager.testing import sysfs

    example = sysfs.__doc__.split("What each call lays out")[0]
    code = "\n".join(line[4:] for line in example.splitlines() if line.startswith("    "))
    namespace = {"Path": Path, "tmp_path": tmp_path}
    exec(code, namespace)
    host = namespace["host"]
    found = {i.name: i for i in interfaces.read(host, pci.walk(host))}
    assert sorted(found) == ["bond0", "ens1f0", "eth0", "eth9"]
    assert found["ens1f0"].pci_switches == ["0000:18:08.0", "0000:17:00.0", "0000:16:01.0"]
    assert len(found["ens1f0"].virtual_functions) == 12
