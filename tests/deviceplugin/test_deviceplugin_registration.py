"""Following kubelet: inotify on the plugin directory, the fallback poll, readiness, the absent-kubelet
warning. Through the real servers and the test kubelet over unix sockets."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable

import pytest
from dp_helpers import FixtureHost, eventually, shutdown, start_plugin, two_nics_and_vfs, wait_all_registered

from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator

EXCLUSIVE = "device.gpustack.ai/rdma"
SHARED = "device.gpustack.ai/rdma.shared"
PARTITIONED = "device.gpustack.ai/rdma.partitioned"
ALL = (EXCLUSIVE, SHARED, PARTITIONED)


async def test_a_kubelet_restart_is_noticed_by_inotify_alone(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    # A safety poll of an hour: only an inotify event can make the plugin look at the directory.
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), safety_poll=3600)
    try:
        await asyncio.wait_for(r.manager.serving.wait(), 30)
        assert r.manager.watching
        await r.kubelet.restart()
        await wait_all_registered(r.kubelet, 2)
        devices = await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
        assert len(devices) == 2
        # kubelet counts a registration when it admits it; the plugin, when Register returns: wait for both.
        await eventually(lambda: r.manager.readiness()[0])
    finally:
        await shutdown(r)


async def test_idle_the_plugin_does_not_wake_up(plugin_dir: str, fixture_host: FixtureHost) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), safety_poll=3600)
    try:
        await asyncio.wait_for(r.manager.serving.wait(), 30)
        await asyncio.sleep(0.1)  # the registrations' own directory events settle
        before = r.manager.reconciles
        # Another plugin's socket and kubelet's DEPRECATION file are not ours to react to.
        with open(os.path.join(plugin_dir, "DEPRECATION"), "w") as f:
            f.write("x\n")
        await asyncio.sleep(0.5)  # a 100 ms poll would have looked five times by now
        assert r.manager.reconciles == before
    finally:
        await shutdown(r)


async def test_without_inotify_the_fallback_poll_follows_a_restart(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(
        plugin_dir, fixture_host.host, two_nics_and_vfs(), use_inotify=False, fallback_poll=0.05
    )
    try:
        await asyncio.wait_for(r.manager.serving.wait(), 30)
        assert not r.manager.watching
        await r.kubelet.restart()
        await wait_all_registered(r.kubelet, 2)
    finally:
        await shutdown(r)


async def test_a_replaced_plugin_directory_is_watched_again(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(
        plugin_dir, fixture_host.host, two_nics_and_vfs(), fallback_poll=0.05, safety_poll=3600
    )
    try:
        await asyncio.wait_for(r.manager.serving.wait(), 30)
        await r.kubelet.stop()
        shutil.rmtree(plugin_dir)
        os.makedirs(plugin_dir)
        await r.kubelet.start()
        await wait_all_registered(r.kubelet, 2)
        await r.kubelet.wait_for(lambda: r.manager.watching)
        # The new directory is watched: the next restart needs no poll.
        await r.kubelet.restart()
        await wait_all_registered(r.kubelet, 3)
    finally:
        await shutdown(r)


async def test_readiness_follows_registration(plugin_dir: str, fixture_host: FixtureHost) -> None:
    kubelet = KubeletEmulator(plugin_dir)
    r = await start_plugin(plugin_dir, fixture_host.host, None, kubelet=kubelet)
    try:
        assert r.manager.readiness() == (False, "device plugin: waiting for the first device record")
        r.source.update(two_nics_and_vfs())

        async def until(predicate: Callable[[tuple[bool, str]], bool]) -> tuple[bool, str]:
            await eventually(lambda: predicate(r.manager.readiness()))
            return r.manager.readiness()

        ok, message = await until(lambda rd: "kubelet.sock" in rd[1])
        assert not ok and message.startswith(f"device plugin: no kubelet.sock at {plugin_dir}/kubelet.sock")

        kubelet.refuse[EXCLUSIVE] = "resource already registered"
        await kubelet.start()
        # The other two register; the refused one is named, with kubelet's reason.
        refused = (
            "device plugin: not registered with kubelet: "
            "device.gpustack.ai/rdma (INVALID_ARGUMENT: resource already registered)"
        )
        assert await until(lambda rd: rd[1] == refused) == (False, refused)
        assert kubelet.registrations(SHARED) == kubelet.registrations(PARTITIONED) == 1

        del kubelet.refuse[EXCLUSIVE]
        ok, message = await until(lambda rd: rd[0])
        assert message == f"device plugin: registered {EXCLUSIVE}, {SHARED}, {PARTITIONED}"

        await kubelet.stop()  # kubelet gone: not ready until a new one accepted every resource
        ok, _ = await until(lambda rd: not rd[0])
        await kubelet.start()
        ok, _ = await until(lambda rd: rd[0])
    finally:
        await shutdown(r)
    assert r.manager.readiness() == (False, "device plugin: not running")


async def test_an_absent_kubelet_is_a_warning_once(
    plugin_dir: str, fixture_host: FixtureHost, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
    kubelet = KubeletEmulator(plugin_dir)
    r = await start_plugin(
        plugin_dir, fixture_host.host, two_nics_and_vfs(), kubelet=kubelet, kubelet_absent_warning=0.2
    )

    def warnings() -> list[logging.LogRecord]:
        return [
            rec
            for rec in caplog.records
            if rec.levelno == logging.WARNING and "kubelet.sock" in rec.getMessage()
        ]

    try:
        await eventually(lambda: bool(warnings()))
        (warning,) = warnings()
        assert warning.path == os.path.join(plugin_dir, "kubelet.sock")  # type: ignore[attr-defined]
        assert warning.absent_s >= 0.2  # type: ignore[attr-defined]
        await asyncio.sleep(0.3)
        assert len(warnings()) == 1, "said once per absence, not on every look"
        await kubelet.start()
        await kubelet.wait_registered(EXCLUSIVE)
        assert any(rec.getMessage() == "kubelet.sock is back" for rec in caplog.records)
    finally:
        await shutdown(r)


def _failed_registrations() -> dict[str, float]:
    from prometheus_client import REGISTRY

    return {
        family: REGISTRY.get_sample_value(
            "nodefabric_deviceplugin_registrations_total", {"family": family, "outcome": "failed"}
        )
        or 0.0
        for family in ("rdma", "rdma.shared", "rdma.partitioned")
    }


async def test_an_absent_kubelet_counts_failed_registrations_for_the_alert(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    """The README's alert, increase(nodefabric_deviceplugin_registrations_total{outcome="failed"}[15m]),
    fires for a kubelet that never shows up: a failure per family per warning interval while absent."""
    kubelet = KubeletEmulator(plugin_dir)
    before = _failed_registrations()
    r = await start_plugin(
        plugin_dir, fixture_host.host, two_nics_and_vfs(), kubelet=kubelet, kubelet_absent_warning=0.2
    )
    try:
        await eventually(lambda: all(_failed_registrations()[f] >= before[f] + 2 for f in before))
        await kubelet.start()
        await kubelet.wait_registered(EXCLUSIVE)
        await wait_all_registered(kubelet, 1)
        settled = _failed_registrations()
        await asyncio.sleep(0.5)
        assert _failed_registrations() == settled, "no more failures once kubelet is back and registered"
    finally:
        await shutdown(r)
