"""/filter and /prioritize over real HTTP against bodies kube-scheduler's encoder never writes: JSON in
UTF-16 or UTF-32, a byte order mark, a UTF-16 surrogate written as UTF-8 bytes. Go's decoder takes none
of them as the ExtenderArgs they spell; each is a 400, and the connection keeps serving."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest
from extender_fixtures import args, extender, fleet, pod

VERBS = ["filter", "prioritize"]


def _body() -> str:
    return json.dumps(args(pod("web"), ["eu-a-0", "eu-b-0"]))


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, verb: str, body: bytes
) -> tuple[int, Any]:
    """One request on an open connection, its answer read whole: (status, decoded JSON)."""
    head = (
        f"POST /{verb} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, json.loads(await reader.readexactly(length))


@pytest.mark.parametrize(
    ("encoding", "says"),
    [
        ("utf-16", "request body is not JSON: it is not UTF-8"),
        ("utf-16-le", "request body is not JSON"),
        ("utf-16-be", "request body is not JSON"),
        ("utf-32", "request body is not JSON: it is not UTF-8"),
        ("utf-8-sig", "request body is not JSON: Unexpected UTF-8 BOM"),
    ],
)
@pytest.mark.parametrize("verb", VERBS)
async def test_json_in_another_encoding_is_a_400_on_a_connection_that_keeps_serving(verb, encoding, says):
    async with extender(fleet(per_zone=1)) as client:
        reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
        try:
            status, answer = await _exchange(reader, writer, verb, _body().encode(encoding))
            assert status == 400
            assert answer["Error"].startswith(says), answer
            # The same connection (kube-scheduler keeps it open) answers the next request in full.
            status, answer = await _exchange(reader, writer, verb, _body().encode())
            assert status == 200
            names = answer["NodeNames"] if verb == "filter" else [h["Host"] for h in answer]
            assert sorted(names) == ["eu-a-0", "eu-b-0"]
        finally:
            writer.close()


@pytest.mark.parametrize("verb", VERBS)
async def test_a_surrogate_written_as_utf8_bytes_is_a_400(verb):
    """b"\\xed\\xa0\\x80" is no UTF-8: Python's json read it as a lone surrogate (surrogatepass)."""
    raw = json.dumps(args(pod("web"), ["eu-a-0"])).encode().replace(b'"web"', b'"w\xed\xa0\x80b"')
    async with extender(fleet(per_zone=1)) as client:
        resp = await client.post(f"/{verb}", data=raw, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert (await resp.json())["Error"].startswith("request body is not JSON: it is not UTF-8")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP", "identity, gzip"])
@pytest.mark.parametrize("verb", VERBS)
async def test_a_compressed_body_is_a_415_unread(verb, encoding):
    """kube-scheduler never compresses a request; a 64 KiB gzip body inflated to 63 MiB of JSON held the
    extender half a second, a thousand times what the same bytes sent plain could."""
    bomb = gzip.compress(b" " * (8 * 2**20) + _body().encode(), 9)
    async with extender(fleet(per_zone=1)) as client:
        resp = await client.post(
            f"/{verb}", data=bomb, headers={"Content-Type": "application/json", "Content-Encoding": encoding}
        )
        assert resp.status == 415
        assert (await resp.json())["Error"] == (
            f"request body has Content-Encoding {encoding!r}: kube-scheduler sends it plain"
        )
        ok = await client.post(f"/{verb}", json=args(pod("web"), ["eu-a-0"]))
        assert ok.status == 200


@pytest.mark.parametrize("verb", VERBS)
async def test_an_identity_content_encoding_is_read(verb):
    async with extender(fleet(per_zone=1)) as client:
        resp = await client.post(
            f"/{verb}",
            data=_body().encode(),
            headers={"Content-Type": "application/json", "Content-Encoding": "identity"},
        )
        assert resp.status == 200


@pytest.mark.parametrize("verb", VERBS)
async def test_one_node_given_twice_in_full_nodes_is_a_400(verb):
    """Two Node objects of one name (kube-scheduler without nodeCacheCapable sends each node once): the
    decision read the last, the answer returned both; which one counts would be a guess."""
    one, other = fleet(per_zone=1)[:2]
    twin = {**other, "metadata": {**other["metadata"], "name": one["metadata"]["name"]}}
    body = {"Pod": pod("web"), "NodeNames": None, "Nodes": {"items": [one, other, twin]}}
    async with extender(fleet(per_zone=1)) as client:
        resp = await client.post(f"/{verb}", json=body)
        assert resp.status == 400
        assert (await resp.json())["Error"] == "Nodes.items[2]: node 'eu-a-0' is given twice (also items[0])"
