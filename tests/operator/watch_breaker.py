"""An HTTP proxy in front of the embedded API that ends watches the way a real API server does, and
refuses what RBAC would.

`expire_watches()` sends every open watch the `410 Gone` ERROR event an API server sends when the
watch's resourceVersion has been compacted away, and closes it. kopf then lists the resource again and
hands every object to its handlers once more: the watch replay whose cost the operator must keep at zero
requests. Everything else is passed through unchanged, so `RunningAPI.count()` still counts every
request the operator made, and the proxy counts the bytes it carried in each direction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from nodefabric_operator.demo.kubeapi import write_kubeconfig

GONE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version",
        "reason": "Expired",
        "code": 410,
    },
}
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class WatchBreaker:
    upstream: str
    url: str = ""
    kubeconfig: str = ""
    bytes_up: int = 0  # request bodies sent to the API
    bytes_down: int = 0  # response bodies (watch events included) sent back
    _open: set[asyncio.Event] = field(default_factory=set)
    refused: int = 0  # requests answered by `refuse`
    poison: bytes = b""  # when set, what every watch request is answered with, and nothing more
    _last_line: bytes = json.dumps(GONE).encode() + b"\n"  # what an ended watch is sent last
    _refusals: list[tuple[str, str, int, dict[str, str]]] = field(default_factory=list)
    _delays: list[tuple[str, str, float]] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None

    def refuse(self, method: str, path: str, status: int, headers: dict[str, str] | None = None) -> None:
        """Answer every `method` request whose path starts with `path` with `status` (say, RBAC's 403),
        and `headers` (a 429's Retry-After)."""
        self._refusals.append((method, path, status, headers or {}))

    def delay(self, method: str, path: str, seconds: float) -> None:
        """Hold every `method` request (not a watch) whose path starts with `path` for `seconds` before
        forwarding it (a slow API server, a list of many objects)."""
        self._delays.append((method, path, seconds))

    def allow(self) -> None:
        """Refuse and delay nothing any more."""
        self._refusals.clear()
        self._delays.clear()
        self.poison = b""

    @property
    def open_watches(self) -> int:
        return len(self._open)

    def expire_watches(self) -> int:
        """End every open watch with 410 Gone; how many there were."""
        return self.end_watches(json.dumps(GONE).encode() + b"\n")

    def end_watches(self, last: bytes) -> int:
        """End every open watch with `last` (an ERROR event of another kind, a line that is no JSON) as
        its last line; how many there were."""
        self._last_line = last
        count = len(self._open)
        for gone in list(self._open):
            gone.set()
        return count

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        for method, path, status, extra in self._refusals:
            if request.method == method and request.path.startswith(path):
                self.refused += 1
                body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status}
                return web.json_response(body, status=status, headers=extra)
        body = await request.read()
        self.bytes_up += len(body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        is_watch = request.query.get("watch") in ("true", "1")
        if is_watch and self.poison:
            return web.Response(status=200, body=self.poison, content_type="application/json")
        for method, path, seconds in self._delays:
            if not is_watch and request.method == method and request.path.startswith(path):
                await asyncio.sleep(seconds)
        timeout = aiohttp.ClientTimeout(total=None if is_watch else 60)
        # Forward the request as sent: aiohttp would label a body without a Content-Type (the Python
        # client sends some so) as application/octet-stream, which an API server refuses (415).
        as_sent = () if any(k.lower() == "content-type" for k in headers) else ("Content-Type",)
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.path_qs,
            headers=headers,
            data=body,
            timeout=timeout,
            skip_auto_headers=as_sent,
        ) as upstream:
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            if not is_watch or upstream.status != 200:
                data = await upstream.read()
                self.bytes_down += len(data)
                return web.Response(status=upstream.status, body=data, headers=out_headers)
            response = web.StreamResponse(status=200, headers=out_headers)
            await response.prepare(request)
            gone = asyncio.Event()
            self._open.add(gone)
            try:
                await self._relay(upstream, response, gone)
            finally:
                self._open.discard(gone)
            return response

    async def _relay(
        self, upstream: aiohttp.ClientResponse, response: web.StreamResponse, gone: asyncio.Event
    ) -> None:
        expired = asyncio.ensure_future(gone.wait())
        try:
            while True:
                line = asyncio.ensure_future(upstream.content.readline())
                done, _ = await asyncio.wait({line, expired}, return_when=asyncio.FIRST_COMPLETED)
                if expired in done:
                    line.cancel()
                    data = self._last_line
                    self.bytes_down += len(data)
                    await response.write(data)
                    await response.write_eof()
                    return
                chunk = line.result()
                if not chunk:
                    await response.write_eof()
                    return
                self.bytes_down += len(chunk)
                await response.write(chunk)
        except (ConnectionError, aiohttp.ClientError):
            return  # the client went away: nothing to relay to
        finally:
            expired.cancel()


@contextlib.asynccontextmanager
async def watch_breaker(upstream: str) -> AsyncIterator[WatchBreaker]:
    """Serve the proxy on 127.0.0.1 with a kubeconfig pointing at it."""
    breaker = WatchBreaker(upstream.rstrip("/"))
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", breaker._forward)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory(prefix="nf-proxy-") as directory:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            breaker._session = session
            breaker.url = f"http://127.0.0.1:{port}"
            breaker.kubeconfig = write_kubeconfig(breaker.url, directory)
            try:
                yield breaker
            finally:
                breaker.expire_watches()
                await runner.cleanup()
