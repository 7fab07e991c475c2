"""A request body read under limits, for the two servers that take one from the cluster: the placement
webhook (AdmissionReviews from the API server) and the scheduler extender (ExtenderArgs from
kube-scheduler). Each answers a refusal in its own shape (`Refuse`); the steps and statuses are these:

- a compressed body (any Content-Encoding but identity) is 415 before a byte of it is read: neither
  sender compresses, and inflated it would be a thousand times the bytes sent (the runner never inflates
  a body, shell.server.runner: not even the rest of a refused one);
- a Content-Length past the limit is 413 at once, and so is a chunked body once it passes the limit;
- the bodies being read at once may hold `max_in_flight` bytes, counted as they arrive: a chunk that
  would pass the bound is 503 at once. Without the bound, each connection that sends most of a body and
  then waits makes the process hold that body until the deadline, enough of them until it is killed for
  memory. Counted at the Content-Length announced instead, a few connections that announce the largest
  body and send nothing held the whole bound for free: every request 503 for a deadline at a time (for
  the webhook under `failurePolicy: Ignore`, every pod created ungated meanwhile). The bytes are held
  until the answer is made: the body is in memory until then;
- a body not whole within the deadline is 408;
- a body whose chunked framing breaks mid-body is 400 (aiohttp's Python parser says so as the body is
  read; its C parser says nothing to the reader, and the body waits out the deadline);
- a client gone mid-body is 400 (answered to no one: the refusal is its one log line, not the ERROR and
  traceback aiohttp logs for a handler that raises).

Every refusal before the body is whole closes the connection: the rest of the body is not read (aiohttp
discards what comes within the runner's lingering second, so the answer reaches the client), so the
connection cannot carry another request.

A client that sends `Expect: 100-continue` waits for the server before it sends its body: the refusals
from the headers (and the 503 of a body the bound cannot hold now: its Content-Length past what is left,
or for a chunked body nothing left) answer it instead of the interim 100, so it is not invited to send a
body only to have it refused and discarded (`BodyReader.expect`). Nothing is taken from the bound then:
the bytes are counted as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from aiohttp import hdrs, web
from aiohttp.http import HttpProcessingError

# aiohttp's own answer to an Expect header (100 Continue, or 417 for any other expectation): delegated to
# for every request not refused, so those behave exactly as on a route without an expect handler.
from aiohttp.web_urldispatcher import _default_expect_handler

# (status, message) -> the server's answer; it counts and logs the refusal its own way.
Refuse = Callable[[int, str], web.Response]
# A route's expect_handler: None lets the request through to its handler, a response answers it instead.
ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


@dataclass(frozen=True)
class Limits:
    max_body: int
    deadline: float  # seconds for the whole body to arrive
    max_in_flight: int
    sender: str  # who sends these bodies ("the API server"), named in the Content-Encoding refusal
    content_type: str | None = None  # the one Content-Type accepted; None: not checked

    def __post_init__(self) -> None:
        if self.max_in_flight < self.max_body:
            raise ValueError(f"max_in_flight ({self.max_in_flight}) must hold one body ({self.max_body})")


class InFlight:
    """The bytes of the request bodies being read now, against the configured bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class _Body:
    """One request's bytes as they arrive, each chunk counted in the server's `InFlight` first."""

    def __init__(self, in_flight: InFlight) -> None:
        self.in_flight = in_flight
        self.data = bytearray()
        self.size = 0  # counted, until released: the bytes outlive `data` in the answer's hands

    def add(self, chunk: bytes) -> bool:
        if not self.in_flight.take(len(chunk)):
            return False
        self.data += chunk
        self.size += len(chunk)
        return True

    def whole(self) -> bytes:
        """The body, its buffer let go: kept, the buffer and its copy would both be held for the whole
        answer, twice what the bound counts."""
        raw = bytes(self.data)
        self.data = bytearray()
        return raw

    def others(self) -> int:
        """The bytes other requests' bodies hold now."""
        return self.in_flight.held - self.size

    def release(self) -> None:
        self.in_flight.give(self.size)
        self.size = 0
        self.data = bytearray()


class BodyReader:
    """Reads the request bodies of one server: its limits, and the one budget all its handlers share."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.in_flight = InFlight(limits.max_in_flight)

    async def answer(
        self, request: web.Request, refuse: Refuse, answer: Callable[[bytes], web.Response]
    ) -> web.Response:
        """`answer(body)`, or the refusal of a body that is not read whole (see the module's note)."""
        refused = self.unreadable(request)
        if refused is not None:
            return _closed(refuse(*refused))
        body = _Body(self.in_flight)
        try:
            raw = await self._read(request, body)
            if isinstance(raw, tuple):
                return _closed(refuse(*raw))
            return answer(raw)
        finally:
            body.release()

    def expect(self, refuse: Refuse) -> ExpectHandler:
        """The expect_handler of a route whose handler reads its body with `answer(request, refuse, ...)`.

        aiohttp answers the expect handler's response in place of the handler's: a request refused here is
        refused (counted, logged) once."""

        async def handle(request: web.Request) -> web.StreamResponse | None:
            if request.headers.get(hdrs.EXPECT, "").lower() == "100-continue":
                refused = self.unreadable(request) or self._full(request.content_length)
                if refused is not None:
                    return _closed(refuse(*refused))
            # A client gone before the 100 could be written: the handler's read says so in its one log
            # line, not aiohttp's ERROR and traceback for an expect handler that raises.
            with contextlib.suppress(ConnectionError):
                await _default_expect_handler(request)
            return None

        return handle

    def unreadable(self, request: web.Request) -> tuple[int, str] | None:
        """Why a request's body is not worth reading, from its headers alone, or None."""
        limits = self.limits
        if limits.content_type is not None and request.content_type != limits.content_type:
            # The header as sent: aiohttp reads one it cannot parse (a list) as application/octet-stream.
            sent = request.headers.get("Content-Type", "")
            return 415, f"Content-Type must be {limits.content_type}, got {sent!r:.80}"
        encoding = compressed(request.headers.getall("Content-Encoding", ()))
        if encoding is not None:
            return 415, f"request body has Content-Encoding {encoding!r:.80}: {limits.sender} sends it plain"
        if (request.content_length or 0) > limits.max_body:
            return 413, self._too_large
        return None

    async def _read(self, request: web.Request, body: _Body) -> bytes | tuple[int, str]:
        try:
            async with asyncio.timeout(self.limits.deadline):
                while chunk := await request.content.readany():
                    if body.size + len(chunk) > self.limits.max_body:
                        return 413, self._too_large
                    if not body.add(chunk):
                        return _busy(body.others())
                return body.whole()
        except TimeoutError:
            return 408, f"request body not received within {self.limits.deadline:g} s"
        except ConnectionError:
            return 400, "the client closed the connection before its body arrived"
        # aiohttp's Python parser: framing broken mid-body (raised as either, by where it broke)
        except (web.RequestPayloadError, HttpProcessingError) as exc:
            # The body ends here: else aiohttp's lingering close reads it again after the 400, the error
            # raised a second time, and logs that as an unhandled exception with its traceback.
            request.content.feed_eof()
            return 400, f"request body framing is broken: {str(exc).strip()!r:.120}"

    def _full(self, announced: int | None) -> tuple[int, str] | None:
        """The 503 of a body asked for that the bound cannot hold now: its Content-Length, or (chunked) not
        one byte of it. Sent, it would be refused as it came; a body of 0 bytes needs none of the bound."""
        held = self.in_flight.held
        needed = 1 if announced is None else announced
        return _busy(held) if needed and held + needed > self.in_flight.limit else None

    @property
    def _too_large(self) -> str:
        return f"request body larger than {self.limits.max_body} bytes"


def compressed(content_encoding: Iterable[str]) -> str | None:
    """The request's Content-Encoding values joined when any is not identity, else None. aiohttp would
    inflate the body as it is read: 64 KiB of gzip is 64 MiB of JSON to decode, work a thousand times the
    bytes sent, and neither kube-scheduler nor the API server compresses a request."""
    values = list(content_encoding)
    if all(v.strip().lower() in ("", "identity") for v in values):
        return None
    return ", ".join(values)


def _busy(others: int) -> tuple[int, str]:
    return 503, f"{others:,} bytes of other request bodies are being read; try again"


def _closed(resp: web.Response) -> web.Response:
    resp.force_close()
    return resp
