"""The agent's watch of its own object against an API server that fails or answers garbage, over real HTTP:
a failed watch, a 410 Gone and an event of an odd shape each cost one reconnect, never the watch itself
(a watch task that ends leaves the agent blind to hand edits and deletes until it restarts)."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nodefabric_devicemanager import nodeclient
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.agent.watch import ObjectWatch
from nodefabric_devicemanager.nodeclient import Backoff

NODE = "gpu-node-1"
GOOD = {"type": "MODIFIED", "object": {"metadata": {"name": NODE, "resourceVersion": "99"}}}


@contextlib.contextmanager
def scripted_api(watches: list[tuple[int, list[Any]]]) -> Iterator[tuple[str, list[str]]]:
    """An API server whose n-th watch request gets `watches[n]` (status, event lines; a str is sent as it
    is), then the good event forever after; every list answers one object at resourceVersion 5."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.append(self.path)
            status, lines = 200, [json.dumps({"metadata": {"resourceVersion": "5"}, "items": []})]
            if "watch=true" in self.path:
                n = sum("watch=true" in p for p in seen) - 1
                status, events = watches[n] if n < len(watches) else (200, [GOOD])
                lines = [e if isinstance(e, str) else json.dumps(e) for e in events]
            body = "".join(line + "\n" for line in lines).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


async def watch_until_good(url: str) -> tuple[ObjectWatch, list[dict[str, Any]]]:
    """Run the real watch against `url` until it delivers the good event; fails if the watch ends first."""
    client = DevicesClient(nodeclient.Api(nodeclient.Credentials(url)))
    events: list[dict[str, Any]] = []
    got = asyncio.Event()

    def on_event(event: dict[str, Any]) -> None:
        events.append(event)
        if event == GOOD:
            got.set()

    async def relist() -> None:
        _, version = await asyncio.to_thread(client.list_one, NODE)
        watch.since = version

    watch = ObjectWatch(client, NODE, on_event, relist, backoff=Backoff(base=0.01, cap=0.05))
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        waiter = asyncio.ensure_future(got.wait())
        await asyncio.wait({task, waiter}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            pytest.fail(f"the watch ended: {task.exception()!r}")
        assert got.is_set(), "the good event never arrived"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    return watch, events


@pytest.mark.parametrize(
    ("status", "events"),
    [
        (500, []),  # the API server restarting: the watch request fails
        (410, []),  # too old to resume from: list again
        (200, [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}]),
        (200, [{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd changed"}}]),
    ],
    ids=["http-500", "http-410", "error-event-410", "error-event-500"],
)
async def test_a_failed_or_expired_watch_reconnects_and_keeps_watching(status, events, caplog):
    caplog.set_level(logging.INFO)  # the reconnect's own log lines must be written, not skipped
    with scripted_api([(status, events)]) as (url, _):
        watch, _ = await watch_until_good(url)
    assert watch.connects >= 2


@pytest.mark.parametrize(
    "garbage",
    [
        {"type": "MODIFIED", "object": {"metadata": "not an object"}},
        {"type": "MODIFIED", "object": {"metadata": {"name": NODE, "resourceVersion": {"a": 1}}}},
        {"type": "ERROR", "object": "not a Status"},
        {"type": "ERROR", "object": {"code": {"a": 1}}},
        {"type": "BOOKMARK", "object": {"metadata": ["x"]}},
        "[1, 2, 3]",
        "not json at all",
    ],
    ids=["metadata-str", "rv-object", "error-str", "error-code", "bookmark-list", "json-list", "not-json"],
)
async def test_a_watch_event_of_an_odd_shape_costs_a_reconnect_not_the_watch(garbage, caplog):
    caplog.set_level(logging.INFO)
    with scripted_api([(200, [garbage])]) as (url, _):
        _, events = await watch_until_good(url)
    assert events[-1] == GOOD
    assert all(isinstance((e.get("object") or {}).get("metadata"), dict) for e in events), (
        "an event whose object has no metadata object is never handed to the agent"
    )


@pytest.mark.parametrize("answer", [(200, []), (410, [])], ids=["closed-at-once", "gone-forever"])
async def test_a_watch_that_ends_at_once_every_time_is_paced_not_a_hot_loop(answer):
    """A proxy that closes every stream at once, or an API server that answers 410 to every resume: each
    quick end after the first counts toward the backoff. Unpaced, this was hundreds of requests a second
    from one node; a slower machine only lowers the count, so the bound cannot fail on a loaded one."""
    with scripted_api([answer] * 100_000) as (url, seen):
        client = DevicesClient(nodeclient.Api(nodeclient.Credentials(url)))

        async def relist() -> None:
            _, version = await asyncio.to_thread(client.list_one, NODE)
            watch.since = version

        watch = ObjectWatch(client, NODE, lambda _: None, relist, backoff=Backoff(base=0.25, cap=0.5))
        stop = asyncio.Event()
        task = asyncio.create_task(watch.run(stop))
        await asyncio.sleep(2.0)
        stop.set()
        await asyncio.wait_for(task, 10)
    # Backoff waits of at least 0.25 s each after the first two quick ends: 2 s holds at most ~10 watches
    # (each with its list when it was a 410).
    assert 2 <= watch.connects <= 12, watch.connects
    assert len(seen) <= 2 * 12
