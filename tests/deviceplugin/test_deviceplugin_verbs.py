"""Resolving an RDMA device to its verbs character device, through both sysfs layouts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec, Interface
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.allocate import grant
from nodefabric_deviceplugin.resources import Family, view
from nodefabric_deviceplugin.verbs import (
    VerbsCache,
    VerbsUnresolvable,
    has_rdma_cm,
    read_devices,
    resolve_uverbs,
)


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


@pytest.mark.parametrize("name", ["", "..", "a/b", "mlx5,1", "mlx5_1:1", "=mlx5_1", "a" * 64, "mlx 5"])
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


# -- the cache the Allocate path reads through -----------------------------------------------------------


def _host(tmp_path: Path) -> SysfsBuilder:
    b = SysfsBuilder(tmp_path)
    b.nic("0000:19:00.0", "ens1f0", rdma="mlx5_0", verbs=7)
    b.nic("0000:5e:00.0", "ens2f0", rdma="mlx5_1", verbs=2)
    return b


async def test_a_hit_reads_no_sysfs(tmp_path: Path) -> None:
    cache = VerbsCache(HostRoot.at(_host(tmp_path).root))
    first = await cache.devices(1, ["mlx5_0"])
    # One read of the class answers every device it names, not only the one asked for.
    second = await cache.devices(1, ["mlx5_1", "mlx5_0"])
    assert cache.reads == 1
    assert dict(first.nodes) == {"mlx5_0": "/dev/infiniband/uverbs7"}
    assert dict(second.nodes) == {"mlx5_1": "/dev/infiniband/uverbs2", "mlx5_0": "/dev/infiniband/uverbs7"}
    assert not first.rdma_cm


async def test_a_new_record_reads_again(tmp_path: Path) -> None:
    cache = VerbsCache(HostRoot.at(_host(tmp_path).root))
    await cache.devices(1, ["mlx5_0"])
    await cache.devices(2, ["mlx5_0"])
    assert cache.reads == 2


async def test_a_driver_reload_that_renumbers_is_noticed_without_a_record_change(tmp_path: Path) -> None:
    b = _host(tmp_path)
    cache = VerbsCache(HostRoot.at(b.root))
    assert dict((await cache.devices(1, ["mlx5_0"])).nodes) == {"mlx5_0": "/dev/infiniband/uverbs7"}
    # The driver comes back with the numbers swapped; the kernel recreates both device nodes.
    (b.functions["0000:19:00.0"] / "infiniband_verbs" / "uverbs7" / "ibdev").write_text("mlx5_1\n")
    (b.functions["0000:5e:00.0"] / "infiniband_verbs" / "uverbs2" / "ibdev").write_text("mlx5_0\n")
    for n in (7, 2):
        b.path(f"/dev/infiniband/uverbs{n}").unlink()
        b.write(f"/dev/infiniband/uverbs{n}", "")
    assert dict((await cache.devices(1, ["mlx5_0"])).nodes) == {"mlx5_0": "/dev/infiniband/uverbs2"}
    assert cache.reads == 2


async def test_rdma_cm_appearing_is_noticed(tmp_path: Path) -> None:
    b = _host(tmp_path)
    cache = VerbsCache(HostRoot.at(b.root))
    assert not (await cache.devices(1, ["mlx5_0"])).rdma_cm
    b.rdma_cm()
    assert (await cache.devices(1, ["mlx5_0"])).rdma_cm
    assert cache.reads == 2


async def test_an_unresolvable_device_is_a_miss_every_time(tmp_path: Path) -> None:
    cache = VerbsCache(HostRoot.at(_host(tmp_path).root))
    for n in (1, 2):
        answer = await cache.devices(1, ["mlx5_9"])
        assert not answer.nodes
        assert "mlx5_9" in str(answer.unresolved["mlx5_9"])
        assert cache.reads == n


async def test_concurrent_misses_share_one_read_and_each_gets_its_devices(tmp_path: Path) -> None:
    cache = VerbsCache(HostRoot.at(_host(tmp_path).root))
    a, b = await asyncio.gather(cache.devices(1, ["mlx5_0"]), cache.devices(1, ["mlx5_1"]))
    assert dict(a.nodes) == {"mlx5_0": "/dev/infiniband/uverbs7"}
    assert dict(b.nodes) == {"mlx5_1": "/dev/infiniband/uverbs2"}
    assert cache.reads == 1


def test_grant_is_pure_and_the_same_for_every_caller(tmp_path: Path) -> None:
    b = _host(tmp_path)
    b.rdma_cm()
    spec = DevicesSpec(
        interfaces=[
            Interface(name="ens2f0", pci_bus_id="0000:5e:00.0", rdma=True, rdma_device="mlx5_1"),
            Interface(name="ens1f0", pci_bus_id="0000:19:00.0", rdma=True, rdma_device="mlx5_0"),
        ]
    )
    endpoints = view(spec, Family.EXCLUSIVE).endpoints
    verbs = read_devices(HostRoot.at(b.root), [e.rdma_device for e in endpoints])
    granted = grant(endpoints, verbs)
    assert [d.path for d in granted.devices] == [
        "/dev/infiniband/uverbs7",
        "/dev/infiniband/uverbs2",
        "/dev/infiniband/rdma_cm",
    ]
    assert granted.envs == {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}
    assert grant((), verbs) == grant((), read_devices(HostRoot.at(b.root), []))
    missing = read_devices(HostRoot.at(b.root), ["mlx5_0"])
    with pytest.raises(VerbsUnresolvable, match="mlx5_1"):
        grant(endpoints, missing)
