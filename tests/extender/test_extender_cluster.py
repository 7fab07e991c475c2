"""The extender against the API emulator over real HTTP: watches feed the cache, pod Events are written."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import kmock
from aiohttp.test_utils import TestClient, TestServer
from extender_fixtures import explicit, filter_, fleet, pod
from kubernetes import client, config
from prometheus_client import CollectorRegistry

from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.events import KubeEvents
from nodefabric_operator.extender.server import make_app
from nodefabric_operator.extender.service import Extender
from nodefabric_operator.extender.watch import Watcher


async def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)


async def written(sink: KubeEvents) -> None:
    """Wait for every Event write the extender started (each runs in a worker thread)."""
    while sink.pending:
        await asyncio.gather(*sink.pending)


async def watching(k: Any, resource: str) -> None:
    """Wait until a watch on `resource` is subscribed to the emulator's event bus: an event put on the
    bus before that is never delivered (the watch's initial listing is taken from the stored objects)."""
    bus = k.api._buses[kmock.resource(resource)]
    assert await eventually(lambda: bus.consumer_count > 0), f"no watch on {resource}"


def pod_events(k: Any) -> list[tuple[str, str, str, str]]:
    out = []
    for key, obj in k.api.objects.items():
        if key[0] == kmock.resource("v1/events") and not obj.deleted:
            out.append((obj["involvedObject"]["name"], obj["type"], obj["reason"], obj["message"]))
    return sorted(out)


async def test_watches_feed_the_cache_and_decisions_become_pod_events():
    async with running_api() as k:
        for n in fleet(per_zone=2):
            k.api.put_object("v1/nodes", n)
        k.api.put_object(
            "v1/pods", pod("other-0", namespace="batch", gpus=8, node_name="eu-a-0", phase="Running")
        )
        k.api.put_object(
            "scheduling.x-k8s.io/v1alpha1/podgroups",
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "pg", "namespace": "ml"},
                "spec": {"minMember": 2},
            },
        )
        api = config.new_client_from_config(config_file=k.kubeconfig)
        cfg = ExtenderConfig()
        cache = Cache(cfg)
        sink = KubeEvents(client.CoreV1Api(api))
        ext = Extender(cfg, cache, events=sink, registry=CollectorRegistry())
        watcher = Watcher(cache, ext.book, api)
        watcher.start(asyncio.get_running_loop())
        try:
            async with TestClient(TestServer(make_app(ext))) as http:
                assert await eventually(lambda: cache.synced and len(cache.nodes) == 10)
                assert (await http.get("/readyz")).status == 200
                assert cache.views["eu-a-0"].free["nvidia.com/gpu"] == 0  # the running pod's GPUs
                assert cache.pod_group_sizes[("scheduling.x-k8s.io", "ml", "pg")] == 2

                first = pod("pg-0", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "pg"})
                names = sorted(cache.nodes)
                result = await filter_(http, first, [n for n in names if n != "eu-a-0"])
                assert sorted(result["NodeNames"]) == ["eu-b-0", "eu-b-1"]
                await written(sink)
                events = pod_events(k)
                assert [e[:3] for e in events] == [("pg-0", "Normal", "GroupPlaced")]
                assert (
                    "2 of 2 pods of group ml/scheduler-plugins/pg go to zone eu-b of region eu"
                    in events[0][3]
                )

                # The pod is bound by kube-scheduler: the watch turns it into a member on eu-b-1.
                await watching(k, "v1/pods")
                bound = {**first, "spec": {**first["spec"], "nodeName": "eu-b-1"}}
                k.api.put_object("v1/pods", bound)
                await k.api._buses[kmock.resource("v1/pods")].put({"type": "ADDED", "object": bound})
                assert await eventually(lambda: cache.views["eu-b-1"].free["nvidia.com/gpu"] == 0)

                # After a restart of the extender (no record), the member alone holds the group to eu-b.
                ext.book.groups.clear()
                second = pod("pg-1", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "pg"})
                result = await filter_(http, second, ["eu-b-0", "eu-c-0", "us-a-1"])
                assert result["NodeNames"] == ["eu-b-0"]

                # The group's pods go away: its record is released.
                deleted = {"type": "DELETED", "object": bound}
                await k.api._buses[kmock.resource("v1/pods")].put(deleted)
                assert await eventually(lambda: "ml/scheduler-plugins/pg" not in ext.book.groups)
        finally:
            watcher.stop()


async def test_never_fits_is_a_warning_event_on_the_pod():
    async with running_api() as k:
        api = config.new_client_from_config(config_file=k.kubeconfig)
        cfg = ExtenderConfig()
        cache = Cache(cfg)
        cache.load_objects(fleet(per_zone=2))
        sink = KubeEvents(client.CoreV1Api(api))
        ext = Extender(cfg, cache, events=sink, registry=CollectorRegistry())
        async with TestClient(TestServer(make_app(ext))) as http:
            p = pod("big-0", gpus=8, **explicit("big", 3, locality="zone"))
            for _ in range(2):
                result = await filter_(http, p, sorted(cache.nodes))
                assert len(result["FailedAndUnresolvableNodes"]) == 10
            await written(sink)  # every write started, so a second Event would be there now
            events = pod_events(k)
            assert [e[:3] for e in events] == [("big-0", "Warning", "GroupNeverFits")]
            assert events[0][3].startswith(
                "never fits: no zone of one nvidia.com/gpu.product can hold the 3 pods"
            )
