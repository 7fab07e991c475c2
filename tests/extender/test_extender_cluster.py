"""The extender against the embedded Kubernetes API over real HTTP: watches feed the cache, verdicts
become pod Events and pod annotations, a restarted (or newly leading) extender rebuilds its claims from
those annotations, and /healthz tells broken watches."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import kmock
from aiohttp.test_utils import TestClient, TestServer
from extender_fixtures import PRODUCT, explicit, filter_, fleet, pod
from kubernetes import client
from prometheus_client import CollectorRegistry

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.extender import decisions
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.events import KubePublisher
from nodefabric_operator.extender.server import Serving, make_app
from nodefabric_operator.extender.service import Extender
from nodefabric_operator.extender.watch import Watcher

DECISION = "placement.gpustack.ai/decision"
CLAIM = "placement.gpustack.ai/claim"
PODS = "v1/pods"


async def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)


def pod_events(k: RunningAPI) -> list[tuple[str, str, str, str]]:
    out = []
    for key, obj in k.api.objects.items():
        if key[0] == kmock.resource("v1/events") and not obj.deleted:
            assert obj["source"]["component"] == "nodefabric-extender"
            out.append((obj["involvedObject"]["name"], obj["type"], obj["reason"], obj["message"]))
    return sorted(out)


def annotations(k: RunningAPI, name: str, namespace: str = "ml") -> dict[str, str]:
    stored = k.api.stored(PODS, name, namespace)
    assert stored is not None, name
    found: dict[str, str] = stored["metadata"].get("annotations") or {}
    return found


class Running:
    """One extender as the CLI runs it: its own cache fed by watches, verdicts written to the API."""

    def __init__(self, k: RunningAPI, http: TestClient[Any, Any], ext: Extender, watcher: Watcher) -> None:
        self.k, self.http, self.ext, self.watcher = k, http, ext, watcher
        publisher = ext.publisher
        assert isinstance(publisher, KubePublisher)
        self.publisher = publisher

    async def filter(self, p: dict[str, Any], names: list[str]) -> dict[str, Any]:
        result = await filter_(self.http, p, names)
        await self.publisher.drain()
        return result

    async def sees(self, check: Callable[[Cache], bool]) -> None:
        assert await eventually(lambda: check(self.ext.cache)), "the watch did not deliver in time"


@asynccontextmanager
async def extender_on(
    k: RunningAPI, clock: Callable[[], float] = time.time, **serving: Any
) -> AsyncIterator[Running]:
    api = load_client(k.kubeconfig)  # as every component reaches the API
    cfg = ExtenderConfig()
    cache = Cache(cfg)
    registry = CollectorRegistry()
    ext = Extender(cfg, cache, registry=registry, clock=clock)
    ext.publisher = KubePublisher(client.CoreV1Api(api), registry)
    watcher = Watcher(cache, ext.book, api)
    watcher.start(asyncio.get_running_loop())
    try:
        app = make_app(ext, Serving(health=lambda: watcher.problems(60.0), **serving))
        async with TestClient(TestServer(app)) as http:
            assert await eventually(lambda: cache.synced), "caches never synced"
            yield Running(k, http, ext, watcher)
    finally:
        watcher.stop()


def seed(k: RunningAPI, pods: list[dict[str, Any]]) -> None:
    for n in fleet(per_zone=2):
        k.api.put_object("v1/nodes", n)
    k.api.put_object(PODS, pod("other-0", namespace="batch", gpus=8, node_name="eu-a-0", phase="Running"))
    for p in pods:  # the group's pods exist (Pending) before kube-scheduler asks about them
        k.api.put_object(PODS, p)


async def bind(k: RunningAPI, p: dict[str, Any], node: str) -> dict[str, Any]:
    """What kube-scheduler's bind does to the stored pod: it gets a node (annotations kept)."""
    stored = k.api.stored(PODS, p["metadata"]["name"], "ml")
    assert stored is not None
    bound = {**stored, "spec": {**stored["spec"], "nodeName": node}}
    k.api.put_object(PODS, bound)
    await k.api._buses[kmock.resource(PODS)].put({"type": "MODIFIED", "object": bound})
    return bound


async def test_watches_feed_the_cache_and_verdicts_are_persisted_on_the_pod():
    pods = [pod(f"pg-{i}", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "pg"}) for i in range(2)]
    async with running_api() as k:
        seed(k, pods)
        k.api.put_object(
            "scheduling.x-k8s.io/v1alpha1/podgroups",
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "pg", "namespace": "ml"},
                "spec": {"minMember": 2},
            },
        )
        async with extender_on(k) as ext:
            cache = ext.ext.cache
            assert len(cache.nodes) == 10 and (await ext.http.get("/readyz")).status == 200
            assert cache.index.views["eu-a-0"].free["nvidia.com/gpu"] == 0  # the running pod's GPUs
            assert cache.pod_group_sizes[("scheduling.x-k8s.io", "ml", "pg")] == 2
            names = sorted(n for n in cache.nodes if n != "eu-a-0")
            patches, creates = k.count("PATCH", PODS), k.count("POST", "v1/events")

            result = await ext.filter(pods[0], names)
            assert sorted(result["NodeNames"]) == ["eu-b-0", "eu-b-1"]
            # One Event and one annotation write per verdict ...
            assert (k.count("PATCH", PODS), k.count("POST", "v1/events")) == (patches + 1, creates + 1)
            events = pod_events(k)
            assert [e[:3] for e in events] == [("pg-0", "Normal", "GroupPlaced")]
            placed = "2 of 2 pods of group ml/scheduler-plugins/pg go to zone eu-b of region eu"
            assert events[0][3].startswith(placed)
            decision = annotations(k, "pg-0")[DECISION]
            assert decision.replace("\n", " ") == "placed: " + events[0][3]
            # ... written so that `kubectl describe pod` shows it whole (it cuts lines past 140 chars).
            assert all(len(line) <= 120 for line in decision.splitlines())
            claim = json.loads(annotations(k, "pg-0")[CLAIM])
            assert claim["group"] == "ml/scheduler-plugins/pg" and claim["uid"] == pods[0]["metadata"]["uid"]
            assert (claim["level"], claim["location"], claim["homogeneity"]) == (
                "zone", "eu-b", {PRODUCT: "NVIDIA-H100-80GB-HBM3"},
            )  # fmt: skip
            # ... not per retry: kube-scheduler asks again, nothing is written.
            await ext.filter(pods[0], names)
            assert (k.count("PATCH", PODS), k.count("POST", "v1/events")) == (patches + 1, creates + 1)

            # Bound by kube-scheduler: the watch turns it into a member on eu-b-1; its claim no longer counts.
            await bind(k, pods[0], "eu-b-1")
            await ext.sees(lambda c: c.index.views["eu-b-1"].free["nvidia.com/gpu"] == 0)
            result = await ext.filter(pods[1], ["eu-b-0", "eu-c-0", "us-a-1"])
            assert result["NodeNames"] == ["eu-b-0"]

            # The group's pods go away: its record is released.
            await k.api._buses[kmock.resource(PODS)].put({"type": "DELETED", "object": pods[0]})
            await k.api._buses[kmock.resource(PODS)].put({"type": "DELETED", "object": pods[1]})
            assert await eventually(lambda: "ml/scheduler-plugins/pg" not in ext.ext.book.groups)


async def test_a_restart_or_a_new_leader_rebuilds_the_groups_claims_from_the_pods():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 3)) for i in range(3)]
    async with running_api() as k:
        seed(k, pods)
        names = [n["metadata"]["name"] for n in fleet(per_zone=2) if n["metadata"]["name"] != "eu-a-0"]
        # Extender A (the leader's) lets the first pod through: the group goes to one region (no zone
        # here holds 3), and the claim is persisted on the pod.
        async with extender_on(k) as a:
            first = await a.filter(pods[0], names)
            assert sorted(first["NodeNames"]) == ["eu-a-1", "eu-b-0", "eu-b-1", "eu-c-0", "eu-c-1"]
            summary = a.ext.summary("ml/explicit/train")
            assert summary is not None
            # Extender B (a standby beside the other scheduler replica) only watched so far ...
            async with extender_on(k) as b:
                await b.sees(lambda c: c.pods[pods[0]["metadata"]["uid"]].claim is not None)
                assert b.ext.book.peek("ml/explicit/train") is None
                # ... then becomes the leader's: the next pod follows A's bucket and counts A's claim.
                second = await b.filter(pods[1], [*names[:2], "us-a-0", "us-a-1", "us-b-0", "us-b-1"])
                assert sorted(second["NodeNames"]) == ["eu-a-1", "eu-b-0"]
                (g,) = await (await b.http.get("/debug/groups")).json()
                assert g["claims"] == sorted(p["metadata"]["uid"] for p in pods[:2])
                assert (g["level"], g["location"]) == ("region", "eu")
                # The decision it wrote on the second pod names the same bucket A chose.
                assert annotations(k, "train-1")[DECISION].replace("\n", " ") == f"placed: {summary}"
        # Both gone; a fresh extender starts: the third pod still goes to region eu.
        async with extender_on(k) as c:
            third = await c.filter(pods[2], ["us-a-0", "us-a-1", "eu-c-1"])
            assert third["NodeNames"] == ["eu-c-1"]
            assert set(third["FailedNodes"].values()) == {"outside region eu of the group"}


async def test_a_pod_let_through_again_renews_its_persisted_claim():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 2, locality="zone")) for i in range(2)]
    now = [time.time()]
    async with running_api() as k:
        seed(k, pods)
        async with extender_on(k, clock=lambda: now[0]) as a:
            await a.filter(pods[0], ["us-a-0", "us-a-1"])
            first = json.loads(annotations(k, "train-0")[CLAIM])["at"]
            patches = k.count("PATCH", PODS)
            # Asked again within half the claim's life: the verdict is the same, nothing is written.
            now[0] += 100
            await a.filter(pods[0], ["us-a-0", "us-a-1"])
            assert k.count("PATCH", PODS) == patches
            # Its binding kept failing; let through again after its claim expired, with the same words.
            # The claim it holds from now is persisted, not only kept in memory.
            now[0] += 300
            await a.filter(pods[0], ["us-a-0", "us-a-1"])
            assert k.count("PATCH", PODS) == patches + 1
            assert [e[:3] for e in pod_events(k)] == [("train-0", "Normal", "GroupPlaced")]  # one Event
            renewed = json.loads(annotations(k, "train-0")[CLAIM])["at"]
            assert renewed == decisions.timestamp(now[0]) != first
        # The extender restarts right after: train-0's claim still counts, so train-1 follows it to
        # us-a (one more pod) instead of the group choosing afresh where two fit.
        now[0] += 10
        async with extender_on(k, clock=lambda: now[0]) as b:
            await b.sees(lambda c: c.pods[pods[0]["metadata"]["uid"]].claim is not None)
            result = await b.filter(pods[1], ["us-a-1", "eu-b-0", "eu-b-1"])
            assert result["NodeNames"] == ["us-a-1"]


async def test_a_claim_copied_into_another_pod_claims_nothing():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 2)) for i in range(2)]
    async with running_api() as k:
        seed(k, pods)
        async with extender_on(k) as a:
            await a.filter(pods[0], ["us-a-0", "us-a-1"])
            stored = k.api.stored(PODS, "train-0", "ml")
            assert stored is not None
        # Someone re-creates the pod from its YAML (annotations and all) under a new uid.
        copy = {**stored, "metadata": {**stored["metadata"], "name": "copy-0", "uid": "another-uid"}}
        copy["metadata"]["annotations"] = dict(stored["metadata"]["annotations"])
        k.api.objects[kmock.resource(PODS), "ml", "train-0"].delete()
        k.api.put_object(PODS, copy)
        async with extender_on(k) as b:
            await b.sees(lambda c: "another-uid" in c.pods)
            assert b.ext.cache.pods["another-uid"].claim is None
            # The group starts afresh: the copy's zone is not a bucket the group was given.
            result = await b.filter(pods[1], ["eu-b-0", "eu-b-1", "us-a-0"])
            assert sorted(result["NodeNames"]) == ["eu-b-0", "eu-b-1"]


async def test_a_waiting_pod_loses_its_stale_claim_and_is_told_why():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 2, locality="zone")) for i in range(2)]
    async with running_api() as k:
        seed(k, pods)
        async with extender_on(k) as ext:
            await ext.filter(pods[0], ["us-a-0", "us-a-1"])
            assert CLAIM in annotations(k, "train-0")
            # Its binding failed and both us-a nodes filled up meanwhile: asked again, it waits.
            result = await ext.filter(pods[0], ["us-b-0"])
            assert result["NodeNames"] == []
            assert CLAIM not in annotations(k, "train-0")
            assert annotations(k, "train-0")[DECISION].startswith("wait: group ml/explicit/train waits")
            assert [e[1:3] for e in pod_events(k)] == [("Normal", "GroupPlaced"), ("Normal", "GroupWaiting")]


async def test_a_pod_deleted_before_it_was_bound_holds_no_room():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 2)) for i in range(2)]
    async with running_api() as k:
        seed(k, pods)
        async with extender_on(k) as ext:
            await ext.filter(pods[0], ["us-a-0", "us-a-1"])
            assert ext.ext.book.groups["ml/explicit/train"].claims
            await k.api._buses[kmock.resource(PODS)].put({"type": "DELETED", "object": pods[0]})
            assert await eventually(lambda: not ext.ext.book.groups["ml/explicit/train"].claims)


async def test_never_fits_is_a_warning_event_on_the_pod():
    big = pod("big-0", gpus=8, **explicit("big", 3, locality="zone"))
    async with running_api() as k:
        seed(k, [big])
        async with extender_on(k) as ext:
            for _ in range(2):
                result = await ext.filter(big, sorted(ext.ext.cache.nodes))
                assert len(result["FailedAndUnresolvableNodes"]) == 10
            events = pod_events(k)
            assert [e[:3] for e in events] == [("big-0", "Warning", "GroupNeverFits")]
            assert events[0][3].startswith(f"never fits: no zone of one {PRODUCT} can hold the 3 pods")
            assert annotations(k, "big-0")[DECISION].startswith("never-fits: never fits: no zone")


async def test_writes_that_fail_are_counted_and_lose_no_decision():
    p = pod("train-0", gpus=8, **explicit("train", 2))
    async with running_api() as k:
        seed(k, [p])
        async with extender_on(k) as ext:
            k.api.fail_next(2, 503)  # the Event and the annotation write both fail
            result = await ext.filter(p, ["us-a-0", "us-a-1"])
            assert sorted(result["NodeNames"]) == ["us-a-0", "us-a-1"]
            text = await (await ext.http.get("/metrics")).text()
            assert 'nodefabric_extender_writes_failed_total{kind="event"} 1.0' in text
            assert 'nodefabric_extender_writes_failed_total{kind="annotation"} 1.0' in text
            assert ext.ext.book.groups["ml/explicit/train"].claims  # the claim holds in memory


async def test_healthz_fails_once_the_watches_stay_broken_past_the_grace():
    now = [1000.0]
    async with running_api() as k:
        k.api.put_object("v1/nodes", fleet(per_zone=1)[0])
        # An API client aimed at a port where nothing listens: every list fails.
        unreachable = client.Configuration(host="http://127.0.0.1:9")
        unreachable.retries = 0
        api = client.ApiClient(unreachable)
        cfg = ExtenderConfig()
        cache = Cache(cfg)
        ext = Extender(cfg, cache, registry=CollectorRegistry())
        watcher = Watcher(cache, ext.book, api, clock=lambda: now[0])
        watcher.start(asyncio.get_running_loop())
        try:
            app = make_app(ext, Serving(health=lambda: watcher.problems(120.0)))
            async with TestClient(TestServer(app)) as http:
                assert await eventually(lambda: "refused" in str(watcher.broken.get("nodes")))
                assert (await http.get("/readyz")).status == 503
                assert (await http.get("/healthz")).status == 200  # within the grace
                now[0] += 121
                resp = await http.get("/healthz")
                assert resp.status == 503
                text = await resp.text()
                assert "nodes watch broken for 121s" in text and "pods watch broken for 121s" in text
                assert "refused" in text
        finally:
            watcher.stop()
