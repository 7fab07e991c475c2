"""The one Event writer (nodefabric_devicemanager.events): its body, its message cap and its spam filter,
and the three components that write through it (agent, operator recorder, extender/placement)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import kmock
import kubernetes
import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from nodefabric_devicemanager import events
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import events as operator_events
from nodefabric_operator import labels, recorder
from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.extender.events import KubePublisher, event_body

LONG = "é" * 5000  # 10,000 UTF-8 bytes: a cut by characters would keep 2,048 bytes
DEVICES = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "name": "gpu-7", "uid": "u-7"}


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# --- the cap --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", ["", "short", "x" * 1024, "é" * 512, "🚀" * 256])
def test_a_message_within_the_cap_is_kept_whole(message: str) -> None:
    assert events.cap(message) == message


@pytest.mark.parametrize("message", ["x" * 1025, "x" * 10**6, LONG, "a" + "🚀" * 400, "\udcff" * 600])
def test_a_longer_message_is_cut_on_a_character_to_at_most_the_cap_in_bytes(message: str) -> None:
    got = events.cap(message)
    assert got.endswith("...") and message.startswith(got[:-3])
    assert events.MAX_MESSAGE - 4 <= _bytes(got) <= events.MAX_MESSAGE  # at most one character short


def test_the_cap_is_what_the_api_server_accepts() -> None:
    # events.k8s.io/v1's NoteLengthLimit (1 KiB), which client-go's recorders cut to as well.
    assert events.MAX_MESSAGE == 1024


@pytest.mark.parametrize("limit", [-1, 0, 2])
def test_a_cap_with_no_room_for_the_ellipsis_is_refused(limit: int) -> None:
    with pytest.raises(ValueError, match="room"):
        events.cap("x" * 10, limit)


# --- the body -------------------------------------------------------------------------------------------


def test_the_body_is_a_valid_v1_event_about_the_object_it_names() -> None:
    now = datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    body = events.body(
        DEVICES,
        namespace="default",
        type_=events.WARNING,
        reason="LinkDown",
        message=LONG,
        component="nodefabric-agent",
        instance="gpu-7",
        now=now,
        host="gpu-7",
        action="Watch",
    )
    event = kubernetes.client.CoreV1Event.model_validate(body)
    assert event.metadata.generate_name == "gpu-7-" and event.metadata.namespace == "default"
    assert body["involvedObject"] == DEVICES  # no namespace invented for a cluster-scoped object
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-01-02T03:04:05Z"  # in UTC
    assert (body["count"], body["action"], body["source"]) == (
        1,
        "Watch",
        {"component": "nodefabric-agent", "host": "gpu-7"},
    )
    assert (body["reportingComponent"], body["reportingInstance"]) == ("nodefabric-agent", "gpu-7")
    assert _bytes(body["message"]) <= events.MAX_MESSAGE


def test_a_naive_time_is_taken_as_utc() -> None:
    assert events.stamp(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"


def test_without_action_or_host_neither_is_written() -> None:
    body = events.body(
        {"kind": "Pod", "name": "p"}, namespace="ml", type_="Normal", reason="R", message="m",
        component="c", instance="c",
    )  # fmt: skip
    assert "action" not in body and body["source"] == {"component": "c"}


# --- the spam filter ------------------------------------------------------------------------------------


def test_the_writer_lets_a_burst_about_one_object_through_then_one_per_refill() -> None:
    now = [1000.0]
    writer = events.Writer("c", clock=lambda: now[0])
    assert [writer.admit("a") for _ in range(26)] == [True] * 25 + [False]
    assert writer.admit("b")  # another object has its own budget
    now[0] += 299.0
    assert not writer.admit("a")
    now[0] += 1.0
    assert writer.admit("a") and not writer.admit("a")


def test_the_writer_admits_exactly_the_burst_from_many_threads() -> None:
    writer = events.Writer("c", clock=lambda: 0.0)
    admitted: list[bool] = []
    lock = threading.Lock()

    def post() -> None:
        for _ in range(20):
            ok = writer.admit("a")
            with lock:
                admitted.append(ok)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert admitted.count(True) == 25 and len(admitted) == 160


# --- the three writers use it ---------------------------------------------------------------------------


def test_the_agent_posts_the_shared_body() -> None:
    posted: list[dict[str, Any]] = []

    class Capture:
        def call(self, what: str, method: str, path: str, body: Any = None, **_: Any) -> None:
            posted.append(body)

    DevicesClient(Capture()).post_event(  # type: ignore[arg-type]
        "gpu-7", {"metadata": {"uid": "u-7"}}, "Warning", "LinkDown", LONG
    )
    (body,) = posted
    want = events.body(
        DEVICES, namespace="default", type_="Warning", reason="LinkDown", message=LONG,
        component="nodefabric-agent", instance="gpu-7", host="gpu-7",
    )  # fmt: skip
    stamps = ("firstTimestamp", "lastTimestamp")
    assert {k: v for k, v in body.items() if k not in stamps} == {
        k: v for k, v in want.items() if k not in stamps
    }


def test_the_operator_recorder_posts_the_shared_body_and_cuts_a_long_change_list_in_bytes() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    notice = operator_events.for_failure(operator_events.PUBLISH_FAILED, LONG)
    body = recorder.event_body({**DEVICES, "namespace": "x"}, notice, "pod-1", now)
    assert body == events.body(
        DEVICES, namespace=recorder.NAMESPACE, type_=notice.type, reason=notice.reason, message=LONG,
        component=operator_events.COMPONENT, instance="pod-1", now=now, action="PublishLabels",
    )  # fmt: skip
    many = [labels.Change(f"feature.gpustack.ai/fabric.k{i}", None, "é" * 30) for i in range(100)]
    changed = operator_events.for_changes("Node n1", many, "gpustack.ai")
    assert changed is not None and _bytes(changed.message) <= events.MAX_MESSAGE
    assert changed.message.endswith("... (100 changes)")


def test_the_extender_body_names_a_pod_by_default() -> None:
    pod = {"metadata": {"name": "p-0", "namespace": "ml", "uid": "u-1"}}
    body = event_body(pod, "Normal", "GroupPlaced", LONG)
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p-0",
        "namespace": "ml",
        "uid": "u-1",
    }
    assert body["metadata"] == {"generateName": "p-0-", "namespace": "ml"}
    assert _bytes(body["message"]) <= events.MAX_MESSAGE


async def test_the_extender_publisher_holds_back_a_burst_about_one_pod_in_a_real_api() -> None:
    async with running_api() as k:
        core = client.CoreV1Api(load_client(k.kubeconfig))
        registry = CollectorRegistry()
        publisher = KubePublisher(core, registry, clock=lambda: 0.0)
        flapping = {"metadata": {"name": "p-0", "namespace": "ml", "uid": "u-0"}}
        other = {"metadata": {"name": "p-1", "namespace": "ml", "uid": "u-1"}}
        for i in range(30):
            publisher.event(flapping, "Warning", "GroupWaits", f"try {i}: {LONG}")
        publisher.event(other, "Normal", "GroupPlaced", "placed")
        await publisher.drain()
        stored = [
            o for key, o in k.api.objects.items() if key[0] == kmock.resource("v1/events") and not o.deleted
        ]
        by_pod: dict[str, int] = {}
        for e in stored:
            by_pod[e["involvedObject"]["name"]] = by_pod.get(e["involvedObject"]["name"], 0) + 1
            assert _bytes(e["message"]) <= events.MAX_MESSAGE
        assert by_pod == {"p-0": 25, "p-1": 1}
        assert k.count("POST", "v1/events") == 26
        dropped = registry.get_sample_value("nodefabric_extender_writes_failed_total", {"kind": "event"})
        assert dropped == 5  # the held-back ones are counted


# A name as long as the API server allows (a DNS subdomain, 253 characters), and one whose first 57
# characters end on a dot: the Event's generateName must still be a valid prefix.
LONGEST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
DOT_AT_CUT = "x" * 56 + ".y" + "z" * 30


@pytest.mark.parametrize("name", [LONGEST, DOT_AT_CUT, "gpu-7"])
async def test_an_event_about_any_valid_name_is_accepted_by_the_api_server(name: str) -> None:
    # "<name>-" is refused (422) for a 253-character name: the prefix is validated as a DNS subdomain
    # with its dash, 254 characters. The server keeps 58 characters of a prefix anyway.
    assert len(LONGEST) == 253
    body = events.body(
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": "u-1"},
        namespace="default", type_="Warning", reason="LinkDown", message=LONG,
        component="nodefabric-agent", instance="gpu-7",
    )  # fmt: skip
    prefix = body["metadata"]["generateName"]
    assert prefix.endswith("-") and not prefix.rstrip("-").endswith(".") and len(prefix) <= 58
    assert body["involvedObject"]["name"] == name  # the object is named whole; only the prefix is cut
    async with running_api() as k:
        core = client.CoreV1Api(load_client(k.kubeconfig))
        # In a thread: the embedded API answers on this test's event loop.
        created = await asyncio.to_thread(core.create_namespaced_event, "default", body)
    assert created.metadata.name.startswith(prefix)
    assert created.involved_object.name == name
