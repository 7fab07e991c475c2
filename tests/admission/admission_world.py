"""A small world for the placement process: GPU nodes in zones, gated group pods created through the real
API, the controller run as the CLI runs it, and what a scheduler and a kubelet would do (bind through
pods/binding, mark Ready) until the scheduler stand-in exists."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kmock
from aiohttp import web
from kubernetes import client
from world_fixtures import free_port

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission import model
from nodefabric_operator.admission.controller import Controller
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.demo.kubeapi.running import write_kubeconfig
from nodefabric_operator.extender.config import ExtenderConfig

GATE = "placement.gpustack.ai/group"
OTHER_GATE = "example.com/other"  # someone else's gate, which ours must never disturb
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
PRODUCT = "nvidia.com/gpu.product"
PODS = "v1/pods"
NS = "ml"


def node(name: str, zone: str, *, gpus: int = 8, product: str | None = "H100") -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, ZONE: zone, REGION: zone.rsplit("-", 1)[0]}
    if product:
        labels[PRODUCT] = product
    alloc = {"cpu": "96", "memory": "1056Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def fleet(zones: tuple[str, ...] = ("eu-a", "eu-b"), per_zone: int = 4, **kw: Any) -> list[dict[str, Any]]:
    return [node(f"{z}-{i}", z, **kw) for z in zones for i in range(per_zone)]


def gpod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gpus: int = 8,
    gated: bool = True,
    scheduler: str = "default-scheduler",
    affinity: dict[str, Any] | None = None,
    owner: dict[str, Any] | None = None,
    other_gate: bool = False,
) -> dict[str, Any]:
    resources = {
        "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)},
        "limits": {"nvidia.com/gpu": str(gpus)},
    }
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "trainer", "image": "trainer:1", "resources": resources}],
    }
    if gated:
        spec["schedulingGates"] = [{"name": OTHER_GATE}] * other_gate + [{"name": GATE}]
    if affinity:
        spec["affinity"] = affinity
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def job_pods(job: str, n: int, **kw: Any) -> list[dict[str, Any]]:
    return [gpod(f"{job}-{i}", labels={"batch.kubernetes.io/job-name": job}, **kw) for i in range(n)]


def job(name: str, parallelism: int, completions: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"parallelism": parallelism, "template": {"spec": {"containers": []}}}
    if completions is not None:
        spec |= {"completions": completions, "completionMode": "Indexed"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


async def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout}s: {what or check}")
        await asyncio.sleep(0.05)


class World:
    def __init__(self, k: RunningAPI) -> None:
        self.k = k
        api = load_client(k.kubeconfig)
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    async def create(self, *objs: dict[str, Any]) -> None:
        for obj in objs:
            if obj["kind"] == "Pod":
                await asyncio.to_thread(self.core.create_namespaced_pod, NS, obj)
            elif obj["kind"] == "Node":
                # Created with its status, as a kubelet registers and then reports it.
                self.k.api.put_object("v1/nodes", obj)
            else:
                group, version = obj["apiVersion"].split("/")
                plural = obj["kind"].lower() + "s"
                await asyncio.to_thread(
                    self.custom.create_namespaced_custom_object, group, version, NS, plural, obj
                )

    def pod(self, name: str) -> dict[str, Any]:
        stored = self.k.api.stored(PODS, name, NS)
        assert stored is not None, name
        return stored

    def pods(self) -> dict[str, dict[str, Any]]:
        return {
            obj["metadata"]["name"]: obj
            for key, obj in self.k.api.objects.items()
            if key[0] == kmock.resource(PODS) and not obj.deleted
        }

    def gates(self, name: str) -> list[str]:
        return [g["name"] for g in self.pod(name)["spec"].get("schedulingGates") or []]

    def pinned(self, name: str) -> list[str]:
        """The nodes every required term narrows the pod to."""
        aff = (self.pod(name)["spec"].get("affinity") or {}).get("nodeAffinity") or {}
        terms = (aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
            "nodeSelectorTerms"
        ) or []
        out = []
        for t in terms:
            for f in t.get("matchFields") or []:
                if f["key"] == "metadata.name":
                    out.extend(f["values"])
        return out

    def pg(self, key: str) -> dict[str, Any] | None:
        return self.k.api.stored(f"{model.API_VERSION}/{model.PLURAL}", model.object_name(key), NS)

    def status(self, key: str) -> dict[str, Any]:
        pg = self.pg(key)
        return (pg or {}).get("status") or {}

    def events(self, reason: str | None = None) -> list[tuple[str, str, str, str]]:
        out = []
        for key, obj in self.k.api.objects.items():
            if key[0] == kmock.resource("v1/events") and not obj.deleted and reason in (None, obj["reason"]):
                out.append(
                    (
                        obj["involvedObject"]["kind"],
                        obj["involvedObject"]["name"],
                        obj["reason"],
                        obj["message"],
                    )
                )
        return sorted(out)

    async def bind_and_ready(self, name: str, node: str | None = None) -> None:
        """What kube-scheduler (bind through pods/binding) and the kubelet (Ready) do. kube-scheduler binds
        no pod before its gates are gone: the placement process pins a pod and removes its gate in two
        writes, and a test that saw the pin may come between them."""
        async with asyncio.timeout(30):  # a deadlock breaker, not a measure
            while self.gates(name):
                await asyncio.sleep(0.02)
        node = node or self.pinned(name)[0]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"kind": "Node", "name": node},
        }
        await asyncio.to_thread(
            self.core.create_namespaced_pod_binding, name, NS, body, _preload_content=False
        )
        status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        await asyncio.to_thread(self.core.patch_namespaced_pod_status, name, NS, status)

    def job_pods(self, job: str, n: int, **kw: Any) -> list[dict[str, Any]]:
        """The Job's pods as the Job controller makes them: controlled by the Job (its uid)."""
        stored = self.k.api.stored("batch/v1/jobs", job, NS)
        assert stored is not None, job
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job,
            "uid": stored["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        return job_pods(job, n, owner=owner, **kw)

    async def remove_other_gate(self, name: str) -> None:
        """What the other gate's owner does when it is done with the pod."""
        gates = self.gates(name)
        i = gates.index(OTHER_GATE)
        patch = [{"op": "remove", "path": f"/spec/schedulingGates/{i}"}]
        await asyncio.to_thread(self.core.patch_namespaced_pod, name, NS, patch)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self.core.delete_namespaced_pod, name, NS)


@contextlib.asynccontextmanager
async def jobs_world(*objects: dict[str, Any]) -> AsyncIterator[tuple[RunningAPI, World]]:
    """The embedded API serving PlacementGroups and Jobs, with `objects` (nodes, Jobs) created."""
    async with running_api([model.placement_crd()]) as k:
        w = World(k)
        k.api.declare("batch/v1/jobs", kind="Job", namespaced=True)
        await w.create(*objects)
        yield k, w


@contextlib.asynccontextmanager
async def placement(
    k: RunningAPI, config: ExtenderConfig | None = None, *, via: str = "", **kw: Any
) -> AsyncIterator[Controller]:
    """The controller as `nodefabric placement` runs it (its own client, watches, loop), leading; `via`:
    the URL it reaches the API at instead (a proxy in between)."""
    with tempfile.TemporaryDirectory(prefix="nodefabric-placement-") as d:
        api = load_client(write_kubeconfig(via, d) if via else k.kubeconfig)
    ctl = Controller(config or ExtenderConfig(), api, **kw)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    try:
        await eventually(lambda: ctl.cache.synced, what="caches synced")
        yield ctl
    finally:
        stop.set()
        await task


class StallingProxy:
    """Real HTTP between the placement process and the API that passes everything through (watches
    streamed as they come) but the requests `stall` picks: those get no answer, as from an API server
    behind a network that drops its replies, until `unstall`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.stall: Callable[[web.Request], bool] = lambda request: False
        self.stalled = 0
        self._unstall = asyncio.Event()
        self.sessions: set[aiohttp.ClientSession] = set()
        self.url = ""

    def unstall(self) -> None:
        self._unstall.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.stall(request):
            self.stalled += 1
            await self._unstall.wait()
            return web.Response(status=504)
        skip = ("host", "content-length", "content-type")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        body = aiohttp.BytesPayload(
            await request.read(), content_type=request.headers.get("Content-Type", "")
        )
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        self.sessions.add(http)
        out = web.StreamResponse()
        try:
            async with http.request(
                request.method, self.upstream + request.path_qs, headers=headers, data=body
            ) as up:
                out.set_status(up.status)
                out.content_type = up.content_type
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
        except (aiohttp.ClientError, ConnectionError):
            pass  # either side went: a watch cut when the test ends
        finally:
            self.sessions.discard(http)
            await http.close()
        return out

    async def close(self) -> None:
        """Every request still open upstream (watches) is cut, so the API can stop."""
        self.unstall()
        for http in list(self.sessions):
            await http.close()


@contextlib.asynccontextmanager
async def stalling_proxy(k: RunningAPI) -> AsyncIterator[StallingProxy]:
    proxy = StallingProxy(k.url.rstrip("/"))
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    # Watches streamed through it are cut at once when it goes, not waited for.
    site_runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await site_runner.setup()
    port = free_port()
    await web.TCPSite(site_runner, "127.0.0.1", port).start()
    proxy.url = f"http://127.0.0.1:{port}"
    try:
        yield proxy
    finally:
        await proxy.close()
        await site_runner.cleanup()
