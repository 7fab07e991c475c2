"""Hostile cases around the waits for what NodeFeatures need (nswait.py, sinks.missing_api, leader.py),
run as the operator runs against the embedded API."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import logging
from typing import Any

import kmock
import pytest
from operator_harness import (
    CRD_NAME,
    DEVICES,
    NF,
    NS,
    Client,
    all_say,
    crds,
    eventually,
    fleet,
    nodefeature_crd,
    running_operator,
    settle,
    writes,
)
from test_operator_leader import Replica, lease

from nodefabric_devicemanager import crd
from nodefabric_operator import cli, events, sinks
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

RECORDS = 4
BACKOFFS = (0.1, 0.2)
JSON = "application/json"
LEASES = "coordination.k8s.io/v1/leases"


async def test_the_nodefeature_watch_ended_by_the_crd_deletion_leaves_no_task_unretrieved(caplog):
    """NFD's CRD deleted under the operator: the NodeFeature watch's 404 ended kopf's watcher task while
    kopf's observer, told of the deletion, stopped that same task as no longer needed; nobody retrieved
    its exception, and asyncio logged "Task exception was never retrieved" as an ERROR whenever the task
    was collected, in whatever came next (a test's count of ERROR lines failed under load). The watch's
    failure is said once, by kopf, when it happens."""
    caplog.set_level(logging.DEBUG)
    async with running_api([crd.devices_crd(), nodefeature_crd()]) as k:
        c = await fleet(k, RECORDS)
        ext = await crds(c)
        for _ in range(3):
            async with running_operator(k, backoffs=BACKOFFS):
                await eventually(lambda: all_say(c, "Published", RECORDS))
                await settle(k)
                await asyncio.to_thread(ext.delete_custom_resource_definition, CRD_NAME)
                await eventually(lambda: all_say(c, events.NFD_NOT_FOUND, RECORDS))
                await asyncio.to_thread(ext.create_custom_resource_definition, nodefeature_crd())
                await eventually(lambda: all_say(c, "Published", RECORDS))
            assert unretrieved() == []


def unretrieved() -> list[str]:
    """Tasks that ended with an exception nobody retrieved: asyncio logs each as an ERROR ("Task exception
    was never retrieved") when it is collected, at no time of the test's choosing."""
    found = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and o.done()]
    return [f"{t.get_name()}: {t._exception!r}" for t in found if getattr(t, "_log_traceback", False)]


NAMED_KIND = json.dumps(  # a Status naming the resource and no object: kube-apiserver's NewNotFound(gr, "")
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "nodefeatures.nfd.k8s-sigs.io not found",
        "reason": "NotFound",
        "details": {"group": "nfd.k8s-sigs.io", "kind": "nodefeatures"},
        "code": 404,
    }
)
OTHER_GROUP = NAMED_KIND.replace("nfd.k8s-sigs.io", "example.com")
PROXY_PAGE = "<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>"


def nodefeature_create(req: Any) -> bool:
    return req.method == "POST" and str(req.url.path).endswith(f"/namespaces/{NS}/nodefeatures")


@pytest.mark.parametrize(
    ("body", "content_type", "said"),
    [
        (NAMED_KIND, "application/json", events.NFD_NOT_FOUND),
        ("not json at all {", "application/json", events.NFD_NOT_FOUND),
        (PROXY_PAGE, "text/html", events.NFD_NOT_FOUND),
        (OTHER_GROUP, "application/json", events.PUBLISH_FAILED),
    ],
    ids=["names-the-resource-not-an-object", "not-json", "proxy-html", "another-group"],
)
async def test_a_create_refused_with_an_ambiguous_404_is_waited_for_only_when_it_can_only_be_the_api(
    caplog, body, content_type, said
):
    """A create's 404 whose Status names the NodeFeature resource and no object (what kube-apiserver
    answers a resource it does not serve through NewNotFound) can only mean the API is not served: a
    create names no object that could be missing. It was taken for a per-record failure: an ERROR line
    and a PublishFailed Event per record. A 404 that is no JSON (a proxy's HTML page) says nothing
    either: waited for as the API's. One naming another group is not about this create: each record's
    own failure, as before."""
    caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
    broken = [True]
    async with running_api([crd.devices_crd(), nodefeature_crd()]) as k:
        c = await fleet(k, RECORDS)
        answer = kmock.Response(status=404, payload=body.encode(), headers={"Content-Type": content_type})
        k.api[lambda req: broken[0] and nodefeature_create(req)] << answer
        async with running_operator(k, backoffs=BACKOFFS):
            await eventually(lambda: all_say(c, said, RECORDS))
            ours = [r for r in caplog.records if r.name.startswith("nodefabric_operator")]
            errors = [r for r in ours if r.levelno >= logging.ERROR]
            if said == events.NFD_NOT_FOUND:
                assert len(errors) == 1, [r.getMessage() for r in errors]
                broken[0] = False
                await eventually(lambda: all_say(c, "Published", RECORDS))
            else:
                assert len(errors) >= RECORDS


RBAC_DENIED = json.dumps(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": 'leases.coordination.k8s.io is forbidden: User "system:serviceaccount:nodefabric:op"'
        ' cannot create resource "leases" in API group "coordination.k8s.io" in the namespace "nodefabric"',
        "reason": "Forbidden",
        "details": {"group": "coordination.k8s.io", "kind": "leases"},
        "code": 403,
    }
)


async def test_a_lease_create_refused_by_rbac_ends_the_operator_saying_so(caplog):
    """A 403 that is not the namespace being deleted (the Role lacks leases): no wait, no backed-off
    retry as for a missing namespace; the operator ends naming the lease and the refusal."""
    caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
    async with running_api([crd.devices_crd()]) as k:
        await fleet(k, 1)
        answer = kmock.Response(status=403, payload=RBAC_DENIED.encode(), headers={"Content-Type": JSON})
        k.api[lambda req: req.method == "POST" and str(req.url.path).endswith("/leases")] << answer
        a = Replica(k)
        await asyncio.to_thread(a.thread.join, 30)
        assert not a.thread.is_alive()
        (failure,) = a.failure
        assert isinstance(failure, cli.StartupError)
        assert f"{NS}/nodefabric-operator" in str(failure) and "403" in str(failure), failure
        assert not [r for r in caplog.records if r.getMessage().startswith("cannot take the lease: its")]
        assert a.published() == 0


@pytest.mark.parametrize(
    "spec",
    [None, {"holderIdentity": 42, "leaseDurationSeconds": 1}, {"holderIdentity": "", "renewTime": 7}],
    ids=["spec-null", "holder-a-number", "renew-time-a-number"],
)
async def test_a_garbage_lease_is_taken_not_crashed_on(spec):
    """A Lease edited to garbage (a null spec, a holder that is a number): read as no live holder's, or
    as one that expires by this replica's clock; the replica takes it and publishes."""
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 1)
        await asyncio.to_thread(
            c.custom.create_namespaced_custom_object,
            "coordination.k8s.io",
            "v1",
            NS,
            "leases",
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "nodefabric-operator"},
            },
        )
        stored = lease(k)
        assert stored is not None
        stored["spec"] = spec
        k.api.put_object(LEASES, stored)
        a = Replica(k)
        try:
            await eventually(lambda: a.published() >= 1)
            assert (lease(k) or {})["spec"]["holderIdentity"]
        finally:
            await a.stopped()
        assert not a.failure


async def published_fleet(k: RunningAPI, records: int) -> Client:
    c = await fleet(k, records)
    async with running_operator(k) as metrics:
        await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == records)
        await settle(k)
    return c


async def test_ours_with_the_managed_by_label_set_by_another_tool_is_marked_ours_again():
    """A NodeFeature owned by its Devices record whose managed-by label says "helm" (a chart's
    commonLabels applied over it): ours, so patched once to say nodefabric; the others cost nothing."""
    async with running_api([crd.devices_crd()]) as k:
        c = await published_fleet(k, 2)
        old = copy.deepcopy(k.api.stored(NF, "n0", NS))
        old["metadata"]["labels"][sinks.MANAGED_BY] = "helm"
        k.api.put_object(NF, old)
        nf_writes = writes(k, NF)
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="unchanged")._value.get() == 2)
            await settle(k)
        assert writes(k, NF) - nf_writes == 1
        assert (await c.nodefeature("n0"))["metadata"]["labels"][sinks.MANAGED_BY] == sinks.MANAGER


async def test_one_with_our_label_but_another_controller_is_not_written():
    """The managed-by label says nodefabric but its controller is nfd-worker's Pod (a copy of ours, or
    the label added by hand): another writer's, left as it is and said in the record's condition."""
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 1)
        foreign = {
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
            "kind": "NodeFeature",
            "metadata": {
                "name": "n0",
                "namespace": NS,
                "labels": {sinks.NFD_NODE_NAME: "n0", sinks.MANAGED_BY: sinks.MANAGER},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "nfd-worker-x",
                        "uid": "u1",
                        "controller": True,
                    }
                ],
            },
            "spec": {"labels": {"x": "y"}},
        }
        k.api.put_object(NF, foreign)
        async with running_operator(k):
            await eventually(lambda: all_say(c, events.PUBLISH_FAILED, 1))
            await settle(k)
        assert writes(k, NF) == 0
        assert k.api.stored(NF, "n0", NS)["spec"] == {"labels": {"x": "y"}}


FLAPS = 8
OPERATOR_WRITES = [
    ("POST", NF),
    ("PATCH", NF),
    ("PATCH", DEVICES),
    ("POST", "v1/events"),
    ("PATCH", "v1/events"),
]


async def test_the_nodefeature_crd_deleted_and_created_again_many_times_converges(caplog):
    """NFD reinstalled over and over (its CRD deleted and created again at once, every NodeFeature with
    it): the operator ends with every record published, and what it said and sent is bounded by the
    flaps, not by records times retries. A flap that deleted the CRD under kopf's watch restarted kopf
    (cli._kopf), whose stop closed the wait for the API: the records waiting (handled, so not brought
    back by the relist) were never probed for again, and waited for good with the CRD back."""
    caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
    records = 8
    async with running_api([crd.devices_crd(), nodefeature_crd()]) as k:
        c = await fleet(k, records)
        ext = await crds(c)
        async with running_operator(k, backoffs=BACKOFFS):
            await eventually(lambda: all_say(c, "Published", records))
            await settle(k)
            caplog.clear()
            before = sum(k.count(*w) for w in OPERATOR_WRITES)
            for i in range(FLAPS):
                await asyncio.to_thread(ext.delete_custom_resource_definition, CRD_NAME)
                await asyncio.sleep(0.05 * (i % 3))
                await asyncio.to_thread(ext.create_custom_resource_definition, nodefeature_crd())
                await asyncio.sleep(0.05 * (i % 4))

            async def published() -> bool:
                return await all_say(c, "Published", records) and all(
                    [await c.nodefeature(f"n{i}") for i in range(records)]
                )

            await eventually(published, timeout=60)
            await settle(k)
            sent = sum(k.count(*w) for w in OPERATOR_WRITES) - before
        ours = [r for r in caplog.records if r.name.startswith("nodefabric_operator")]
        errors = [r.getMessage() for r in ours if r.levelno >= logging.ERROR]
        assert len(errors) <= FLAPS, errors
        assert len([r for r in ours if r.levelno >= logging.WARNING]) <= 4 * FLAPS
        # Per flap and record: the create, its status, an Event; and the probes.
        assert sent <= FLAPS * records * 4, sent
