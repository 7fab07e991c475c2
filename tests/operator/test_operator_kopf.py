"""The real operator (kopf) against the API emulator over real HTTP: publishing, removal rules,
idempotence, restarts, both sinks, garbage collection, drift repair, faults, metrics and health."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.request

import kmock
import kopf
import pytest
from operator_harness import DEVICES, NF, NS, Client, eventually, running_operator, settle, writes
from operator_records import devices, gpu, group, nic, nvlink, ub

from nodefabric_devicemanager import crd, models
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_devicemanager.models import LinkState
from nodefabric_operator import handlers, labels, sinks
from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.reconcile import Reconciler

P = "feature.gpustack.ai/"
CAPABLE, DISTANCE, NUMA = P + "rdma.capable", P + "rdma.distance", P + "rdma.numa"
DOMAIN, MEMBERS = P + "fabric.domain", P + "fabric.members"
FULL = {
    CAPABLE: "true",
    DISTANCE: "PIX",
    NUMA: "0",
    DOMAIN: "nvlink-5b0e112233445566778899aabbccddef-1",
    MEMBERS: "18",
}


def gpu_node(name: str = "n1", **kw):
    kw.setdefault("interfaces", [nic()])
    kw.setdefault("groups", [group("nvidia", gpu(0, fabric=nvlink()), gpu(1, fabric=nvlink()))])
    return devices(name, **kw)


async def nf_labels(c: Client, name: str = "n1") -> dict[str, str] | None:
    nf = await c.nodefeature(name)
    return None if nf is None else nf["spec"].get("labels", {})


def all_writes(k) -> int:
    return writes(k, NF) + writes(k, "v1/nodes") + writes(k, DEVICES) + writes(k, "v1/events")


def events(k, name: str = "n1") -> list[tuple[str, str]]:
    """(reason, message) of every Event posted about the Devices object `name`."""
    out = []
    for key, obj in k.api.objects.items():
        is_event = key[0] == kmock.resource("v1/events") and not obj.deleted
        if is_event and obj.get("involvedObject", {}).get("name") == name:
            out.append((obj.get("reason"), obj.get("message")))
    return sorted(out)


async def published(c: Client, name: str = "n1") -> bool:
    """Whether the record's status says its labels were published (the last write of a first pass)."""
    return bool((await c.devices(name)).get("status", {}).get("labelsPublishedTime"))


async def test_publishes_a_nodefeature_owned_by_devices_with_status_and_no_event():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k):
            assert await eventually(lambda: nf_labels(c)) == FULL
            await eventually(lambda: published(c))
            await settle(k)
        nf = await c.nodefeature("n1")
        record = await c.devices("n1")
        assert nf["metadata"]["namespace"] == NS
        assert nf["metadata"]["labels"] == {sinks.NFD_NODE_NAME: "n1", sinks.MANAGED_BY: sinks.MANAGER}
        (owner,) = nf["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Devices", "n1", record["metadata"]["uid"])

        status = record["status"]
        assert status["labels"] == FULL and status["labelsPublishedTime"]
        assert (status["rdmaEndpoints"], status["bestDistance"], status["fabricDomain"]) == (
            1,
            "PIX",
            FULL[DOMAIN],
        )
        (cond,) = [c for c in status["conditions"] if c["type"] == models.LABELS_PUBLISHED]
        assert (cond["status"], cond["reason"]) == ("True", "Published")

        # A first publication is told by the status above, not by an Event (one per node at once on an
        # install); changes to published labels have theirs (below).
        assert events(k) == []


async def test_reconciling_twice_writes_once_and_a_restart_changes_nothing():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k) as metrics:
            await eventually(lambda: nf_labels(c))
            await eventually(lambda: published(c))  # the first pass's writes end with its status
            await settle(k)
            after_first = all_writes(k)
            assert writes(k, NF) == 1  # one create, nothing after
            # Read before the patch below: the operator's thread may reconcile that one before this reads.
            assert metrics.reconciles.labels(outcome="unchanged")._value.get() == 0  # replays are skipped

            # An event that changes nothing the labels depend on: a full reconcile, zero writes.
            await asyncio.to_thread(
                c.custom.patch_cluster_custom_object,
                *DEVICES.split("/"),
                "n1",
                {"metadata": {"annotations": {"x": "1"}}},
            )
            await eventually(lambda: metrics.reconciles.labels(outcome="unchanged")._value.get() == 1)
            await settle(k)
            assert all_writes(k) == after_first + 1  # the annotation patch above, and nothing of ours

        before_restart = all_writes(k)
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="unchanged")._value.get() >= 1)
            await settle(k)
        assert all_writes(k) == before_restart
        assert await nf_labels(c) == FULL


async def test_mixed_vendor_node_never_publishes_a_fabric_domain():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node(groups=[group("nvidia", gpu(0, fabric=nvlink()))]))
        async with running_operator(k):
            assert (await eventually(lambda: nf_labels(c)))[DOMAIN] == FULL[DOMAIN]
            # The Ascend detector adds its group: the node now has two domains, so it has none.
            mixed = [group("nvidia", gpu(0, fabric=nvlink())), group("ascend", gpu(1, fabric=ub("7")))]
            await c.put_devices(gpu_node(groups=mixed))

            async def domain_gone():
                got = await nf_labels(c)
                return DOMAIN not in got and MEMBERS not in got and got

            got = await eventually(domain_gone)
            await eventually(lambda: len(events(k)) == 1)  # posted after the status write
            await settle(k)
        assert got[CAPABLE] == "true"
        assert (await c.devices("n1"))["status"]["fabricDomain"] == ""
        (lost,) = [m for r, m in events(k) if r == "FabricLabelsLost"]
        assert f"removed {DOMAIN} (was {FULL[DOMAIN]})" in lost


async def test_a_link_going_down_withdraws_capable_only_when_every_endpoint_is_unusable():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        two = [nic("ens1f0", numa="0"), nic("ens1f1", bus_id="0000:19:00.1", numa="0")]
        await c.put_devices(devices("n1", interfaces=two))
        async with running_operator(k):
            assert await eventually(lambda: nf_labels(c)) == {CAPABLE: "true", NUMA: "0"}
            await settle(k)
            nf_writes = writes(k, NF)

            one_down = [nic("ens1f0", link=LinkState.FAILED), nic("ens1f1", bus_id="0000:19:00.1")]
            await c.put_devices(devices("n1", interfaces=one_down))
            await eventually(lambda: _status_endpoints(c, 1))
            await settle(k)
            assert await nf_labels(c) == {CAPABLE: "true", NUMA: "0"}
            assert writes(k, NF) == nf_writes  # the surviving NIC keeps the node schedulable

            all_down = [
                nic("ens1f0", link=LinkState.FAILED),
                nic("ens1f1", bus_id="0000:19:00.1", link=LinkState.FAILED),
            ]
            await c.put_devices(devices("n1", interfaces=all_down))
            assert await eventually(lambda: _labels_equal(c, {}))
            await eventually(lambda: len(events(k)) == 1)
            await settle(k)
        assert await nf_labels(c) == {}
        (lost,) = [m for r, m in events(k) if r == "RdmaCapabilityLost"]
        assert f"removed {CAPABLE} (was true)" in lost and f"removed {NUMA} (was 0)" in lost


async def _status_endpoints(c: Client, n: int) -> bool:
    return (await c.devices("n1")).get("status", {}).get("rdmaEndpoints") == n


async def _labels_equal(c: Client, want: dict[str, str]) -> bool:
    return await nf_labels(c) == want


async def test_a_failed_enumeration_keeps_labels_until_a_good_read_says_otherwise():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k):
            assert await eventually(lambda: nf_labels(c)) == FULL
            # Both reads fail and (worst case) the record arrives empty: nothing may be removed.
            failed = {models.INTERFACES_ENUMERATED: False, models.ACCELERATORS_ENUMERATED: False}
            await c.put_devices(devices("n1", conditions=failed))

            async def kept():
                cond = {x["type"]: x for x in (await c.devices("n1"))["status"]["conditions"]}
                return cond[models.LABELS_PUBLISHED]["reason"] == "RemovalSkipped" and cond

            cond = await eventually(kept)
            await settle(k)
            assert await nf_labels(c) == FULL
            assert "fabric., rdma." in cond[models.LABELS_PUBLISHED]["message"]
            assert cond[models.INTERFACES_ENUMERATED]["status"] == "False"  # the agent's condition survives

            # Only the fabric read recovers: fabric keys go, rdma keys stay.
            await c.put_devices(
                devices(
                    "n1",
                    conditions={models.INTERFACES_ENUMERATED: False, models.ACCELERATORS_ENUMERATED: True},
                )
            )
            assert await eventually(lambda: _labels_equal(c, {CAPABLE: "true", DISTANCE: "PIX", NUMA: "0"}))
            await settle(k)


async def test_node_sink_without_nfd_keeps_foreign_and_hand_set_labels():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        hand = {"example.com/rack": "r1", DOMAIN: "set-by-hand"}
        await c.node("n1", hand)
        await c.put_devices(devices("n1", interfaces=[nic()]))
        ann = sinks.managed_annotation("gpustack.ai")
        async with running_operator(k, sink="node"):
            want = {**hand, CAPABLE: "true", NUMA: "0"}
            assert await eventually(lambda: _node_labels_equal(c, want))
            assert (await c.node_annotations("n1"))[ann] == f"{CAPABLE},{NUMA}"

            # Someone removes our label by hand: the operator puts it back (level-based).
            await c.label_node("n1", {CAPABLE: None})
            assert await eventually(lambda: _node_labels_equal(c, want))

            # The link fails: our keys go, the hand-set one under our prefix stays.
            await c.put_devices(devices("n1", interfaces=[nic(link=LinkState.FAILED)]))
            assert await eventually(lambda: _node_labels_equal(c, hand))
            assert ann not in await c.node_annotations("n1")

            # Back up, then the record is deleted: what we wrote is withdrawn, nothing else.
            await c.put_devices(devices("n1", interfaces=[nic()]))
            assert await eventually(lambda: _node_labels_equal(c, want))
            await c.delete_devices("n1")
            assert await eventually(lambda: _node_labels_equal(c, hand))
            await settle(k)
        assert writes(k, NF) == 0


@pytest.mark.parametrize("failures", [1, 3])
async def test_a_failed_withdrawal_is_retried_then_reported_and_done_on_the_nodes_next_change(
    caplog, failures
):
    """The Node sink's withdrawal (the record deleted) failing: once, retried after a backoff and done;
    past its two retries (3 failures), one ERROR line naming the node, no traceback from the watch's
    catch-all, counted as an error, and the labels still withdrawn on the Node's next change."""
    caplog.set_level(logging.INFO, logger="nodefabric_operator")
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        hand = {"example.com/rack": "r1"}
        await c.node("n1", hand)
        await c.put_devices(devices("n1", interfaces=[nic()]))
        async with running_operator(k, sink="node") as metrics:
            assert await eventually(lambda: _node_labels_equal(c, {**hand, CAPABLE: "true", NUMA: "0"}))
            assert await eventually(lambda: published(c))
            await settle(k)  # the publish's own writes all done: the faults below meet the withdrawal
            k.api.fail_next(failures, 503)  # writes only: the deletion below goes around the HTTP API
            k.api.remove_object(DEVICES, "n1")
            if failures == 1:
                assert await eventually(lambda: _node_labels_equal(c, hand))
            else:
                errored = metrics.reconciles.labels(outcome="error")
                assert await eventually(lambda: errored._value.get() == 1)
                assert await c.node_labels("n1") != hand, "three failures: nothing withdrawn yet"
                await c.label_node("n1", {"example.com/row": "2"})  # the Node's next change
                assert await eventually(lambda: _node_labels_equal(c, {**hand, "example.com/row": "2"}))
            await settle(k)
    said = [r for r in caplog.records if r.name.startswith("nodefabric_operator")]
    assert not [r for r in said if r.getMessage() == "watch event not handled"]
    assert not [r for r in said if r.exc_info]
    retried = [r for r in said if r.getMessage() == "label withdrawal failed, retrying"]
    assert len(retried) == min(failures, 2)
    given_up = [r for r in said if r.getMessage().startswith("labels not withdrawn")]
    assert [(r.levelno, r.node, "503" in r.error) for r in given_up] == [(logging.ERROR, "n1", True)] * (
        failures == 3
    )


async def _node_labels_equal(c: Client, want: dict[str, str]) -> bool:
    return await c.node_labels("n1") == want


async def test_nodefeature_is_garbage_collected_with_devices_and_recreated_when_deleted():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k):
            await eventually(lambda: nf_labels(c))
            # Someone deletes our NodeFeature: it comes back.
            await asyncio.to_thread(
                c.custom.delete_namespaced_custom_object,
                "nfd.k8s-sigs.io",
                "v1alpha1",
                NS,
                "nodefeatures",
                "n1",
            )
            assert await eventually(lambda: _labels_equal(c, FULL))
            # The record goes: garbage collection takes the NodeFeature with it, and it stays gone.
            await c.delete_devices("n1")
            await settle(k)
            assert await c.nodefeature("n1") is None


async def test_echoes_of_our_own_writes_are_dropped_before_kopf_and_drift_still_repaired(monkeypatch):
    """A first sync meets three events per record: the record, its status write's echo and the
    NodeFeature create's echo (and, at start, the Nodes as listed). Only the record is reconciled: the
    echoes are counted and dropped ahead of kopf's processing (a status write's echo that arrives while
    its record's reconcile is under way waits in the record's lane and is dropped there, not
    reconciled). A NodeFeature someone else edits afterwards is newer than anything held, so it still
    reaches the handler and is repaired."""
    calls: dict[str, int] = {"devices_event": 0, "sink_event": 0, "node_event": 0}
    for method in calls:
        original = getattr(Reconciler, method)

        async def spy(self, body, _original=original, _method=method):
            outcome = await _original(self, body)
            if getattr(outcome, "outcome", None) != "skipped":
                calls[_method] += 1
            return outcome

        monkeypatch.setattr(Reconciler, method, spy)
    n = 5
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        for i in range(n):
            await c.node(f"n{i}")
            await c.put_devices(gpu_node(f"n{i}"))
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == n)
            await settle(k)
            assert calls == {"devices_event": n, "sink_event": 0, "node_event": 0}
            for resource in ("devices", "nodefeature", "nodes"):
                assert metrics.skipped.labels(resource=resource)._value.get() == n

            # Someone else's edit of a NodeFeature is no echo: it reaches the handler and is undone.
            await c.edit_nodefeature("n2", {"spec": {"labels": {CAPABLE: None}}})
            await eventually(lambda: calls["sink_event"] >= 1)

            async def repaired() -> bool:
                return await nf_labels(c, "n2") == FULL

            assert await eventually(repaired)
            await settle(k)
        # The repair wrote the NodeFeature once. (Its status write's echo may reach a handler: it comes
        # from the NodeFeature's handler, not from the record's, so nothing holds it back; it is
        # skipped or found unchanged, and writes nothing.)
        assert writes(k, NF) == n + 2  # n creates, the edit above, the repair


async def test_a_sink_event_met_while_its_publish_is_in_flight_is_judged_when_it_ends():
    """The NodeFeature create's echo often arrives before the create's answer: held back, then dropped
    as what our write made. An edit by someone else met at that moment is newer than our write: held
    back too, then handed to the drift check, which repairs it."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        record = await c.put_devices(gpu_node())
        api = load_client(k.kubeconfig)
        rec = Reconciler(api, sinks.NodeFeatureSink(api, NS, labels.DEFAULT_DOMAIN))
        assert (await rec.devices_event(record)).outcome == "published"
        ours = await c.nodefeature("n1")
        skipped = rec.metrics.skipped.labels(resource="nodefeature")._value.get

        rec.echoes.begin("n1")  # a publish of n1 under way
        assert rec.echoes.echo(ours)  # held back, not yet judged
        rec.echoes.end("n1")
        assert skipped() == 1 and not rec.echoes.running  # our own write's echo: dropped

        edited = await c.edit_nodefeature("n1", {"spec": {"labels": {CAPABLE: None}}})
        rec.echoes.begin("n1")  # two reconciles of n1 under way
        rec.echoes.begin("n1")
        assert rec.echoes.echo(edited) and rec.echoes.echo(ours)  # the newer one is kept
        rec.echoes.end("n1")
        assert not rec.echoes.running  # the other reconcile is still under way: it judges them
        rec.echoes.end("n1")
        await asyncio.gather(*list(rec.echoes.running))
        assert await nf_labels(c) == FULL  # the edit was no echo: repaired
        assert skipped() == 1
        await rec.aclose()
        api.close()


async def test_a_sink_event_held_back_as_kopf_stops_is_dropped_and_judged_again_once_kopf_starts_again():
    """kopf's cleanup closes the reconciler: a publish ending after it drops the edit it held back (the
    next listing brings it back; handed over, it was repaired in a task kopf no longer waits for, after
    the stop). kopf started again in the same operator (a watched resource's 404) hands them over again."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        record = await c.put_devices(gpu_node())
        api = load_client(k.kubeconfig)
        rec = Reconciler(api, sinks.NodeFeatureSink(api, NS, labels.DEFAULT_DOMAIN))
        memo = kopf.Memo(reconciler=rec, projector=None)
        assert (await rec.devices_event(record)).outcome == "published"
        edited = await c.edit_nodefeature("n1", {"spec": {"labels": {CAPABLE: None}}})

        rec.echoes.begin("n1")  # a publish of n1 under way as kopf stops
        assert rec.echoes.echo(edited)  # held back
        await handlers.cleanup(memo=memo)
        rec.echoes.end("n1")
        assert not rec.echoes.running and not rec.echoes.held_back  # dropped, nothing judged

        await handlers.startup(memo=memo)  # kopf started again
        rec.echoes.begin("n1")
        assert rec.echoes.echo(edited)
        rec.echoes.end("n1")
        assert rec.echoes.running
        await asyncio.gather(*list(rec.echoes.running))
        assert await nf_labels(c) == FULL  # repaired
        await rec.aclose()
        api.close()


@pytest.mark.parametrize("order", ["sink-deletion-first", "late-event-first"])
async def test_a_late_event_for_a_deleted_record_does_not_bring_its_nodefeature_back(order):
    """The race behind the test above: a record's MODIFIED event is handled only after the record was
    deleted and its NodeFeature collected, in either order with the NodeFeature's DELETED event. Nothing
    may be recreated for a record that is gone."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        first = await c.put_devices(gpu_node())
        api = load_client(k.kubeconfig)
        rec = Reconciler(api, sinks.NodeFeatureSink(api, NS, labels.DEFAULT_DOMAIN))
        rec.note_devices(first)
        assert (await rec.devices_event(first)).outcome == "published"
        nf = await c.nodefeature("n1")
        late = await c.put_devices(gpu_node(interfaces=[nic(link=LinkState.FAILED)]))  # not yet delivered
        await c.delete_devices("n1")
        assert await c.nodefeature("n1") is None  # garbage-collected with its owner
        if order == "sink-deletion-first":
            await rec.sink_deleted(nf)
        assert (await rec.devices_event(late)).outcome == "unchanged"
        assert await c.nodefeature("n1") is None
        # A replay of the version already handled is skipped outright.
        assert (await rec.devices_event(first)).outcome == "skipped"
        assert await c.nodefeature("n1") is None
        await rec.aclose()
        api.close()


async def test_a_transient_outage_is_retried_and_a_persistent_one_is_reported():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        k.api.fail_next(1, 503)
        async with running_operator(k) as metrics:
            assert await eventually(lambda: nf_labels(c)) == FULL
            assert metrics.reconciles.labels(outcome="error")._value.get() == 0

        await c.put_devices(gpu_node(interfaces=[nic(link=LinkState.FAILED)]))
        k.api.fail_next(3, 503)  # the first try and both retries of the NodeFeature write
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="error")._value.get() >= 1)
            # The failure is recorded in status; that write's own event brings the retry that succeeds.
            assert await eventually(lambda: _labels_equal(c, {DOMAIN: FULL[DOMAIN], MEMBERS: "18"}))
            await eventually(lambda: _published_condition(c, "True"))
            failed = ("PublishFailed", "nodefeature write failed: HTTP 503 Service Unavailable")
            await eventually(lambda: failed in events(k))
            await settle(k)
        cond = {x["type"]: x for x in (await c.devices("n1"))["status"]["conditions"]}
        assert cond[models.LABELS_PUBLISHED]["status"] == "True"
        assert failed in events(k)


async def _published_condition(c: Client, status: str) -> bool:
    conditions = (await c.devices("n1")).get("status", {}).get("conditions", [])
    return any(x["type"] == models.LABELS_PUBLISHED and x["status"] == status for x in conditions)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_metrics_and_health_are_served_over_http():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        mport, hport = _free_port(), _free_port()
        async with running_operator(k, metrics_port=mport, health_port=hport):
            await eventually(lambda: nf_labels(c))
            await settle(k)
            body = await asyncio.to_thread(_get, f"http://127.0.0.1:{mport}/metrics")
            health = await eventually(lambda: _try_get(f"http://127.0.0.1:{hport}/healthz"))
        assert 'nodefabric_operator_reconciles_total{outcome="published"} 1.0' in body
        assert 'nodefabric_operator_label_changes_total{change="added"} 5.0' in body
        assert json.loads(health) == {"nodes": 1, "sinkObjects": 1}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


async def _try_get(url: str) -> str | None:
    try:
        return await asyncio.to_thread(_get, url)
    except OSError:
        return None


@pytest.mark.parametrize("sink", ["nodefeature", "node"])
async def test_an_invalid_record_publishes_and_removes_nothing(sink):
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k, sink=sink) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            await eventually(lambda: published(c))  # the first pass's writes end with its status
            await settle(k)
            before = all_writes(k)
            # A record whose accelerator lacks its required index: unreadable, so no label may move.
            # The API server refuses such a write; a record stored under an older schema can be so.
            bad = {"spec": {"groups": [{"id": "x", "manufacturer": "x", "accelerators": [{"id": "a"}]}]}}
            k.api.put_object(DEVICES, {**k.api.stored(DEVICES, "n1"), **bad}, validate=False)
            await eventually(lambda: metrics.reconciles.labels(outcome="invalid")._value.get() >= 1)
            await settle(k)
            assert all_writes(k) == before


async def test_without_nfd_the_failure_says_what_to_do():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        # What an API server without NFD's CRDs answers the NodeFeature create (a 404 naming no object):
        # one fact for every record (nswait.py), said in the record's condition, probed until it is served.
        k.api.fail_next(1, 404)
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            await settle(k)
        # The status writes as sent: the condition said why first, then that the labels were published.
        said = [
            cond
            for r in k.requests("PATCH", DEVICES)
            for cond in ((r.data or {}).get("status") or {}).get("conditions") or []
            if cond.get("type") == models.LABELS_PUBLISHED
        ]
        assert [x["reason"] for x in said] == ["NodeFeatureAPINotFound", "Published"], said
        assert "install NFD (its CRDs), or run with --sink node" in said[0]["message"]
        assert not [
            r for r, _ in events(k) if r == "PublishFailed"
        ]  # a fact of the operator's, not the node's


async def test_a_node_name_longer_than_a_label_value_is_refused_with_a_reason_before_any_write():
    """A node may be named with up to 253 characters, a label value only 63; the NodeFeature carries the
    node's name as its node-name label (nfd-master selects by it), so the API server refused its create
    with 422 on every change of the record, the condition reading only "HTTP 422 Unprocessable Entity".
    It is not sent: the condition says why, and what to run instead."""
    name = "gpu-" + "a" * 60 + ".example.com"
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node(name)
        await c.put_devices(gpu_node(name))
        async with running_operator(k):

            async def refused():
                conditions = (await c.devices(name)).get("status", {}).get("conditions", [])
                return next((x for x in conditions if x["type"] == models.LABELS_PUBLISHED), None)

            cond = await eventually(refused)
            await settle(k)
        assert cond["status"] == "False", cond
        assert "63" in cond["message"] and "--sink node" in cond["message"], cond["message"]
        assert k.count("POST", NF) == 0


async def test_peering_mode_runs_one_active_replica():
    async with running_api([crd.devices_crd()]) as k:
        k.api.declare("kopf.dev/v1/clusterkopfpeerings", kind="ClusterKopfPeering", namespaced=False)
        k.api.put_object("kopf.dev/v1/clusterkopfpeerings", {"metadata": {"name": "nodefabric"}})
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k, standalone=False):
            assert await eventually(lambda: nf_labels(c)) == FULL

            async def peers():
                obj = await asyncio.to_thread(
                    c.custom.get_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", "nodefabric"
                )
                return obj.get("status")

            peering = await eventually(peers)
        assert len(peering) == 1  # this replica announced itself and holds the peering


async def test_a_foreign_key_in_our_nodefeature_survives_our_writes():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k):
            await eventually(lambda: nf_labels(c))
            await c.edit_nodefeature("n1", {"spec": {"labels": {"example.com/owner": "team-a"}}})
            await c.put_devices(gpu_node(interfaces=[nic(link=LinkState.FAILED)]))
            want = {"example.com/owner": "team-a", DOMAIN: FULL[DOMAIN], MEMBERS: "18"}
            assert await eventually(lambda: _labels_equal(c, want))
            await eventually(lambda: _status_labels(c, {DOMAIN: FULL[DOMAIN], MEMBERS: "18"}))
            await settle(k)
        assert (await c.devices("n1"))["status"]["labels"] == {DOMAIN: FULL[DOMAIN], MEMBERS: "18"}


async def _status_labels(c: Client, want: dict[str, str]) -> bool:
    """The status write follows the NodeFeature write: wait for it rather than for a quiet moment."""
    return (await c.devices("n1")).get("status", {}).get("labels") == want


async def test_a_nodefeature_stripped_of_its_node_name_label_is_tagged_again():
    """nfd-master reads a NodeFeature only by its `nfd.node.kubernetes.io/node-name` label: someone who
    removes it from ours takes every label we publish off the node. That edit is no echo and no event to
    ignore: the operator puts the label back, as it puts back a label of ours."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node())
        async with running_operator(k):
            await eventually(lambda: published(c))
            await settle(k)
            await c.edit_nodefeature("n1", {"metadata": {"labels": {sinks.NFD_NODE_NAME: None}}})

            async def tagged() -> bool:
                nf = await c.nodefeature("n1")
                return nf is not None and nf["metadata"].get("labels", {}).get(sinks.NFD_NODE_NAME) == "n1"

            assert await eventually(tagged)
            assert await nf_labels(c) == FULL
