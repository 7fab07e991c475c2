"""A family's device list whose build failed is built again while the record stays the same: a failure
kept for its record version until the record changed left the resource unserved for good on a node whose
record no longer changes. Tried again after a backoff (1 s doubling to 60 s), logged once per streak of
failures, not at every try. Through a test kubelet over real gRPC on unix sockets; the failure is
injected into the list's encoding (`wire.device_list`), as a bug in it would fail."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from dp_helpers import FixtureHost, nic, shutdown, start_plugin, two_nics_and_vfs

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin import offloop, wire
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.resources import Family, FamilyView

EXCLUSIVE = "device.gpustack.ai/rdma"
FAILED = "could not build the device list"
RECOVERED = "built the device list after failed tries"


def failing(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """The exclusive family's list fails its first `times` builds; returns the count of builds tried."""
    real = wire.device_list
    tried, lock = [0], threading.Lock()

    def flaky(current: FamilyView) -> pb.ListAndWatchResponse:
        if current.family is Family.EXCLUSIVE:
            with lock:
                tried[0] += 1
                if tried[0] <= times:
                    raise RuntimeError(f"injected failure {tried[0]}")
        return real(current)

    monkeypatch.setattr(wire, "device_list", flaky)
    return tried


def said(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage().startswith(message) and getattr(r, "resource", "") == EXCLUSIVE
    ]


async def test_a_build_that_failed_once_is_built_again_without_a_record_change(
    plugin_dir: str,
    fixture_host: FixtureHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The default backoff: the first try again comes 1 s after the failure."""
    caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
    tried = failing(monkeypatch, 1)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    try:
        devices = await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2, timeout=30)
        assert {d.health for d in devices} == {"Healthy"}
        assert r.source.version == 1 and tried[0] == 2  # the same record, built twice
        state = r.kubelet.resources[EXCLUSIVE]
        assert not state.stream_ended and state.lists_received == 1
        [failed] = said(caplog, FAILED)
        assert failed.version == 1 and failed.retry_in_s == offloop.BUILD_RETRY.base  # type: ignore[attr-defined]
        assert failed.exc_info is not None and "injected failure 1" in str(failed.exc_info[1])
        [recovered] = said(caplog, RECOVERED)
        assert recovered.failed_tries == 1  # type: ignore[attr-defined]
    finally:
        await shutdown(r)


async def test_a_streak_of_failures_is_logged_once_and_backs_off(
    plugin_dir: str,
    fixture_host: FixtureHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Four failures in a row: one Error for the streak (not one per try), each try further from the
    last (the backoff doubles), then the list served and the streak's end said once. A later failure
    starts a streak of its own."""
    caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
    tried = failing(monkeypatch, 4)
    retry = Backoff(base=0.02, cap=0.16, jitter=False)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), build_retry=retry)
    try:
        await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2, timeout=30)
        assert r.source.version == 1 and tried[0] == 5
        assert len(said(caplog, FAILED)) == 1
        [recovered] = said(caplog, RECOVERED)
        assert recovered.failed_tries == 4  # type: ignore[attr-defined]
        assert all(s.servicer._builds.failures == 0 for s in r.manager.servers)
        # A later failure of a new record is a new streak: said again, once, and served on its retry.
        tried[0] = 0
        r.source.update(DevicesSpec(interfaces=[nic("ens1f0", "0000:19:00.0", "mlx5_0")]))
        await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 1, timeout=30)
        assert len(said(caplog, FAILED)) == 2 and len(said(caplog, RECOVERED)) == 2
    finally:
        await shutdown(r)


async def test_every_call_of_a_failed_version_waits_for_the_backoff_not_a_build_each(
    plugin_dir: str, fixture_host: FixtureHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the backoff the failure answers every call of that version (an Allocate, a preferred
    allocation): no thread, no build. A build is tried again only once the backoff has passed."""
    tried = failing(monkeypatch, 1_000)
    retry = Backoff(base=600.0, cap=600.0, jitter=False)  # no retry within the test
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), build_retry=retry)
    try:
        await asyncio.wait_for(r.manager.serving.wait(), timeout=30)
        servicer = next(s.servicer for s in r.manager.servers if s.servicer.family is Family.EXCLUSIVE)
        while tried[0] == 0:
            await asyncio.sleep(0.01)
        for _ in range(5):
            with pytest.raises(offloop.BuildFailed) as failed:
                await servicer.view()
            assert failed.value.version == 1 and failed.value.retry_in > 500
        assert tried[0] == 1 and servicer._builds.started == 1
    finally:
        await shutdown(r)


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_a_build_ending_after_its_loop_closed_ends_its_thread_quietly(outcome: str) -> None:
    """A build still running when the process's loop closes (a stop mid-build) has nobody to hand its
    outcome to: its thread ends without a traceback from the threading excepthook, whichever way it ends."""
    release, ended = threading.Event(), threading.Event()
    hooked: list[threading.ExceptHookArgs] = []
    before = threading.excepthook
    threading.excepthook = hooked.append

    def build() -> int:
        release.wait(10)
        ended.set()
        if outcome == "raises":
            raise RuntimeError("the build failed after the stop")
        return 1

    async def begin() -> None:
        offloop.start(build, "nodefabric-test-build")

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(begin())
    finally:
        loop.close()
    try:
        release.set()
        assert ended.wait(10)
        for thread in threading.enumerate():
            if thread.name == "nodefabric-test-build":
                thread.join(10)
        assert hooked == []
    finally:
        threading.excepthook = before
