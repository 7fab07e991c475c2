"""Lists, selectors and watches behave as the API server's do (over real HTTP): field selectors with its
refusals, resuming a watch from a resourceVersion, 410 Expired, bookmarks, selector transitions; the
DRA resources; and request accounting that stays exact past the bounded history."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest

from nodefabric_devicemanager import crd as crd_module
from nodefabric_operator.demo.kubeapi import running_api

SLICES = "resource.k8s.io/v1/resourceslices"
SLICES_URL = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS_URL = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims"
MERGE = {"Content-Type": "application/merge-patch+json"}


def rslice(name: str, node: str, driver: str = "rdma.gpustack.ai") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        },
    }


async def get(k: Any, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(k.url + path) as resp:
        return resp.status, await resp.json()


async def send(
    k: Any, method: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        async with http.request(method, k.url + path, data=json.dumps(body), headers=hdrs) as resp:
            return resp.status, await resp.json()


class Stream:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, timeout: float = 10) -> dict[str, Any] | None:
        line = await asyncio.wait_for(self.resp.content.readline(), timeout)
        return json.loads(line) if line else None

    async def quiet(self, seconds: float = 0.3) -> bool:
        """True if nothing arrives for `seconds`."""
        try:
            await asyncio.wait_for(self.resp.content.readline(), seconds)
        except TimeoutError:
            return True
        return False


@contextlib.asynccontextmanager
async def watch(k: Any, path: str, **params: str) -> AsyncIterator[Stream]:
    query = "&".join(f"{key}={value}" for key, value in {"watch": "true", **params}.items())
    async with aiohttp.ClientSession() as http, http.get(f"{k.url}{path}?{query}") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/json")
        yield Stream(resp)


def names(listed: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in listed["items"]]


async def test_field_selectors_on_lists_and_their_refusals():
    async with running_api() as k:
        for name, node, driver in (
            ("a", "n1", "rdma.gpustack.ai"),
            ("b", "n2", "rdma.gpustack.ai"),
            ("c", "n1", "gpu.example.com"),
        ):
            k.api.put_object(SLICES, rslice(name, node, driver))
        _, listed = await get(k, SLICES_URL + "?fieldSelector=spec.nodeName=n1")
        assert names(listed) == ["a", "c"]
        _, listed = await get(k, SLICES_URL + "?fieldSelector=spec.nodeName==n1,spec.driver=rdma.gpustack.ai")
        assert names(listed) == ["a"]
        _, listed = await get(k, SLICES_URL + "?fieldSelector=spec.driver!=rdma.gpustack.ai")
        assert names(listed) == ["c"]
        _, listed = await get(k, SLICES_URL + "?fieldSelector=metadata.name=b")
        assert names(listed) == ["b"]
        code, body = await get(k, SLICES_URL + "?fieldSelector=spec.devices=x")
        assert (code, body["reason"], body["message"]) == (
            400,
            "BadRequest",
            "field label not supported: spec.devices",
        )
        code, body = await get(k, SLICES_URL + "?fieldSelector=nonsense")
        assert code == 400
        code, body = await get(k, "/api/v1/nodes?labelSelector=a%20in%20(x")
        assert code == 400 and body["message"].startswith("unable to parse requirement")
        code, body = await get(k, "/api/v1/nodes?labelSelector=Bad%20Key")
        assert code == 400


async def test_pages_continue_where_they_stopped():
    async with running_api() as k:
        for i in range(7):
            k.api.put_object("v1/nodes", {"metadata": {"name": f"n{i}", "labels": {"odd": str(i % 2)}}})
        _, page = await get(k, "/api/v1/nodes?limit=3")
        seen, rv = names(page), page["metadata"]["resourceVersion"]
        assert page["metadata"]["remainingItemCount"] == 4
        while page["metadata"].get("continue"):
            _, page = await get(k, f"/api/v1/nodes?limit=3&continue={page['metadata']['continue']}")
            seen += names(page)
            assert page["metadata"]["resourceVersion"] == rv
        assert seen == [f"n{i}" for i in range(7)]
        _, page = await get(k, "/api/v1/nodes?labelSelector=odd%3D1&limit=2")
        assert names(page) == ["n1", "n3"] and page["metadata"]["continue"]
        code, _ = await get(k, "/api/v1/nodes?limit=3&continue=garbage")
        assert code == 400


async def test_a_watch_from_a_list_sees_only_what_came_after_it():
    async with running_api() as k:
        k.api.put_object(SLICES, rslice("a", "n1"))
        _, listed = await get(k, SLICES_URL)
        k.api.put_object(SLICES, rslice("b", "n1"))
        async with watch(k, SLICES_URL, resourceVersion=listed["metadata"]["resourceVersion"]) as w:
            event = await w.next()
            assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "b")
            assert await w.quiet(), "'a' was in the list: no replay of it"
            k.api.put_object(
                SLICES, {**k.api.stored(SLICES, "a"), "metadata": {"name": "a", "labels": {"x": "1"}}}
            )
            event = await w.next()
            assert (event["type"], event["object"]["metadata"]["name"]) == ("MODIFIED", "a")


async def test_a_watch_without_a_resource_version_starts_with_the_current_state():
    async with running_api() as k:
        k.api.put_object(SLICES, rslice("a", "n1"))
        k.api.put_object(SLICES, rslice("b", "n2"))
        async with watch(k, SLICES_URL, fieldSelector="spec.nodeName=n2") as w:
            event = await w.next()
            assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "b")
            assert await w.quiet()
            k.api.put_object(SLICES, rslice("c", "n1"))  # another node's: not this watch's business
            k.api.put_object(SLICES, rslice("d", "n2"))
            event = await w.next()
            assert event["object"]["metadata"]["name"] == "d"


async def test_objects_entering_and_leaving_a_label_selector():
    async with running_api() as k:
        k.api.put_object("v1/nodes", {"metadata": {"name": "n1"}})
        async with watch(k, "/api/v1/nodes", labelSelector="rdma%3Dtrue") as w:
            assert await w.quiet()
            k.api.put_object("v1/nodes", {"metadata": {"name": "n1", "labels": {"rdma": "true"}}})
            assert (await w.next())["type"] == "ADDED"
            k.api.put_object("v1/nodes", {"metadata": {"name": "n1", "labels": {"rdma": "true", "z": "1"}}})
            assert (await w.next())["type"] == "MODIFIED"
            k.api.put_object("v1/nodes", {"metadata": {"name": "n1"}})
            assert (await w.next())["type"] == "DELETED", "it left the selection"
            k.api.remove_object("v1/nodes", "n1")
            assert await w.quiet(), "already gone for this watch"


async def test_resuming_from_a_forgotten_resource_version_is_410_expired():
    async with running_api(event_window=3) as k:
        for i in range(5):
            k.api.put_object("v1/nodes", {"metadata": {"name": f"n{i}"}})
        async with watch(k, "/api/v1/nodes", resourceVersion="5") as w:
            event = await w.next()
            assert event["type"] == "ERROR"
            assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
            assert event["object"]["message"].startswith("too old resource version: 5 (")
            assert await w.next() is None, "the stream ends"
        k.api.compact()
        async with watch(k, "/api/v1/nodes", resourceVersion=str(k.api.resource_version - 1)) as w:
            assert (await w.next())["object"]["code"] == 410


async def test_bookmarks_initial_events_and_the_end_of_a_watch():
    async with running_api(bookmark_interval=0.1) as k:
        k.api.put_object("v1/nodes", {"metadata": {"name": "n1"}})
        k.api.put_object(SLICES, rslice("a", "n1"))
        params = {
            "allowWatchBookmarks": "true",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
        }
        async with watch(k, "/api/v1/nodes", **params) as w:
            assert (await w.next())["type"] == "ADDED"
            end = await w.next()
            assert end["type"] == "BOOKMARK"
            assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
            k.api.put_object(SLICES, rslice("b", "n1"))  # progress elsewhere moves the bookmark on
            bookmark = await w.next()
            assert bookmark["type"] == "BOOKMARK"
            assert int(bookmark["object"]["metadata"]["resourceVersion"]) == k.api.resource_version
            assert bookmark["object"]["kind"] == "Node"
            assert k.api.close_watches() == 1
            assert await w.next() is None, "a closed watch ends cleanly; the client resumes"
        async with watch(k, "/api/v1/nodes", resourceVersion=str(k.api.resource_version)) as w:
            await asyncio.sleep(0.1)
            k.api.close_watches(expired=True)
            assert (await w.next())["object"]["code"] == 410, "an expired watch makes the client re-list"
        async with watch(
            k, "/api/v1/nodes", resourceVersion=str(k.api.resource_version), timeoutSeconds="1"
        ) as w:
            assert await w.next(5) is None, "timeoutSeconds ends the stream"


async def test_dra_resources_are_served_with_their_scopes_and_claim_status():
    async with running_api() as k:
        code, created = await send(k, "POST", SLICES_URL, rslice("hgx-0-rdma", "hgx-0"))
        assert code == 201 and "namespace" not in created["metadata"]
        code, _ = await send(
            k,
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            {"metadata": {"name": "rdma.gpustack.ai"}, "spec": {}},
        )
        assert code == 201
        claim = {
            "metadata": {"name": "c1"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"x": 1}},
        }
        code, created = await send(k, "POST", CLAIMS_URL, claim)
        assert code == 201 and created["metadata"]["namespace"] == "ml" and "status" not in created
        allocation = {
            "devices": {
                "results": [{"request": "nic", "driver": "rdma.gpustack.ai", "pool": "hgx-0", "device": "d0"}]
            }
        }
        code, body = await send(
            k, "PATCH", CLAIMS_URL + "/c1/status", {"status": {"allocation": allocation}}, MERGE
        )
        assert code == 200 and body["status"]["allocation"] == allocation
        code, listed = await get(k, "/apis/resource.k8s.io/v1/resourceclaims")
        assert names(listed) == ["c1"]
        code, _ = await get(k, "/apis/resource.k8s.io/v1/namespaces/ml/resourceslices")
        assert code == 404, "ResourceSlices are cluster-scoped"


async def test_garbage_collection_follows_owners_and_finalizers():
    async with running_api() as k:
        n1 = k.api.put_object("v1/nodes", {"metadata": {"name": "n1"}})
        n2 = k.api.put_object("v1/nodes", {"metadata": {"name": "n2"}})

        def owner(node: dict[str, Any]) -> dict[str, Any]:
            return {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node["metadata"]["name"],
                "uid": node["metadata"]["uid"],
            }

        only = rslice("only", "n1")
        only["metadata"]["ownerReferences"] = [owner(n1)]
        both = rslice("both", "n1")
        both["metadata"]["ownerReferences"] = [owner(n1), owner(n2)]
        held = rslice("held", "n1")
        held["metadata"].update(ownerReferences=[owner(n1)], finalizers=["example.com/hold"])
        for obj in (only, both, held):
            k.api.put_object(SLICES, obj)
        code, _ = await send(k, "DELETE", "/api/v1/nodes/n1", {})
        assert code == 200
        assert k.api.stored(SLICES, "only") is None
        assert [r["name"] for r in k.api.stored(SLICES, "both")["metadata"]["ownerReferences"]] == ["n2"]
        assert k.api.stored(SLICES, "held")["metadata"]["deletionTimestamp"], "waits for its finalizer"
        code, _ = await send(k, "PATCH", SLICES_URL + "/held", {"metadata": {"finalizers": None}}, MERGE)
        assert code == 200 and k.api.stored(SLICES, "held") is None


async def test_request_accounting_is_exact_past_the_bounded_history():
    async with running_api(history=5) as k:
        for i in range(12):
            await send(k, "POST", "/api/v1/nodes", {"metadata": {"name": f"n{i}"}})
        await get(k, "/api/v1/nodes")
        assert k.count("POST", "v1/nodes") == 12
        assert k.count(resource="v1/nodes", verb="list") == 1
        assert k.count("GET") == 1
        assert len(k.requests()) == 5 and len(k.requests("POST", "v1/nodes")) == 4


async def test_kmock_surfaces_still_work_for_tests_written_against_them():
    async with running_api() as k:
        k.api.put_object("v1/nodes", {"metadata": {"name": "n1"}})
        [(key, obj)] = [
            (key, obj) for key, obj in k.api.objects.items() if key[0] == kmock.resource("v1/nodes")
        ]
        assert key[1:] == (None, "n1") and not obj.deleted and obj["metadata"]["name"] == "n1"
        async with watch(k, "/api/v1/nodes", resourceVersion=str(k.api.resource_version)) as w:
            bus = k.api._buses[kmock.resource("v1/nodes")]
            while bus.consumer_count == 0:
                await asyncio.sleep(0.01)
            await bus.put({"type": "DELETED", "object": {"metadata": {"name": "ghost"}}})
            event = await w.next()
            assert (event["type"], event["object"]["metadata"]["name"]) == ("DELETED", "ghost")
        k.api.objects[kmock.resource("v1/nodes"), None, "n1"].patch({"metadata": {"labels": {"a": "b"}}})
        assert k.api.stored("v1/nodes", "n1")["metadata"]["labels"] == {"a": "b"}
        k.api.objects[kmock.resource("v1/nodes"), None, "n1"].delete()
        assert k.api.stored("v1/nodes", "n1") is None
        k.api["get /version"] << {"gitVersion": "v9.9.9"}
        assert (await get(k, "/version"))[1] == {"gitVersion": "v9.9.9"}, (
            "a registered reaction answers first"
        )


@pytest.mark.parametrize(
    "path", ["/api", "/apis", "/api/v1", "/apis/resource.k8s.io/v1", "/version", "/openapi/v3"]
)
async def test_discovery_documents(path):
    async with running_api() as k:
        code, doc = await get(k, path)
        assert code == 200
        if path == "/api/v1":
            assert doc["groupVersion"] == "v1"
            nodes = next(r for r in doc["resources"] if r["name"] == "nodes")
            assert nodes["shortNames"] == ["no"] and not nodes["namespaced"]
            assert {r["name"] for r in doc["resources"]} >= {"nodes/status", "pods/binding", "namespaces"}
        if path == "/apis/resource.k8s.io/v1":
            assert {r["name"] for r in doc["resources"]} == {
                "resourceslices",
                "resourceclaims",
                "resourceclaims/status",
                "deviceclasses",
            }


async def test_kmock_resources_and_clear_keep_what_the_api_serves():
    async with running_api([crd_module.devices_crd()]) as k:
        assert SLICES in k.api.resources and "worker.gpustack.ai/v1alpha1/devices" in k.api.resources
        assert k.api.resources[SLICES].kind == "ResourceSlice"
        # Declaring a served resource again (as code written for kmock does) keeps what it has.
        k.api.declare(SLICES, kind="ResourceSlice", namespaced=False)
        k.api.put_object(SLICES, rslice("a", "n1"))
        _, listed = await get(k, SLICES_URL + "?fieldSelector=spec.nodeName=n1")
        assert names(listed) == ["a"]
        k.api.resources["example.com/v1/gadgets"] = kmock.ResourceInfo(kind="Gadget", namespaced=True)
        assert (await get(k, "/apis/example.com/v1/gadgets"))[0] == 200
        k.api.objects.clear()
        assert k.api.stored(SLICES, "a") is None
        assert k.api.stored("v1/namespaces", "default") is not None
        assert (await get(k, "/apis/worker.gpustack.ai/v1alpha1/devices"))[0] == 200, "its CRD stays"


async def test_a_client_that_leaves_before_its_answer_is_no_server_error(caplog):
    # `kubectl get -w` interrupted, a component stopping: the connection closes before the answer is
    # written. That is the client's business; the emulator logged each as a failure with a traceback.
    async with running_api([crd_module.devices_crd()]) as k:
        port = int(k.url.rsplit(":", 1)[1])
        for _ in range(20):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /api/v1/nodes?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            writer.transport.abort()
        await asyncio.sleep(0.5)
        async with aiohttp.ClientSession() as s, s.get(k.url + "/api/v1/nodes") as resp:
            assert resp.status == 200  # and it still answers
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_the_request_history_is_bounded_in_bytes_as_well_as_in_requests():
    # Each kept request holds its body and its decoded JSON: kubectl applying a 2 MiB manifest in a
    # loop grew the emulator by about 14 MiB a request, up to the 4,096 the history kept (58 GiB).
    async with running_api([], history_bytes=2**20) as k:
        big = json.dumps({"metadata": {"name": "n"}, "x": "y" * 300_000}).encode()
        async with aiohttp.ClientSession() as s:
            for _ in range(10):
                async with s.post(
                    k.url + "/api/v1/nodes", data=big, headers={"Content-Type": "application/json"}
                ) as resp:
                    assert resp.status in (201, 409)
            async with s.post(k.url + "/api/v1/nodes", json={"metadata": {"name": "small"}}) as resp:
                assert resp.status == 201
        kept = k.requests("POST", "v1/nodes")  # three of 300 KB, and the small one
        assert len(kept) == 4 and kept[-1].data["metadata"]["name"] == "small"
        assert sum(len(r.body) for r in kept) <= 2**20
        assert k.count("POST", "v1/nodes") == 11  # the counter stays exact whatever the history forgot
