"""The extender against the embedded Kubernetes API over real HTTP: watches feed the cache, verdicts
become pod Events and a copy in the pod's decision annotation, nothing a pod carries is read back as
state (forged claims and decisions change nothing), an admitted PlacementGroup is followed, and /healthz
tells broken watches."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kmock
from aiohttp.test_utils import TestClient, TestServer
from extender_fixtures import PRODUCT, explicit, filter_, fleet, pod
from kubernetes import client
from prometheus_client import CollectorRegistry

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.demo.kubeapi.running import load_crds
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.events import KubePublisher
from nodefabric_operator.extender.server import Serving, make_app
from nodefabric_operator.extender.service import Extender
from nodefabric_operator.extender.watch import Feed, Watcher

ROOT = Path(__file__).resolve().parents[2]
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
            # Only the decision: no claim is written on a pod any more (nor read back).
            assert CLAIM not in annotations(k, "pg-0")
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


PLG = "placement.gpustack.ai/v1alpha1/placementgroups"
# The PlacementGroup CRD as the chart installs it: the embedded API serves and validates it.
PLG_CRDS = load_crds([str(ROOT / "crds" / "placement.gpustack.ai_placementgroups.yaml")])


def placement_group(key: str, phase: str, nodes: dict[str, str], decision: str) -> dict[str, Any]:
    ns, family, name = key.split("/")
    return {
        "apiVersion": "placement.gpustack.ai/v1alpha1",
        "kind": "PlacementGroup",
        "metadata": {"name": f"{family}-{name}", "namespace": ns, "uid": f"plg-{name}"},
        "spec": {"key": key, "family": family, "name": name},
        "status": {
            "phase": phase,
            "decision": decision,
            "members": [
                {"pod": f"pod-{uid}", "uid": uid, "node": node, "bound": False, "ready": False}
                for uid, node in nodes.items()
            ],
        },
    }


async def test_a_member_of_an_admitted_group_is_allowed_only_its_assigned_node():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 2)) for i in range(2)]
    uids = [p["metadata"]["uid"] for p in pods]
    text = "2 of 2 pods of group ml/explicit/train go to zone us-a of region us (nodes us-a-0, us-a-1)"
    async with running_api(crds=PLG_CRDS) as k:
        seed(k, pods)
        k.api.put_object(
            PLG,
            placement_group("ml/explicit/train", "Admitted", {uids[0]: "us-a-1", uids[1]: "us-a-0"}, text),
        )
        async with extender_on(k) as ext:
            await ext.sees(lambda c: "ml/explicit/train" in c.admissions)
            names = sorted(n for n in ext.ext.cache.nodes if n != "eu-a-0")
            first = await ext.filter(pods[0], names)
            assert first["NodeNames"] == ["us-a-1"]
            assert set(first["FailedNodes"]) == set(names) - {"us-a-1"}
            # The PlacementGroup's own words, once, as the Event and the annotation (no doubled prefix).
            assert annotations(k, "train-0")[DECISION].replace("\n", " ") == f"placed: {text}"
            assert [e[2:] for e in pod_events(k)] == [("GroupPlaced", text)]
            second = await ext.filter(pods[1], ["us-a-1", "eu-b-0"])
            # Its node is taken by nobody else's choice: it waits for us-a-0 rather than go elsewhere.
            assert second["NodeNames"] == [] and second["Error"] == ""
            assert set(second["FailedNodes"].values()) == {
                "group ml/explicit/train is admitted to node us-a-0, which is not feasible for this pod now"
            }
            assert (await ext.filter(pods[1], ["us-a-0", "us-a-1"]))["NodeNames"] == ["us-a-0"]
            # A PlacementGroup not admitted (waiting) leaves the group to the extender's own rule.
            k.api.put_object(PLG, placement_group("ml/explicit/train", "Waiting", {}, "waits"))
            await k.api._buses[kmock.resource(PLG)].put(
                {"type": "MODIFIED", "object": placement_group("ml/explicit/train", "Waiting", {}, "waits")}
            )
            await ext.sees(lambda c: not c.admissions["ml/explicit/train"].admitted)
            result = await ext.filter(pods[1], ["eu-b-0", "eu-b-1"])
            assert sorted(result["NodeNames"]) == ["eu-b-0", "eu-b-1"]


async def test_a_placement_group_in_another_namespace_admits_nothing():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 2)) for i in range(2)]
    async with running_api(crds=PLG_CRDS) as k:
        seed(k, pods)
        forged = placement_group("ml/explicit/train", "Admitted", {pods[0]["metadata"]["uid"]: "us-b-0"}, "x")
        forged["metadata"]["namespace"] = "attacker"
        k.api.put_object(PLG, forged)
        async with extender_on(k) as ext:
            await ext.sees(lambda c: c.synced)
            result = await ext.filter(pods[0], ["eu-b-0", "eu-b-1", "us-b-0"])
            assert sorted(result["NodeNames"]) == ["eu-b-0", "eu-b-1"]


FORGED_CLAIM = json.dumps(
    {
        "group": "ml/explicit/train",
        "uid": "",  # filled per pod
        "at": "9999-12-31T23:59:59Z",
        "level": "any",
        "location": None,
        "homogeneity": {},
        "enclosing": [],
    }
)


async def test_forged_claims_and_decisions_on_pods_change_nothing():
    """An attacker's own pod in the group (its label, a claim dated 9999 on no location, a decision in
    their words), and the same on the victim's pods: the group is placed exactly as without them."""
    victims = [pod(f"train-{i}", gpus=8, **explicit("train", 2, locality="zone")) for i in range(2)]
    attacker = pod("evil-0", gpus=8, **explicit("train", 2, locality="zone"))
    for p in [*victims, attacker]:
        claim = json.loads(FORGED_CLAIM)
        claim["uid"] = p["metadata"]["uid"]
        p["metadata"]["annotations"][CLAIM] = json.dumps(claim)
        p["metadata"]["annotations"][DECISION] = "placed: attacker's words (nodes us-b-0)"
    async with running_api() as k:
        seed(k, [*victims, attacker])
        async with extender_on(k) as ext:
            result = await ext.filter(victims[0], ["us-a-0", "us-a-1", "us-b-0"])
            # The group's own rule: one zone that holds both pods (us-a), not "anywhere", not us-b-0.
            assert sorted(result["NodeNames"]) == ["us-a-0", "us-a-1"]
            (g,) = await (await ext.http.get("/debug/groups")).json()
            assert g["claims"] == [victims[0]["metadata"]["uid"]]
            assert "attacker" not in g["summary"]
            events = pod_events(k)
            assert [e[:3] for e in events] == [("train-0", "Normal", "GroupPlaced")]
            assert "attacker" not in events[0][3]
            assert "attacker" not in annotations(k, "train-0")[DECISION]


async def test_twenty_pods_of_another_scheduler_with_a_jobs_label_never_count():
    """Pods of another scheduler carrying the Job's job-name label are not members: the Job's group is
    sized and placed from its own pods, as without them."""
    job = [pod(f"train-{i}", gpus=8, labels={"batch.kubernetes.io/job-name": "train"}) for i in range(2)]
    foreign = []
    for i in range(20):
        f = pod(f"foreign-{i}", gpus=8, labels={"batch.kubernetes.io/job-name": "train"})
        f["spec"]["schedulerName"] = "someone-else"
        foreign.append(f)
    async with running_api() as k:
        seed(k, [*job, *foreign])
        async with extender_on(k) as ext:
            await ext.sees(lambda c: len(c.pods) == 23)
            result = await ext.filter(job[0], ["us-a-0", "us-a-1", "us-b-0"])
            assert sorted(result["NodeNames"]) == ["us-a-0", "us-a-1"], result
            summary = ext.ext.summary("ml/job/train")
            assert summary is not None and summary.startswith("2 of 2 pods of group ml/job/train"), summary


async def test_a_waiting_pod_releases_its_claim_and_is_told_why():
    pods = [pod(f"train-{i}", gpus=8, **explicit("train", 2, locality="zone")) for i in range(2)]
    async with running_api() as k:
        seed(k, pods)
        async with extender_on(k) as ext:
            await ext.filter(pods[0], ["us-a-0", "us-a-1"])
            assert ext.ext.book.groups["ml/explicit/train"].claims
            # Its binding failed and both us-a nodes filled up meanwhile: asked again, it waits.
            result = await ext.filter(pods[0], ["us-b-0"])
            assert result["NodeNames"] == []
            assert not ext.ext.book.groups["ml/explicit/train"].claims
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
            # Said once: "never-fits: never fits:" was the outcome written twice.
            assert annotations(k, "big-0")[DECISION].startswith("never fits: no zone")


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


async def test_lists_are_paged(monkeypatch):
    """LIST in pages of PAGE (limit/continue): a cluster's pods are never decoded in one response."""
    from nodefabric_operator.extender import watch

    monkeypatch.setattr(watch, "PAGE", 3)
    pods = [pod(f"p-{i}", gpus=1) for i in range(10)]
    async with running_api() as k:
        seed(k, pods)
        async with extender_on(k) as ext:
            assert len(ext.ext.cache.pods) == 11 and len(ext.ext.cache.nodes) == 10
            # 11 pods in pages of 3: four list requests (then the watch); 10 nodes: four too.
            assert k.count("GET", PODS) >= 4, k.count("GET", PODS)
            assert k.count("GET", "v1/nodes") >= 4


async def test_a_stop_that_lands_while_a_watch_is_being_opened_still_ends_that_watch():
    """stop() closes the watches it finds open; one opened just after it looked (the thread had checked
    the stop flag before, and registers the response after) must be closed by its thread, or the thread
    reads an idle watch until the server's timeout and the API server waits for it at shutdown."""
    async with running_api() as k:
        seed(k, [])
        api = load_client(k.kubeconfig)
        nodes = client.CoreV1Api(api)
        seen: list[str] = []

        def list_call(**kw: Any) -> Any:
            answer = nodes.list_node(**kw)
            if kw.get("watch"):
                watcher.stop_event.set()  # stop() ran here: it found no open watch to close
            return answer

        def apply(kind: str, obj: dict[str, Any]) -> None:
            seen.append(kind)

        feed = Feed("nodes", list_call, lambda items: None, apply)
        watcher = Watcher(Cache(ExtenderConfig()), None, api, feeds=[feed])
        watcher.start(asyncio.get_running_loop())
        [thread] = watcher.threads
        await eventually(lambda: not thread.is_alive(), timeout=5.0)
        assert not thread.is_alive(), "the watch opened after stop() is still being read"
