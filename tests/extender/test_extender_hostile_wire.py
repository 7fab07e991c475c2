"""/filter and /prioritize over real HTTP against ExtenderArgs kube-scheduler never sends: a number
beyond float64 (which came back as `Infinity`, no JSON), a client gone mid-body, 100,000 node names, a
missing field, a priority out of range. Each is answered (a 400 says what is wrong) and the extender keeps
serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from extender_fixtures import args, explicit, extender, fleet, pod
from prometheus_client import CollectorRegistry

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.server import build_app, runner

VERBS = ["filter", "prioritize"]


async def _post(client: Any, verb: str, body: bytes) -> tuple[int, Any]:
    resp = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
    return resp.status, await resp.json()


def _full_nodes(extra: bytes) -> bytes:
    """ExtenderArgs with full Nodes (kube-scheduler without nodeCacheCapable), each node's spec holding
    `x: <extra>`."""
    body = json.dumps({"Pod": pod("web"), "NodeNames": None, "Nodes": {"items": fleet(per_zone=1)[:2]}})
    return body.encode().replace(b'"podCIDR"', b'"x": ' + extra + b', "podCIDR"')


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"2e308"])
@pytest.mark.parametrize("verb", VERBS)
async def test_a_number_beyond_float64_is_a_400_not_echoed_as_infinity(verb: str, number: bytes) -> None:
    """JSON's grammar allows 1e999; Python read it as inf, and /filter, echoing the full Nodes it was
    given, wrote it back as `Infinity`: an answer Go's decoder refuses, which fails the pod's cycle."""
    async with extender(fleet(per_zone=1)) as client:
        status, out = await _post(client, verb, _full_nodes(number))
        assert status == 400, out
        assert out["Error"] == f"request body is not JSON: the number {number.decode()!r} is beyond float64"
        status, out = await _post(client, verb, _full_nodes(b"1.5e10"))
        assert status == 200
        if verb == "filter":
            assert [n["spec"]["x"] for n in out["Nodes"]["items"]] == [1.5e10, 1.5e10]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"Pod": pod("web")}, "one of NodeNames or Nodes is required"),
        ({"Pod": pod("web"), "NodeNames": None, "Nodes": None}, "one of NodeNames or Nodes is required"),
        ({"Pod": {"spec": {}}, "NodeNames": ["eu-a-0"]}, "Pod must be a Pod object with metadata"),
        ({"NodeNames": ["eu-a-0"]}, "Pod must be a Pod object with metadata"),
        (
            args(pod("web") | {"spec": {**pod("web")["spec"], "priority": -(2**70)}}, ["eu-a-0"]),
            "request body is not JSON: a number of 22 digits",
        ),
    ],
    ids=["both-absent", "both-null", "pod-without-metadata", "no-pod", "priority-beyond-int64"],
)
@pytest.mark.parametrize("verb", VERBS)
async def test_missing_fields_and_numbers_out_of_range_are_a_400(verb: str, body: Any, says: str) -> None:
    async with extender(fleet(per_zone=1)) as client:
        status, out = await _post(client, verb, json.dumps(body).encode())
        assert (status, out["Error"]) == (400, says)


@pytest.mark.parametrize("priority", [-(2**31), 2**31 - 1, 0])
async def test_a_priority_in_range_is_answered(priority: int) -> None:
    p = pod("g-0", gpus=8, **explicit("g", 2))
    p["spec"]["priority"] = priority
    async with extender(fleet(per_zone=1)) as client:
        status, out = await _post(client, "filter", json.dumps(args(p, ["eu-a-0", "eu-b-0"])).encode())
        assert status == 200, out


@pytest.mark.parametrize("verb", VERBS)
async def test_100000_node_names_are_answered_in_full(verb: str) -> None:
    names = [f"n-{i}" for i in range(100_000)]
    async with extender(fleet(per_zone=1)) as client:
        status, out = await _post(client, verb, json.dumps(args(pod("web"), ["eu-a-0", *names])).encode())
        assert status == 200
        got = out["NodeNames"] if verb == "filter" else [h["Host"] for h in out]
        assert got == ["eu-a-0", *names]
        # ... and the same names with one given twice, the last of 100,001.
        twice = json.dumps(args(pod("web"), ["eu-a-0", *names, "n-5"])).encode()
        assert await _post(client, verb, twice) == (
            400,
            {"Error": "NodeNames[100001]: 'n-5' is given twice (also NodeNames[6])"},
        )


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[tuple[str, int]]:
    """The extender with the runner `nodefabric extender` uses (its connection limits); yields host, port."""
    app = build_app(ExtenderConfig(), fleet(per_zone=1), registry=CollectorRegistry())
    hook = runner(app)
    await hook.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    await web.TCPSite(hook, "127.0.0.1", port).start()
    try:
        yield "127.0.0.1", port
    finally:
        await hook.cleanup()


@pytest.mark.parametrize("verb", VERBS)
async def test_a_client_gone_mid_body_is_one_warning_not_a_traceback(
    verb: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The read failed with ConnectionResetError, which aiohttp logged as an ERROR with a traceback."""
    caplog.set_level(logging.INFO)
    async with served() as (host, port):
        _, writer = await asyncio.open_connection(host, port)
        writer.write(f"POST /{verb} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode())
        await writer.drain()
        writer.close()

        def told() -> list[logging.LogRecord]:
            return [
                r
                for r in caplog.records
                if r.levelno >= logging.ERROR or r.__dict__.get("error", "").startswith("the client closed")
            ]

        for _ in range(600):  # the server notices on its next turn of the loop; bounded, never timed
            if told():
                break
            await asyncio.sleep(0.05)
        [record] = told()
        assert record.levelno == logging.WARNING
        assert record.__dict__["error"] == "the client closed the connection before its body arrived"
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"http://{host}:{port}/{verb}", json=args(pod("web"), ["eu-a-0"]))
            assert resp.status == 200
