"""Retries pending when kopf is started again within one operator run (cli._kopf: a watched resource's
404, NFD's CRD deleted under its watch), run as the operator runs against the embedded API. kopf's stop
closes the reconciler (handlers.cleanup), which cancels the retries due later (Requeue.close): a record
whose publish failed for a transient reason must still end published."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import kmock
import pytest
from operator_harness import NF, NS, Client, all_say, conditions, eventually, fleet, lines, running_operator
from operator_records import devices, gpu, group, nic, nvlink

from nodefabric_devicemanager import crd
from nodefabric_operator import events
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.noderecord import Outcome
from nodefabric_operator.reconcile import Requeue

RECORDS = 4
FAILING = ("n0", "n1")
# The longest backoff is the requeue's delay: long enough that the retries due after the failure are
# still pending when the restart cancels them (the restart takes about a second).
BACKOFFS = (0.05, 4.0)
RESTARTED = "a watched resource disappeared, restarting the watches"
KOPF_STOPPING = "Root tasks are stopped"  # kopf's DEBUG line, just before it gathers every task of its loop


def refusal(status: int) -> kmock.Response:
    reason = {500: "InternalError", 404: "NotFound", 409: "Conflict"}[status]
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": status}
    body["message"] = f"injected {reason}"
    return kmock.Response(
        status=status, payload=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )


def failing_create(req: Any) -> bool:
    """A NodeFeature write for one of the failing records."""
    if req.method == "GET" or f"/namespaces/{NS}/nodefeatures" not in str(req.url.path):
        return False
    data = req.data if isinstance(req.data, dict) else {}
    name = req.name or (data.get("metadata") or {}).get("name")
    return name in FAILING


def nodefeature_watch(req: Any) -> bool:
    return req.method == "GET" and str(req.url.path).endswith("/nodefeatures") and "watch" in req.url.query


async def published(c: Client) -> bool:
    return await all_say(c, "Published", RECORDS) and all(
        [await c.nodefeature(f"n{i}") for i in range(RECORDS)]
    )


async def restart_with_retries_pending(k: RunningAPI, status: int, caplog: pytest.LogCaptureFixture) -> None:
    """The failing records' creates refused with `status` until kopf has been started again: only a retry
    made after the restart can publish them."""
    broken = [True]
    k.api[lambda req: broken[0] and failing_create(req)] << refusal(status)
    c = await fleet(k, RECORDS)
    gone = [False]
    k.api[lambda req: gone[0] and nodefeature_watch(req)] << refusal(404)
    async with running_operator(k, backoffs=BACKOFFS):

        async def failed_and_others_published() -> bool:
            found = await conditions(c)
            return len(found) == RECORDS and all(
                found[n]["reason"] == (events.PUBLISH_FAILED if n in FAILING else "Published") for n in found
            )

        # Each failing record given up on twice: once with its condition written, then again on that
        # write's echo with nothing to write (the condition says so already), so the version the
        # listing after the restart delivers is the one the last failed publish had in hand.
        await eventually(failed_and_others_published)
        await eventually(lambda: len(lines(caplog, "labels not published")) >= 2 * len(FAILING))
        # The NodeFeature watch ended and re-opened onto a 404 while kopf's observer still sees the CRD:
        # kopf fails whole, and cli._kopf starts it again (as when NFD's CRD is deleted under the watch).
        gone[0] = True
        for watcher in list(k.api.hub(NF).watchers):
            watcher.close()
        await eventually(lambda: lines(caplog, RESTARTED))
        gone[0] = broken[0] = False
        await eventually(lambda: published(c))


async def test_a_publish_failed_for_a_transient_reason_is_retried_after_kopf_restarts(caplog):
    """A server error leaves the record's version unhandled (only a permanent failure marks it so): the
    listing of the kopf started again brings it back and it is published at once, the retries cancelled
    by the stop notwithstanding. Were the version marked handled, the listing's event would be skipped as
    an echo and the record wait for its next change (as a 409 on the read-back, a permanent failure, did
    when this test's fault first answered it)."""
    caplog.set_level(logging.INFO)
    async with running_api([crd.devices_crd()]) as k:
        await restart_with_retries_pending(k, 500, caplog)


def nodefeature_write(req: Any) -> bool:
    return req.method != "GET" and f"/namespaces/{NS}/nodefeatures" in str(req.url.path)


class HeldConflicts:
    """Every NodeFeature write answered 409 while `on`; a write armed to be held gets its 409 only once
    kopf has stopped its root tasks (its watches gone, about to gather every task of its loop), so that
    it is in flight when kopf takes the tasks it waits for."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.on = False
        self.armed = False
        self.held = 0  # writes held so far

    def stops(self) -> int:
        return sum(r.getMessage().startswith(KOPF_STOPPING) for r in self.caplog.records)

    async def __call__(self) -> kmock.Response:
        if self.armed:
            self.armed, self.held, before = False, self.held + 1, self.stops()
            await eventually(lambda: self.stops() > before, timeout=60)
        return refusal(409)


async def test_a_write_answered_409_as_kopf_stops_neither_ends_the_operator_nor_its_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NodeFeature writes refused 409 throughout while kopf stops: once for a watched resource gone (the
    NodeFeature watch's 404, which cli._kopf restarts kopf for), then for the operator's own stop. A
    write in flight as kopf stopped is left its answer (apicall.Landing), and kopf re-raises the
    failure of any task of its loop it waited for: the 409 of that write left kopf.operator in place of
    the 404, and the operator ended, the watches never restarted (8 restarts in 10 here: whichever
    failure kopf came to first), or a plain stop ended with the 409's traceback (every time). The 409 is
    the write's own: its publish reads the object back and is retried like any other conflict."""
    caplog.set_level(logging.DEBUG)
    conflicts = HeldConflicts(caplog)
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 2)
        k.api[lambda req: conflicts.on and nodefeature_write(req)] << conflicts
        gone = [False]
        k.api[lambda req: gone[0] and nodefeature_watch(req)] << refusal(404)
        async with running_operator(k, backoffs=(0.05, 0.1)):
            await eventually(lambda: all_say(c, "Published", 2))
            before = (await c.nodefeature("n0") or {}).get("spec")
            conflicts.on = conflicts.armed = True
            await c.put_devices(members("n0", 8))  # its publish: a NodeFeature write, held
            await eventually(lambda: conflicts.held == 1)
            gone[0] = True
            for watcher in list(k.api.hub(NF).watchers):
                watcher.close()
            await eventually(lambda: lines(caplog, RESTARTED))
            gone[0] = conflicts.on = False
            await eventually(lambda: spec_of(c, "n0", not_equal=before))
            # The operator's own stop with a write in flight, answered 409 once kopf stopped.
            conflicts.on = conflicts.armed = True
            await c.put_devices(members("n1", 4))
            await eventually(lambda: conflicts.held == 2)
        # running_operator: the operator's thread ended without an exception.


def members(name: str, count: int) -> Any:
    """A record whose NVLink domain has `count` members: another label value, a NodeFeature write."""
    return devices(name, interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink(members=count)))])


async def spec_of(c: Client, name: str, *, not_equal: Any) -> bool:
    found = await c.nodefeature(name)
    return found is not None and found.get("spec") != not_equal


async def test_a_retry_armed_after_kopf_stopped_is_not_due_until_kopf_starts_again() -> None:
    """kopf's cleanup closes the reconciler, cancelling the retries due later; a publish still under way
    then (left to end) that failed for a transient reason armed a new one, whose reconcile ran in a task
    kopf neither waits for nor cancels: its writes went out through the stop, and after the lease's
    release on a session opened again. The record is left unhandled for kopf's next listing instead."""
    ran: list[str] = []
    done = asyncio.Event()

    async def run(name: str) -> Outcome:
        ran.append(name)
        done.set()
        return Outcome("published")

    requeue = Requeue(0.01, run, lambda name: True)
    requeue.close()  # kopf's cleanup
    requeue.add("n0")  # a publish ending after it, failed for a transient reason
    assert not requeue._due  # nothing armed: nothing can run later
    requeue.reopen()  # kopf started again: its retries are armed as before
    requeue.add("n1")
    await done.wait()
    assert ran == ["n1"]
    requeue.close()
