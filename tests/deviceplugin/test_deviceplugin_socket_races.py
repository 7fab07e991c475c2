"""Our sockets deleted at the worst moments (kubelet restarting in a loop deletes every socket in the
directory, whenever it starts): whenever the deletions stop, every resource is served and registered
again. A socket deleted between the server's bind and the plugin's look at it once read as "serving, no
file", which equals "no file" forever: that resource stayed unregistered until the next kubelet restart."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import pytest
from dp_helpers import (
    ALL_RESOURCES,
    FixtureHost,
    eventually,
    shutdown,
    start_plugin,
    two_nics_and_vfs,
    wait_all_registered,
)

from nodefabric_deviceplugin import unixserver
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator
from nodefabric_deviceplugin.testing.sockets import delete_on_sight


async def test_sockets_deleted_as_soon_as_they_are_bound_are_served_and_registered_again(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    done = threading.Event()
    cleaners = [
        delete_on_sight(os.path.join(plugin_dir, f"nodefabric-{resource.split('/')[1]}.sock"), 5, done)
        for resource in ALL_RESOURCES
    ]
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), kubelet=kubelet)
    try:
        await asyncio.to_thread(lambda: [c.join(30) for c in cleaners])
        sockets = [os.path.join(plugin_dir, f"nodefabric-{res.split('/')[1]}.sock") for res in ALL_RESOURCES]
        # Readiness answers from the last look: the last deletion may not have been seen yet.
        await eventually(lambda: all(map(os.path.exists, sockets)) and r.manager.readiness()[0], timeout=20)
        for resource in ALL_RESOURCES:
            devices = await kubelet.plugin(resource).options()
            assert devices.get_preferred_allocation_available
    finally:
        done.set()
        await shutdown(r)


async def test_kubelet_restarting_in_a_loop_ends_with_every_resource_registered(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    try:
        await eventually(lambda: r.manager.readiness()[0], timeout=20)
        for _ in range(10):
            await r.kubelet.restart()
        # The last kubelet forgot every list: each resource registers again and sends its devices.
        for resource in ALL_RESOURCES:
            assert await r.kubelet.wait_devices(resource, lambda devices: len(devices) > 0, timeout=20)
        await eventually(lambda: r.manager.readiness()[0], timeout=20)
    finally:
        await shutdown(r)


async def test_a_socket_retry_due_while_kubelet_answers_slowly_is_not_left_for_the_safety_poll(
    plugin_dir: str, fixture_host: FixtureHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restart loop above timed out so now and then: a look at the directory finds one socket of ours gone
    too soon after it was served (its serve backs off, 0.04 s here) and a new kubelet to register the
    others with. When kubelet answered those Registers after the backoff had passed (a loaded node), the
    next wake-up left out the retry that was already due: the socket stayed unserved and its resource
    unregistered until the 30 s safety poll (an hour here), as nothing else changes in the directory."""
    # Every loss counts as a quick one: the first serve after it fails, and is retried, whatever the speed.
    monkeypatch.setattr(unixserver, "QUICK_LOSS_S", 3600.0)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), safety_poll=3600)
    try:
        await wait_all_registered(r.kubelet, 1)
        await eventually(lambda: r.manager.readiness()[0])  # the plugin has seen each Register return
        exclusive, *others = ALL_RESOURCES
        hold = r.kubelet.hold_registrations = asyncio.Event()
        # A new kubelet, and one socket of ours gone: no await between them, so one look sees both.
        await r.kubelet.stop()
        os.unlink(os.path.join(plugin_dir, f"nodefabric-{exclusive.split('/')[1]}.sock"))
        await r.kubelet.start()
        # That look: the exclusive socket's serve failed and backs off; the others' Registers wait here.
        await r.kubelet.wait_for(lambda: r.kubelet.registrations_held == len(others), timeout=20)
        await asyncio.sleep(0.2)  # kubelet answers after the retry is due (shorter only weakens the check)
        hold.set()
        await r.kubelet.wait_registered(exclusive, count=2, timeout=20)
        assert len(await r.kubelet.wait_devices(exclusive, lambda ds: len(ds) > 0, timeout=20)) == 2
        await eventually(lambda: r.manager.readiness()[0], timeout=20)
    finally:
        await shutdown(r)


async def test_a_socket_deleted_for_ever_is_served_again_with_backoff_not_in_a_hot_loop(
    plugin_dir: str, fixture_host: FixtureHost, caplog: pytest.LogCaptureFixture
) -> None:
    """Something deleting our socket the instant it appears (a second plugin on the same directory, a
    cleaner gone wrong): each serve that succeeded reset the backoff, so the plugin re-served and tried
    to register in a hot loop (about 90 serves and 90 ERROR lines a second, a core spent). A socket lost
    right after it was served counts as a failed serve: the retries back off to the 5 s cap."""
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    try:
        await eventually(lambda: r.manager.readiness()[0], timeout=20)
        resource = ALL_RESOURCES[0]
        path = os.path.join(plugin_dir, f"nodefabric-{resource.split('/')[1]}.sock")
        caplog.clear()
        caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
        done = threading.Event()
        cleaner = delete_on_sight(path, 10**9, done)
        await asyncio.sleep(3)  # the length of the attack, not a wait for a result
        done.set()
        # The lines of the attack's 3 s only: once it ends the resource is served and registered again,
        # which logs on while the cleaner thread is joined (a loaded machine joins it late).
        during = list(caplog.records)
        await asyncio.to_thread(cleaner.join, 10)
        ours = [
            rec
            for rec in during
            if getattr(rec, "socket", None) == path or getattr(rec, "resource", None) == resource
        ]
        serves = [rec for rec in ours if rec.getMessage() == "serving"]
        # Backoff 0.2, 0.4, 0.8, 1.6 s...: a handful of serves in 3 s however fast the machine is.
        assert len(serves) <= 8, len(serves)
        # The hot loop's mark is its ERROR lines (90 a second); the INFO lines of each cycle vary with the
        # machine's speed (a loaded one lets some registrations through, each a cycle of its own).
        errors = [rec.getMessage() for rec in ours if rec.levelno >= logging.ERROR]
        assert len(errors) <= 30, errors
        # Once the deletions stop, the resource is served and registered again.
        await eventually(lambda: os.path.exists(path) and r.manager.readiness()[0], timeout=20)
        assert (await r.kubelet.plugin(resource).options()).get_preferred_allocation_available
    finally:
        await shutdown(r)
