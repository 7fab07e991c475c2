"""The API emulator behaves like an API server where our parts depend on it (real client, real HTTP)."""

from __future__ import annotations

import asyncio
import shutil

import kubernetes
import pytest

from nodefabric_devicemanager import crd
from nodefabric_operator.demo.kubeapi import (
    KubeAPI,
    as_table,
    parse_label_selector,
    running_api,
    selector_matches,
)
from nodefabric_operator.demo.kubeapi.compat import Backend
from nodefabric_operator.demo.kubeapi.knobs import Knobs

G, V, P = "worker.gpustack.ai", "v1alpha1", "devices"


def _client(kubeconfig: str) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return kubernetes.client.ApiClient(cfg)


async def test_emulator_behaves_like_an_api_server():
    async with running_api([crd.devices_crd()]) as k:

        def scenario() -> None:
            api = _client(k.kubeconfig)
            core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
            node = core.create_node({"metadata": {"name": "n1", "labels": {"zone": "a"}}})
            assert node.metadata.uid and node.metadata.resource_version

            # a merge patch with null removes a label; selectors filter lists
            core.patch_node("n1", {"metadata": {"labels": {"rack": "r1", "zone": None}}})
            assert core.read_node("n1").metadata.labels == {"rack": "r1"}
            assert [n.metadata.name for n in core.list_node(label_selector="rack in (r1,r2)").items] == ["n1"]
            assert core.list_node(label_selector="rack=r2").items == []

            # optimistic concurrency
            with pytest.raises(kubernetes.client.ApiException) as err:
                core.patch_node("n1", {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}})
            assert err.value.status == 409

            owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": node.metadata.uid}
            body = {"metadata": {"name": "n1", "ownerReferences": [owner]}, "spec": {"interfaces": []}}
            created = custom.create_cluster_custom_object(G, V, P, {**body, "status": {"rdmaEndpoints": 9}})
            assert "status" not in created, "status is written through its subresource only"

            # the status subresource isolates spec and status
            after = custom.patch_cluster_custom_object_status(
                G, V, P, "n1", {"status": {"rdmaEndpoints": 2}, "spec": {"interfaces": [{"name": "x"}]}}
            )
            assert after["spec"] == {"interfaces": []} and after["status"] == {"rdmaEndpoints": 2}
            after = custom.patch_cluster_custom_object(G, V, P, "n1", {"status": {"rdmaEndpoints": 5}})
            assert after["status"] == {"rdmaEndpoints": 2}

            listed = custom.list_cluster_custom_object(G, V, P)
            assert listed["kind"] == "DevicesList" and listed["metadata"]["resourceVersion"]

            # deleting the owner garbage-collects the dependent
            core.delete_node("n1")
            with pytest.raises(kubernetes.client.ApiException) as err:
                custom.get_cluster_custom_object(G, V, P, "n1")
            assert err.value.status == 404

        await asyncio.to_thread(scenario)
        assert len(k.requests("PATCH", "v1/nodes")) == 2


async def test_injected_faults_answer_writes_then_clear():
    async with running_api() as k:
        k.api.fail_next(1, 503)

        def scenario() -> None:
            core = kubernetes.client.CoreV1Api(_client(k.kubeconfig))
            with pytest.raises(kubernetes.client.ApiException) as err:
                core.create_node({"metadata": {"name": "n1"}})
            assert err.value.status == 503
            core.create_node({"metadata": {"name": "n1"}})

        await asyncio.to_thread(scenario)
        assert k.api.stored("v1/nodes", "n1") is not None


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": ""}, True),
        ("a notin (1)", {"a": "1"}, False),
        ("!a", {"a": "1"}, False),
    ],
)
def test_label_selectors(selector, labels, expected):
    assert selector_matches(parse_label_selector(selector), labels) is expected


def test_printer_columns_render_as_a_table():
    columns = crd.devices_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    item = {
        "metadata": {"name": "gpu-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"interfaces": [{"name": "eth0"}, {"name": "ib0"}]},
        "status": {"rdmaServed": 8, "rdmaEndpoints": 9, "bestDistance": "PIX", "failedLinks": 1},
    }
    table = as_table([item], columns, {})
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "RDMA", "Distance", "Fabric", "Failed", "Unread", "Usable", "Interfaces", "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[:8] == ["gpu-1", 8, "PIX", None, 1, None, 9, "eth0,ib0"]
    assert cells[8].endswith("d")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed on this machine")
async def test_kubectl_get_devices_shows_the_printer_columns():
    async with running_api([crd.devices_crd()]) as k:
        k.api.put_object(
            "worker.gpustack.ai/v1alpha1/devices",
            {
                "metadata": {"name": "gpu-1"},
                "spec": {},
                "status": {"rdmaServed": 8, "bestDistance": "PIX", "failedLinks": 0, "notRead": "x"},
            },
        )
        proc = await asyncio.create_subprocess_exec(
            "kubectl", "--kubeconfig", k.kubeconfig, "get", "devices", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
    header, row = out.decode().splitlines()
    assert header.split() == ["NAME", "RDMA", "DISTANCE", "FABRIC", "FAILED", "UNREAD", "AGE"]
    assert row.split()[:5] == ["gpu-1", "8", "PIX", "0", "x"]


def test_the_api_has_what_its_parts_hold_it_as():
    # kmock's views and the request handlers hold the API under small protocols, so that none of them
    # imports the server; mypy cannot check KubeAPI against them (kmock is untyped), so this does.
    api = KubeAPI()
    assert isinstance(api, Backend)
    assert isinstance(api, Knobs)
    assert not isinstance(object(), Backend) and not isinstance(object(), Knobs)
