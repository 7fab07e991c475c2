"""Hostile tests of the device list built off the event loop, as kubelet's Allocate and
GetPreferredAllocation meet it: a build that fails, and one that never ends. kubelet's Allocate carries
no deadline of its own, so an answer must come from the plugin. Through a test kubelet over real gRPC on
unix sockets; the failure or the hang is injected into the list's encoding (`wire.device_list`)."""

from __future__ import annotations

import logging
import threading

import grpc
import pytest
from dp_helpers import FixtureHost, nic, shutdown, start_plugin, two_nics_and_vfs

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin import wire
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.resources import Family, FamilyView

EXCLUSIVE = "device.gpustack.ai/rdma"
BUS = "0000:19:00.0"


class Broken:
    """The exclusive family's list builds fail (`fail`) or wait for `release` (`hang`), once armed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fail, self.hang, self.release, self.entered = (threading.Event() for _ in range(4))
        real = wire.device_list

        def device_list(current: FamilyView) -> pb.ListAndWatchResponse:
            if current.family is Family.EXCLUSIVE:
                if self.fail.is_set():
                    raise RuntimeError("injected failure")
                if self.hang.is_set():
                    self.entered.set()
                    self.release.wait(20)  # a deadlock breaker, not a measure
            return real(current)

        monkeypatch.setattr(wire, "device_list", device_list)


def one_nic() -> DevicesSpec:
    return DevicesSpec(interfaces=[nic("ens1f0", BUS, "mlx5_0")])


def grpc_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What grpc's server says of a handler that raised: an unexpected exception."""
    return [r for r in caplog.records if r.name.startswith("grpc") and r.levelno >= logging.ERROR]


async def test_an_allocate_meeting_a_failed_build_is_refused_unavailable_with_the_cause(
    plugin_dir: str,
    fixture_host: FixtureHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The new record's list fails to build: an Allocate (and a preferred allocation) is refused
    UNAVAILABLE saying the build failed, not an UNKNOWN of an exception the handler let through."""
    caplog.set_level(logging.INFO)
    broken = Broken(monkeypatch)
    retry = Backoff(base=600.0, cap=600.0, jitter=False)  # no retry within the test
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), build_retry=retry)
    try:
        await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2, timeout=30)
        plugin = r.kubelet.plugin(EXCLUSIVE)
        broken.fail.set()
        r.source.update(one_nic())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plugin.allocate([BUS], timeout=30)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "record version 2 failed" in str(refused.value.details())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plugin.preferred([BUS], [], 1, timeout=30)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert grpc_errors(caplog) == []
    finally:
        await shutdown(r)


async def test_an_allocate_meeting_a_build_that_hangs_is_refused_within_its_budget(
    plugin_dir: str, fixture_host: FixtureHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new record's list build never ends: the Allocate is refused UNAVAILABLE after the plugin's
    budget, naming the build, rather than wait for ever (kubelet sets no deadline on it); once the
    build ends the Allocate succeeds."""
    broken = Broken(monkeypatch)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), build_budget=0.3)
    try:
        await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2, timeout=30)
        plugin = r.kubelet.plugin(EXCLUSIVE)
        broken.hang.set()
        r.source.update(one_nic())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plugin.allocate([BUS], timeout=30)
        assert not broken.release.is_set()  # answered while the build still hangs
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "did not finish within 0.3 s" in str(refused.value.details())
        broken.hang.clear()
        broken.release.set()
        response = await plugin.allocate([BUS], timeout=30)
        assert len(response.container_responses) == 1
    finally:
        broken.release.set()
        await shutdown(r)
