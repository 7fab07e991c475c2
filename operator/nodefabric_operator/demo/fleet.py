"""The demo's scheduling half: a simulated GPU fleet, and an 8-pod training group admitted whole through
the scheduling gate.

Every part runs as deployed and talks over its real interface: the job controller's pods are created
through the API; the API server calls nodefabric's mutating webhook (HTTPS, trusting the configuration's
caBundle), which gives each pod the gate `placement.gpustack.ai/group`; the placement controller sees the
whole group, records the assignment in a PlacementGroup, pins each pod to its node and removes the gate;
the kube-scheduler stand-in binds them through `pods/binding` and, as kubelets, marks them Ready.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import kmock
from aiohttp import web

from nodefabric_devicemanager import vocabulary
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission.controller import Controller
from nodefabric_operator.admission.model import placement_crd
from nodefabric_operator.admission.webhook import WebhookConfig, build_webhook_app, ssl_context
from nodefabric_operator.demo import temporary
from nodefabric_operator.demo.kubeapi import RunningAPI
from nodefabric_operator.demo.kubeapi.tls import self_signed
from nodefabric_operator.demo.scheduler import Kube, StandInScheduler, is_ready
from nodefabric_operator.extender.config import ExtenderConfig

GPU = "nvidia.com/gpu"
PODS, NODES = kmock.resource("v1/pods"), kmock.resource("v1/nodes")
MWC = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PLACEMENT_GROUPS = f"{vocabulary.PLACEMENT_GROUP}/{vocabulary.VERSION}/{vocabulary.PLACEMENT_GROUP_PLURAL}"
GATE = vocabulary.scheduling_gate()
GROUP_SIZE = vocabulary.placement_key(vocabulary.GROUP_SIZE)
ADMISSION = vocabulary.placement_key(vocabulary.ADMISSION)
DECISION = vocabulary.placement_key(vocabulary.DECISION)
PLACED_WITHIN_S = 60.0
GROUP = "train"
NAMESPACE = "ml"
SIZE = 8
FABRIC = vocabulary.fabric_domain_key()
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


def _worker(index: int) -> dict[str, Any]:
    """A training pod as its job controller creates it: no gate (the webhook adds it), default-scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"train-worker-{index}",
            "namespace": NAMESPACE,
            "labels": {GATE: GROUP},
            "annotations": {GROUP_SIZE: str(SIZE)},
        },
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "image": "nvcr.io/nvidia/pytorch:24.10-py3",
                    "resources": {"requests": {GPU: "8"}, "limits": {GPU: "8"}},
                }
            ]
        },
    }


def _webhook_configuration(url: str, ca: bytes) -> dict[str, Any]:
    """What the chart installs: pods of opted-in namespaces go to the webhook; failurePolicy Ignore."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "nodefabric-placement"},
        "webhooks": [
            {
                "name": f"namespaces.{vocabulary.PLACEMENT_GROUP}",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {ADMISSION: "enabled"}},
                "objectSelector": {
                    "matchExpressions": [
                        {
                            "key": ADMISSION,
                            "operator": "NotIn",
                            "values": ["disabled"],
                        }
                    ]
                },
            }
        ],
    }


@contextlib.asynccontextmanager
async def _webhook(k: RunningAPI, directory: str) -> AsyncIterator[None]:
    """nodefabric's mutating webhook on 127.0.0.1 over HTTPS, registered with the API."""
    cert = self_signed(directory, name="webhook")
    runner = web.AppRunner(build_webhook_app(WebhookConfig()), access_log=None)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(
        runner, "127.0.0.1", port, ssl_context=ssl_context(cert.cert_file, cert.key_file)
    ).start()
    k.api.put_object(MWC, _webhook_configuration(f"https://127.0.0.1:{port}/mutate-pods", cert.pem))
    try:
        yield
    finally:
        k.api.remove_object(MWC, "nodefabric-placement")
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _placement(k: RunningAPI) -> AsyncIterator[Controller]:
    """The placement controller, as `nodefabric placement` runs it once it holds the Lease."""
    controller = Controller(ExtenderConfig(), load_client(k.kubeconfig))
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        yield controller
    finally:
        stop.set()
        controller.wake.set()
        await asyncio.wait_for(task, 15)


def _workers(k: RunningAPI) -> list[dict[str, Any]]:
    return [
        p
        for p in k.api.store.select("v1/pods", NAMESPACE)
        if (p["metadata"].get("labels") or {}).get(GATE) == GROUP
    ]


async def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + PLACED_WITHIN_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {PLACED_WITHIN_S:.0f} s")
        await asyncio.sleep(0.05)


def placement_group_row(k: RunningAPI) -> dict[str, Any]:
    groups = list(k.api.store.select(PLACEMENT_GROUPS, NAMESPACE))
    return dict(groups[0]) if groups else {}


async def place_group(k: RunningAPI) -> str:
    zones = _seed_fleet(k)
    free = len(_feasible(k))
    lines = [
        f"  fleet: {len(zones)} simulated H100 nodes in {len(ZONES)} zones of 2 regions, {free} free",
        f"  us-east-1a is one NVLink domain ({RACK_DOMAIN}), but 4 of its 8 nodes are busy",
        f"  namespace {NAMESPACE} opted in (label {ADMISSION}=enabled)\n",
    ]
    k.api.declare_crd(placement_crd())  # what `helm install` applies first
    labels = {ADMISSION: "enabled"}
    k.api.put_object("v1/namespaces", {"metadata": {"name": NAMESPACE, "labels": labels}})
    kube = Kube(k.kubeconfig, user_agent="job-controller")
    with temporary.directory("nodefabric-webhook-") as certs:
        async with (
            _webhook(k, certs),
            _placement(k),
            StandInScheduler(k.kubeconfig, interval=0.2) as scheduler,
        ):
            try:
                for i in range(SIZE):
                    created = await kube.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _worker(i))
                    gates = [g["name"] for g in created["spec"].get("schedulingGates") or []]
                    if i in (0, SIZE - 1):
                        lines.append(f"  train-worker-{i} created; the webhook gave it the gates {gates}")
                await _until(
                    lambda: sum(1 for p in _workers(k) if is_ready(p)) == SIZE, "the group bound and Ready"
                )
                # The controller records Bound after it sees the last pod Ready: wait for that write while
                # it still runs, so the table below shows the group as it ends, not a step behind.
                await _until(
                    lambda: (placement_group_row(k).get("status") or {}).get("phase") == "Bound",
                    "the PlacementGroup to record the group Bound",
                )
            finally:
                await kube.close()
            bound = list(scheduler.bound)
    lines.append(
        "  the placement controller admitted the whole group, pinned each pod and removed the gates;"
    )
    lines.append("  the scheduler stand-in bound them (pods/binding) and, as kubelets, marked them Ready:")
    by_pod = {ref.split("/", 1)[1]: node for ref, node in bound}
    for i in range(SIZE):
        node = by_pod.get(f"train-worker-{i}", "?")
        lines.append(f"  train-worker-{i} -> {node} ({zones.get(node, '?')})")
    placed = sorted({zones[node] for node in by_pod.values() if node in zones})
    lines.append(f"\n  the group landed in {len(placed)} zone(s): {', '.join(placed)}")
    status = placement_group_row(k).get("status") or {}
    lines.append("  the PlacementGroup (written only by nodefabric) explains it:")
    lines.append(f"    phase {status.get('phase')} at level {status.get('level')} ({status.get('location')})")
    lines += ["    " + part.strip() for part in str(status.get("decision", "")).split(";")]
    stored = k.api.stored("v1/pods", "train-worker-0", NAMESPACE) or {}
    decision = (stored.get("metadata", {}).get("annotations") or {}).get(DECISION, "")
    lines.append("  kubectl describe pod train-worker-0 shows a copy:")
    lines.append(f"    Annotations:  {DECISION}:")
    lines += [f"                    {line}" for line in decision.splitlines()]
    return "\n".join(lines) + "\n"
