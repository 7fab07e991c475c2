"""Request content never changes the extender's state, and its state is bounded, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from extender_fixtures import Recorder, args, explicit, extender, filter_, fleet, node, pod
from prometheus_client import CollectorRegistry

from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.placement import Choice
from nodefabric_operator.extender.server import EXTENDER, Serving, build_app, make_app, runner
from nodefabric_operator.extender.service import Extender


def with_nodes(p: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """ExtenderArgs as a kube-scheduler without nodeCacheCapable sends them: full Node objects."""
    return {"Pod": p, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": nodes}, "NodeNames": None}


async def test_nodes_in_a_request_count_for_that_request_only():
    cached = fleet(per_zone=2)
    async with extender(cached) as client:
        # A request carries a phantom node and a relabelled eu-a-0 claiming 800 GPUs in zone "x".
        phantom = node("phantom", zone="x", region="r")
        forged = node("eu-a-0", zone="x", region="r", gpus=800)
        body = with_nodes(pod("g-0", gpus=8, **explicit("g", 20, locality="zone")), [forged, phantom])
        resp = await client.post("/filter", json=body)
        kept = [n["metadata"]["name"] for n in (await resp.json())["Nodes"]["items"]]
        assert sorted(kept) == ["eu-a-0", "phantom"]  # for this request, zone x holds 20 pods
        # ... and for nothing else: the cache still has eu-a-0 as it was and no phantom node.
        cache = client.server.app[EXTENDER].cache
        assert cache.index.views["eu-a-0"].allocatable == {"nvidia.com/gpu": 8}
        assert "phantom" not in cache.nodes
        result = await filter_(client, pod("h-0", gpus=8, **explicit("h", 20, locality="zone")), ["eu-a-0"])
        assert result["FailedAndUnresolvableNodes"]  # no zone holds 20: the forged one is gone
        result = await filter_(client, pod("h-1", gpus=8, **explicit("h1", 2)), ["eu-a-0", "phantom"])
        assert result["FailedNodes"]["phantom"] == "node is not in the extender's node cache yet"


async def test_a_malformed_request_node_is_a_400_and_blames_no_later_request():
    nodes = fleet(per_zone=2)
    async with extender(nodes) as client:
        bad = node("n", zone="z")
        bad["metadata"]["labels"]["topology.kubernetes.io/zone"] = ["a", "b"]
        resp = await client.post("/filter", json=with_nodes(pod("g-0", **explicit("g", 2)), [bad]))
        assert resp.status == 400
        error = (await resp.json())["Error"]
        assert (
            error
            == "Nodes.items[0].metadata.labels['topology.kubernetes.io/zone']: must be a string, got list"
        )
        # Every grouped request after it is decided as before, and the extender is healthy.
        for i in range(3):
            result = await filter_(
                client, pod(f"x{i}-0", gpus=8, **explicit(f"x{i}", 2)), ["eu-a-0", "eu-a-1"]
            )
            assert sorted(result["NodeNames"]) == ["eu-a-0", "eu-a-1"]
        assert (await client.get("/healthz")).status == 200


async def test_a_body_past_the_size_limit_is_refused_with_413():
    async with extender(fleet(per_zone=1), serving=Serving(max_body=4096)) as client:
        body = json.dumps(args(pod("web"), [f"node-{i:05d}" for i in range(1000)]))
        resp = await client.post("/filter", data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 413
        assert "request body larger than 4096 bytes" in (await resp.json())["Error"]
        ok = await client.post("/filter", json=args(pod("web"), ["eu-a-0"]))
        assert ok.status == 200
        metrics = await (await client.get("/metrics")).text()
        assert 'nodefabric_extender_bad_requests_total{verb="filter"} 1.0' in metrics


async def test_a_body_announced_past_the_size_limit_is_refused_before_it_is_sent():
    app = build_app(ExtenderConfig(), fleet(per_zone=1), serving=Serving(max_body=4096, read_timeout=30))
    served = runner(app)
    await served.setup()
    await web.TCPSite(served, "127.0.0.1", 0).start()
    port = served.addresses[0][1]
    try:
        # The header says 100 MB and the body never comes: the answer is 413 at once, not a 408 after
        # the read deadline.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        assert answer.startswith(b"HTTP/1.1 413")
        assert b"request body larger than 4096 bytes" in answer
        writer.close()
    finally:
        await served.cleanup()


async def test_a_slow_or_partial_body_is_dropped_after_the_read_timeout():
    app = build_app(ExtenderConfig(), fleet(per_zone=1), serving=Serving(read_timeout=0.5))
    served = runner(app)  # the listener as the CLI runs it
    await served.setup()
    site = web.TCPSite(served, "127.0.0.1", 0)
    await site.start()
    try:
        port = served.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps(args(pod("web"), ["eu-a-0"])).encode()
        # Headers promise the whole body; half of it arrives, then nothing.
        writer.write(
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        await writer.drain()
        started = time.monotonic()
        answer = await asyncio.wait_for(reader.read(), timeout=30)  # read() returns once it is closed
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408")
        assert b"request body not received within 0.5 s" in answer
        assert time.monotonic() - started < 10  # dropped, not kept for aiohttp's 10 s of lingering
        # The extender keeps serving.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert (await asyncio.wait_for(reader.read(), timeout=30)).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await served.cleanup()


def _claim_pod(name: str, group: str, choice: Choice, node_name: str | None = None) -> dict[str, Any]:
    """A pod carrying a claim annotation as an earlier extender wrote them (or anyone could)."""
    p = pod(name, gpus=8, node_name=node_name, **explicit(group, 3))
    body = {
        "group": f"ml/explicit/{group}",
        "uid": p["metadata"]["uid"],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "level": choice.level,
        "location": choice.location,
        "homogeneity": dict(choice.homogeneity),
        "enclosing": [list(e) for e in choice.enclosing],
    }
    p["metadata"]["annotations"]["placement.gpustack.ai/claim"] = json.dumps(body)
    p["metadata"]["annotations"]["placement.gpustack.ai/decision"] = f"placed: {choice.summary}"
    return p


async def test_group_records_are_capped_and_a_claim_on_a_pod_rebuilds_nothing():
    nodes = fleet(per_zone=3)
    names = [n["metadata"]["name"] for n in nodes]
    product = (("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),)
    # A pod of group "old" carries a claim annotation on zone us-b (an earlier extender wrote such
    # claims; anyone can write one): it is never read back.
    earlier = _claim_pod("old-0", "old", Choice("zone", "us-b", product, (("region", "us"),), "earlier"))
    config = ExtenderConfig(maxGroups=2)
    async with extender([*nodes, earlier], config) as client:
        for g in ("a", "b", "c"):  # three groups through a record of two
            await filter_(client, pod(f"{g}-0", gpus=8, **explicit(g, 2)), names)
        groups = [g["group"] for g in await (await client.get("/debug/groups")).json()]
        assert groups == ["ml/explicit/b", "ml/explicit/c"]
        text = await (await client.get("/metrics")).text()
        assert (
            "nodefabric_extender_groups_evicted_total 1.0" in text
            and "nodefabric_extender_groups 2.0" in text
        )
        # "old" has no record here: its next pod is placed by the rule alone, the annotated claim
        # counts for nothing (only the pod let through now holds room).
        second = pod("old-1", gpus=8, **explicit("old", 3))
        result = await filter_(client, second, names)
        assert len(result["NodeNames"]) == 3, result
        (old,) = [
            g for g in await (await client.get("/debug/groups")).json() if g["group"] == "ml/explicit/old"
        ]
        assert old["claims"] == [second["metadata"]["uid"]]
        assert "earlier" not in old["summary"]


async def test_before_the_caches_synced_group_pods_wait_and_nothing_is_recorded_or_told():
    # The extender as started, before its watches listed the cluster: it knows no node, no bound member
    # and no claim yet. A decision now could split a placed group or call it "never fits".
    config = ExtenderConfig()
    told = Recorder()
    ext = Extender(config, Cache(config), publisher=told, registry=CollectorRegistry())
    async with TestClient(TestServer(make_app(ext))) as client:
        assert (await client.get("/readyz")).status == 503
        for p in (pod("g-0", gpus=8, **explicit("g", 2)), pod("bad-0", **explicit("bad", 0))):
            result = await filter_(client, p, ["eu-a-0", "eu-a-1"])
            assert result["NodeNames"] == [] and result["FailedAndUnresolvableNodes"] == {}
            assert result["FailedNodes"] == dict.fromkeys(
                ["eu-a-0", "eu-a-1"], "the extender has not listed the cluster's nodes and pods yet"
            )
        assert told.events == [] and told.writes == []
        assert await (await client.get("/debug/groups")).json() == []
        # A pod of no group needs nothing the caches hold: it passes untouched.
        result = await filter_(client, pod("web"), ["eu-a-0", "eu-a-1"])
        assert result["NodeNames"] == ["eu-a-0", "eu-a-1"]


async def test_prioritize_changes_nothing():
    nodes = fleet(per_zone=2)
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        p = pod("g-0", gpus=8, **explicit("g", 2))
        for _ in range(3):
            resp = await client.post("/prioritize", json=args(p, names))
            assert resp.status == 200
        assert await (await client.get("/debug/groups")).json() == []
        # Nor does it change a group's record: a pod of group g claiming another size and policy.
        await filter_(client, p, names)
        before = await (await client.get("/debug/groups")).json()
        other = pod("g-1", gpus=8, **explicit("g", 7, locality="any", rank="first-fit"))
        assert (await client.post("/prioritize", json=args(other, names))).status == 200
        assert await (await client.get("/debug/groups")).json() == before
