"""The bytes of request bodies the extender reads at once are bounded, over real HTTP with the runner
`nodefabric extender` uses: connections that send most of a body and then wait hold the bound, and one
more request is a 503 at once; whichever way a held body ends (whole, as garbage, its client gone, its
deadline past), its bytes are let go, so a request of the largest size is served after it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from extender_fixtures import args, fleet, pod
from prometheus_client import CollectorRegistry

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.server import BODIES, Serving, build_app, runner
from nodefabric_operator.httpbody import BodyReader

BODY = 4096
LOGGER = "nodefabric_operator.extender.server"


# The body readers of the servers running, by base URL: a test that holds a body waits until the bytes it
# sent are counted (they are counted as the server reads them, on its own turn of the loop).
READERS: dict[str, BodyReader] = {}


@contextlib.asynccontextmanager
async def served(serving: Serving) -> AsyncIterator[str]:
    """The extender on 127.0.0.1 with the CLI's runner; yields its base URL."""
    app = build_app(ExtenderConfig(), fleet(per_zone=1), registry=CollectorRegistry(), serving=serving)
    hook = runner(app)
    await hook.setup()
    await web.TCPSite(hook, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{hook.addresses[0][1]}"
    READERS[base] = app[BODIES]
    try:
        yield base
    finally:
        READERS.pop(base, None)
        await hook.cleanup()


async def counted(base: str, held: int) -> None:
    """Until the server's bodies hold at least `held` bytes; bounded, never timed."""
    for _ in range(600):
        if READERS[base].in_flight.held >= held:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the server never held {held} bytes: {READERS[base].in_flight.held}")


def full_body() -> bytes:
    """A request kube-scheduler could send, padded to exactly BODY bytes: the largest accepted."""
    raw = json.dumps(args(pod("web"), ["eu-a-0"])).encode()
    return raw + b" " * (BODY - len(raw))


async def post(base: str, body: bytes) -> tuple[int, dict[str, object], aiohttp.ClientResponse]:
    async with aiohttp.ClientSession() as http, http.post(base + "/filter", data=body) as resp:
        return resp.status, await resp.json(), resp


async def stalled(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose request announced BODY bytes and sent all but the last; returns once the server
    holds them (counted as they arrive: one byte more than another stalled body left is counted too)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    before = READERS[base].in_flight.held
    # No Expect: 100-continue: beside another stalled body the bound may not hold this one whole, and it
    # would be refused from its head.
    head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n"
    writer.write(head.encode() + full_body()[:-1])
    await writer.drain()
    await counted(base, before + BODY - 1)
    return reader, writer


async def status_of(reader: asyncio.StreamReader) -> bytes:
    """The status of the final answer on a raw connection (past the interim 100 and its blank): aiohttp
    answers a request it cannot parse in HTTP/1.0."""
    while not (line := await reader.readline()).startswith((b"HTTP/1.1 2", b"HTTP/1.1 4", b"HTTP/1.0 4")):
        assert line, "the connection closed unanswered"
    return line.split()[1]


async def test_stalled_bodies_hold_the_bound_and_one_more_request_is_a_503() -> None:
    """Each connection that sent most of a 64 MiB body and then waited made the process hold it until the
    read deadline: a few such connections got the extender killed for memory."""
    async with served(Serving(max_body=BODY, max_in_flight=2 * BODY, read_timeout=30)) as base:
        held = [await stalled(base), await stalled(base)]
        try:
            status, out, resp = await post(base, full_body())
            assert status == 503, out
            assert out["Error"] == "8,190 bytes of other request bodies are being read; try again"
            assert resp.headers["Connection"] == "close"  # its body was not read
            async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as metrics:
                assert 'nodefabric_extender_bad_requests_total{verb="filter"} 1.0' in await metrics.text()
            reader, writer = held[0]
            writer.write(full_body()[-1:])  # one held body ends whole: it is answered, its bytes let go
            await writer.drain()
            assert await status_of(reader) == b"200"
            status, out, _ = await post(base, full_body())
            assert status == 200, out
        finally:
            for _, writer in held:
                writer.close()


async def announced(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose request announced BODY bytes and sent none, once its handler started."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\nExpect: 100-continue\r\n\r\n"
    writer.write(head.encode())
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 100")
    return reader, writer


async def test_bodies_announced_and_not_sent_hold_nothing() -> None:
    """Counted at the Content-Length announced, two connections that announced the largest body and sent
    nothing held the whole bound for free: every request was a 503 until their deadline, again after each
    reconnect. The bytes are counted as they arrive."""
    async with served(Serving(max_body=BODY, max_in_flight=2 * BODY, read_timeout=30)) as base:
        idle = [await announced(base) for _ in range(5)]
        try:
            assert READERS[base].in_flight.held == 0
            status, out, _ = await post(base, full_body())
            assert status == 200, out
        finally:
            for _, writer in idle:
                writer.close()


async def _finish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, how: str) -> bytes | None:
    """Ends the held body `how`; the answer's status line, None when the client left."""
    if how == "whole":
        writer.write(full_body()[-1:])
    elif how == "garbage":
        writer.write(b"\xff")
    elif how == "gone":
        writer.close()
        return None
    await writer.drain()
    return await status_of(reader)


@pytest.mark.parametrize(
    ("how", "answer"),
    [
        ("whole", b"200"),
        ("garbage", b"400"),
        ("deadline", b"408"),
        ("gone", None),
    ],
)
async def test_a_held_body_lets_its_bytes_go_however_it_ends(
    how: str, answer: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    """The bound holds one body: the largest request after the held one ends is served only when not a
    byte of the held one is still counted."""
    caplog.set_level(logging.INFO)
    timeout = 0.5 if how == "deadline" else 30
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=timeout)) as base:
        reader, writer = await stalled(base)
        try:
            status, out, _ = await post(base, full_body())
            assert status == 503, out
            line = await _finish(reader, writer, how)
            if answer is None:
                await _logged(caplog, "the client closed the connection before its body arrived")
            else:
                assert line == answer
        finally:
            writer.close()
        status, out, _ = await post(base, full_body())
        assert status == 200, out


async def _logged(caplog: pytest.LogCaptureFixture, error: str) -> None:
    for _ in range(600):  # the server notices on its next turn of the loop; bounded, never timed
        if any(r.name == LOGGER and r.__dict__.get("error") == error for r in caplog.records):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never logged: {error}")


@pytest.mark.parametrize(
    ("length", "answer"),
    [
        (10, b"400"),  # fewer bytes than sent: the rest is no request (aiohttp's 400, the connection closed)
        (BODY + 1, b"413"),  # announced past the limit: refused before it is read
        ("abc", b"400"),  # no number: aiohttp refuses the request before the handler
    ],
)
async def test_a_wrong_content_length_is_refused_and_the_largest_body_still_served(
    length: int | str, answer: bytes
) -> None:
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = json.dumps(args(pod("web"), ["eu-a-0"])).encode()
        writer.write(f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode() + body)
        await writer.drain()
        try:
            assert await status_of(reader) == answer
        finally:
            writer.close()
        status, out, _ = await post(base, full_body())
        assert status == 200, out


# --- Expect: 100-continue ---------------------------------------------------------------------------------


async def _asked(
    base: str, *headers: str, verb: str = "filter"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent a POST /<verb> head with `headers` and no body yet."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write("\r\n".join([f"POST /{verb} HTTP/1.1", "Host: x", *headers, "", ""]).encode())
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """The next answer on a raw connection, the first line it reads (an interim 100 included): status,
    headers (lowercase names), body."""
    status = (await reader.readline()).split()[1]
    headers: dict[str, str] = {}
    while (line := await reader.readline()).strip():
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, await reader.readexactly(int(headers.get("content-length", 0)))


async def _bad_requests(base: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as metrics:
        text = await metrics.text()
    return next(
        (line for line in text.splitlines() if line.startswith("nodefabric_extender_bad_requests_total")),
        "",
    )


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        ((f"Content-Length: {BODY + 1}",), b"413", f"request body larger than {BODY} bytes"),
        (
            ("Content-Length: 100", "Content-Encoding: gzip"),
            b"415",
            "request body has Content-Encoding 'gzip': kube-scheduler sends it plain",
        ),
    ],
    ids=["too-large", "gzip"],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_a_body_refused_from_its_headers_is_refused_before_the_client_sends_it(
    headers: tuple[str, ...], status: bytes, error: str, verb: str, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp answered `Expect: 100-continue` with an interim 100 before the handler ran: the client was
    invited to send a body that was then refused from headers the server already had, and read and
    discarded for the lingering second. The refusal is the answer to the headers, counted and logged once."""
    caplog.set_level(logging.INFO)
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        reader, writer = await _asked(base, *headers, "Expect: 100-continue", verb=verb)
        try:
            got, answered, body = await _answer(reader)
            assert got == status, body  # the final answer, no interim 100 before it
            assert json.loads(body) == {"Error": error}
            assert answered["connection"] == "close"
            assert await reader.read() == b""  # nothing after it: the connection is closed
        finally:
            writer.close()
        assert await _bad_requests(base) == f'nodefabric_extender_bad_requests_total{{verb="{verb}"}} 1.0'
        assert [r.__dict__["error"] for r in caplog.records if r.name == LOGGER] == [error]
        status_, out, _ = await post(base, full_body())
        assert status_ == 200, out


async def test_a_body_asked_for_while_the_bound_is_full_is_a_503_before_it_is_sent() -> None:
    """Not a byte of it could be counted: the client is told so before it sends any."""
    async with served(Serving(max_body=BODY, max_in_flight=2 * BODY - 2, read_timeout=30)) as base:
        held = [await stalled(base), await stalled(base)]  # BODY - 1 bytes each: the bound is full
        try:
            reader, writer = await _asked(base, f"Content-Length: {BODY}", "Expect: 100-continue")
            got, answered, body = await _answer(reader)
            writer.close()
            assert got == b"503", body
            assert json.loads(body) == {
                "Error": "8,190 bytes of other request bodies are being read; try again"
            }
            assert answered["connection"] == "close"
            assert await _bad_requests(base) == 'nodefabric_extender_bad_requests_total{verb="filter"} 1.0'
        finally:
            for _, w in held:
                w.close()


async def test_a_readable_body_is_still_asked_for_and_served() -> None:
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        reader, writer = await _asked(base, f"Content-Length: {BODY}", "Expect: 100-Continue")
        try:
            assert (await _answer(reader))[0] == b"100"
            writer.write(full_body())
            await writer.drain()
            status, _, body = await _answer(reader)
            assert status == b"200", body
            assert "NodeNames" in json.loads(body)
        finally:
            writer.close()
        assert await _bad_requests(base) == ""  # no refusal counted


async def test_another_expectation_is_aiohttps_417_even_for_a_body_too_large() -> None:
    """Only 100-continue is refused from the headers; any other expectation is refused as aiohttp does."""
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        reader, writer = await _asked(base, f"Content-Length: {BODY + 1}", "Expect: 200-ok")
        try:
            status, _, body = await _answer(reader)
            assert (status, body) == (b"417", b"Unknown Expect: 200-ok")
        finally:
            writer.close()
        assert await _bad_requests(base) == ""  # aiohttp's, not the extender's


async def _asked_beside(base: str, length: int) -> tuple[bool, bytes]:
    """Whether a body of `length` spaces asked for with Expect: 100-continue got the interim 100 (and was
    sent then), and the final status."""
    reader, writer = await _asked(base, f"Content-Length: {length}", "Expect: 100-continue")
    try:
        got, _, _ = await _answer(reader)
        if invited := got == b"100":
            writer.write(b" " * length)
            await writer.drain()
            got, _, _ = await _answer(reader)
        else:
            assert await reader.read() == b""  # refused from its head: nothing more, the connection closed
        return invited, got
    finally:
        writer.close()


async def test_a_body_asked_for_at_the_edge_of_the_bound() -> None:
    """Beside a held body that leaves 11 bytes of the bound: 11 are asked for and read (no JSON: 400); 12
    were invited too, sent, and refused 503 as they came: the waste the answer to the head is there to
    spare. They are refused before the interim 100."""
    async with served(Serving(max_body=BODY, max_in_flight=BODY + 10, read_timeout=30)) as base:
        _, held = await stalled(base)
        try:
            assert await _asked_beside(base, 11) == (True, b"400")
            assert await _asked_beside(base, 12) == (False, b"503")
            assert await _bad_requests(base) == 'nodefabric_extender_bad_requests_total{verb="filter"} 2.0'
        finally:
            held.close()


async def test_an_empty_body_asked_for_while_the_bound_is_full_is_read() -> None:
    """It needs none of the bound, and without the Expect header it is read: so it is with it."""
    async with served(Serving(max_body=BODY, max_in_flight=2 * BODY - 2, read_timeout=30)) as base:
        held = [await stalled(base), await stalled(base)]  # BODY - 1 bytes each: the bound is full
        try:
            assert await _asked_beside(base, 0) == (True, b"400")  # read whole: no JSON
        finally:
            for _, w in held:
                w.close()
