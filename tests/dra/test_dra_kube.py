"""The driver's API shell over the node side's light client: each request against the embedded API, and
every answer a broken or hostile API server could give turned into an `ApiFailure` that says what to do."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
from asyncio import to_thread
from collections.abc import Iterator
from typing import Any

import pytest
from dra_helpers import CLAIMS, DRIVER, NODE, SLICES, Dirs, live_slices, put_claim, result

from nodefabric_devicemanager import nodeclient
from nodefabric_devicemanager.nodeclient import ApiFailure
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_operator.demo.kubeapi import RunningAPI


def _slice(name: str, node: str = NODE, driver: str = DRIVER, devices: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"d{i}"} for i in range(devices)],
        },
    }


async def test_each_request_against_the_embedded_api(api: RunningAPI, dirs: Dirs) -> None:
    # The embedded API runs on this test's event loop; the blocking client runs on a thread, as in the driver.
    dra = DraApi(nodeclient.load(api.kubeconfig), dirs.config())
    uid = api.api.stored("v1/nodes", NODE)["metadata"]["uid"]
    assert await to_thread(dra.node_owner) == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}

    api.api.put_object(SLICES, _slice("gpu-9-x", node="gpu-9"))  # another node's
    api.api.put_object(SLICES, _slice("other-driver", driver="gpu.example.com"))
    created = await to_thread(dra.create_slice, _slice("ours"))
    assert (
        created["metadata"]["resourceVersion"]
        == api.api.stored(SLICES, "ours")["metadata"]["resourceVersion"]
    )
    (listed,), version = await to_thread(dra.list_slices)
    assert listed["metadata"]["name"] == "ours"
    assert version  # the list's resourceVersion: where the watch resumes

    with pytest.raises(ApiFailure) as exists:
        created = await to_thread(dra.create_slice, _slice("ours"))
    assert (
        created["metadata"]["resourceVersion"]
        == api.api.stored(SLICES, "ours")["metadata"]["resourceVersion"]
    )
    assert (exists.value.kind, exists.value.status) == ("conflict", 409)
    assert str(exists.value).startswith("create resourceslice ours: ")

    rv = listed["metadata"]["resourceVersion"]
    updated = await to_thread(dra.update_slice, _slice("ours", devices=2), rv)
    assert updated["metadata"]["resourceVersion"] != rv and len(updated["spec"]["devices"]) == 2
    assert len(api.api.stored(SLICES, "ours")["spec"]["devices"]) == 2
    with pytest.raises(ApiFailure) as stale:  # the version we compared with is gone: list again
        await to_thread(dra.update_slice, _slice("ours", devices=3), rv)
    assert stale.value.kind == "conflict"
    assert len(api.api.stored(SLICES, "ours")["spec"]["devices"]) == 2

    await to_thread(dra.delete_slice, "ours", api.api.stored(SLICES, "ours")["metadata"]["resourceVersion"])
    assert [s["metadata"]["name"] for s in live_slices(api)] == ["gpu-9-x", "other-driver"]
    await to_thread(dra.delete_slice, "ours", "1")  # already gone: what we wanted, not an error

    assert await to_thread(dra.get_claim, "ml", "absent") is None
    claim = put_claim(api, "pair", [result("pci-0000-1c-00-0")])
    assert (await to_thread(dra.get_claim, "ml", "pair"))["metadata"]["uid"] == claim["metadata"]["uid"]
    assert api.count("GET", CLAIMS) == 2


async def test_a_node_that_is_gone_is_no_owner(api: RunningAPI, dirs: Dirs) -> None:
    dra = DraApi(nodeclient.load(api.kubeconfig), dirs.config(node="gone-node"))
    assert await to_thread(dra.node_owner) is None


# --- a hostile API server --------------------------------------------------------------------------------


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every request with the (status, body) the test set, and records what it was asked."""

    answer: tuple[int, bytes] = (200, b"{}")
    seen: list[tuple[str, str, str]] = []

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.seen.append((self.command, self.path, self.headers.get("User-Agent", "")))
        status, body = self.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_DELETE = _reply

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hostile() -> Iterator[type[_Answers]]:
    handler = type("Answers", (_Answers,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def _status(code: int, reason: str) -> bytes:
    return json.dumps({"kind": "Status", "code": code, "reason": reason, "message": f"{reason}!"}).encode()


CALLS = {
    "list": lambda d: d.list_slices(),
    "create": lambda d: d.create_slice(_slice("s")),
    "update": lambda d: d.update_slice(_slice("s"), "7"),
    "delete": lambda d: d.delete_slice("s", "7"),
    "claim": lambda d: d.get_claim("ml", "c"),
    "node": lambda d: d.node_owner(),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(
    "answer",
    [
        ((503, _status(503, "ServiceUnavailable")), "unavailable", "HTTP 503 ServiceUnavailable"),
        ((429, _status(429, "TooManyRequests")), "unavailable", "HTTP 429"),
        ((500, b"\xff\xfe not a status"), "unavailable", "HTTP 500"),
        ((403, _status(403, "Forbidden")), "rejected", "HTTP 403 Forbidden: Forbidden!"),
        ((422, _status(422, "Invalid")), "rejected", "HTTP 422 Invalid"),
        ((409, _status(409, "Conflict")), "conflict", "HTTP 409"),
        ((200, b"\xff garbage"), "unavailable", "not JSON"),
        ((200, b"[1, 2]"), "unavailable", "not a JSON object"),
    ],
)
def test_every_failure_says_what_it_was_doing_and_whether_to_retry(
    hostile: Any, dirs: Dirs, call: str, answer: tuple[tuple[int, bytes], str, str]
) -> None:
    hostile.answer, kind, words = answer
    dra = DraApi(nodeclient.Api(nodeclient.Credentials(hostile.url)), dirs.config())
    with pytest.raises(ApiFailure) as failed:
        CALLS[call](dra)
    assert failed.value.kind == kind
    assert words in str(failed.value)
    assert str(failed.value).split(":")[0] in (
        "list resourceslices", "create resourceslice s", "update resourceslice s", "delete resourceslice s",
        "read resourceclaim ml/c", f"read node {NODE}",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("call", "body", "words"),
    [
        ("list", b'{"kind": "ResourceSliceList"}', "no items list"),
        ("list", b'{"items": {"not": "a list"}}', "no items list"),
        ("node", b'{"metadata": {"name": "hgx-0"}}', "has no uid"),
        ("node", b'{"metadata": {"name": "hgx-0", "uid": 7}}', "has no uid"),
        ("node", b'{"metadata": "junk"}', "has no uid"),
    ],
)
def test_a_well_formed_answer_without_what_we_need_is_rejected(
    hostile: Any, dirs: Dirs, call: str, body: bytes, words: str
) -> None:
    hostile.answer = (200, body)
    dra = DraApi(nodeclient.Api(nodeclient.Credentials(hostile.url)), dirs.config())
    with pytest.raises(ApiFailure, match=words) as failed:
        CALLS[call](dra)
    assert failed.value.kind == "rejected"


def test_list_items_that_are_not_objects_are_dropped_and_both_fields_are_selected(
    hostile: Any, dirs: Dirs
) -> None:
    # Junk among the items is dropped. Items are not filtered by node or driver again: a resource.k8s.io/v1
    # API server selects by both fields (and refuses a field it cannot select by with 400).
    items = [_slice("ours"), 7, "s"]
    hostile.answer = (200, json.dumps({"items": items, "metadata": {"resourceVersion": "42"}}).encode())
    dra = DraApi(nodeclient.Api(nodeclient.Credentials(hostile.url)), dirs.config())
    listed, version = dra.list_slices()
    assert ([s["metadata"]["name"] for s in listed], version) == (["ours"], "42")
    ((method, path, _),) = hostile.seen
    assert method == "GET"
    assert path == (
        "/apis/resource.k8s.io/v1/resourceslices?fieldSelector="
        "spec.nodeName%3Dhgx-0%2Cspec.driver%3Drdma.gpustack.ai"
    )


def test_names_become_one_path_segment_and_requests_name_the_component(hostile: Any, dirs: Dirs) -> None:
    hostile.answer = (404, _status(404, "NotFound"))
    api = nodeclient.Api(nodeclient.Credentials(hostile.url, user_agent="nodefabric-draplugin"))
    dra = DraApi(api, dirs.config())
    assert dra.get_claim("ml", "a/b?c") is None
    dra.delete_slice("s/../x", "7")
    assert hostile.seen == [
        ("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/a%2Fb%3Fc", "nodefabric-draplugin"),
        ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s%2F..%2Fx", "nodefabric-draplugin"),
    ]


def test_no_api_server_at_all_is_unavailable(dirs: Dirs) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dra = DraApi(nodeclient.Api(nodeclient.Credentials(f"http://127.0.0.1:{port}")), dirs.config())
    for call in CALLS.values():
        with pytest.raises(ApiFailure) as failed:
            call(dra)
        assert (failed.value.kind, failed.value.status) == ("unavailable", 0)


def test_the_watch_selects_both_fields_resumes_and_says_gone_for_a_410(hostile: Any, dirs: Dirs) -> None:
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    hostile.answer = (200, json.dumps({"type": "ERROR", "object": expired}).encode() + b"\n")
    dra = DraApi(nodeclient.Api(nodeclient.Credentials(hostile.url)), dirs.config())
    with pytest.raises(ApiFailure) as failed:
        list(dra.watch_slices("7"))
    assert (failed.value.kind, failed.value.status) == ("gone", 410)
    assert "watch resourceslices: too old resource version" in str(failed.value)
    ((method, path, _),) = hostile.seen
    query = dict(p.split("=", 1) for p in path.split("?", 1)[1].split("&"))
    assert method == "GET" and path.startswith("/apis/resource.k8s.io/v1/resourceslices?")
    assert query["fieldSelector"] == "spec.nodeName%3Dhgx-0%2Cspec.driver%3Drdma.gpustack.ai"
    assert (query["watch"], query["allowWatchBookmarks"], query["resourceVersion"]) == ("true", "true", "7")
    assert 300 <= int(query["timeoutSeconds"]) <= 600


async def test_a_server_that_ends_every_watch_at_once_is_backed_off_not_hammered(
    hostile: Any, dirs: Dirs
) -> None:
    # 200 and an empty body, every time (a broken proxy): without a backoff it would reconnect in a loop.
    hostile.answer = (200, b"")
    dra = DraApi(nodeclient.Api(nodeclient.Credentials(hostile.url)), dirs.config())

    async def relist() -> None:
        watch.resume_from("7")

    watch = nodeclient.ResumableWatch(
        "test", dra.watch_slices, lambda event: None, relist, backoff=nodeclient.Backoff(base=0.2, cap=0.4)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.wait_for(task, 10)
    # 0.1-0.2 s, then 0.2-0.4 s between attempts: a handful, not thousands.
    assert 2 <= len(hostile.seen) <= 10
