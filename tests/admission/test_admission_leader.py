"""Leader election against the embedded API's Lease: a holder that cannot renew stops admitting before
another replica may take the Lease, so two replicas never admit at once; expiry is judged by each
replica's own clock, from when it saw the Lease last change, never from the holder's renewTime."""

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
        first = LeaderElector(
            load_client(k.kubeconfig), "nodefabric", "a", lease_s=15, clock=clock, monotonic=clock
        )
        second = LeaderElector(
            load_client(k.kubeconfig), "nodefabric", "b", lease_s=15, clock=clock, monotonic=clock
        )
        assert await asyncio.to_thread(first.try_once)
        assert not await asyncio.to_thread(second.try_once)  # held: the other replica sees it from now
        first.leading = True  # what run() records
        assert first.leading
        clock.now += 5
        assert first.leading  # renewed 5 s ago: still within its renew deadline
        # Its renewals hang or fail from here on (an API server it cannot reach); run() is stuck in the
        # call, so nothing sets leading to False. Past the renew deadline it must not lead any more.
        clock.now += 6
        assert not first.leading
        clock.now += 5  # unchanged for longer than the Lease by the other replica's clock: it takes it
        assert await asyncio.to_thread(second.try_once)
        second.leading = True
        assert second.leading and not first.leading
        # A renewal that succeeds again gives the lead back only through the Lease.
        assert not await asyncio.to_thread(first.try_once)


async def test_a_lease_stamped_by_a_clock_far_behind_is_not_taken_while_its_holder_renews() -> None:
    """The holder's renewTime is another machine's clock: a holder whose clock runs a day behind stamps
    renewals that look expired to ours, yet it renews, and the Lease is not taken from it."""
    async with running_api() as k:
        ours, behind = Clock(), Clock()
        behind.now -= 86_400
        holder = LeaderElector(load_client(k.kubeconfig), "nodefabric", "a", lease_s=15, clock=behind)
        other = LeaderElector(
            load_client(k.kubeconfig), "nodefabric", "b", lease_s=15, clock=ours, monotonic=ours
        )
        assert await asyncio.to_thread(holder.try_once)
        for _ in range(5):
            ours.now += 10
            behind.now += 10
            assert not await asyncio.to_thread(other.try_once)
            assert await asyncio.to_thread(holder.try_once)
        # It stops renewing: the Lease is the other replica's once unchanged for its duration.
        ours.now += 10
        assert not await asyncio.to_thread(other.try_once)
        ours.now += 16
        assert await asyncio.to_thread(other.try_once)
