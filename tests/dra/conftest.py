"""Fixtures of the DRA tests: short socket directories, the embedded API (it serves resource.k8s.io/v1
as a Kubernetes >= 1.34 API server does) with this node's Node, and the HGX fixture host with its
record; drivers running on that host."""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from dra_helpers import Dirs, HeldDriver, HgxDriver, driving, held_driving, hgx, put_node, read

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import hops
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    # Unix socket paths are limited to 107 bytes: a short base under /tmp, not pytest's tmp_path.
    base = tempfile.mkdtemp(prefix="nfdra", dir="/tmp")
    yield Dirs(plugin=f"{base}/plugins", registry=f"{base}/reg", cdi=f"{base}/cdi")
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[RunningAPI]:
    async with running_api(directory=str(tmp_path)) as k:
        put_node(k)
        yield k


@pytest.fixture
def hgx_host(tmp_path: Path) -> tuple[SysfsBuilder, Libraries]:
    return hgx(tmp_path / "hgx")


@pytest.fixture
def hgx_spec(hgx_host: tuple[SysfsBuilder, Libraries]) -> DevicesSpec:
    return read(*hgx_host)


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> hops.HopThreads:
    """A hop-thread pool of this test's own, so counts are not another test's."""
    pool = hops.HopThreads()
    monkeypatch.setattr(hops, "THREADS", pool)
    return pool


@pytest.fixture
def hgx_driver(api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries]) -> HgxDriver:
    """`async with hgx_driver(record, **options) as r`: the driver on the HGX host (dra_helpers.driving)."""
    return functools.partial(driving, api, dirs, hgx_host[0].host)


@pytest.fixture
def held_driver(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], monkeypatch: pytest.MonkeyPatch
) -> HeldDriver:
    """`async with held_driver(record, held) as (r, hold)`: the driver on the HGX host, started with
    `record`, whose pool build of record `held` is held (dra_helpers.held_driving)."""
    return functools.partial(held_driving, api, dirs, hgx_host[0].host, monkeypatch)
