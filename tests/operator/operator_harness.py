"""Runs the real operator (kopf) against the API emulator over HTTP, and the client calls tests make."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest
from aiohttp import web
from operator_records import gpu_record

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import Devices
from nodefabric_operator import cli, sinks
from nodefabric_operator.demo.kubeapi import RunningAPI, write_kubeconfig
from nodefabric_operator.metrics import Metrics

G, V, P = models.GROUP, models.VERSION, models.PLURAL
NS = "nodefabric"
NF = "nfd.k8s-sigs.io/v1alpha1/nodefeatures"
DEVICES = f"{G}/{V}/{P}"
CRD_NAME = f"{sinks.NFD_PLURAL}.{sinks.NFD_GROUP}"  # NFD's NodeFeature CRD


class Client:
    def __init__(self, kubeconfig: str) -> None:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        api = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)

    async def node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        body = {"metadata": {"name": name, "labels": labels or {}}}
        node = await asyncio.to_thread(self.core.create_node, body)
        return {"uid": node.metadata.uid}

    async def put_devices(self, record: Devices, *, node_owner: bool = True) -> dict[str, Any]:
        """Write the record as the agent does: created owned by its Node (when the Node exists), then its
        conditions (on /status), then the spec. Conditions go first so a failed read is never seen
        without its condition. `node_owner=False`: a record created by hand, with no owner."""
        name = record.metadata.name
        try:
            live = await asyncio.to_thread(self.custom.get_cluster_custom_object, G, V, P, name)
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
            meta: dict[str, Any] = {"name": name}
            uid = await self.node_uid(name) if node_owner else None
            if uid is not None:
                meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]
            body = {"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": meta, "spec": {}}
            live = await asyncio.to_thread(self.custom.create_cluster_custom_object, G, V, P, body)
        # The agent owns its conditions; keep whatever the operator already wrote beside them.
        status = models.DevicesStatus.model_validate(live.get("status") or {})
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        for cond in record.status.conditions:
            status.conditions = models.set_condition(status.conditions, cond, now)
        await asyncio.to_thread(
            self.custom.patch_cluster_custom_object_status,
            G,
            V,
            P,
            name,
            {"status": {"conditions": [c.wire() for c in status.conditions]}},
        )
        return await asyncio.to_thread(
            self.custom.patch_cluster_custom_object, G, V, P, name, {"spec": record.wire()["spec"]}
        )

    async def edit_nodefeature(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Someone else's merge patch of our NodeFeature (in the operator's namespace)."""
        edited: dict[str, Any] = await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object,
            "nfd.k8s-sigs.io",
            "v1alpha1",
            NS,
            "nodefeatures",
            name,
            patch,
        )
        return edited

    async def node_uid(self, name: str) -> str | None:
        try:
            node = await asyncio.to_thread(self.core.read_node, name)
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return str(node.metadata.uid)

    async def devices(self, name: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.custom.get_cluster_custom_object, G, V, P, name)

    async def delete_devices(self, name: str) -> None:
        await asyncio.to_thread(self.custom.delete_cluster_custom_object, G, V, P, name)

    async def nodefeature(self, name: str) -> dict[str, Any] | None:
        try:
            return await asyncio.to_thread(
                self.custom.get_namespaced_custom_object,
                "nfd.k8s-sigs.io",
                "v1alpha1",
                NS,
                "nodefeatures",
                name,
            )
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                return None
            raise

    async def node_labels(self, name: str) -> dict[str, str]:
        node = await asyncio.to_thread(self.core.read_node, name)
        return dict(node.metadata.labels or {})

    async def node_annotations(self, name: str) -> dict[str, str]:
        node = await asyncio.to_thread(self.core.read_node, name)
        return dict(node.metadata.annotations or {})

    async def label_node(self, name: str, labels: dict[str, str | None]) -> None:
        await asyncio.to_thread(self.core.patch_node, name, {"metadata": {"labels": labels}})


async def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Await until `check()` (sync or async) returns a truthy value; fail with the last value. The
    deadline only matters on failure: it is generous for a loaded 2-core CI machine."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s; last value: {last!r}")


async def settle(k: RunningAPI, seconds: float = 0.6) -> None:
    """Wait until the API saw no request for `seconds`: the operator has nothing left to do."""
    while True:
        before = k.count()
        await asyncio.sleep(seconds)
        if k.count() == before:
            return


def writes(k: RunningAPI, resource: str) -> int:
    return sum(len(k.requests(m, resource)) for m in ("POST", "PATCH", "PUT", "DELETE"))


def lines(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    """The log records saying exactly `message`."""
    return [r for r in caplog.records if r.getMessage() == message]


async def fleet(k: RunningAPI, records: int) -> Client:
    """`records` Nodes n0, n1, ..., each with its GPU record (operator_records.gpu_record)."""
    c = Client(k.kubeconfig)
    for i in range(records):
        await c.node(f"n{i}")
        await c.put_devices(gpu_record(f"n{i}"))
    return c


async def conditions(c: Client) -> dict[str, dict[str, Any]]:
    """Each record's LabelsPublished condition, by record."""
    listed = await asyncio.to_thread(c.custom.list_cluster_custom_object, *DEVICES.split("/"))
    out = {}
    for item in listed["items"]:
        for cond in (item.get("status") or {}).get("conditions") or []:
            if cond["type"] == models.LABELS_PUBLISHED:
                out[item["metadata"]["name"]] = cond
    return out


async def all_say(c: Client, reason: str, records: int) -> bool:
    """Whether each of the `records` records' LabelsPublished condition gives `reason`."""
    found = await conditions(c)
    return len(found) == records and all(x["reason"] == reason for x in found.values())


# What kube-apiserver answers a create in a namespace that does not exist (`% (namespace, namespace)`).
NAMESPACE_NOT_FOUND_STATUS = (
    '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces \\"%s\\" not'
    ' found","reason":"NotFound","details":{"name":"%s","kind":"namespaces"},"code":404}'
)


@dataclass(frozen=True)
class Probing:
    """What the operator had sent when a wait's probes were counted: NodeFeature creates, records'
    status writes, and the probes logged (`probed`, the line each says)."""

    probed: str
    creates: int
    statuses: int
    probes: int

    @classmethod
    def now(cls, k: RunningAPI, caplog: pytest.LogCaptureFixture, probed: str) -> Probing:
        return cls(probed, k.count("POST", NF), k.count("PATCH", DEVICES), len(lines(caplog, probed)))

    async def one_create_per_probe(self, k: RunningAPI, caplog: pytest.LogCaptureFixture) -> None:
        """Four more probes on: one create per probe (one more may be under way), and no record's status
        written again."""
        await eventually(lambda: len(lines(caplog, self.probed)) >= self.probes + 4)
        assert k.count("POST", NF) - self.creates <= len(lines(caplog, self.probed)) - self.probes + 1
        assert k.count("PATCH", DEVICES) == self.statuses


@contextlib.asynccontextmanager
async def running_operator(k: RunningAPI, **options: Any) -> AsyncIterator[Metrics]:
    """The operator in a thread with its own event loop, as it would be in its own process: kopf treats
    every task of its loop as its own at shutdown, so it must not share the emulator's loop."""
    settings: dict[str, Any] = {
        "standalone": True,
        "namespace": NS,
        "backoffs": (0.05, 0.1),
        "kubeconfig": k.kubeconfig,
        **options,
    }
    opts = cli.Options(**settings)
    metrics = Metrics()
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(cli.serve(opts, metrics=metrics, stop_flag=stop, ready_flag=ready))
        except BaseException as err:
            failure.append(err)
            ready.set()

    thread = threading.Thread(target=main, name="operator", daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 60), "operator did not start"
    assert not failure, failure
    try:
        yield metrics
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive(), "operator did not stop"
        assert not failure, failure


async def answering_api(
    tmp_path: Any, answer: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> tuple[web.AppRunner, str]:
    """An HTTP server on a free loopback port where `answer` answers every request, and a kubeconfig (in
    `tmp_path`) pointing at it. The caller cleans the runner up."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, write_kubeconfig(f"http://127.0.0.1:{port}", str(tmp_path))


def nodefeature_crd() -> dict[str, Any]:
    """NFD's NodeFeature CRD as far as the operator needs it (schema-less)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": sinks.NFD_GROUP,
            "scope": "Namespaced",
            "names": {"plural": sinks.NFD_PLURAL, "singular": "nodefeature", "kind": "NodeFeature"},
            "versions": [
                {
                    "name": sinks.NFD_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


async def crds(c: Client) -> kubernetes.client.ApiextensionsV1Api:
    return kubernetes.client.ApiextensionsV1Api(c.custom.api_client)
