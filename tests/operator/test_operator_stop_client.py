"""The operator's client after the operator stopped: a task that escaped kopf's stop (kopf waits for and
cancels only the tasks it found when it began to stop) cannot send through it, after the lease was
released to a standby. The client refuses at once, and nothing reaches the API."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from operator_harness import Client, eventually, running_operator

from nodefabric_devicemanager import crd
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import apicall, rawcall, reconcile
from nodefabric_operator.aioclient import AsyncClient, Closed, Driver
from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.metrics import Metrics


def _label_patch(node: str) -> apicall.Calls[bytes]:
    body = {"metadata": {"labels": {"zone": "b"}}}
    path = "/api/v1/nodes/{name}"
    return (yield apicall.Request("patch", "nodes", "PATCH", path, {"name": node}, body, rawcall.MERGE_PATCH))


async def test_after_the_operator_stopped_its_client_refuses_a_request_and_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[AsyncClient] = []
    original = AsyncClient.__init__

    def kept(this: AsyncClient, api: kubernetes.client.ApiClient, **kwargs: Any) -> None:
        original(this, api, **kwargs)
        made.append(this)

    monkeypatch.setattr(AsyncClient, "__init__", kept)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1", {"zone": "a"})
        async with running_operator(k, sink="node"):
            assert await eventually(lambda: made)
        (client,) = made
        before = k.count()
        with pytest.raises(Closed) as refused:
            await apicall.arun(_label_patch("n1"), client, Metrics())
        assert k.count() == before, "a request was sent after the operator stopped"
        # What the reconcile makes of it: a stop, or a transient failure (retried, no traceback).
        assert isinstance(refused.value, apicall.Stopped)
        assert reconcile.transient(refused.value)
        assert await c.node_labels("n1") == {"zone": "a"}


async def test_a_closed_driver_refuses_calls_on_either_path_before_a_request_is_sent() -> None:
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1", {"zone": "a"})
        api = load_client(k.kubeconfig)
        try:
            on_loop = Driver(api, Metrics())
            in_thread = Driver(api, Metrics())
            in_thread.client = None  # a configuration the loop's client does not reproduce: a thread sends
            for driver in (on_loop, in_thread):
                await driver.close()
                before = k.count()
                calls = _label_patch("n1")
                with pytest.raises(Closed):
                    await driver(calls)
                assert k.count() == before
        finally:
            api.close()  # type: ignore[no-untyped-call]
