"""More than one operator replica: a Lease elects the one that publishes; the others stand by, take
over when it stops (it releases the lease) or when it cannot renew, and a leader that lost its lease
stops publishing and exits 1. Real operators against the embedded API."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from operator_harness import NS, Client, eventually
from operator_records import gpu_record

from nodefabric_devicemanager import crd
from nodefabric_operator import cli, leader, sinks
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.metrics import Metrics

TIMING = (2.0, 1.0, 0.1)  # duration, renew deadline, retry: seconds, for a quick test


class Replica:
    def __init__(self, k: RunningAPI, kubeconfig: str | None = None) -> None:
        self.metrics = Metrics()
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.failure: list[BaseException] = []
        opts = cli.Options(
            namespace=NS,
            kubeconfig=kubeconfig or k.kubeconfig,
            backoffs=(0.05,),
            leader_elect=True,
            lease_timing=TIMING,
        )

        def main() -> None:
            try:
                asyncio.run(cli.serve(opts, metrics=self.metrics, stop_flag=self.stop, ready_flag=self.ready))
            except BaseException as err:
                self.failure.append(err)

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()

    def published(self) -> float:
        return sum(self.metrics.reconciles.labels(outcome=o)._value.get() for o in ("published", "unchanged"))

    async def stopped(self) -> None:
        self.stop.set()
        await asyncio.to_thread(self.thread.join, 60)
        assert not self.thread.is_alive()


@contextlib.asynccontextmanager
async def replicas(k: RunningAPI, n: int) -> AsyncIterator[list[Replica]]:
    started = [Replica(k) for _ in range(n)]
    try:
        yield started
    finally:
        for r in started:
            await r.stopped()


def lease(k: RunningAPI) -> dict[str, Any] | None:
    return k.api.stored("coordination.k8s.io/v1/leases", "nodefabric-operator", NS)


async def test_one_replica_publishes_and_a_standby_takes_over_when_it_stops():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        for n in ("n0", "n1"):
            await c.node(n)
            await c.put_devices(gpu_record(n))
        async with replicas(k, 2) as (a, b):
            await eventually(lambda: a.published() + b.published() == 2)
            # (No settle(): the replicas renew and poll the lease every 0.1 s, so the API is never quiet.)
            leading, standing = (a, b) if a.published() else (b, a)
            assert standing.published() == 0 and not standing.ready.is_set()
            holder = lease(k)["spec"]["holderIdentity"]
            assert holder.startswith(cli.instance() + "_")
            await asyncio.sleep(TIMING[0] * 1.5)  # past a lease duration: renewed, still one leader
            assert standing.published() == 0 and lease(k)["spec"]["holderIdentity"] == holder

            started = time.monotonic()
            await leading.stopped()  # releases the lease: the standby need not wait it out
            assert not leading.failure
            await eventually(lambda: standing.published() == 2)
            assert time.monotonic() - started < 10
            spec = lease(k)["spec"]
            assert spec["holderIdentity"] != holder and spec["leaseTransitions"] >= 1
            assert standing.metrics.reconciles.labels(outcome="published")._value.get() == 0  # already done
        assert not a.failure and not b.failure


async def test_a_leader_that_cannot_renew_stops_publishing_and_exits_1(caplog):
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        async with replicas(k, 1) as (a,):
            await eventually(lambda: a.published() == 1)
            # Someone else holds it now, freshly renewed for a minute: a renewal is refused.
            stolen = lease(k)
            stolen["spec"].update(
                holderIdentity="thief", leaseDurationSeconds=60, renewTime=leader._stamp(time.time())
            )
            k.api.put_object("coordination.k8s.io/v1/leases", stolen)
            await asyncio.to_thread(a.thread.join, 30)
            assert not a.thread.is_alive()
        (lost,) = a.failure
        assert isinstance(lost, cli.LeadershipLost)
        assert any(r.getMessage() == "lost the lease, stopping" for r in caplog.records)
        assert lease(k)["spec"]["holderIdentity"] == "thief"  # not released: it was not ours any more


async def test_without_the_right_to_the_lease_it_is_one_line_and_exit_2(caplog):
    from watch_breaker import watch_breaker

    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        proxy.refuse("GET", "/apis/coordination.k8s.io/", 403)
        parser = __import__("argparse").ArgumentParser()
        cli.add_arguments(parser)
        args = parser.parse_args(["--kubeconfig", proxy.kubeconfig, "--namespace", NS, "--leader-elect"])
        assert await asyncio.to_thread(cli.run, args) == 2
        (line,) = [r for r in caplog.records if r.getMessage() == "operator cannot start"]
        assert line.error == f"cannot take the lease {NS}/nodefabric-operator: HTTP 403 Forbidden"


def test_a_lease_name_the_api_would_refuse_is_refused_at_start(caplog):
    parser = __import__("argparse").ArgumentParser()
    cli.add_arguments(parser)
    for bad in ("Operator", "a_b", "-x", "x" * 254):
        args = parser.parse_args(["--leader-elect", f"--lease-name={bad}"])
        assert cli.run(args) == 2
        assert "is not a Lease name" in caplog.records[-1].error


async def test_a_lease_whose_renew_time_lies_ahead_is_taken_once_nobody_renews_it():
    # A Lease edited by hand, or renewed by a holder whose clock runs ahead: its renewTime is years away.
    # Read against our own clock it would never expire, and no replica would ever lead. As client-go
    # does, a holder is gone when its record has not changed for a lease duration of our own clock.
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        ahead = leader._stamp(time.time() + 10 * 365 * 86400)
        k.api.put_object(
            "coordination.k8s.io/v1/leases",
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "nodefabric-operator", "namespace": NS},
                "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 2, "renewTime": ahead},
            },
        )
        async with replicas(k, 1) as (a,):
            await eventually(lambda: a.published() == 1)
            assert lease(k)["spec"]["holderIdentity"] != "ghost"
        assert not a.failure


def test_a_holder_is_gone_once_its_record_went_unchanged_for_a_lease_duration():
    """Times are of the replica's own clock: when it first saw the record as it is, and now."""
    held = {"holderIdentity": "other", "renewTime": "2099-01-01T00:00:00.000000Z", "leaseDurationSeconds": 15}
    assert not leader.takeable(held, "me", seen=100.0, now=110.0)
    assert leader.takeable(held, "me", seen=100.0, now=116.0)
    assert leader.takeable({**held, "holderIdentity": "me"}, "me", seen=100.0, now=100.0)
    assert leader.takeable({**held, "holderIdentity": ""}, "me", seen=100.0, now=100.0)
    assert leader.takeable({**held, "leaseDurationSeconds": "15"}, "me", seen=100.0, now=100.0)


async def test_the_lease_is_renewed_while_the_new_leader_lists_what_it_starts_from():
    """Between taking the lease and starting its watches the leader lists the records and the sink's
    objects (seconds on a large or slow cluster). Unrenewed meanwhile, the lease expired under it: a
    standby took it while this replica went on to publish, two writers until its renewal failed."""
    from watch_breaker import watch_breaker

    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        # The listing of the NodeFeatures takes twice the lease's duration.
        proxy.delay("GET", f"/apis/{sinks.NFD_GROUP}/", TIMING[0] * 2)
        a = Replica(k, kubeconfig=proxy.kubeconfig)
        try:
            first = await eventually(lambda: (lease(k) or {}).get("spec", {}).get("renewTime"))
            await asyncio.sleep(TIMING[0] * 1.5)
            assert a.published() == 0, "still listing"
            assert lease(k)["spec"]["renewTime"] != first, "not renewed while listing"
            proxy.allow()
            await eventually(lambda: a.published() == 1)
        finally:
            await a.stopped()
        assert not a.failure


async def test_a_leader_refused_its_lease_stops_and_says_why(caplog):
    """RBAC taken away mid-run (the Role edited, the binding deleted): a renewal answered 403 ends the
    leadership at once. It stopped with exit 1 and no word of why (the renewal task's error was never
    read); now the error is logged."""
    from watch_breaker import watch_breaker

    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        a = Replica(k, kubeconfig=proxy.kubeconfig)
        try:
            await eventually(lambda: a.published() == 1)
            proxy.refuse("PUT", "/apis/coordination.k8s.io/", 403)
            await asyncio.to_thread(a.thread.join, 30)
            assert not a.thread.is_alive()
        finally:
            await a.stopped()
        (lost,) = a.failure
        assert isinstance(lost, cli.LeadershipLost)
        (line,) = [r for r in caplog.records if r.getMessage() == "lost the lease, stopping"]
        assert line.error.startswith("HTTP 403"), line.error
