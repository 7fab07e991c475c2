"""Request heads and bodies an attacker crafts, sent to the extender over real HTTP with the runner
`nodefabric extender` uses: each is answered (by the extender in its {"Error"} shape, or by aiohttp's
parser before it), the connection ends, nothing is logged as an ERROR, and not a byte of the in-flight
bound stays taken: a body of the largest size is served after each."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import http_parser, web_protocol
from test_extender_bodies import BODY, READERS, counted, full_body, post, served, stalled, status_of

from nodefabric_operator.extender.server import Serving
from nodefabric_operator.extender.service import Extender

HEAD = "POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"


def chunked(body: bytes, size: int = 512) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


def small() -> bytes:
    return full_body().rstrip()


SMALL = len(small())
# aiohttp's C parser refuses a Content-Length past 2**64 itself; its Python one (AIOHTTP_NO_EXTENSIONS)
# takes it, and the extender refuses it as past the limit.
C_PARSER = http_parser.HttpRequestParser is not http_parser.HttpRequestParserPy


async def exchange(base: str, request: bytes) -> bytes:
    """The whole answer to a request on its own connection: read to the end, when the server closed it
    (after it read, or gave up reading, the rest of the body)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    try:
        return await reader.read()
    finally:
        writer.close()


async def refusals(base: str) -> float:
    """The filter requests the extender refused, by its metrics (0 before its first)."""
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as metrics:
        text = await metrics.text()
    series = 'nodefabric_extender_bad_requests_total{verb="filter"} '
    return sum(float(line.removeprefix(series)) for line in text.splitlines() if line.startswith(series))


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_body_said_to_be_gzip_that_is_not_is_a_415_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After the 415 aiohttp went on reading the body it was not asked for (its lingering close) and
    inflated it as it read: a body that is not gzip was an ERROR and three tracebacks per request, and
    510 KiB of gzip (512 MiB inflated) a second of the event loop's time."""
    caplog.set_level(logging.INFO)
    body = b"not gzip at all" * 64
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        head = f"{HEAD}Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
        answer = await exchange(base, head.encode() + body)
        assert answer.startswith(b"HTTP/1.1 415"), answer[:200]
        assert answer.endswith(
            b'{"Error":"request body has Content-Encoding \'gzip\': kube-scheduler sends it plain"}'
        )
        assert errors(caplog) == []
        assert await refusals(base) == 1
        status, out, _ = await post(base, full_body())
        assert status == 200, out


def _ce(*values: str) -> bytes:
    said = "".join(f"Content-Encoding: {v}\r\n" for v in values)
    return f"{HEAD}{said}Content-Length: {SMALL}\r\n\r\n".encode() + small()


def _cl(value: str, body: bytes | None = None) -> bytes:
    return f"{HEAD}Content-Length: {value}\r\n\r\n".encode() + (small() if body is None else body)


def _te(extra: str, body: bytes) -> bytes:
    return f"{HEAD}Transfer-Encoding: chunked\r\n{extra}\r\n".encode() + chunked(body)


@pytest.mark.parametrize(
    ("request_", "status", "extender"),
    [
        (_cl("0", b""), b"400", True),  # no body: not JSON
        (_cl(f" {SMALL} "), b"200", True),  # whitespace around the value is allowed
        (_cl("-1"), b"400", False),
        (_cl(f"+{SMALL}"), b"400", False),
        (_cl(str(10**30)), b"400" if C_PARSER else b"413", not C_PARSER),
        (_cl(f"{SMALL}, {SMALL}"), b"400", False),
        (f"{HEAD}Content-Length: 10\r\nContent-Length: {SMALL}\r\n\r\n".encode() + small(), b"400", False),
        (_te("", small()), b"200", True),  # no Content-Length: counted at the limit while read
        (_te("", full_body() + b" "), b"413", True),  # passes the limit as it is read
        (_te("Content-Length: 10\r\n", full_body()), b"400", False),  # which one counts? neither
        (_cl(str(BODY + 1), full_body() + b" "), b"413", True),
        (_cl(str(BODY), full_body()), b"200", True),  # exactly the limit
        (_ce("identity"), b"200", True),
        (_ce("Identity"), b"200", True),
        (_ce(""), b"200", True),
        (_ce("gzip, identity"), b"415", True),
        (_ce("identity", "gzip"), b"415", True),
    ],
    ids=[
        "cl-0",
        "cl-spaces",
        "cl-negative",
        "cl-plus",
        "cl-10e30",
        "cl-list",
        "cl-twice",
        "chunked",
        "chunked-past-limit",
        "chunked-and-cl",
        "cl-limit+1",
        "cl-limit",
        "ce-identity",
        "ce-Identity",
        "ce-empty",
        "ce-gzip-identity",
        "ce-twice",
    ],
)
async def test_a_crafted_head_is_answered_and_lets_the_largest_body_through(
    request_: bytes, status: bytes, extender: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """`extender`: the extender answers (a refusal counted once); else aiohttp refuses the head itself."""
    caplog.set_level(logging.INFO)
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        answer = await exchange(base, request_)
        assert answer.split(b" ", 2)[1] == status, answer[:300]
        if extender and status != b"200":
            assert b"Connection: close" in answer
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1]).keys() == {"Error"}
        counted = 1.0 if extender and status != b"200" else 0.0
        assert await refusals(base) == counted
        assert errors(caplog) == []
        status_, out, _ = await post(base, full_body())
        assert status_ == 200, out


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_client_reset_mid_body_lets_its_bytes_go(framing: str) -> None:
    """A connection reset (RST, not a close) while its body is held: the bound is whole again."""
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        framed = (
            f"Content-Length: {BODY}\r\n\r\n{{"
            if framing == "length"
            else "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"
        )
        writer.write(f"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n{framed}".encode())
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 100")
        status, out, _ = await post(base, full_body())
        assert status == 503, out
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        for _ in range(600):  # the server notices on its next turn of the loop; bounded, never timed
            status, out, _ = await post(base, full_body())
            if status == 200:
                break
            await asyncio.sleep(0.05)
        assert status == 200, out


async def test_a_body_at_the_bound_and_one_byte_past_it(caplog: pytest.LogCaptureFixture) -> None:
    """Beside a held body, a request that brings the bytes to exactly the bound is read; one byte more is
    a 503; a request of 0 bytes is always read."""
    caplog.set_level(logging.INFO)
    async with served(Serving(max_body=BODY, max_in_flight=BODY + 10, read_timeout=30)) as base:
        reader, writer = await stalled(base)
        try:
            # The held body's BODY - 1 bytes leave 11.
            fits = await exchange(base, _cl("11", small()[:11]))
            assert fits.split(b" ", 2)[1] == b"400", fits  # read whole: 11 bytes are no JSON
            past = await exchange(base, _cl("12", small()[:12]))
            assert past.split(b" ", 2)[1] == b"503", past
            assert (await exchange(base, _cl("0", b""))).split(b" ", 2)[1] == b"400"
            writer.write(full_body()[-1:])
            await writer.drain()
            assert await status_of(reader) == b"200"
        finally:
            writer.close()
        assert errors(caplog) == []


@pytest.mark.parametrize("garbage", [b"zz\r\n", b"XX3\r\nabc\r\n0\r\n\r\n", b"5\r\nabcdeXX"])
async def test_a_chunked_body_broken_mid_body_is_a_400_and_no_traceback(
    garbage: bytes, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's Python parser (AIOHTTP_NO_EXTENSIONS, or no C extension for the platform) raises its
    framing error from the body's read: it escaped the reader as a 500 with an ERROR and a traceback. The
    C parser gives up on the framing without a word to the reader: its body waits out the deadline."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(web_protocol, "HttpRequestParser", http_parser.HttpRequestParserPy)
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(f'{HEAD}Transfer-Encoding: chunked\r\n\r\n5\r\n{{"a":\r\n'.encode())
            await writer.drain()
            await counted(base, 5)
            writer.write(garbage)
            await writer.drain()
            answer = await reader.read()
        finally:
            writer.close()
        assert answer.split(b" ", 2)[1] == b"400", answer[:300]
        assert b"Connection: close" in answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1]).keys() == {"Error"}
        assert await refusals(base) == 1.0
        assert errors(caplog) == []
        status, out, _ = await post(base, full_body())
        assert status == 200, out


def test_the_body_reader_imports_on_its_own() -> None:
    """It took compressed() from the extender's wire module, whose package imports the extender's server,
    which imports the body reader: imported first (as by a server of its own), it failed half-initialised."""
    done = subprocess.run(
        [sys.executable, "-c", "import nodefabric_operator.httpbody"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


async def test_a_verb_that_raises_lets_its_body_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault past the read (a 500, aiohttp's ERROR) still gives back the bytes of the body it was given."""

    def fault(*_: object) -> None:
        raise RuntimeError("fault")

    monkeypatch.setattr(Extender, "filter", fault)
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        async with aiohttp.ClientSession() as http, http.post(base + "/filter", data=full_body()) as resp:
            assert resp.status == 500
        assert READERS[base].in_flight.held == 0
        async with aiohttp.ClientSession() as http, http.post(base + "/prioritize", data=full_body()) as resp:
            assert resp.status == 200, await resp.text()


async def test_a_client_gone_before_its_interim_100_is_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A head with Expect: 100-continue, then a reset before the server wrote the 100: the write failed in
    the expect handler and aiohttp logged each such connection as an ERROR with its traceback."""
    caplog.set_level(logging.INFO)
    async with served(Serving(max_body=BODY, max_in_flight=BODY, read_timeout=30)) as base:
        host, port = base.removeprefix("http://").split(":")
        head = f"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {BODY}\r\n\r\n"
        for _ in range(5):  # the reset lands before the 100 is written nearly always; one of five is enough
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(head.encode())
            await writer.drain()
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            writer.transport.abort()
        status, out, _ = await post(base, full_body())  # after the five, on the server's loop
        assert status == 200, out
        assert errors(caplog) == []
