"""LabelsOnNode: whether the labels the operator published reached the Node. With the NodeFeature sink
nfd-master copies them; where it does not (not running, not accepting our namespace), LabelsPublished
alone said "5 labels on NodeFeature" while the Node carried none. Run against the embedded API, where
the test plays nfd-master by copying the NodeFeature's labels onto the Node."""

from __future__ import annotations

import pytest
from operator_harness import DEVICES, NF, Client, eventually, running_operator, settle, writes
from operator_records import devices, gpu_record, nic
from watch_breaker import watch_breaker

from nodefabric_devicemanager import crd, models
from nodefabric_devicemanager.models import LinkState
from nodefabric_operator import labels, onnode, sinks
from nodefabric_operator.demo.kubeapi import running_api

D = labels.DEFAULT_DOMAIN
CAPABLE = labels.key(D, labels.RDMA_CAPABLE)
NUMA = labels.key(D, labels.RDMA_NUMA)


async def on_node(c: Client, name: str) -> dict | None:
    conds = (await c.devices(name)).get("status", {}).get("conditions", [])
    return next((x for x in conds if x["type"] == models.LABELS_ON_NODE), None)


async def nfd_applies(c: Client, name: str) -> None:
    """What nfd-master does: the Node's labels of our namespace become the NodeFeature's."""
    wanted = (await c.nodefeature(name))["spec"]["labels"]
    have = {k: v for k, v in (await c.node_labels(name)).items() if k.startswith(labels.prefix(D))}
    await c.label_node(name, {k: None for k in have if k not in wanted} | wanted)


def _sample(metrics) -> float:
    return metrics.registry.get_sample_value("nodefabric_operator_labels_not_on_node")


async def test_labels_nfd_never_applied_are_reported_and_the_condition_turns_true_when_it_does():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        async with running_operator(k) as metrics:
            cond = await eventually(lambda: on_node(c, "n0"))
            await settle(k)
            assert (cond["status"], cond["reason"]) == ("False", "NotApplied")
            assert cond["message"].startswith("5 of 5 labels not on Node n0 (fabric.domain, fabric.members, ")
            assert "nfd-master applies them" in cond["message"]
            published = {x["type"]: x for x in (await c.devices("n0"))["status"]["conditions"]}
            assert published[models.LABELS_PUBLISHED]["status"] == "True"  # both said, in one write
            assert _sample(metrics) == 1

            status_writes, nf_writes = k.count("PATCH", DEVICES), writes(k, NF)
            await c.label_node("n0", {"example.com/rack": "r1"})  # a Node change that is not ours: no write
            await settle(k)
            assert k.count("PATCH", DEVICES) == status_writes

            await nfd_applies(c, "n0")
            cond = await eventually(
                lambda: _true(on_node(c, "n0")),
            )
            await settle(k)
            assert (cond["reason"], cond["message"]) == ("Applied", "5 labels on Node n0")
            assert k.count("PATCH", DEVICES) == status_writes + 1  # one status write, nothing else
            assert writes(k, NF) == nf_writes
            assert _sample(metrics) == 0
            rv = (await c.devices("n0"))["metadata"]["resourceVersion"]

        # A restart finds the Node as it left it: no write at all.
        before = k.count("PATCH", DEVICES)
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="unchanged")._value.get() == 1)
            await settle(k)
        assert k.count("PATCH", DEVICES) == before
        assert (await c.devices("n0"))["metadata"]["resourceVersion"] == rv


async def _true(cond):
    got = await cond
    return got if got and got["status"] == "True" else None


async def test_a_label_no_longer_published_but_still_on_the_node_is_named():
    """The dangerous half: the record lost RDMA, the NodeFeature no longer says rdma.capable, but the Node
    still does (nfd-master did not remove it), so workloads keep landing there."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        async with running_operator(k):
            await eventually(lambda: on_node(c, "n0"))
            await nfd_applies(c, "n0")
            await eventually(lambda: _true(on_node(c, "n0")))
            await c.put_devices(gpu_record("n0", LinkState.FAILED))

            async def stale():
                cond = await on_node(c, "n0")
                return cond if cond and cond["status"] == "False" else None

            cond = await eventually(stale)
            assert cond["reason"] == "NotApplied"
            assert (
                "3 no longer published still on Node n0 (rdma.capable, rdma.distance, rdma.numa)"
                in (cond["message"])
            )
            assert (await c.node_labels("n0"))[CAPABLE] == "true"  # the operator never writes the Node
            await nfd_applies(c, "n0")
            cond = await eventually(lambda: _true(on_node(c, "n0")))
            assert cond["message"] == "2 labels on Node n0"
            await settle(k)


async def test_with_the_node_sink_the_labels_are_on_the_node_in_the_same_write():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        before = k.count("PATCH", DEVICES)
        async with running_operator(k, sink="node") as metrics:
            cond = await eventually(lambda: on_node(c, "n0"))
            await settle(k)
            assert (cond["status"], cond["reason"], cond["message"]) == (
                "True",
                "Applied",
                "5 labels on Node n0",
            )
            assert k.count("PATCH", DEVICES) == before + 1
            assert _sample(metrics) == 0


async def test_without_the_right_to_list_nodes_the_operator_runs_and_says_nothing_of_the_node(caplog):
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        proxy.refuse("GET", "/api/v1/nodes", 403)
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            await settle(k)
        assert await on_node(c, "n0") is None
        assert "cannot list Nodes, LabelsOnNode is not reported" in caplog.text


def test_the_condition_names_missing_changed_and_stale_keys_and_cuts_long_lists():
    k = lambda n: labels.key(D, n)  # noqa: E731
    published = {k("rdma.capable"): "true", k("rdma.numa"): "0"}
    assert onnode.condition("n", published, None, D, "nfd-master").status == "Unknown"
    assert onnode.condition("n", {}, {}, D, "").message == "0 labels on Node n"
    # A value that differs is not applied; another domain's keys and other families are not ours.
    other = {k("rdma.capable"): "true", k("rdma.numa"): "1", "feature.example.com/rdma.x": "1", k("x.y"): "1"}
    cond = onnode.condition("n", published, other, D, "")
    assert (cond.status, cond.message) == ("False", "1 of 2 labels not on Node n (rdma.numa)")
    many = {k(f"rdma.k{i}"): "v" for i in range(8)}
    cond = onnode.condition("n", {}, many, D, "")
    assert (
        cond.message
        == "8 no longer published still on Node n (rdma.k0, rdma.k1, rdma.k2, rdma.k3, rdma.k4 and 3 more)"
    )


@pytest.mark.parametrize("sink", ["nodefeature", "node"])
async def test_a_node_event_for_a_node_without_a_record_writes_nothing(sink):
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("lonely", labels={CAPABLE: "true"})
        async with running_operator(k, sink=sink):
            await settle(k)
            await c.label_node("lonely", {"example.com/x": "1"})
            await settle(k)
        assert k.count("PATCH", DEVICES) == 0


async def test_node_labels_of_a_record_deleted_while_the_operator_was_down_are_withdrawn_at_start():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        hand = {"example.com/rack": "r1"}
        await c.node("n1", hand)
        await c.node("n2", hand)
        await c.put_devices(devices("n1", interfaces=[nic()]))
        await c.put_devices(devices("n2", interfaces=[nic()]))
        ann = sinks.managed_annotation("gpustack.ai")
        async with running_operator(k, sink="node"):
            assert await eventually(lambda: _has(c, "n1", CAPABLE))
            await settle(k)
        await c.delete_devices("n1")  # while no operator runs: no DELETED event will ever reach it
        async with running_operator(k, sink="node") as metrics:
            assert await eventually(lambda: metrics.reconciles.labels(outcome="withdrawn")._value.get() >= 1)
            await settle(k)
        assert await c.node_labels("n1") == hand
        assert ann not in await c.node_annotations("n1")
        # The node whose record still exists keeps what we wrote.
        assert await c.node_labels("n2") == {**hand, CAPABLE: "true", NUMA: "0"}


async def _has(c: Client, node: str, key: str) -> bool:
    return key in await c.node_labels(node)


async def test_nodes_are_listed_page_by_page_with_our_keys_only(monkeypatch):
    """The Nodes are read raw (no CoreV1Api, no client models) and every page is followed: with pages of
    2, five Nodes take three list requests and each keeps only the labels of our domain."""
    from nodefabric_devicemanager.kubeclient import load_client
    from nodefabric_operator.reconcile import Reconciler

    monkeypatch.setattr(sinks, "PAGE", 2)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        for i in range(5):
            await c.node(f"n{i}", {CAPABLE: "true", NUMA: str(i), "example.com/rack": "r1"})
        api = load_client(k.kubeconfig)
        r = Reconciler(api, sinks.NodeFeatureSink(api, "nodefabric", D))
        lists = k.count("GET", "v1/nodes", "list")
        await r.on_node.prime()
        assert k.count("GET", "v1/nodes", "list") - lists == 3
        assert r.on_node.nodes is not None
        seen = {f"n{i}": r.on_node.nodes.get(f"n{i}") for i in range(5)}
        assert all(s is not None for s in seen.values())
        assert {n: dict(s.labels) for n, s in seen.items() if s} == {
            f"n{i}": {CAPABLE: "true", NUMA: str(i)} for i in range(5)
        }
