"""The demo's scheduling half: a simulated GPU fleet, and kube-scheduler's side of the extender protocol.

The extender runs exactly as deployed (its caches fed by list+watch from the API, its verdicts written
back as pod Events and annotations), and each pod of the training group goes through what kube-scheduler
does with an extender: the pod exists (Pending), kube-scheduler's own feasibility filter (free GPUs),
POST /filter and /prioritize with the full Pod in PascalCase, the best-scored node, a bind.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import aiohttp
import kmock
from aiohttp import web

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.demo.kubeapi import RunningAPI
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.cli import serving_app
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.events import KubePublisher

GPU = "nvidia.com/gpu"
PODS, NODES = kmock.resource("v1/pods"), kmock.resource("v1/nodes")
GROUP = "train"
NAMESPACE = "ml"
SIZE = 8
FABRIC = "feature.gpustack.ai/fabric.domain"
# zone -> (region, nodes, busy): the seed's fleet shape, 5 zones in 2 regions with about half busy.
ZONES = {
    "us-east-1a": ("us-east-1", 8, 4),
    "us-east-1b": ("us-east-1", 10, 1),
    "us-east-1c": ("us-east-1", 4, 2),
    "us-west-2a": ("us-west-2", 6, 5),
    "us-west-2b": ("us-west-2", 4, 4),
}
# One NVLink domain spans the whole of us-east-1a, but half of it is busy: too small for the group.
RACK_DOMAIN = "nvlink-0f1e2d3c4b5a69788796a5b4c3d2e1f0-3"


def fleet() -> Iterator[tuple[dict[str, Any], bool]]:
    """(Node, busy) pairs."""
    for zone, (region, count, busy) in ZONES.items():
        for i in range(count):
            labels = {
                "topology.kubernetes.io/region": region,
                "topology.kubernetes.io/zone": zone,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            }
            if zone == "us-east-1a":
                labels[FABRIC] = RACK_DOMAIN
            node = {
                "metadata": {"name": f"{zone}-{i:02d}", "labels": labels},
                "status": {"allocatable": {GPU: "8", "cpu": "192", "memory": "2Ti", "pods": "110"}},
            }
            yield node, i < busy


def _pod(name: str, node: str | None, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "nodefabric-scheduler",
        "containers": [
            {
                "name": "worker",
                "image": "nvcr.io/nvidia/pytorch:24.10-py3",
                "resources": {"requests": {GPU: "8"}, "limits": {GPU: "8"}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _feasible(k: RunningAPI) -> list[str]:
    """kube-scheduler's own filter before the extender: nodes with 8 GPUs not yet requested."""
    used: dict[str, int] = {}
    for key, obj in k.api.objects.items():
        if key[0] == PODS and not obj.deleted and obj.get("spec", {}).get("nodeName"):
            used[obj["spec"]["nodeName"]] = used.get(obj["spec"]["nodeName"], 0) + 8
    nodes = []
    for key, obj in k.api.objects.items():
        if key[0] == NODES and not obj.deleted:
            allocatable = int(obj.get("status", {}).get("allocatable", {}).get(GPU, "0"))
            if allocatable - used.get(key[2], 0) >= 8:
                nodes.append(key[2])
    return sorted(nodes)


def _seed_fleet(k: RunningAPI) -> dict[str, str]:
    """Put the fleet and its busy pods into the API; returns node -> zone."""
    zones: dict[str, str] = {}
    for node, busy in fleet():
        name = node["metadata"]["name"]
        k.api.put_object("v1/nodes", node)
        zones[name] = node["metadata"]["labels"]["topology.kubernetes.io/zone"]
        if busy:
            k.api.put_object("v1/pods", _pod(f"busy-{name}", name, {"app": "inference"}, {}))
    return zones


async def _schedule(
    http: aiohttp.ClientSession, base: str, k: RunningAPI, pod: dict[str, Any], writes: KubePublisher
) -> str | None:
    """One scheduling cycle as kube-scheduler runs it with a nodeCacheCapable extender; the bound node."""
    k.api.put_object("v1/pods", pod)  # created by the job controller, Pending
    args = {"Pod": pod, "Nodes": None, "NodeNames": _feasible(k)}
    async with http.post(f"{base}/filter", json=args) as resp:
        allowed = (await resp.json())["NodeNames"] or []
    await writes.drain()  # the extender's annotations are on the pod before it is bound
    if not allowed:
        return None
    args["NodeNames"] = allowed
    async with http.post(f"{base}/prioritize", json=args) as resp:
        scores = {p["Host"]: p["Score"] for p in await resp.json()}
    chosen: str = min(allowed, key=lambda n: (-scores.get(n, 0), n))
    stored = k.api.stored("v1/pods", pod["metadata"]["name"], NAMESPACE) or pod
    bound = {**stored, "spec": {**stored["spec"], "nodeName": chosen}, "status": {"phase": "Running"}}
    k.api.put_object("v1/pods", bound)  # the bind: same pod (same uid), now on a node
    return chosen


async def place_group(k: RunningAPI) -> str:
    zones = _seed_fleet(k)
    free = len(_feasible(k))
    lines = [
        f"  fleet: {len(zones)} simulated H100 nodes in {len(ZONES)} zones of 2 regions, {free} free",
        f"  us-east-1a is one NVLink domain ({RACK_DOMAIN}), but 4 of its 8 nodes are busy\n",
    ]
    app, extender = serving_app(
        ExtenderConfig(), Cache(ExtenderConfig()), load_client(k.kubeconfig), watch=True
    )
    writes = extender.publisher
    assert isinstance(writes, KubePublisher)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    labels = {"placement.gpustack.ai/group": GROUP}
    annotations = {"placement.gpustack.ai/group-size": str(SIZE)}
    bound_to: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:
            while (await http.get(f"{base}/readyz")).status != 200:
                await asyncio.sleep(0.05)
            for i in range(SIZE):
                pod = _pod(f"train-worker-{i}", None, labels, annotations)
                pod["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
                chosen = await _schedule(http, base, k, pod, writes)
                if chosen is None:
                    lines.append(f"  {pod['metadata']['name']}: waits")
                    break
                bound_to.append(chosen)
                lines.append(f"  {pod['metadata']['name']} -> {chosen} ({zones[chosen]})")
            async with http.get(f"{base}/debug/groups") as resp:
                groups: list[dict[str, Any]] = await resp.json()
    finally:
        await runner.cleanup()
    record = next((g for g in groups if g.get("group") == f"{NAMESPACE}/explicit/{GROUP}"), {})
    placed = sorted({zones[node] for node in bound_to})
    lines.append(f"\n  the group landed in {len(placed)} zone(s): {', '.join(placed)}")
    lines.append("  the extender's explanation (GET /debug/groups, and an Event on each pod):")
    lines.append(
        f"    outcome {record.get('outcome')} at level {record.get('level')} ({record.get('location')})"
    )
    lines += ["    " + part.strip() for part in str(record.get("summary", "")).split(";")]
    stored = k.api.stored("v1/pods", "train-worker-0", NAMESPACE) or {}
    annotations = stored.get("metadata", {}).get("annotations", {})
    decision = annotations.get("placement.gpustack.ai/decision", "")
    lines.append("  kubectl describe pod train-worker-0 shows it, after the Events expire too:")
    lines.append("    Annotations:  placement.gpustack.ai/decision:")
    lines += [f"                    {line}" for line in decision.splitlines()]
    return "\n".join(lines) + "\n"
