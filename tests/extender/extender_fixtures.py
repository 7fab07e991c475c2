"""Builders for Node and Pod objects as the API server holds them, and an HTTP client for the extender."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.server import build_app

ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
PRODUCT = "nvidia.com/gpu.product"
_uids = itertools.count(1)


def node(
    name: str,
    *,
    zone: str | None = None,
    region: str | None = None,
    gpus: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    lab = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", PRODUCT: product}
    if zone:
        lab[ZONE] = zone
    if region:
        lab[REGION] = region
    lab.update(labels or {})
    alloc = {
        "cpu": "96",
        "memory": "1056Gi",
        "pods": "110",
        "ephemeral-storage": "900Gi",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"node-{name}", "labels": lab},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str,
    *,
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gpus: int = 0,
    node_name: str | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    """A full Pod as kube-scheduler sends it in ExtenderArgs."""
    resources: dict[str, Any] = {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "32Gi"}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "schedulerName": "nodefabric-scheduler",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "containers": [
            {
                "name": "trainer",
                "image": "ghcr.io/example/trainer:1.0",
                "command": ["torchrun", "train.py"],
                "resources": resources,
                "volumeMounts": [
                    {
                        "name": "kube-api-access",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": True,
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        # The service account admission adds the mount and its volume together: a mount of no volume is
        # refused by the API server (and by the embedded one).
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]
                },
            }
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"00000000-0000-4000-8000-{next(_uids):012d}",
            "resourceVersion": "4242",
            "creationTimestamp": "2026-11-30T00:00:00Z",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name.rsplit("-", 1)[0],
                    "uid": "11111111-2222-3333-4444-555555555555",
                    "controller": True,
                }
            ],
        },
        "spec": spec,
        "status": {"phase": phase, "qosClass": "Burstable"},
    }


def explicit(group: str, size: int, **ann: str) -> dict[str, dict[str, str]]:
    """Labels/annotations for an explicit group; ann keys use _ for - (locality, rank, homogeneous)."""
    annotations = {"placement.gpustack.ai/group-size": str(size)}
    annotations.update({f"placement.gpustack.ai/{k.replace('_', '-')}": v for k, v in ann.items()})
    return {"labels": {"placement.gpustack.ai/group": group}, "annotations": annotations}


def fleet(per_zone: int = 6, zones: Iterable[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """The seed's fleet: 5 zones in 2 regions, `per_zone` 8-GPU nodes each, named <zone>-<i>."""
    zones = list(zones or [("eu-a", "eu"), ("eu-b", "eu"), ("eu-c", "eu"), ("us-a", "us"), ("us-b", "us")])
    return [node(f"{z}-{i}", zone=z, region=r) for z, r in zones for i in range(per_zone)]


def args(p: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler marshals them for a nodeCacheCapable extender."""
    return {"Pod": p, "Nodes": None, "NodeNames": list(names)}


class Recorder:
    """A Publisher that keeps what it was told: Events, and annotation writes per pod name."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []
        self.annotations: dict[str, dict[str, str]] = {}
        self.writes: list[tuple[str, dict[str, str | None]]] = []

    def event(self, pod: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((pod["metadata"]["name"], type_, reason, message))

    def annotate(self, pod: Any, annotations: Any) -> None:
        name = pod["metadata"]["name"]
        self.writes.append((name, dict(annotations)))
        mine = self.annotations.setdefault(name, {})
        for k, v in annotations.items():
            if v is None:
                mine.pop(k, None)
            else:
                mine[k] = v


@asynccontextmanager
async def extender(
    snapshot: list[dict[str, Any]], config: ExtenderConfig | None = None, **kw: Any
) -> AsyncIterator[TestClient[Any, Any]]:
    app = build_app(config or ExtenderConfig(), snapshot, registry=CollectorRegistry(), **kw)
    async with TestClient(TestServer(app)) as client:
        yield client


async def filter_(client: TestClient[Any, Any], p: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    resp = await client.post("/filter", json=args(p, names))
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def prioritize(client: TestClient[Any, Any], p: dict[str, Any], names: Iterable[str]) -> dict[str, int]:
    resp = await client.post("/prioritize", json=args(p, names))
    assert resp.status == 200, await resp.text()
    return {e["Host"]: e["Score"] for e in await resp.json()}
