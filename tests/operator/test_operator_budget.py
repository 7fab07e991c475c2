"""What the operator costs the API server, pinned per record through the embedded API's request counter:
a first sync is one sink write and one status write per record (a first publication posts no Event),
and a restart or a watch replay (a relist after 410 Gone) costs lists and watches only, whatever the
number of records."""

from __future__ import annotations

import asyncio

import pytest
from operator_harness import DEVICES, NF, NS, Client, eventually, running_operator, settle
from operator_records import devices, gpu, gpu_record, group, nic, nvlink
from watch_breaker import watch_breaker

from nodefabric_devicemanager import crd, models
from nodefabric_devicemanager.correlator import Correlator, Posted
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_devicemanager.models import LinkState
from nodefabric_operator import labels, sinks
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.reconcile import Reconciler

N = 12
CAPABLE = labels.key(labels.DEFAULT_DOMAIN, labels.RDMA_CAPABLE)
EVENTS = "v1/events"
NODES = "v1/nodes"
# Every (verb, resource) the operator could spend per record; discovery requests are not among them.
PER_RESOURCE = [
    (m, r) for r in (NF, DEVICES, NODES, EVENTS) for m in ("GET", "POST", "PATCH", "PUT", "DELETE")
]


def spend(k: RunningAPI) -> dict[tuple[str, str], int]:
    return {key: k.count(*key) for key in PER_RESOURCE}


def delta(
    after: dict[tuple[str, str], int], before: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    return {key: n for key in after if (n := after[key] - before[key])}


async def fleet(k: RunningAPI, n: int = N) -> Client:
    c = Client(k.kubeconfig)
    for i in range(n):
        await c.node(f"n{i}")
        await c.put_devices(gpu_record(f"n{i}"))
    return c


def reconciled(metrics, outcome: str) -> float:
    return metrics.reconciles.labels(outcome=outcome)._value.get()


def skipped(metrics, resource: str) -> float:
    return metrics.skipped.labels(resource=resource)._value.get()


async def first_sync(k: RunningAPI, **options):
    """Start the operator on a seeded fleet and wait until every record is published."""
    before, total = spend(k), k.count()
    async with running_operator(k, **options) as metrics:
        await eventually(lambda: reconciled(metrics, "published") == N)
        await settle(k)
    return delta(spend(k), before), k.count() - total


async def test_first_sync_is_two_requests_per_record():
    async with running_api([crd.devices_crd()]) as k:
        await fleet(k)
        spent, total = await first_sync(k)
    # Creating each NodeFeature, writing each status; no Event for a first publication (the status says
    # it, and one per node at once is what an install would flood the API server with). Per start: the
    # NodeFeatures and the Nodes (for LabelsOnNode) read once before kopf starts, then kopf's list and
    # watch of the three resources. No GET of a watched NodeFeature, no owner GET, no 409. LabelsOnNode
    # (False here: no nfd-master copies the labels) goes in the same status write as LabelsPublished.
    assert spent == {
        ("POST", NF): N,
        ("PATCH", DEVICES): N,
        ("GET", NF): 3,
        ("GET", DEVICES): 2,
        ("GET", NODES): 3,
    }
    per_record = (total - 8 - discovery(total, spent)) / N
    assert per_record == 2


def discovery(total: int, spent: dict[tuple[str, str], int]) -> int:
    """Requests outside the record's resources (API discovery, the start-up probe): a fixed few per start."""
    rest = total - sum(spent.values())
    assert 0 <= rest <= 12, rest
    return rest


async def test_a_restart_costs_no_request_per_record():
    async with running_api([crd.devices_crd()]) as k:
        await fleet(k)
        await first_sync(k)
        before, total = spend(k), k.count()
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "unchanged") == N)
            await settle(k)
            assert reconciled(metrics, "published") == 0
            # kopf's listing of the NodeFeatures and Nodes is what the start read: dropped unprocessed.
            assert skipped(metrics, "nodefeature") == N and skipped(metrics, "nodes") == N
        spent = delta(spend(k), before)
        # The start's lists and watches only.
        assert spent == {("GET", NF): 3, ("GET", DEVICES): 2, ("GET", NODES): 3}
        discovery(k.count() - total, spent)


async def test_a_restart_over_a_half_published_fleet_publishes_the_rest_and_posts_no_event():
    """Records added while the operator was down (or never reached before it stopped): each costs its
    two writes and no Event (a first publication); the published ones cost nothing."""
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 2)
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "published") == 2)
            await settle(k)
        for name in ("n2", "n3"):
            await c.node(name)
            await c.put_devices(gpu_record(name))
        before = spend(k)
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "published") == 2)
            await eventually(lambda: reconciled(metrics, "unchanged") == 2)
            await settle(k)
        spent = delta(spend(k), before)
        assert (spent[("POST", NF)], spent[("PATCH", DEVICES)]) == (2, 2)
        assert ("POST", EVENTS) not in spent
        for name in ("n2", "n3"):
            assert (await c.devices(name))["status"]["labelsPublishedTime"]


async def test_a_watch_replay_costs_no_request_per_record():
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        await fleet(k)
        await first_sync(k)
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: reconciled(metrics, "unchanged") == N)
            await settle(k)
            before, total = spend(k), k.count()
            seen_devices, seen_nf = skipped(metrics, "devices"), skipped(metrics, "nodefeature")

            # The Devices, NodeFeature and Node watches, and kopf's own watch of CRDs.
            assert proxy.expire_watches() == 4
            # kopf lists both again and hands every object over once more; each is skipped unread.
            await eventually(lambda: skipped(metrics, "devices") >= seen_devices + N)
            await eventually(lambda: skipped(metrics, "nodefeature") >= seen_nf + N)
            await eventually(lambda: proxy.open_watches == 4)
            await settle(k)
            assert reconciled(metrics, "published") == 0
        spent = delta(spend(k), before)
        # The relist and the new watch, each.
        assert spent == {("GET", NF): 2, ("GET", DEVICES): 2, ("GET", NODES): 2}
        assert k.count() - total == 8  # and kopf's relist and watch of CRDs


async def test_no_event_for_a_first_publication_then_one_per_change_and_a_warning_when_capability_goes():
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 1)
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "published") == 1)
            await settle(k)
            # The record's status says it (labels, labelsPublishedTime, LabelsPublished): no Event.
            assert k.count("POST", EVENTS) == 0
            assert (await c.devices("n0"))["status"]["labelsPublishedTime"]

            # A second NIC on the other NUMA node: published labels change, and an Event says how.
            two = [nic(), nic("ens2f1", bus_id="0000:1b:00.1", numa="1")]
            gpus = [group("nvidia", gpu(0, fabric=nvlink()))]
            await c.put_devices(devices("n0", interfaces=two, groups=gpus))
            await eventually(lambda: k.count("POST", EVENTS) == 1)
            await settle(k)
            (first,) = k.requests("POST", EVENTS)
            assert (first.data["type"], first.data["reason"]) == ("Normal", "LabelsChanged")
            assert first.data["message"].startswith("NodeFeature nodefabric/n0: changed ")
            assert "rdma.numa" in first.data["message"]
            assert first.data["source"] == {"component": "nodefabric-operator"}
            assert first.data["reportingComponent"] == "nodefabric-operator"
            # Where `kubectl describe devices n0` finds it: in `default`, about an object with no namespace.
            assert first.data["metadata"]["namespace"] == "default"
            involved = first.data["involvedObject"]
            assert "namespace" not in involved and (involved["kind"], involved["name"]) == ("Devices", "n0")

            down = nic(link=LinkState.FAILED)
            down.link.reason = "state 1: DOWN\nphys_state 3: Disabled\n"  # as the kernel prints them
            await c.put_devices(devices("n0", interfaces=[down], groups=[group("nvidia", gpu(0))]))
            await eventually(lambda: k.count("POST", EVENTS) == 2)
            await settle(k)
            assert reconciled(metrics, "published") == 3
        second = k.requests("POST", EVENTS)[-1].data
        assert (second["type"], second["reason"]) == ("Warning", "RdmaCapabilityLost")
        for gone in ("rdma.capable (was true)", "rdma.distance (was PIX)", "fabric.domain (was nvlink-"):
            assert gone in second["message"]
        # Which link to look at, not only which labels went.
        assert second["message"].endswith(
            "; failing links: ens1f0 (mlx5_0): state 1: DOWN phys_state 3: Disabled"
        )
        assert k.count("POST", EVENTS) == 2


async def test_losing_only_a_fabric_label_is_a_warning_of_its_own():
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 1)
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "published") == 1)
            mixed = [group("nvidia", gpu(0, fabric=nvlink())), group("amd", gpu(1))]
            await c.put_devices(devices("n0", interfaces=[nic()], groups=mixed))
            await eventually(lambda: k.count("POST", EVENTS) == 1)
            await settle(k)
        event = k.requests("POST", EVENTS)[-1].data
        assert (event["type"], event["reason"]) == ("Warning", "FabricLabelsLost")
        assert "rdma.capable" not in event["message"]


async def test_a_newer_record_supersedes_a_status_write_without_reading_it_back():
    """The version the operator handles changes before its status write: the write is refused (409) and
    not retried from a GET, because the newer version's own event is on its way and writes it."""
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 1)
        stale = await c.devices("n0")
        await c.put_devices(devices("n0", interfaces=[nic(), nic("ens2f1", bus_id="0000:1b:00.1", numa="1")]))
        api = load_client(k.kubeconfig)
        rec = Reconciler(api, sinks.NodeFeatureSink(api, NS, labels.DEFAULT_DOMAIN))
        newer = await c.devices("n0")
        gets = k.count("GET")
        assert (await rec.devices_event(stale)).outcome == "superseded"
        assert k.count("GET") == gets
        assert (await c.devices("n0")).get("status", {}).get("labels") is None

        gets = k.count("GET")
        assert (await rec.devices_event(newer)).outcome == "published"
        assert k.count("GET") == gets
        numa = labels.key(labels.DEFAULT_DOMAIN, "rdma.numa")
        assert (await c.devices("n0"))["status"]["labels"][numa] == "0_1"
        # Handled: the same version again (a replay, or our own status write's echo) is not even parsed.
        assert (await rec.devices_event(newer)).outcome == "skipped"
        await rec.aclose()
        api.close()


@pytest.mark.parametrize("sink", ["node"])
async def test_node_sink_first_sync_and_restart_budgets(sink):
    async with running_api([crd.devices_crd()]) as k:
        await fleet(k)
        spent, _ = await first_sync(k, sink=sink)
        assert spent == {
            ("PATCH", NODES): N,
            ("PATCH", DEVICES): N,
            ("GET", NODES): 3,  # read at start, then kopf's list and watch
            ("GET", DEVICES): 3,  # the records' names at start, then kopf's list and watch
        }
        before = spend(k)
        async with running_operator(k, sink=sink) as metrics:
            await eventually(lambda: reconciled(metrics, "unchanged") == N)
            await settle(k)
        assert delta(spend(k), before) == {("GET", NODES): 3, ("GET", DEVICES): 3}


async def test_a_record_without_a_node_owner_costs_one_node_read_and_reports_a_missing_node():
    """A record the agent wrote always names its Node as owner. One created by hand does not: the node is
    read once before its NodeFeature is created, and a node that does not exist is reported as such."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"), node_owner=False)
        await c.put_devices(gpu_record("ghost"))  # no Node of that name: no owner either
        before = spend(k)
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "published") == 1)
            await eventually(lambda: reconciled(metrics, "error") >= 1)
            # The ghost's warning (n0's first publication has no Event).
            await eventually(lambda: k.count("POST", EVENTS) - before[("POST", EVENTS)] == 1)
            await settle(k)
        spent = delta(spend(k), before)
        # A read per version of a record without an owner: n0 once, the ghost twice (its first version,
        # and the version its failure status made, which retries once in case the node appeared); and
        # the start's list of Nodes, kopf's list and watch of them (for LabelsOnNode).
        assert spent[("GET", NODES)] == 3 + 3
        assert spent[("POST", NF)] == 1  # none for the ghost
        assert await c.nodefeature("ghost") is None
        cond = {x["type"]: x for x in (await c.devices("ghost"))["status"]["conditions"]}
        published = cond[models.LABELS_PUBLISHED]
        assert (published["status"], published["reason"]) == ("False", "NodeNotFound")
        assert published["message"] == "node ghost does not exist: labels are published once it does"
        warning = [r.data for r in k.requests("POST", EVENTS) if r.data["reason"] == "NodeNotFound"]
        assert [(w["type"], w["involvedObject"]["name"]) for w in warning] == [("Warning", "ghost")]


async def test_a_nodefeature_record_for_a_missing_node_is_published_when_the_node_comes():
    """The condition says "labels are published once it does", with either sink. With the NodeFeature
    sink the Node's arrival (watched, for LabelsOnNode) did nothing: the record stayed NodeNotFound, and
    its node unlabelled, until the record itself changed."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.put_devices(gpu_record("late"), node_owner=False)
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "error") >= 1)
            cond = await eventually(lambda: _published_condition(c, "late", "False"))
            assert cond["reason"] == "NodeNotFound"
            await settle(k)
            await c.node("late")
            await eventually(lambda: _published_condition(c, "late", "True"))
            await settle(k)
        assert (await c.nodefeature("late"))["spec"]["labels"][
            labels.key(labels.DEFAULT_DOMAIN, "rdma.capable")
        ] == "true"


async def test_a_node_sink_record_for_a_missing_node_is_reported_and_published_when_the_node_comes():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.put_devices(gpu_record("late"))
        async with running_operator(k, sink="node") as metrics:
            await eventually(lambda: reconciled(metrics, "error") >= 1)
            cond = await eventually(lambda: _published_condition(c, "late", "False"))
            assert cond["reason"] == "NodeNotFound"
            await c.node("late")  # the watch brings the Node; its record is published without a poll
            await eventually(lambda: _published_condition(c, "late", "True"))
            await settle(k)
        assert (await c.node_labels("late"))[labels.key(labels.DEFAULT_DOMAIN, "rdma.capable")] == "true"


async def _published_condition(c: Client, name: str, status: str):
    conditions = (await c.devices(name)).get("status", {}).get("conditions", [])
    return next(
        (x for x in conditions if x["type"] == models.LABELS_PUBLISHED and x["status"] == status), None
    )


async def test_a_sink_conflict_reads_the_object_back_once_and_keeps_a_foreign_owner():
    """The view can be behind the API server (another writer changed the NodeFeature a moment ago): the
    write is refused with 409, the object is read back once, and the next write succeeds."""
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 1)
        api = load_client(k.kubeconfig)
        rec = Reconciler(api, sinks.NodeFeatureSink(api, NS, labels.DEFAULT_DOMAIN))
        assert (await rec.devices_event(await c.devices("n0"))).outcome == "published"
        # Someone else writes the NodeFeature; the operator's view has not seen it.
        await asyncio.to_thread(
            c.custom.patch_namespaced_custom_object,
            sinks.NFD_GROUP,
            sinks.NFD_VERSION,
            NS,
            sinks.NFD_PLURAL,
            "n0",
            {"spec": {"labels": {"example.com/team": "a"}}},
        )
        await c.put_devices(devices("n0", interfaces=[nic(link=LinkState.FAILED)]))
        gets = k.count("GET", NF)
        assert (await rec.devices_event(await c.devices("n0"))).outcome == "published"
        assert k.count("GET", NF) == gets + 1
        nf = await c.nodefeature("n0")
        assert nf["spec"]["labels"] == {"example.com/team": "a"}
        await rec.aclose()
        api.close()


async def test_an_outage_longer_than_the_backoffs_is_retried_without_a_new_event():
    """Every write of the operator fails for a while, the failure's own status write too: nothing records
    the failure and no event will come. The record is requeued and published once the API answers."""
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = await fleet(k, 1)
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:
            await eventually(lambda: reconciled(metrics, "published") == 1)
            await settle(k)
            proxy.refuse("PATCH", f"/apis/{sinks.NFD_GROUP}/", 503)
            proxy.refuse("PATCH", f"/apis/{models.GROUP}/", 503)
            await c.put_devices(devices("n0", interfaces=[nic(link=LinkState.FAILED)]))  # not via the proxy
            await eventually(lambda: reconciled(metrics, "error") >= 2)  # requeued, failed again
            proxy.allow()
            await eventually(lambda: reconciled(metrics, "published") == 2)
            await settle(k)
        assert (
            labels.key(labels.DEFAULT_DOMAIN, "rdma.capable")
            not in (await c.nodefeature("n0"))["spec"]["labels"]
        )
        cond = {x["type"]: x for x in (await c.devices("n0"))["status"]["conditions"]}
        assert cond[models.LABELS_PUBLISHED]["status"] == "True"


def test_the_spam_filter_allows_a_burst_per_object_then_one_every_five_minutes():
    c = Correlator(burst=3, refill_s=300.0, max_keys=2)
    assert [c.admit("a", 0.0) for _ in range(4)] == [True, True, True, False]
    assert c.admit("b", 0.0)  # each object has its own allowance
    assert not c.admit("a", 299.0)
    assert c.admit("a", 300.0) and not c.admit("a", 301.0)
    assert [c.admit("a", 1e6) for _ in range(4)] == [True, True, True, False]  # refilled to the burst only
    c.admit("c", 1e6)  # a third object: the least recently used ("b") is forgotten, with its spent token
    assert [c.admit("b", 1e6) for _ in range(4)] == [True, True, True, False]
    key = ("uid", "n0", "Warning", "RdmaCapabilityLost", "m")
    assert c.posted(key) is None
    c.record(key, Posted("n0-x", 1, "t"))
    assert c.posted(key) == Posted("n0-x", 1, "t")


async def test_a_flapping_link_counts_events_up_instead_of_creating_one_per_flap():
    """A link that fails and recovers on every pass changes the labels each time. Each change still has
    its Event, but a repeat of the same Event raises its count (as client-go's recorder does), so the
    node holds one Event per distinct change, and beyond 25 at once the spam filter drops the rest."""
    async with running_api([crd.devices_crd()]) as k:
        c = await fleet(k, 1)
        flaps = 16
        async with running_operator(k) as metrics:
            await eventually(lambda: reconciled(metrics, "published") == 1)
            done = 1
            for _ in range(flaps):
                for link, capable in ((LinkState.FAILED, None), (LinkState.OK, "true")):
                    await c.put_devices(
                        devices(
                            "n0",
                            interfaces=[nic(link=link)],
                            groups=[group("nvidia", gpu(0, fabric=nvlink()))],
                        )
                    )

                    async def shows(capable: str | None = capable) -> bool:
                        nf = await c.nodefeature("n0") or {}
                        return nf.get("spec", {}).get("labels", {}).get(CAPABLE) == capable

                    await eventually(shows)
                    # The publish over, its status written too, before the next change: one put while
                    # the status write is in flight makes that publish "superseded" (labels written, the
                    # status left to the newer record's), which is not what this test counts.
                    done += 1
                    await eventually(lambda done=done: reconciled(metrics, "published") == done)
            await settle(k)
            assert reconciled(metrics, "published") == 1 + 2 * flaps
            actions = {
                a: metrics.events.labels(action=a)._value.get() for a in ("created", "counted", "dropped")
            }
        # Lost, regained: two Events, whatever the number of flaps (the first publication has none).
        assert k.count("POST", EVENTS) == 2 == actions["created"]
        assert actions["created"] + actions["counted"] == k.count("POST", EVENTS) + k.count("PATCH", EVENTS)
        assert actions["dropped"] >= 2 * flaps - 25 - 1  # one token back at most, on a slow machine
        assert actions["created"] + actions["counted"] + actions["dropped"] == 2 * flaps
        listed = await asyncio.to_thread(c.core.list_namespaced_event, "default")
        about = sorted((e.reason, e.count) for e in listed.items if e.involved_object.name == "n0")
        lost = [n for reason, n in about if reason == "RdmaCapabilityLost"]
        assert len(about) == 2 and len(lost) == 1 and lost[0] >= 12
        assert sum(n for _, n in about) == actions["created"] + actions["counted"]


async def test_labels_are_published_once_nfd_is_installed_without_a_record_change():
    """The NodeFeature API is missing (NFD not installed yet, or its CRD deleted and installed again): the
    failure says so, and the records are tried again until it exists, like an outage. It used to be
    tried once, so a cluster where NFD came back published nothing until a record changed."""
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        c = await fleet(k, 1)
        proxy.refuse("POST", f"/apis/{sinks.NFD_GROUP}/", 404)
        async with running_operator(k, kubeconfig=proxy.kubeconfig) as metrics:

            async def failed() -> str:
                conds = (await c.devices("n0")).get("status", {}).get("conditions", [])
                return next((x["message"] for x in conds if x["type"] == models.LABELS_PUBLISHED), "")

            assert "install NFD" in await eventually(failed)
            errors = reconciled(metrics, "error")
            await eventually(lambda: reconciled(metrics, "error") > errors)  # tried again, unprompted
            proxy.allow()
            await eventually(lambda: reconciled(metrics, "published") == 1)
            await settle(k)
        assert CAPABLE in (await c.nodefeature("n0"))["spec"]["labels"]
