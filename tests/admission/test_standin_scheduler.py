"""The kube-scheduler stand-in filters and binds as kube-scheduler does (for what group admission depends
on), and the foreign scheduler takes the nodes a test names: through the embedded API over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.demo.scheduler import (
    ForeignScheduler,
    Room,
    StandInScheduler,
    is_pending,
    rooms,
    unschedulable_message,
    why_not,
)
from nodefabric_operator.extender.pods import pod_needs

GPU = "nvidia.com/gpu"


def node(name: str, labels: dict[str, str] | None = None, **more: Any) -> dict[str, Any]:
    alloc = {GPU: "8", "cpu": "64", "memory": "512Gi", "pods": "110", **more.pop("alloc", {})}
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": more.pop("spec", {}),
        "status": {"allocatable": alloc},
    }
    return obj


def pod(name: str, *, gpus: int = 8, ns: str = "ml", **spec: Any) -> dict[str, Any]:
    requests = {GPU: str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "containers": [
                {"name": "w", "image": "img", "resources": {"requests": requests, "limits": requests}}
            ],
            **spec,
        },
    }


def room(n: dict[str, Any], bound: list[dict[str, Any]] = ()) -> Room:  # type: ignore[assignment]
    return rooms([n], bound)[n["metadata"]["name"]]


def terms(*exprs: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {"matchExpressions": list(exprs)}
    if fields:
        term["matchFields"] = fields
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


# --- the filters (pure) --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        ({"nodeSelector": {"zone": "a"}}, True),
        ({"nodeSelector": {"zone": "b"}}, False),
        ({"affinity": terms({"key": "zone", "operator": "In", "values": ["a", "b"]})}, True),
        ({"affinity": terms({"key": "zone", "operator": "NotIn", "values": ["a"]})}, False),
        ({"affinity": terms({"key": "zone", "operator": "Exists"})}, True),
        ({"affinity": terms({"key": "rack", "operator": "DoesNotExist"})}, True),
        ({"affinity": terms({"key": "zone", "operator": "DoesNotExist"})}, False),
        ({"affinity": terms({"key": "gen", "operator": "Gt", "values": ["3"]})}, True),
        ({"affinity": terms({"key": "gen", "operator": "Lt", "values": ["4"]})}, False),
        ({"affinity": terms(fields=[{"key": "metadata.name", "operator": "In", "values": ["n1"]}])}, True),
        ({"affinity": terms(fields=[{"key": "metadata.name", "operator": "In", "values": ["n2"]}])}, False),
        (
            {
                "affinity": terms(
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    fields=[{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}],
                )
            },
            False,
        ),
    ],
)
def test_node_rules_are_kube_schedulers(spec: dict[str, Any], fits: bool) -> None:
    n = node("n1", {"zone": "a", "gen": "4"})
    why = why_not(pod_needs(pod("p", **spec)), room(n))
    assert (why is None) is fits
    if not fits:
        assert why == "node(s) didn't match Pod's node affinity/selector"


def test_every_blocking_taint_counts_even_transient_ones() -> None:
    tainted = node("n1", spec={"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]})
    assert (
        why_not(pod_needs(pod("p")), room(tainted))
        == "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    )
    tolerant = pod("p", tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}])
    assert why_not(pod_needs(tolerant), room(tainted)) is None
    soft = node("n1", spec={"taints": [{"key": "x", "value": "y", "effect": "PreferNoSchedule"}]})
    assert why_not(pod_needs(pod("p")), room(soft)) is None
    cordoned = node("n1", spec={"unschedulable": True})
    assert why_not(pod_needs(pod("p")), room(cordoned)) == "node(s) were unschedulable"


def test_room_is_allocatable_minus_bound_non_terminal_pods() -> None:
    n = node("n1", alloc={"pods": "2"})
    six = pod("a", gpus=6, nodeName="n1")
    assert why_not(pod_needs(pod("p", gpus=2)), room(n, [six])) is None
    assert why_not(pod_needs(pod("p", gpus=3)), room(n, [six])) == f"Insufficient {GPU}"
    done = {**pod("b", gpus=8, nodeName="n1"), "status": {"phase": "Succeeded"}}
    assert why_not(pod_needs(pod("p", gpus=2)), room(n, [six, done])) is None
    two = [pod("c", gpus=0, nodeName="n1"), pod("d", gpus=0, nodeName="n1")]
    assert why_not(pod_needs(pod("p", gpus=0)), room(n, two)) == "Too many pods"
    cpu = pod("p", gpus=0)
    cpu["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "65"}}
    assert why_not(pod_needs(cpu), room(n)) == "Insufficient cpu"
    mem = pod("p", gpus=0)
    mem["spec"]["containers"][0]["resources"] = {"requests": {"memory": "513Gi"}}
    assert why_not(pod_needs(mem), room(n)) == "Insufficient memory"


def test_only_ungated_unbound_pods_of_its_schedulers_are_pending() -> None:
    assert is_pending(pod("p"), ["default-scheduler"])
    assert not is_pending(pod("p", schedulingGates=[{"name": "g"}]), ["default-scheduler"])
    assert not is_pending(pod("p", nodeName="n1"), ["default-scheduler"])
    assert not is_pending(pod("p", schedulerName="other"), ["default-scheduler"])
    assert is_pending(pod("p", schedulerName="other"), ["default-scheduler", "other"])
    assert not is_pending({**pod("p"), "status": {"phase": "Failed"}}, ["default-scheduler"])


def test_the_unschedulable_message_is_kube_schedulers() -> None:
    message = unschedulable_message(3, {"Insufficient nvidia.com/gpu": 2, "node(s) were unschedulable": 1})
    assert message == "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."


# --- against the embedded API ---------------------------------------------------------------------------


@pytest.fixture
async def k() -> AsyncIterator[RunningAPI]:
    async with running_api() as api:
        for i in range(3):
            api.api.put_object("v1/nodes", node(f"n{i}", {"zone": "a" if i < 2 else "b"}))
        yield api


async def until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def stored(k: RunningAPI, name: str, ns: str = "ml") -> dict[str, Any]:
    obj = k.api.stored("v1/pods", name, ns)
    assert obj is not None
    return obj


async def test_a_cycle_binds_what_fits_and_marks_it_ready(k: RunningAPI) -> None:
    k.api.put_object("v1/pods", pod("a", nodeSelector={"zone": "b"}))
    k.api.put_object("v1/pods", pod("b", nodeSelector={"zone": "b"}))
    k.api.put_object("v1/pods", pod("gated", schedulingGates=[{"name": "placement.gpustack.ai/group"}]))
    scheduler = StandInScheduler(k.kubeconfig)
    try:
        bound = await scheduler.cycle()
        assert bound == [("ml/a", "n2")]
        a = stored(k, "a")
        assert a["spec"]["nodeName"] == "n2"
        assert a["status"]["phase"] == "Running"
        assert {c["type"]: c["status"] for c in a["status"]["conditions"]} == {
            "PodScheduled": "True",
            "Initialized": "True",
            "ContainersReady": "True",
            "Ready": "True",
        }
        b = stored(k, "b")
        assert "nodeName" not in b["spec"]
        [cond] = b["status"]["conditions"]
        assert (cond["reason"], cond["message"]) == (
            "Unschedulable",
            "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, "
            "2 node(s) didn't match Pod's node affinity/selector.",
        )
        assert "nodeName" not in stored(k, "gated")["spec"]
        assert await scheduler.cycle() == []  # nothing changed: nothing bound, no rewrite
    finally:
        await scheduler.stop()


async def test_running_it_binds_a_pod_once_its_gate_goes(k: RunningAPI) -> None:
    k.api.put_object("v1/pods", pod("g", schedulingGates=[{"name": "placement.gpustack.ai/group"}]))
    async with StandInScheduler(k.kubeconfig, interval=5) as scheduler:
        await asyncio.sleep(0.3)
        assert "nodeName" not in stored(k, "g")["spec"]
        gone = {**stored(k, "g")}
        gone["spec"] = {k2: v for k2, v in gone["spec"].items() if k2 != "schedulingGates"}
        k.api.put_object("v1/pods", gone)
        # Woken by its watch, not by its 5 s resync.
        await until(lambda: bool(stored(k, "g")["spec"].get("nodeName")), timeout=3)
        await until(lambda: stored(k, "g").get("status", {}).get("phase") == "Running", timeout=3)
    assert scheduler.bound == [("ml/g", "n0")]


async def test_it_leaves_pods_of_other_schedulers_and_held_pods(k: RunningAPI) -> None:
    k.api.put_object("v1/pods", pod("mine"))
    k.api.put_object("v1/pods", pod("theirs", schedulerName="foreign-scheduler"))
    scheduler = StandInScheduler(k.kubeconfig)
    scheduler.hold.add("ml/mine")
    try:
        assert await scheduler.cycle() == [("ml/mine", "n0")]
        assert "nodeName" not in stored(k, "theirs")["spec"]
        assert "Ready" not in [c["type"] for c in stored(k, "mine")["status"]["conditions"]]
    finally:
        await scheduler.stop()


async def test_the_foreign_scheduler_takes_the_node_it_is_told(k: RunningAPI) -> None:
    foreign = ForeignScheduler(k.kubeconfig)
    scheduler = StandInScheduler(k.kubeconfig)
    try:
        taken = await foreign.take("n0", requests={GPU: "8"})
        assert taken["spec"]["schedulerName"] == "foreign-scheduler"
        assert stored(k, "foreign-scheduler-n0", "default")["spec"]["nodeName"] == "n0"
        k.api.put_object("v1/pods", pod("p", nodeSelector={"zone": "a"}))
        assert await scheduler.cycle() == [("ml/p", "n1")]  # n0 is full now
        k.api.put_object("v1/pods", pod("q", nodeSelector={"zone": "a"}))
        assert await scheduler.cycle() == []
        with pytest.raises(ValueError, match="is not a pod of foreign-scheduler"):
            await foreign.bind(stored(k, "q"), "n2")
    finally:
        await foreign.close()
        await scheduler.stop()


async def test_a_pod_it_cannot_read_is_said_unschedulable(k: RunningAPI) -> None:
    bad = pod("bad")
    bad["spec"]["containers"][0]["resources"] = {"requests": {GPU: "1.5"}}
    k.api.put_object("v1/pods", bad)
    scheduler = StandInScheduler(k.kubeconfig)
    try:
        assert await scheduler.cycle() == []
        [cond] = stored(k, "bad")["status"]["conditions"]
        assert cond["reason"] == "Unschedulable"
        assert "the pod cannot be read" in cond["message"]
    finally:
        await scheduler.stop()
