"""Fixtures of the device-plugin tests: a fixture host with verbs devices, a plugin directory short
enough for unix socket paths (108 bytes at most), and a plugin serving two_nics_and_vfs() to a kubelet."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from dp_helpers import FixtureHost, Running, shutdown, start_plugin, two_nics_and_vfs

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder


@pytest.fixture
def fixture_host(tmp_path: Path) -> FixtureHost:
    """A host whose verbs devices match two_nics_and_vfs(); uverbsN deliberately differs from mlx5_N."""
    b = SysfsBuilder(tmp_path / "host")
    b.nic("0000:19:00.0", "ens1f0", numa=0, rdma="mlx5_0", verbs=7)
    b.nic("0000:5e:00.0", "ens2f0", numa=1, rdma="mlx5_1", verbs=2)
    b.nic("0000:86:00.0", "ens3f0", numa=1, rdma="mlx5_2", verbs=0)
    b.sriov("0000:86:00.0", vfs=2, numa=1, rdma_prefix="mlx5_", first_rdma=3, first_verbs=4)
    b.rdma_cm()
    return FixtureHost(b, HostRoot.at(b.root))


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="nfdp", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def running(plugin_dir: str, fixture_host: FixtureHost) -> AsyncIterator[Running]:
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    await asyncio.wait_for(r.manager.serving.wait(), timeout=30)
    yield r
    await shutdown(r)
