"""The mutating webhook over real HTTPS, served as `nodefabric placement` serves it (its runner and
connection limits), against AdmissionReview bodies a real API server could send and ones an attacker
crafts: each answer is an AdmissionReview with the request's uid, or a 4xx/503 saying what is wrong, and
the server keeps serving. The JSONPatch it returns applies to the pod it was given."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from aiohttp import web
from world_fixtures import free_port, make_ca, make_server_cert, until

from nodefabric_operator.admission.webhook import BODIES, WebhookConfig, build_webhook_app, ssl_context
from nodefabric_operator.extender.server import runner
from nodefabric_operator.httpbody import BodyReader

GATE = "placement.gpustack.ai/group"
JOB = {"batch.kubernetes.io/job-name": "train"}
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
LOGGER = "nodefabric_operator.admission.webhook"


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "w0", "namespace": "ml", "labels": dict(JOB if labels is None else labels)},
        "spec": {"containers": [{"name": "c", "image": "img"}], **spec},
    }


def review(obj: Any = None, **request: Any) -> dict[str, Any]:
    req = {
        "uid": UID,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ml",
        "object": pod() if obj is None else obj,
        **request,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    d = tmp_path_factory.mktemp("certs")
    ca = make_ca(d)
    cert, key = make_server_cert(d, ca)
    yield {"ca": ca[0], "cert": cert, "key": key}


# The body readers of the webhooks running, by base URL: a test that holds a body waits until the bytes
# it sent are counted (they are counted as the webhook reads them, on its own turn of the loop).
READERS: dict[str, BodyReader] = {}


@contextlib.asynccontextmanager
async def webhook(certs: dict[str, Path], config: WebhookConfig | None = None) -> AsyncIterator[str]:
    """The webhook on https://127.0.0.1:<port>, with the runner `nodefabric placement` uses."""
    app = build_webhook_app(config or WebhookConfig())
    hook = runner(app)
    await hook.setup()
    port = free_port()
    await web.TCPSite(hook, "127.0.0.1", port, ssl_context=ssl_context(certs["cert"], certs["key"])).start()
    base = f"https://127.0.0.1:{port}"
    READERS[base] = app[BODIES]
    try:
        yield base
    finally:
        READERS.pop(base, None)
        await hook.cleanup()


def client_ssl(certs: dict[str, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs["ca"]))


async def post(
    base: str, certs: dict[str, Path], body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            base + "/mutate-pods",
            data=body,
            headers={"Content-Type": "application/json", **(headers or {})},
            ssl=client_ssl(certs),
        ) as resp,
    ):
        return resp.status, await resp.json()


async def answered(base: str, certs: dict[str, Path], body: dict[str, Any]) -> dict[str, Any]:
    """The response of a review that must be answered 200, with its own uid and allowed."""
    status, out = await post(base, certs, json.dumps(body).encode())
    assert status == 200, out
    assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response: dict[str, Any] = out["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True
    return response


async def still_serves(base: str, certs: dict[str, Path]) -> None:
    assert "patch" in await answered(base, certs, review())


# --- bodies no API server writes ---------------------------------------------------------------------------


def _encoded(encoding: str) -> bytes:
    return json.dumps(review()).encode(encoding)


def _spliced(value: bytes) -> bytes:
    return json.dumps(review(pod(priority=0))).encode().replace(b'"priority": 0', b'"priority": ' + value)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_encoded("utf-16"), "request body is not JSON: it is not UTF-8 (invalid start byte at byte 0)"),
        (_encoded("utf-16-le"), "request body is not JSON: "),
        (_encoded("utf-32"), "request body is not JSON: it is not UTF-8 (invalid start byte at byte 0)"),
        (_encoded("utf-8-sig"), "request body is not JSON: Unexpected UTF-8 BOM"),
        (
            json.dumps(review()).encode().replace(b'"w0"', b'"w\xed\xa0\x80"'),
            "request body is not JSON: it is not UTF-8 (invalid continuation byte",
        ),
        (_spliced(b"NaN"), "request body is not JSON: NaN is not JSON"),
        (_spliced(b"-Infinity"), "request body is not JSON: -Infinity is not JSON"),
        (_spliced(b"1e999"), "request body is not JSON: the number '1e999' is beyond float64"),
        (_spliced(b"9" * 100_000), "request body is not JSON: a number of 100,000 digits"),
    ],
    ids=["utf16", "utf16le", "utf32", "utf8-bom", "surrogate", "nan", "infinity", "1e999", "long-int"],
)
async def test_a_body_that_is_not_the_api_servers_json_is_a_400(
    certs: dict[str, Path], body: bytes, says: str
) -> None:
    """Python's json.loads(bytes) takes UTF-16, UTF-32 and surrogates, NaN and Infinity, none of which the
    API server's encoder writes: each was answered 200 as a review."""
    async with webhook(certs) as base:
        status, out = await post(base, certs, body)
        assert status == 400, out
        assert out["error"].startswith(says), out
        await still_serves(base, certs)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "identity, gzip"])
async def test_a_compressed_body_is_a_415_unread(certs: dict[str, Path], encoding: str) -> None:
    """The API server never compresses a review; aiohttp inflated one as it read it, 7 KiB of gzip to
    7 MiB of JSON."""
    small = gzip.compress(json.dumps(review()).encode())
    async with webhook(certs) as base:
        status, out = await post(base, certs, small, {"Content-Encoding": encoding})
        assert status == 415, out
        assert out["error"] == (
            f"request body has Content-Encoding {encoding!r}: the API server sends it plain"
        )
        await still_serves(base, certs)


async def test_a_body_said_to_be_gzip_that_is_not_is_a_415_and_no_traceback(
    certs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """After the 415 aiohttp went on reading the body it was not asked for (its lingering close) and
    inflated it as it read: a body that is not gzip was an ERROR and three tracebacks per request, and a
    gzip bomb a second of the event loop's time."""
    caplog.set_level(logging.INFO)
    body = b"not gzip at all" * 64
    async with webhook(certs) as base:
        reader, writer = await _open(base, certs)
        writer.write(_head(len(body), "Content-Encoding: gzip") + body)
        await writer.drain()
        try:
            answer = await reader.read()  # to the end: the server closed it once done with the body
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 415"), answer[:200]
        assert b"Connection: close" in answer
        assert answer.endswith(
            b'{"error": "request body has Content-Encoding \'gzip\': the API server sends it plain"}'
        )
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        await still_serves(base, certs)


async def test_an_identity_content_encoding_is_read(certs: dict[str, Path]) -> None:
    async with webhook(certs) as base:
        status, _ = await post(base, certs, json.dumps(review()).encode(), {"Content-Encoding": "identity"})
        assert status == 200


async def test_a_chunked_body_is_read_and_one_past_the_limit_is_a_413(certs: dict[str, Path]) -> None:
    """No Content-Length: the body is read up to the limit as it comes."""

    async def chunks(pad: int) -> AsyncIterator[bytes]:
        for _ in range(pad):
            yield b" " * 2**20
        yield json.dumps(review()).encode()

    async with webhook(certs) as base, aiohttp.ClientSession() as http:
        for pad, want in ((0, 200), (10, 413)):
            async with http.post(
                base + "/mutate-pods",
                data=chunks(pad),
                headers={"Content-Type": "application/json"},
                ssl=client_ssl(certs),
            ) as resp:
                assert resp.status == want, await resp.text()
        await still_serves(base, certs)


# --- what the answer holds --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gates",
    [None, [], [{"name": "example.com/other"}], [{"name": f"example.com/g{i}"} for i in range(1000)]],
    ids=["absent", "empty", "one-other", "1000-others"],
)
async def test_the_patch_applies_to_the_pod_it_was_given(certs: dict[str, Path], gates: Any) -> None:
    the_pod = pod() if gates is None else pod(schedulingGates=gates)
    async with webhook(certs) as base:
        response = await answered(base, certs, review(the_pod))
    patch = jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"])))
    patched = patch.apply(the_pod)
    assert patched["spec"]["schedulingGates"] == [*(gates or []), {"name": GATE}]


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": {"name": "w0", "labels": JOB}},
        {"metadata": {"name": "w0", "labels": JOB}, "spec": None},
    ],
    ids=["no-spec", "null-spec"],
)
async def test_a_pod_without_a_spec_gets_no_patch(certs: dict[str, Path], obj: dict[str, Any]) -> None:
    """The patch adds /spec/schedulingGates, which cannot apply where /spec is not an object: the API
    server would fail the pod's creation on the webhook's patch instead of its own validation."""
    async with webhook(certs) as base:
        response = await answered(base, certs, review(obj))
    assert response == {"uid": UID, "allowed": True}


@pytest.mark.parametrize(
    "request_",
    [
        # A pod that removes our gate itself: by design the webhook refuses nothing; the placement process
        # does not count a member ungated by hand (README, "Whole or nothing").
        {"operation": "UPDATE", "oldObject": pod(schedulingGates=[{"name": GATE}])},
        # A pod that adds our gate on update: the API server itself refuses a gate added after creation.
        {"operation": "UPDATE", "object": pod(schedulingGates=[{"name": GATE}]), "oldObject": pod()},
        {"operation": "UPDATE"},  # no oldObject
        {"operation": "DELETE", "object": None, "oldObject": pod()},
        {
            "operation": "CONNECT",
            "kind": {"group": "", "version": "v1", "kind": "PodExecOptions"},
            "object": {"kind": "PodExecOptions", "command": ["sh"]},
        },
    ],
    ids=["update-removes-gate", "update-adds-gate", "update-without-old", "delete", "connect"],
)
async def test_other_operations_are_allowed_untouched(
    certs: dict[str, Path], request_: dict[str, Any]
) -> None:
    async with webhook(certs) as base:
        response = await answered(base, certs, review(**request_))
    assert response == {"uid": UID, "allowed": True}


async def test_a_dry_run_creation_is_gated_like_any(certs: dict[str, Path]) -> None:
    """sideEffects: None: the answer to a dry run is the answer to the creation."""
    async with webhook(certs) as base:
        assert "patch" in await answered(base, certs, review(dryRun=True))


# --- connections ------------------------------------------------------------------------------------------


async def _open(base: str, certs: dict[str, Path]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = base.removeprefix("https://").split(":")
    return await asyncio.open_connection(host, int(port), ssl=client_ssl(certs))


def _head(length: int, *extra: str) -> bytes:
    lines = [
        "POST /mutate-pods HTTP/1.1",
        "Host: webhook",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_client_gone_mid_body_is_one_warning_not_a_traceback(
    certs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A client that closes its connection halfway through its body: the read failed with
    ConnectionResetError, which aiohttp logged as an ERROR with a traceback (a 500), once per client."""
    caplog.set_level(logging.INFO)
    async with webhook(certs) as base:
        _, writer = await _open(base, certs)
        writer.write(_head(1000) + b"{")
        await writer.drain()
        writer.close()

        def told() -> list[logging.LogRecord]:
            return [
                r
                for r in caplog.records
                if r.levelno >= logging.ERROR or r.__dict__.get("error", "").startswith("the client closed")
            ]

        await until(lambda: bool(told()), what="the webhook to notice the client went away")
        [record] = told()
        assert (record.name, record.levelno) == (LOGGER, logging.WARNING)
        assert record.__dict__["error"] == "the client closed the connection before its body arrived"
        await still_serves(base, certs)


async def test_the_bodies_read_at_once_are_bounded(certs: dict[str, Path]) -> None:
    """Each connection that sent most of a 7 MiB body and then waited made the process hold it until the
    body timeout: a few dozen such connections from anywhere in the cluster held hundreds of MiB, enough to
    get the placement process killed for memory. The bytes being read at once are bounded; past the bound
    a review is answered 503 at once, and served again once the bodies before it are read."""
    config = WebhookConfig(max_body=4096, max_in_flight=4096)
    async with webhook(certs, config) as base:
        reader, writer = await _held(base, certs)
        try:
            status, out = await post(base, certs, json.dumps(review()).encode())
            assert status == 503, out
            assert out["error"] == "4,095 bytes of other request bodies are being read; try again"
            writer.write(b"\xff")  # the slow body ends (as no JSON): its bytes are let go
            await writer.drain()
            assert await _status_of(reader) == b"400"
        finally:
            writer.close()
        await still_serves(base, certs)


@pytest.mark.parametrize("sent", ["application/json, text/plain", "text/plain", ""])
async def test_a_wrong_content_type_is_quoted_as_sent(certs: dict[str, Path], sent: str) -> None:
    """aiohttp reads a Content-Type it cannot parse (a list) as application/octet-stream: the refusal quoted
    that, not what the client sent."""
    async with webhook(certs) as base:
        status, out = await post(base, certs, _full_review(), {"Content-Type": sent})
        assert status == 415, out
        assert out["error"] == f"Content-Type must be application/json, got {sent!r}"


async def test_reviews_announced_and_not_sent_hold_nothing(certs: dict[str, Path]) -> None:
    """Counted at the Content-Length announced, four connections from any pod that announced 7 MiB and
    sent nothing held the whole bound: every review a 503 for the body timeout, and under the chart's
    `failurePolicy: Ignore` every pod created meanwhile went ungated. The bytes are counted as they
    arrive."""
    async with webhook(certs, WebhookConfig(max_body=4096, max_in_flight=4096)) as base:
        idle = []
        try:
            for _ in range(5):
                reader, writer = await _open(base, certs)
                writer.write(_head(4096, "Expect: 100-continue"))
                await writer.drain()
                assert (await reader.readline()).startswith(b"HTTP/1.1 100")
                idle.append(writer)
            assert READERS[base].in_flight.held == 0
            status, out = await post(base, certs, _full_review())
            assert status == 200, out
        finally:
            for writer in idle:
                writer.close()


async def _held(base: str, certs: dict[str, Path]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose review announced 4096 bytes and sent all but the last; returns once the webhook
    holds them. No Expect: 100-continue: beside another held body the bound may not hold this one whole,
    and it would be refused from its head."""
    reader, writer = await _open(base, certs)
    writer.write(_head(4096) + _full_review()[:-1])
    await writer.drain()
    await until(lambda: READERS[base].in_flight.held >= 4095, what="the webhook to hold the body's bytes")
    return reader, writer


def _full_review() -> bytes:
    """A review padded to exactly 4096 bytes: the largest the bounded webhooks here accept."""
    raw = json.dumps(review()).encode()
    return raw + b" " * (4096 - len(raw))


async def _status_of(reader: asyncio.StreamReader) -> bytes:
    """The status of the final answer on a raw connection, past the interim 100: aiohttp answers a
    request it cannot parse in HTTP/1.0."""
    while not (line := await reader.readline()).startswith((b"HTTP/1.1 2", b"HTTP/1.1 4", b"HTTP/1.0 4")):
        assert line, "the connection closed unanswered"
    return line.split()[1]


@pytest.mark.parametrize(
    ("how", "answer"), [("whole", b"200"), ("garbage", b"400"), ("deadline", b"408"), ("gone", None)]
)
async def test_a_held_body_lets_its_bytes_go_however_it_ends(
    certs: dict[str, Path], caplog: pytest.LogCaptureFixture, how: str, answer: bytes | None
) -> None:
    """The bound holds one body: the largest review after the held one ends is answered only when not a
    byte of the held one is still counted."""
    caplog.set_level(logging.INFO)
    config = WebhookConfig(max_body=4096, max_in_flight=4096, body_timeout=0.5 if how == "deadline" else 30)
    async with webhook(certs, config) as base:
        reader, writer = await _held(base, certs)
        try:
            status, out = await post(base, certs, _full_review())
            assert status == 503, out
            if how == "gone":
                writer.close()
                gone = "the client closed the connection before its body arrived"
                await until(
                    lambda: any(r.__dict__.get("error") == gone for r in caplog.records),
                    what="the webhook to notice the client went away",
                )
            else:
                writer.write({"whole": _full_review()[-1:], "garbage": b"\xff", "deadline": b""}[how])
                await writer.drain()
                assert await _status_of(reader) == answer
        finally:
            writer.close()
        status, out = await post(base, certs, _full_review())
        assert status == 200, out


@pytest.mark.parametrize(
    ("length", "answer"),
    [
        (10, b"400"),  # fewer bytes than sent: the rest is no request (aiohttp's 400, the connection closed)
        (4097, b"413"),  # announced past the limit: refused before it is read
        ("abc", b"400"),  # no number: aiohttp refuses the request before the handler
    ],
)
async def test_a_wrong_content_length_is_refused_and_the_largest_review_still_served(
    certs: dict[str, Path], length: int | str, answer: bytes
) -> None:
    async with webhook(certs, WebhookConfig(max_body=4096, max_in_flight=4096)) as base:
        reader, writer = await _open(base, certs)
        head = _head(0).replace(b"Content-Length: 0", f"Content-Length: {length}".encode())
        writer.write(head + json.dumps(review()).encode())
        await writer.drain()
        try:
            assert await _status_of(reader) == answer
        finally:
            writer.close()
        status, out = await post(base, certs, _full_review())
        assert status == 200, out


async def test_many_concurrent_reviews_each_get_their_own_uid(certs: dict[str, Path]) -> None:
    """A burst (a Job of hundreds of pods created at once) is answered whole, each review with its uid."""
    async with webhook(certs) as base, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one(i: int) -> tuple[int, str]:
            body = review(uid=f"uid-{i}")
            async with http.post(
                base + "/mutate-pods",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
                ssl=client_ssl(certs),
            ) as resp:
                out = await resp.json()
                return resp.status, out["response"]["uid"]

        answers = await asyncio.gather(*(one(i) for i in range(200)))
    assert answers == [(200, f"uid-{i}") for i in range(200)]


# --- Expect: 100-continue ---------------------------------------------------------------------------------


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """The next answer on a raw connection, the first line it reads (an interim 100 included): status,
    headers (lowercase names), body."""
    status = (await reader.readline()).split()[1]
    headers: dict[str, str] = {}
    while (line := await reader.readline()).strip():
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, await reader.readexactly(int(headers.get("content-length", 0)))


@pytest.mark.parametrize(
    ("head", "status", "error"),
    [
        (_head(4097, "Expect: 100-continue"), b"413", "request body larger than 4096 bytes"),
        (
            _head(100, "Content-Encoding: gzip", "Expect: 100-continue"),
            b"415",
            "request body has Content-Encoding 'gzip': the API server sends it plain",
        ),
        (
            _head(100, "Expect: 100-continue").replace(b"application/json", b"text/plain"),
            b"415",
            "Content-Type must be application/json, got 'text/plain'",
        ),
    ],
    ids=["too-large", "gzip", "content-type"],
)
@pytest.mark.parametrize("path", ["/mutate-pods", "/mutate-pods/explicit"])
async def test_a_review_refused_from_its_headers_is_refused_before_the_client_sends_it(
    certs: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
    *,
    head: bytes,
    status: bytes,
    error: str,
    path: str,
) -> None:
    """aiohttp answered `Expect: 100-continue` with an interim 100 before the handler ran: the client was
    invited to send a body that was then refused from headers the webhook already had, and read and
    discarded for the lingering second. The refusal is the answer to the headers, logged once."""
    caplog.set_level(logging.INFO)
    async with webhook(certs, WebhookConfig(max_body=4096, max_in_flight=4096)) as base:
        reader, writer = await _open(base, certs)
        writer.write(head.replace(b"POST /mutate-pods ", f"POST {path} ".encode()))
        await writer.drain()
        try:
            got, answered, body = await _answer(reader)
            assert got == status, body  # the final answer, no interim 100 before it
            assert json.loads(body) == {"error": error}
            assert answered["connection"] == "close"
            assert await reader.read() == b""  # nothing after it: the connection is closed
        finally:
            writer.close()
        assert [r.__dict__.get("error") for r in caplog.records if r.name == LOGGER] == [error]
        await still_serves(base, certs)


async def test_a_review_asked_for_while_the_bound_is_full_is_a_503_before_it_is_sent(
    certs: dict[str, Path],
) -> None:
    """Not a byte of it could be counted: the client is told so before it sends any."""
    async with webhook(certs, WebhookConfig(max_body=4096, max_in_flight=8190)) as base:
        held = [await _held(base, certs), await _held(base, certs)]  # 4095 bytes each: the bound is full
        try:
            await until(lambda: READERS[base].in_flight.held == 8190, what="the webhook to hold both bodies")
            reader, writer = await _open(base, certs)
            writer.write(_head(4096, "Expect: 100-continue"))
            await writer.drain()
            got, answered, body = await _answer(reader)
            writer.close()
            assert got == b"503", body
            assert json.loads(body) == {
                "error": "8,190 bytes of other request bodies are being read; try again"
            }
            assert answered["connection"] == "close"
        finally:
            for _, w in held:
                w.close()


async def test_a_readable_review_is_still_asked_for_and_answered(certs: dict[str, Path]) -> None:
    async with webhook(certs, WebhookConfig(max_body=4096, max_in_flight=4096)) as base:
        reader, writer = await _open(base, certs)
        writer.write(_head(4096, "Expect: 100-continue"))
        await writer.drain()
        try:
            assert (await _answer(reader))[0] == b"100"
            writer.write(_full_review())
            await writer.drain()
            status, _, body = await _answer(reader)
            assert status == b"200", body
            assert json.loads(body)["response"]["uid"] == UID
        finally:
            writer.close()


async def test_another_expectation_is_aiohttps_417_even_for_a_review_too_large(
    certs: dict[str, Path],
) -> None:
    """Only 100-continue is refused from the headers; any other expectation is refused as aiohttp does."""
    async with webhook(certs, WebhookConfig(max_body=4096, max_in_flight=4096)) as base:
        reader, writer = await _open(base, certs)
        writer.write(_head(4097, "Expect: 200-ok"))
        await writer.drain()
        try:
            status, _, body = await _answer(reader)
            assert (status, body) == (b"417", b"Unknown Expect: 200-ok")
        finally:
            writer.close()
