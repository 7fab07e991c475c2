"""Objects of the wrong shape, from the watch or the API: the operator plans them as empty, reports what
it cannot do, and never crashes a handler or loses a label it should keep."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import kubernetes
import pytest
from operator_harness import NF, NS, Client, eventually, running_operator, settle
from operator_records import devices, gpu_record, nic
from watch_breaker import watch_breaker

from nodefabric_devicemanager import crd, models
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import cli, labels, sinks
from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.reconcile import Reconciler

P = "feature.gpustack.ai/"
CAPABLE = P + "rdma.capable"
DEVICES_PATH = (models.GROUP, models.VERSION, models.PLURAL)
NF_PATH = (sinks.NFD_GROUP, sinks.NFD_VERSION, NS, sinks.NFD_PLURAL)


async def test_without_rbac_to_read_nodes_a_record_without_owner_is_still_published(caplog):
    """The NodeFeature sink reads the Node of a record without a Node owner; a least-privilege install
    may not grant that: the record is published as before, with one warning, not failed."""
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_record("n1"), node_owner=False)
        proxy.refuse("GET", "/api/v1/nodes/", 403)
        caplog.set_level(logging.WARNING, logger="nodefabric_operator")
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            await settle(k)
        assert (await c.nodefeature("n1"))["spec"]["labels"][CAPABLE] == "true"
        (warning,) = [
            r
            for r in caplog.records
            if r.getMessage() == "cannot check that the node exists, publishing anyway"
        ]
        assert (warning.node, warning.error) == ("n1", "HTTP 403 Forbidden")


def _reconciler(kubeconfig: str) -> Reconciler:
    api = load_client(kubeconfig)
    return Reconciler(api, sinks.NodeFeatureSink(api, NS, labels.DEFAULT_DOMAIN), backoffs=())


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param({"spec": {"labels": {CAPABLE: 1, P + "rdma.numa": None}}}, id="values-not-text"),
        # (ownerReferences that are not maps cannot be stored: every API server refuses them with 400)
        pytest.param({"metadata": {"ownerReferences": []}}, id="owners-removed"),
        pytest.param({"metadata": {"labels": {sinks.NFD_NODE_NAME: "someone-else"}}}, id="tag-changed"),
    ],
)
async def test_a_nodefeature_bent_out_of_shape_is_repaired_not_a_crash(garbage):
    """Someone writes our NodeFeature into a shape no schema allows (an API without NFD's schema stores
    it): the watch delivers it, the operator plans it as empty and writes its labels and owner back."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_record("n1"))
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            uid = (await c.devices("n1"))["metadata"]["uid"]
            await asyncio.to_thread(c.custom.patch_namespaced_custom_object, *NF_PATH, "n1", garbage)

            async def repaired():
                nf = await c.nodefeature("n1")
                spec_labels = nf["spec"].get("labels") if isinstance(nf.get("spec"), dict) else None
                owners = nf["metadata"].get("ownerReferences")
                return (
                    isinstance(spec_labels, dict)
                    and spec_labels.get(CAPABLE) == "true"
                    and isinstance(owners, list)
                    and any(isinstance(o, dict) and o.get("uid") == uid for o in owners)
                    and nf["metadata"].get("labels")
                    == {sinks.NFD_NODE_NAME: "n1", sinks.MANAGED_BY: sinks.MANAGER}
                )

            assert await eventually(repaired)
            # Still working: the next change of the record is published as usual.
            await c.put_devices(devices("n1", interfaces=[nic(numa="1")]))
            assert await eventually(lambda: _numa(c, "1"))
            await settle(k)
        assert metrics.reconciles.labels(outcome="error")._value.get() == 0


async def _numa(c: Client, value: str) -> bool:
    nf = await c.nodefeature("n1")
    return nf["spec"]["labels"].get(P + "rdma.numa") == value


@pytest.mark.parametrize(
    "obj",
    [
        {"spec": "labels"},
        {"spec": {"labels": ["a", "b"]}},
        {"spec": {"labels": {CAPABLE: 1, 7: "x"}}},
        {"metadata": "n1"},
        {"metadata": {"name": "n1", "ownerReferences": {"uid": "x"}, "labels": "x", "resourceVersion": True}},
        {"metadata": {"annotations": ["x"], "resourceVersion": ["1"]}},
        {"metadata": {"annotations": {sinks.managed_annotation("gpustack.ai"): 7}}},
        [],
        "x",
    ],
)
@pytest.mark.parametrize("sink", ["nodefeature", "node"])
def test_an_object_of_any_shape_is_read_as_what_it_shows(obj, sink):
    """Shapes no schema allows (an API without NFD's schema stores them; a merge patch cannot make them
    here) read as empty, never as an exception inside a watch handler."""
    api = kubernetes.client.ApiClient()  # never called: reading a shape makes no request
    if sink == "nodefeature":
        target: sinks.Sink = sinks.NodeFeatureSink(api, NS, "gpustack.ai")
    else:
        target = sinks.NodeSink(api, "gpustack.ai")
    snapshot = target.snapshot(obj)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in snapshot.labels.items())
    assert snapshot.rv is None or isinstance(snapshot.rv, str)
    assert isinstance(snapshot.owners, frozenset)
    desired = {CAPABLE: "true"}
    assert target.drifted(sinks.Owner("n1", "u1"), desired, frozenset(), snapshot)  # a repair, planned


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"metadata": ["n1"]}, id="metadata-a-list"),
        pytest.param(
            {"metadata": {"name": "n1", "resourceVersion": "7"}, "spec": {"interfaces": "x"}}, id="spec-wrong"
        ),
        pytest.param(
            {"metadata": {"name": "n1", "resourceVersion": 7, "ownerReferences": "x"}}, id="rv-a-number"
        ),
        pytest.param({}, id="empty"),
    ],
)
async def test_a_devices_record_of_the_wrong_shape_publishes_and_removes_nothing(body):
    async with running_api([crd.devices_crd()]) as k:
        rec = _reconciler(k.kubeconfig)
        before = k.count()
        outcome = await rec.devices_event(body)
        assert outcome.outcome in ("invalid", "unchanged")
        assert k.count() == before or outcome.outcome == "unchanged"
        assert k.count("POST", NF) == 0


async def test_a_record_owned_by_another_node_is_not_taken_for_proof_that_its_own_node_exists():
    """The NodeFeature sink trusts a Node owner as proof that the node exists (the agent sets it, and
    deleting the Node deletes the record). An owner reference to a different Node proves nothing about
    this one: the record's own node is read, and a missing one is reported, not published for."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        other = await c.node("n2")
        await c.put_devices(gpu_record("n1"), node_owner=False)
        owner = {"apiVersion": "v1", "kind": "Node", "name": "n2", "uid": other["uid"]}
        await asyncio.to_thread(
            c.custom.patch_cluster_custom_object,
            *DEVICES_PATH,
            "n1",
            {"metadata": {"ownerReferences": [owner]}},
        )
        async with running_operator(k):

            async def reported() -> bool:
                conds = (await c.devices("n1")).get("status", {}).get("conditions", [])
                return any(x["type"] == "LabelsPublished" and x["reason"] == "NodeNotFound" for x in conds)

            await eventually(reported)
            await settle(k)
        assert await c.nodefeature("n1") is None
        assert k.count("POST", NF) == 0


async def test_the_devices_crd_deleted_and_created_again_does_not_stop_the_operator():
    """Deleting the CRD deletes every record (and their NodeFeatures with them) and ends the watch; kopf
    re-opened it before it learnt the resource was gone and failed whole on the 404. The operator keeps
    running, and publishes the records written once the CRD is back."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        record = gpu_record("n0")
        await c.put_devices(record)
        ext = kubernetes.client.ApiextensionsV1Api(c.core.api_client)
        async with running_operator(k):
            await eventually(lambda: c.nodefeature("n0"))
            await settle(k)
            await asyncio.to_thread(
                ext.delete_custom_resource_definition, crd.devices_crd()["metadata"]["name"]
            )
            await eventually(lambda: k.api.stored(NF, "n0", NS) is None)
            await settle(k)
            await asyncio.to_thread(ext.create_custom_resource_definition, crd.devices_crd())
            await c.put_devices(record)

            async def capable() -> str | None:
                nf = await c.nodefeature("n0") or {}
                return nf.get("spec", {}).get("labels", {}).get(CAPABLE)

            assert await eventually(capable, timeout=90) == "true"


TOO_LARGE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "Too large resource version: 1200, current: 1100",
        "reason": "Timeout",
        "details": {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
        },
        "code": 504,
    },
}


@pytest.mark.parametrize(
    "last",
    [
        # What an API server behind a load balancer sends a watch resumed on a replica whose cache lags.
        pytest.param(json.dumps(TOO_LARGE).encode() + b"\n", id="error-504-too-large-rv"),
        pytest.param(
            json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 500}}).encode() + b"\n",
            id="error-500",
        ),
        pytest.param(b'{"type": "ERROR", "object": {"kind": "Status"}}\n', id="error-without-code"),
        pytest.param(b"[1]\n", id="json-not-an-event"),
        pytest.param(b"<html>502 Bad Gateway</html>\n", id="not-json"),
    ],
)
async def test_a_watch_ended_by_an_error_event_or_garbage_is_opened_again_not_the_operator_ended(
    last, caplog
):
    """kopf restarts a watch only after a 410 ERROR event; any other ERROR event (a 504 "Too large
    resource version" from a lagging API server replica, a 500) or a line that is no JSON (a proxy's
    page) failed the whole operator: a traceback, exit 1, and no labels until the pod restarted. The
    watch is listed and opened again, as client-go's reflector does, and publishing goes on."""
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(devices("n1", interfaces=[nic(numa="0")]))
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            await eventually(lambda: proxy.open_watches >= 2)
            assert proxy.end_watches(last) >= 2
            await c.put_devices(devices("n1", interfaces=[nic(numa="1")]))
            assert await eventually(lambda: _numa(c, "1"))
            await settle(k)


@pytest.mark.parametrize(
    ("status", "headers"),
    [
        # kopf slept what a 429's Retry-After asked, however long: a day here, the watch gone with it.
        pytest.param(429, {"Retry-After": "86400"}, id="429-retry-after-a-day"),
        # kopf read it with int(float(...)): text, "nan" or "inf" raised out of the watcher.
        pytest.param(429, {"Retry-After": "soon"}, id="429-retry-after-text"),
        pytest.param(429, {"Retry-After": "inf"}, id="429-retry-after-inf"),
        # kopf retries a 5xx for 54 s (its backoffs, cut short here), then raised out of the watcher.
        pytest.param(503, {}, id="503-past-kopfs-retries"),
    ],
)
async def test_kopfs_listing_refused_for_a_while_is_retried_not_the_operator_ended(
    status, headers, monkeypatch
):
    """kopf lists a resource again when its watch ends; a list refused past kopf's own retries, or with a
    Retry-After kopf cannot read, ended the operator (exit 1), and one with a long Retry-After held the
    watch that long. The listing is retried (a Retry-After read as at most 10 s) until it succeeds."""
    made = cli.settings

    def quick(opts: cli.Options) -> Any:
        out = made(opts)
        out.networking.error_backoffs = [0.1, 0.1]
        return out

    monkeypatch.setattr(cli, "settings", quick)
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(devices("n1", interfaces=[nic(numa="0")]))
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            proxy.refuse("GET", f"/apis/{models.GROUP}/", status, headers)
            assert proxy.expire_watches() >= 1
            await eventually(lambda: proxy.refused >= 3)
            proxy.allow()
            await c.put_devices(devices("n1", interfaces=[nic(numa="1")]))
            assert await eventually(lambda: _numa(c, "1"), timeout=40)
            await settle(k)


async def test_a_record_deleted_while_its_watch_was_down_is_withdrawn_when_kopf_lists_again():
    """A watch that ends (410 Gone, an error) is followed by a new listing, which has no event for a
    record deleted in between: with the Node sink its labels stayed on the Node until the operator
    restarted. A record the operator holds that the new listing lacks is handled as deleted, as
    client-go's reflector does."""
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        for name in ("n1", "n2"):
            await c.node(name)
            await c.put_devices(devices(name, interfaces=[nic()]))
        async with running_operator(k, sink="node", kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 2)
            await settle(k)
            proxy.refuse("GET", f"/apis/{models.GROUP}/", 503)
            assert proxy.expire_watches() >= 1
            await eventually(lambda: proxy.refused >= 1)
            await c.delete_devices("n2")  # not through the proxy: no watch sees it
            proxy.allow()
            assert await eventually(lambda: _no_labels(c, "n2"))
            await settle(k)
        assert (await c.node_labels("n1"))[CAPABLE] == "true"


async def _no_labels(c: Client, node: str) -> bool:
    return CAPABLE not in await c.node_labels(node)


async def test_a_nodefeature_deleted_while_its_watch_was_down_is_created_again_when_kopf_lists_again():
    """The same for a sink object: a NodeFeature deleted while no watch was open stayed in the view, so
    the operator took it for there and never created it again (nfd-master had taken its labels off the
    node) until the record changed."""
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(devices("n1", interfaces=[nic()]))
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            await settle(k)
            proxy.refuse("GET", f"/apis/{sinks.NFD_GROUP}/", 503)
            assert proxy.expire_watches() >= 1
            await eventually(lambda: proxy.refused >= 1)
            k.api.remove_object(NF, "n1", NS)  # no watch sees it
            proxy.allow()
            assert await eventually(lambda: k.api.stored(NF, "n1", NS) is not None)
            await settle(k)
        assert k.api.stored(NF, "n1", NS)["spec"]["labels"][CAPABLE] == "true"


async def test_a_watch_that_fails_at_once_every_time_relists_with_a_growing_pause(caplog):
    """Each listing succeeds and each watch after it fails at once (an API server whose watch cache is
    broken): the listing's objects are not taken for a watch that worked, so the pause before the next
    listing keeps doubling instead of listing every record once a second."""
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(devices("n1", interfaces=[nic()]))
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            proxy.poison = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 500}}).encode()
            proxy.expire_watches()

            def pauses() -> list[float]:
                return [
                    r.in_s
                    for r in caplog.records
                    if r.getMessage() == "a watch ended with an error, listing and watching again"
                    and r.resource == f"devices.{models.GROUP}"
                ]

            await eventually(lambda: len(pauses()) >= 3)
            proxy.allow()
        assert pauses()[:3] == [1.0, 2.0, 4.0]
