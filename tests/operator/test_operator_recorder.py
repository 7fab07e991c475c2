"""The Event recorder against the embedded API over real HTTP. It posts through the ApiClient's own
serializer (not CoreV1Api), so what the generated calls did for it is checked here: the body as sent,
an answer outside 2xx taken as the failure it is (a 404 on a count posts anew), and a failure of any
kind counted, never raised."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import events
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.recorder import NAMESPACE, Recorder

EVENTS = "v1/events"
INVOLVED = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "name": "n1", "uid": "u-1"}
NOTICE = events.Notice(events.WARNING, events.CAPABILITY_LOST, "NodeFeature ns/n1: rdma.capable removed")


def actions(metrics: Metrics) -> dict[str, float]:
    names = ("created", "counted", "dropped", "failed")
    return {a: metrics.events.labels(action=a)._value.get() for a in names}


def _call(k: RunningAPI, method: str, path: str) -> Any:
    request = urllib.request.Request(f"{k.url}/api/v1/namespaces/{NAMESPACE}/events{path}", method=method)
    with urllib.request.urlopen(request) as r:
        return json.loads(r.read())


async def listed(k: RunningAPI) -> list[dict[str, Any]]:
    return list((await asyncio.to_thread(_call, k, "GET", ""))["items"])


async def test_an_event_is_posted_then_counted_and_posted_again_once_it_is_gone():
    async with running_api() as k:
        metrics = Metrics()
        rec = Recorder(load_client(k.kubeconfig), "pod-1", metrics)
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        [event] = await listed(k)
        assert event["involvedObject"] == INVOLVED  # no namespace: what `kubectl describe` searches for
        assert (event["type"], event["reason"], event["message"]) == (
            NOTICE.type,
            NOTICE.reason,
            NOTICE.message,
        )
        assert (event["reportingComponent"], event["reportingInstance"]) == (events.COMPONENT, "pod-1")
        assert event["count"] == 1 and event["metadata"]["name"].startswith("n1-")
        # The same Event again raises its count (a merge patch of the Event the answer named).
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        assert [e["count"] for e in await listed(k)] == [2]
        # Deleted meanwhile (expired): the count meets a 404, and a new Event is posted.
        await asyncio.to_thread(_call, k, "DELETE", f"/{event['metadata']['name']}")
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        [again] = await listed(k)
        assert again["count"] == 1 and again["metadata"]["name"] != event["metadata"]["name"]
        assert k.count("POST", EVENTS) == 2 and k.count("PATCH", EVENTS) == 2
        assert actions(metrics) == {"created": 2, "counted": 1, "dropped": 0, "failed": 0}
        gone = Recorder(load_client(k.kubeconfig), "pod-1", metrics)
    # The API is gone: a connection error, counted as a failure, nothing raised.
    await asyncio.to_thread(gone.post, INVOLVED, NOTICE)
    assert actions(metrics)["failed"] == 1
