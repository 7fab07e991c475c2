"""Leader election against the embedded API's Lease: a holder that cannot renew stops admitting before
another replica may take the Lease, so two replicas never admit at once."""

from __future__ import annotations

import asyncio

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission.leader import LeaderElector
from nodefabric_operator.demo.kubeapi import running_api


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_holder_that_cannot_renew_stops_leading_before_the_lease_is_free() -> None:
    async with running_api() as k:
        clock = Clock()
        first = LeaderElector(load_client(k.kubeconfig), "nodefabric", "a", lease_s=15, clock=clock)
        second = LeaderElector(load_client(k.kubeconfig), "nodefabric", "b", lease_s=15, clock=clock)
        assert await asyncio.to_thread(first.try_once)
        first.leading = True  # what run() records
        assert first.leading
        clock.now += 5
        assert first.leading  # renewed 5 s ago: still within its renew deadline
        # Its renewals hang or fail from here on (an API server it cannot reach); run() is stuck in the
        # call, so nothing sets leading to False. Past the renew deadline it must not lead any more.
        clock.now += 6
        assert not first.leading
        clock.now += 5  # the Lease ran out: the other replica takes it
        assert await asyncio.to_thread(second.try_once)
        second.leading = True
        assert second.leading and not first.leading
        # A renewal that succeeds again gives the lead back only through the Lease.
        assert not await asyncio.to_thread(first.try_once)
