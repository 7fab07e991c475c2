"""One watch request, written to its HTTP response as the API server streams it.

Events are JSON lines (`{"type": ..., "object": ...}`) with `Content-Type: application/json` (client-go
picks its stream decoder by it: without it kubectl says "no stream serializers"), or Tables when
kubectl asks for `as=Table`. The stream ends at `timeoutSeconds`, when the client goes away, when the
API closes it (the client then resumes from the last resourceVersion it saw), or with an ERROR event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp.web

from nodefabric_operator.demo.kubeapi import errors
from nodefabric_operator.demo.kubeapi.catalogue import ResourceType
from nodefabric_operator.demo.kubeapi.store import Watcher, meta
from nodefabric_operator.demo.kubeapi.tables import render_table

TABLE_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class WatchStream:
    rt: ResourceType
    watcher: Watcher
    current_rv: Callable[[], int]  # the API's newest resourceVersion, for bookmarks
    last_rv: int  # the resourceVersion this watch is known to have reached
    table: bool = False
    include: str = "Metadata"
    bookmarks: bool = False
    bookmark_interval: float = 60.0
    _response: aiohttp.web.StreamResponse | None = None
    _columns_sent: bool = False

    async def run(
        self,
        raw: aiohttp.web.BaseRequest,
        backlog: list[tuple[str, dict[str, Any]]],
        expired: errors.ApiError | None,
        *,
        timeout: float | None,
        initial_bookmark: bool,
    ) -> aiohttp.web.StreamResponse:
        response = self._response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "application/json"
        if self.table:
            response.headers["Content-Type"] = TABLE_TYPE
        response.enable_chunked_encoding()
        try:
            await response.prepare(raw)  # the client may be gone already (kubectl -w interrupted)
            if expired is not None:
                await self._send("ERROR", expired.status())
            else:
                for kind, obj in backlog:
                    await self._event(kind, obj)
                if initial_bookmark:
                    await self._send("BOOKMARK", self._bookmark({INITIAL_EVENTS_END: "true"}))
                await self._follow(raw, timeout)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away: nothing more to say to it
        return response

    async def _follow(self, raw: aiohttp.web.BaseRequest, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        last_write = time.monotonic()
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if raw.transport is None or raw.transport.is_closing():
                return
            # Wake at least every second: to notice a client that went away, and for bookmarks.
            wait = min(1.0, self.bookmark_interval, float("inf") if deadline is None else deadline - now)
            item = await self.watcher.next(max(wait, 0.01))
            if item is None:
                if self.watcher.expired:
                    expired = errors.expired(str(self.last_rv), self.current_rv())
                    await self._send("ERROR", expired.status())
                return
            if item is False:
                due = time.monotonic() - last_write >= self.bookmark_interval
                if self.bookmarks and not self.table and due and self.current_rv() > self.last_rv:
                    await self._send("BOOKMARK", self._bookmark())
                    last_write = time.monotonic()
                continue
            assert not isinstance(item, bool)
            await self._event(*item)
            last_write = time.monotonic()

    def _bookmark(self, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        self.last_rv = max(self.last_rv, self.current_rv())
        m: dict[str, Any] = {"resourceVersion": str(self.last_rv)}
        if annotations:
            m["annotations"] = annotations
        return {"kind": self.rt.kind, "apiVersion": self.rt.group_version, "metadata": m}

    async def _event(self, kind: str, obj: dict[str, Any]) -> None:
        rv = meta(obj).get("resourceVersion") or ""
        self.last_rv = max(self.last_rv, int(rv) if rv.isdigit() else 0)
        if self.table:
            columns = not self._columns_sent
            self._columns_sent = True
            table = render_table(
                [obj], self.rt.columns, {"resourceVersion": rv}, include=self.include, definitions=columns
            )
            await self._send(kind, table)
        else:
            await self._send(kind, obj)

    async def _send(self, kind: str, obj: dict[str, Any]) -> None:
        assert self._response is not None
        await self._response.write(dumps({"type": kind, "object": obj}) + b"\n")
