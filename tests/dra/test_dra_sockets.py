"""The DRA driver's two sockets deleted at the worst moments, as the device plugin's are in
tests/deviceplugin/test_deviceplugin_socket_races.py: whenever the deletions stop, both are served again,
and while they go on the retries back off instead of spinning."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import pytest
from dra_helpers import DRIVER, HgxDriver

from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.testing.sockets import delete_on_sight


async def eventually(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("times", [5, 10**9])
async def test_a_dra_socket_deleted_on_sight_is_served_again_with_backoff(
    *,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    caplog: pytest.LogCaptureFixture,
    times: int,
) -> None:
    """Deleted 5 times as soon as it appears (a socket gone between bind and the driver's look read as
    "serving, no file", equal to "no file" for ever), or for 3 s on end (each successful serve reset the
    backoff: a hot loop)."""
    async with hgx_driver(hgx_spec) as r:
        await r.kubelet.wait_registered(DRIVER)
        path = r.driver.config.dra_socket
        caplog.clear()
        caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
        done = threading.Event()
        cleaner = delete_on_sight(path, times, done)
        await asyncio.to_thread(cleaner.join, 3)  # the length of the attack, not a wait for a result
        done.set()
        await asyncio.to_thread(cleaner.join, 10)
        ours = [rec for rec in caplog.records if getattr(rec, "socket", "") == path]
        serves = [rec for rec in ours if rec.getMessage() == "serving"]
        assert len(serves) <= 8 or times == 5, len(serves)
        await eventually(lambda: os.path.exists(path) and not r.driver.servers.dra.needs_serving())
        await eventually(lambda: os.path.exists(r.driver.config.registration_socket))


async def test_a_registration_retry_that_fell_due_during_the_last_look_wakes_the_driver_at_once(
    *, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """The registration socket lost and backed off, and its retry due by the time the look that skipped it
    (not due when it began) ends, after a slow serve of the DRA socket: the wake-up is at once. It was
    counted only while still ahead, leaving the socket for the next poll (30 s with inotify, were our own
    new DRA socket not to wake the loop). While the DRA socket needs serving, its retry is the one waited
    for: the registration socket is never served before it."""
    async with hgx_driver(hgx_spec, use_inotify=False, fallback_poll=30.0) as r:
        await r.kubelet.wait_registered(DRIVER)
        servers = r.driver.servers
        now = asyncio.get_running_loop().time()
        assert servers.next_retry(now) is None
        servers.registration.retry_at = now - 0.01
        os.unlink(r.driver.config.registration_socket)
        assert servers.next_retry(now) == 0.0
        servers.dra.retry_at = now + 2.0
        os.unlink(r.driver.config.dra_socket)
        assert servers.next_retry(now) == 2.0
