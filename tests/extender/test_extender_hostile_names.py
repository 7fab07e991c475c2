"""/filter and /prioritize over real HTTP against hostile requests: a NodeNames entry the API server would
refuse for a Node, wrong JSON types, garbage, a huge or deep body. Each is a 400 (413 past the size) with
a message, and the extender keeps serving."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from extender_fixtures import args, explicit, extender, fleet, pod
from prometheus_client import CollectorRegistry

from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.nodes import is_node_name
from nodefabric_operator.extender.server import Serving, make_app
from nodefabric_operator.extender.service import NOT_SYNCED, Extender

VERBS = ["filter", "prioritize"]
NOT_A_NODE = "is not a node name (a DNS subdomain, as the API server requires of a Node"


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("eu-a-0", True),
        ("a", True),
        ("0", True),
        ("node-1.zone.example.com", True),
        ("a" * 253, True),
        ("a" * 254, False),
        ("", False),
        ("Upper", False),
        ("-a", False),
        ("a-", False),
        (".a", False),
        ("a.", False),
        ("a..b", False),
        ("a.-b", False),
        ("a-.b", False),
        ("a_b", False),
        ("a b", False),
        ("ä", False),
        ("a\n", False),
        (None, False),
        (7, False),
        (["a"], False),
    ],
)
def test_is_node_name_is_the_api_servers_rule(name, ok):
    assert is_node_name(name) is ok


async def _post(client: TestClient[Any, Any], verb: str, body: bytes) -> tuple[int, str]:
    resp = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
    status = resp.status
    return status, (await resp.json())["Error"] if status != 200 else ""


async def _still_serves(client: TestClient[Any, Any], verb: str) -> None:
    ok = await client.post(f"/{verb}", json=args(pod("web"), ["eu-a-0"]))
    assert ok.status == 200, await ok.text()


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("-a", "'-a'"),
        ("a-", "'a-'"),
        (".a", "'.a'"),
        ("a.", "'a.'"),
        ("a..b", "'a..b'"),
        ("a.-b", "'a.-b'"),
        ("a" * 254, f"'{'a' * 80}' (254 characters)"),
        ("", "''"),
        ("Upper", "'Upper'"),
        ("a/b", "'a/b'"),
        ("ä", "'ä'"),
        (None, "null"),
        (True, "bool True"),
        (1.5, "float 1.5"),
        (["a"], "a JSON array"),
        ({"a": 1}, "a JSON object"),
    ],
)
@pytest.mark.parametrize("verb", VERBS)
async def test_a_name_the_api_server_would_refuse_is_a_400(verb, name, shown):
    async with extender(fleet(per_zone=1)) as client:
        body = json.dumps(args(pod("web"), ["eu-a-0", name])).encode()
        status, error = await _post(client, verb, body)
        assert status == 400
        assert error.startswith(f"NodeNames[1]: {shown} {NOT_A_NODE}")
        await _still_serves(client, verb)


@pytest.mark.parametrize("verb", VERBS)
async def test_a_bad_name_is_refused_on_every_request_not_only_the_first(verb):
    """The last NodeNames are remembered: a bad one must not be, or its repeat would be answered."""
    async with extender(fleet(per_zone=1)) as client:
        body = json.dumps(args(pod("web"), ["eu-a-0", "bad-"])).encode()
        assert (await _post(client, verb, body))[0] == 400
        assert (await _post(client, verb, body))[0] == 400


@pytest.mark.parametrize(
    ("names", "says"),
    [
        (["eu-a-0", "eu-a-0"], "NodeNames[1]: 'eu-a-0' is given twice (also NodeNames[0])"),
        (["new-0", "eu-a-0", "new-0"], "NodeNames[2]: 'new-0' is given twice (also NodeNames[0])"),
        (["eu-a-0", "new-0", "new-1", "eu-a-0"], "NodeNames[3]: 'eu-a-0' is given twice (also NodeNames[0])"),
    ],
)
@pytest.mark.parametrize("verb", VERBS)
async def test_a_node_named_twice_is_a_400_not_two_verdicts(verb, names, says):
    """kube-scheduler names each node once: a node known to the cache or not, named twice, is refused
    (the answer would echo it with two verdicts), on every request, not only the first."""
    async with extender(fleet(per_zone=1)) as client:
        grouped = pod("g-0", gpus=8, **explicit("g", 2))
        for asking in (pod("web"), grouped, pod("web")):
            body = json.dumps(args(asking, names)).encode()
            assert await _post(client, verb, body) == (400, says)
        await _still_serves(client, verb)


async def test_a_bad_name_is_a_400_for_a_pod_whose_placement_is_invalid():
    """An invalid placement is answered before the nodes are decided over: the names still are checked."""
    async with extender(fleet(per_zone=1)) as client:
        bad = pod("g-0", gpus=8, **explicit("g", 2, locality="nowhere"))
        for verb in VERBS:
            status, error = await _post(client, verb, json.dumps(args(bad, ["eu-a-0", "a."])).encode())
            assert status == 400 and error.startswith(f"NodeNames[1]: 'a.' {NOT_A_NODE}")


async def test_a_bad_name_is_a_400_before_the_caches_sync():
    """Before the first list a grouped pod waits, and the answer repeats NodeNames: checked first."""
    cache = Cache(ExtenderConfig())
    app = make_app(Extender(ExtenderConfig(), cache, registry=CollectorRegistry()))
    async with TestClient(TestServer(app)) as client:
        grouped = pod("g-0", gpus=8, **explicit("g", 2))
        status, error = await _post(client, "filter", json.dumps(args(grouped, ["eu-a-0", "a."])).encode())
        assert status == 400 and error.startswith(f"NodeNames[1]: 'a.' {NOT_A_NODE}")
        ok = await client.post("/filter", json=args(grouped, ["eu-a-0"]))
        assert (await ok.json())["FailedNodes"] == {"eu-a-0": NOT_SYNCED}


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"\xff\xfe\x00garbage", 400, "request body is not JSON"),
        (b"\x00" * 1000, 400, "request body is not JSON"),
        (b"", 400, "request body is not JSON"),
        (b"null", 400, "request body must be a JSON object (ExtenderArgs), got NoneType"),
        (b"[]", 400, "request body must be a JSON object (ExtenderArgs), got list"),
        (b'"x"', 400, "request body must be a JSON object (ExtenderArgs), got str"),
        (b'{"Pod": null, "NodeNames": ["a"]}', 400, "Pod must be a Pod object with metadata"),
        (b'{"Pod": [], "NodeNames": ["a"]}', 400, "Pod must be a Pod object with metadata"),
        (b'{"Pod": {"metadata": null}, "NodeNames": []}', 400, "Pod must be a Pod object with metadata"),
        (b'{"Pod": {"metadata": {}, "spec": null}, "NodeNames": []}', 400, "Pod spec must be an object"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": {"a": 1}}', 400, "NodeNames must be a list of node names"),
        (b'{"Pod": {"metadata": {}}, "Nodes": []}', 400, "Nodes must be a NodeList with items"),
        (b'{"Pod": {"metadata": {}}, "Nodes": {"items": null}}', 400, "Nodes must be a NodeList with items"),
        (b'{"Pod": {"metadata": {}}, "Nodes": {"items": [null]}}', 400, "Nodes.items[0]: must be a Node"),
        (
            b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {"name": "-a"}}]}}',
            400,
            "Nodes.items[0].metadata.name: '-a' is not a node name",
        ),
        (
            b'{"Pod": {"metadata": {}}, "NodeNames": ["eu-a-0"], "nodenames": ["bad-"]}',
            400,
            "the request names a field more than once, in different case: ['NodeNames', 'nodenames']",
        ),
        (
            b'{"Pod": {"metadata": {}, "spec": {"priority": NaN}}, "NodeNames": []}',
            400,
            "request body is not JSON: NaN is not JSON",
        ),
        (
            b'{"Pod": {"metadata": {}}, "NodeNames": [], "x": ' + b"9" * 5000 + b"}",
            400,
            "request body is not JSON: a number of 5,000 digits",
        ),
        (
            b'{"Pod": {"metadata": {}}, "NodeNames": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            400,
            "request body is not JSON",
        ),
        (
            b'{"Pod": {"metadata": {}}, "NodeNames": [' + b"[" * 500 + b"]" * 500 + b"]}",
            400,
            f"NodeNames[0]: a JSON array {NOT_A_NODE}",
        ),
    ],
)
@pytest.mark.parametrize("verb", VERBS)
async def test_a_hostile_body_is_refused_with_a_message(verb, body, status, says):
    async with extender(fleet(per_zone=1)) as client:
        got, error = await _post(client, verb, body)
        assert got == status
        assert says in error
        await _still_serves(client, verb)


@pytest.mark.parametrize("verb", VERBS)
async def test_a_body_past_the_size_limit_is_a_413(verb):
    async with extender(fleet(per_zone=1), serving=Serving(max_body=64 * 1024)) as client:
        names = [f"n-{i}" for i in range(20_000)]
        status, error = await _post(client, verb, json.dumps(args(pod("web"), names)).encode())
        assert status == 413
        assert error == f"request body larger than {64 * 1024} bytes"
        await _still_serves(client, verb)


async def test_thousands_of_good_unknown_names_are_answered():
    """The full rule runs on the names the cache does not know: 5,000 of them still get an answer."""
    async with extender(fleet(per_zone=1), ExtenderConfig()) as client:
        names = [f"node-{i}.rack-{i % 40}.example.com" for i in range(5000)]
        resp = await client.post("/filter", json=args(pod("web"), ["eu-a-0", *names]))
        assert resp.status == 200
        assert (await resp.json())["NodeNames"] == ["eu-a-0", *names]
