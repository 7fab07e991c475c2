"""Our sockets deleted at the worst moments (kubelet restarting in a loop deletes every socket in the
directory, whenever it starts): whenever the deletions stop, every resource is served and registered
again. A socket deleted between the server's bind and the plugin's look at it once read as "serving, no
file", which equals "no file" forever: that resource stayed unregistered until the next kubelet restart."""

from __future__ import annotations

import asyncio
import os
import threading

from dp_helpers import ALL_RESOURCES, FixtureHost, eventually, shutdown, start_plugin, two_nics_and_vfs

from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator


def delete_on_sight(path: str, times: int, done: threading.Event) -> threading.Thread:
    """A thread that deletes `path` the instant it appears, `times` times (or until `done`)."""

    def run() -> None:
        left = times
        while left and not done.is_set():
            try:
                os.unlink(path)
                left -= 1
            except FileNotFoundError:
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


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
