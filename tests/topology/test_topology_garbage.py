"""The topology writer's reads answered with garbage over real HTTP (a broken aggregated API, a proxy's
page): a Topology list that is no list of objects, owner references of the wrong types, an /apis listing
versions no API server serves. Nothing is deleted that is not provably ours, no pass ends in a TypeError,
and no request is sent for a version that is not one."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest

from nodefabric_operator import events
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.topology import project
from nodefabric_operator.topology.discovery import MAX_VERSIONS, Discovery
from nodefabric_operator.topology.objects import Objects
from nodefabric_operator.topology.sweep import Sweeper

UID = "0d7e3c4a-owner"
MANAGED = {project.MANAGED_BY: project.MANAGER}
KUEUE_LIST = f"/apis/{project.KUEUE_GROUP}/v1beta2/topologies"


class Answers:
    """What the server answers, by path (anything else: 404), and every request it was sent."""

    def __init__(self, answers: dict[str, Any], refused: dict[tuple[str, str], int]) -> None:
        self.answers = answers
        self.refused = refused  # (method, path) -> the code it is answered with
        self.seen: list[tuple[str, str]] = []


@contextmanager
def serving(
    answers: dict[str, Any], refused: dict[tuple[str, str], int] | None = None
) -> Iterator[tuple[kubernetes.client.ApiClient, Answers]]:
    state = Answers(answers, refused or {})

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            path = self.path.split("?", 1)[0]
            state.seen.append((self.command, path))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            found = path in state.answers and self.command == "GET"
            answer = state.answers.get(path)
            body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            code = state.refused.get((self.command, path), 200 if found else 404)
            body = body if code == 200 else json.dumps({"kind": "Status", "code": code}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_DELETE = do_POST = do_PATCH = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = kubernetes.client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    api = kubernetes.client.ApiClient(config)
    try:
        yield api, state
    finally:
        api.close()
        server.shutdown()
        server.server_close()
        thread.join()


def _old(refs: Any) -> dict[str, Any]:
    return {"metadata": {"name": "old", "labels": MANAGED, "ownerReferences": refs, "resourceVersion": "7"}}


@pytest.mark.parametrize(
    "listed",
    [
        {"items": 5},
        {"items": "old"},
        {"items": {"old": _old([{"uid": UID}])}},
        [_old([{"uid": UID}])],
        "items",
        {"items": [1, None, {"metadata": []}, {"metadata": {"name": 7, "labels": MANAGED}}]},
        {"items": [_old(UID), _old([UID]), _old([{"uid": [UID]}]), _old({"uid": UID}), _old(None)]},
    ],
    ids=["items-int", "items-text", "items-map", "a-list", "text", "garbage-items", "garbage-owners"],
)
def test_a_garbage_topology_list_removes_nothing_and_ends_no_pass(listed: Any) -> None:
    """`{"items": 5}` or an answer that is not an object ended the sweep in a TypeError or an
    AttributeError (only API errors are caught there), so the writer's pass failed."""
    said: list[events.Notice] = []
    again: list[bool] = []
    with serving({KUEUE_LIST: listed}) as (api, state):
        objects = Objects(api, Metrics(), lambda: {project.KUEUE: "v1beta2"}, lambda body: body)
        sweeper = Sweeper(objects, "nodefabric", lambda: UID, said.append, lambda: again.append(True))
        sweeper.sweep(project.KUEUE)
    assert [m for m, _ in state.seen] == ["GET"]
    assert said == [] and again == []


def test_a_topology_of_an_earlier_name_changed_since_its_listing_is_listed_again_not_read() -> None:
    """The delete's 409 (changed since listed) read the object by name, which the chart refuses for any
    name but the configured one (get is name-limited, list and delete are not): the 403 read as "cannot
    list", said as such, and the sweep gave up until the next resync. Now it is listed again on the
    pass's backoff and nothing outside the chart's rules is asked."""
    said: list[events.Notice] = []
    again: list[bool] = []
    old = f"{KUEUE_LIST}/old"
    refused = {("DELETE", old): 409, ("GET", old): 403}
    with serving({KUEUE_LIST: {"items": [_old([{"uid": UID}])]}}, refused) as (api, state):
        objects = Objects(api, Metrics(), lambda: {project.KUEUE: "v1beta2"}, lambda body: body)
        sweeper = Sweeper(objects, "nodefabric", lambda: UID, said.append, lambda: again.append(True))
        sweeper.sweep(project.KUEUE)
        assert state.seen == [("GET", KUEUE_LIST), ("DELETE", old)]
        assert said == [] and again == [True]
        sweeper.sweep(project.KUEUE)  # not swept yet: the pass again lists it
        assert state.seen[2:] == [("GET", KUEUE_LIST), ("DELETE", old)]


def test_an_apis_listing_of_garbage_versions_asks_about_none_of_them() -> None:
    """/apis is read when no known version of a target serves it; each version it lists was asked about
    with a request of its own, whatever it was: a path, 100,000 characters, 1,000 versions."""
    garbage = ["v1/../../api/v1/secrets", "v" + "1" * 100_000, "", "V2", "v0", "v2gamma1", 5, None]
    many = [f"v{i}" for i in range(3, 1_003)]
    apis = {
        "kind": "APIGroupList",
        "groups": [
            {"name": project.KUEUE_GROUP, "versions": [{"version": v} for v in [*garbage, *many]]},
            {"name": project.KAI_GROUP, "versions": "v1"},
            {"name": ["x"], "versions": [{"version": "v1"}]},
            "junk",
        ],
    }
    with serving({"/apis/": apis}) as (api, state):
        discovery = Discovery(api, Metrics(), owner=None, ttl=60)
        discovery.discover()
    asked = [p for _, p in state.seen if p.startswith(f"/apis/{project.KUEUE_GROUP}/")]
    known = [f"/apis/{project.KUEUE_GROUP}/{v}" for v in project.KUEUE_VERSIONS]
    assert asked[: len(known)] == known
    assert asked[len(known) :] == [f"/apis/{project.KUEUE_GROUP}/{v}" for v in many[:MAX_VERSIONS]]
    assert discovery.served[project.KUEUE] is None and project.KUEUE not in discovery.unknown


def test_an_apis_listing_nested_past_the_parsers_depth_is_no_listing() -> None:
    """A RecursionError out of json.loads was not caught: discovery failed instead of reading "not
    served"."""
    with serving({"/apis/": b"[" * 100_000}) as (api, state):
        discovery = Discovery(api, Metrics(), owner=None, ttl=60)
        discovery.discover()
    assert ("GET", "/apis/") in state.seen
    assert discovery.served[project.KUEUE] is None and discovery.unknown == {}
