"""Resolving an RDMA device to its verbs character device, through both sysfs layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.verbs import VerbsUnresolvable, has_rdma_cm, resolve_uverbs


@pytest.mark.parametrize("layout", ["both", "class", "device"])
def test_each_layout_resolves_the_named_device(tmp_path: Path, layout: str) -> None:
    b = SysfsBuilder(tmp_path)
    b.nic("0000:19:00.0", "ens1f0", rdma="mlx5_0")
    b.nic("0000:5e:00.0", "ens2f0", rdma="mlx5_1")
    b.verbs("0000:19:00.0", "mlx5_0", 1, layout=layout)
    b.verbs("0000:5e:00.0", "mlx5_1", 0, layout=layout)
    host = HostRoot.at(tmp_path)
    # The N of uverbsN is unrelated to the N of mlx5_N.
    assert resolve_uverbs(host, "mlx5_0") == "/dev/infiniband/uverbs1"
    assert resolve_uverbs(host, "mlx5_1") == "/dev/infiniband/uverbs0"


def test_a_lone_device_entry_without_ibdev_is_that_functions(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path)
    b.nic("0000:19:00.0", "ens1f0", rdma="mlx5_0")
    b.verbs("0000:19:00.0", "mlx5_0", 3, layout="device")
    (b.functions["0000:19:00.0"] / "infiniband_verbs" / "uverbs3" / "ibdev").unlink()
    assert resolve_uverbs(HostRoot.at(tmp_path), "mlx5_0") == "/dev/infiniband/uverbs3"


def test_unresolvable_names_every_location_checked(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path)
    b.nic("0000:19:00.0", "ens1f0", rdma="mlx5_0", verbs=0)
    b.nic("0000:5e:00.0", "ens2f0", rdma="mlx5_1")  # no verbs device at all
    with pytest.raises(VerbsUnresolvable) as err:
        resolve_uverbs(HostRoot.at(tmp_path), "mlx5_1")
    assert err.value.checked == [
        "/sys/class/infiniband_verbs/uverbs*/ibdev (1 entries, none names mlx5_1)",
        "/sys/class/infiniband/mlx5_1/device/infiniband_verbs (absent)",
    ]
    assert "mlx5_1" in str(err.value)


def test_an_unknown_device_and_a_host_without_verbs_class(tmp_path: Path) -> None:
    SysfsBuilder(tmp_path)
    with pytest.raises(VerbsUnresolvable) as err:
        resolve_uverbs(HostRoot.at(tmp_path), "mlx5_9")
    assert err.value.checked == [
        "/sys/class/infiniband_verbs/uverbs*/ibdev (absent)",
        "/sys/class/infiniband/mlx5_9/device/infiniband_verbs (absent)",
    ]


def test_a_missing_device_node_is_unresolvable(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path)
    b.nic("0000:19:00.0", "ens1f0", rdma="mlx5_0", verbs=2)
    b.path("/dev/infiniband/uverbs2").unlink()
    with pytest.raises(VerbsUnresolvable, match=r"/dev/infiniband/uverbs2 \(sysfs names it"):
        resolve_uverbs(HostRoot.at(tmp_path), "mlx5_0")


@pytest.mark.parametrize("name", ["", "..", "a/b"])
def test_a_name_that_is_not_a_device_name_is_refused(tmp_path: Path, name: str) -> None:
    SysfsBuilder(tmp_path)
    with pytest.raises(VerbsUnresolvable, match="not a valid RDMA device name"):
        resolve_uverbs(HostRoot.at(tmp_path), name)


def test_a_symlink_escaping_the_root_is_refused_not_followed(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "root")
    outside = tmp_path / "outside" / "uverbs0"
    outside.mkdir(parents=True)
    (outside / "ibdev").write_text("mlx5_0\n")
    b.mkdir("/sys/class/infiniband_verbs")
    (b.path("/sys/class/infiniband_verbs") / "uverbs0").symlink_to(outside)
    with pytest.raises(VerbsUnresolvable, match="unreadable"):
        resolve_uverbs(HostRoot.at(tmp_path / "root"), "mlx5_0")


def test_rdma_cm_presence(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path)
    assert not has_rdma_cm(HostRoot.at(tmp_path))
    b.rdma_cm()
    assert has_rdma_cm(HostRoot.at(tmp_path))
