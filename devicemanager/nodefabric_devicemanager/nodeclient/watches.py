"""Watches: one stream of events after a resourceVersion (`watch`), and a watch kept running for as
long as asked, resumed and paced after every end (`ResumableWatch`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_devicemanager.nodeclient.client import Api, Cancel
from nodefabric_devicemanager.nodeclient.errors import ApiError, ApiFailure, classify
from nodefabric_devicemanager.nodeclient.objects import metadata, resource_version

# Named for the package, as before it was cut in modules: log readers select the node client's lines by it.
log = logging.getLogger(__package__)

# The API server ends a watch after timeoutSeconds; a random length spreads a fleet's reconnects.
WATCH_SECONDS = (300, 600)
# A watch open this long before it ended was healthy: the next one opens at once. One that ended sooner
# counts toward the backoff, as client-go's reflector paces its restarts.
WATCH_HEALTHY_AFTER_S = 5.0


def watch(
    api: Api, path: str, what: str, field_selector: str, *, since: str, cancel: Cancel | None = None
) -> Iterator[dict[str, Any]]:
    """Events of the objects `field_selector` picks under `path`, after resourceVersion `since` (from now
    when empty), with bookmarks, until the API server ends the watch after a random 300-600 s. Raises
    ApiFailure ("gone" when `since` is older than the server keeps history for)."""
    seconds = random.randint(*WATCH_SECONDS)
    query = {
        "watch": "true",
        "fieldSelector": field_selector,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(seconds),
    }
    if since:
        query["resourceVersion"] = since
    try:
        for event in api.stream(path, query, timeout=seconds + 30, cancel=cancel):
            if event.get("type") == "ERROR":
                status = event.get("object")
                status = status if isinstance(status, dict) else {}
                code = int(status.get("code") or 0) if str(status.get("code") or "").isdigit() else 0
                raise ApiError(code, f"{what}: {status.get('message') or status}")
            yield event
    except ApiError as exc:
        raise classify(exc) from exc


class ResumableWatch:
    """Runs a watch for as long as asked, on a daemon thread (a silent API server holds a thread, never
    the event loop or a SIGTERM), resumed from the last resourceVersion it saw: a list's, an event's, a
    bookmark's, or a write's the owner reports (`resume_from`). `on_event(event)` is called on the event
    loop for every ADDED/MODIFIED/DELETED event whose object `keep` accepts; `relist()` (awaited) lists
    again when there is nothing to resume from (at start, and once after a 410 Gone) and sets `since`
    (left empty when the list failed: the watch backs off and asks again). A failed watch, an expired one
    and an event of an odd shape each cost one reconnect, never the watch itself."""

    def __init__(
        self,
        what: str,
        open_: Callable[[str, Cancel], Iterator[dict[str, Any]]],
        on_event: Callable[[dict[str, Any]], None],
        relist: Callable[[], Awaitable[Any]],
        *,
        keep: Callable[[dict[str, Any]], bool] = lambda obj: True,
        backoff: Backoff | None = None,
        healthy_after: float = WATCH_HEALTHY_AFTER_S,
    ) -> None:
        self.what = what
        self.open = open_
        self.on_event = on_event
        self.relist = relist
        self.keep = keep
        self.backoff = backoff or Backoff(base=1.0, cap=60.0)
        self.healthy_after = healthy_after
        self.since = ""  # the resourceVersion to resume from: the last list, event, bookmark or write
        self.connects = 0
        # The last attempt failed and no stream has worked since: the owner's copy may be going stale.
        self.failing = False
        self._cancel = Cancel()

    def resume_from(self, resource_version_: str) -> None:
        """Where the next watch starts (after a list or a write of the owner's)."""
        if resource_version_:
            self.since = resource_version_

    def _consume(self, loop: asyncio.AbstractEventLoop, since: str) -> str:
        """Blocking: stream events until the server ends the watch. Returns the last version seen."""
        last = since
        for event in self.open(since, self._cancel):
            obj = event.get("object")
            if not isinstance(obj, dict) or not metadata(obj):
                continue  # not an object: nothing in it can be kept or resumed from
            self.failing = False
            last = resource_version(obj) or last
            if event.get("type") == "BOOKMARK" or not self.keep(obj):
                continue
            loop.call_soon_threadsafe(self.on_event, event)
        return last

    def _start(self, since: str) -> asyncio.Future[str]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()

        def settle(result: str | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result or "")

        def body() -> None:
            try:
                result = self._consume(loop, since)
            except BaseException as exc:  # handed to the awaiting task, which decides
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                    loop.call_soon_threadsafe(settle, None, exc)
            else:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(settle, result, None)

        threading.Thread(target=body, name=f"watch {self.what}", daemon=True).start()
        return fut

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        self._cancel = Cancel()
        try:
            while not stop.is_set():
                if not self.since:
                    await self.relist()
                    if not self.since:  # the list failed; the owner logged it
                        failures += 1
                        self.failing = True
                        if await sleep_or_stop(self.backoff.delay(failures), stop):
                            return
                        continue
                self.connects += 1
                opened = time.monotonic()
                stream = self._start(self.since)
                stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
                await asyncio.wait([stream, stopper], return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if stop.is_set():
                    return
                delay = self._after(stream, failures)
                # A watch that ended (or expired) as soon as it opened, again and again, is paced like a
                # failure: a proxy that closes every stream at once, or a 410 on every resume, must not
                # turn one node into hundreds of requests a second. The first quick end is free.
                quick = time.monotonic() - opened < self.healthy_after
                failures = failures + 1 if delay is not None or quick else 0
                if delay is None and failures > 1:
                    delay = self.backoff.delay(failures - 1)
                if delay is not None and await sleep_or_stop(delay, stop):
                    return
        finally:
            self._cancel.set()

    def _after(self, stream: asyncio.Future[str], failures: int) -> float | None:
        """Where the next watch resumes after `stream` ended; the delay it must wait first when it failed."""
        try:
            self.since = stream.result() or self.since
            self.failing = False
            return None
        except ApiFailure as exc:
            if exc.kind == "gone":
                log.info("the watch cannot resume; listing again", extra={"watch": self.what})
                self.since = ""
                return None
            self.failing = True
            delay = self.backoff.delay(failures + 1)
            log.warning(
                "a watch failed; retrying",
                extra={"watch": self.what, "error": str(exc), "retry_in_s": round(delay, 1)},
            )
            return delay
        except Exception:
            # A bug, or an answer no API server gives, costs this watch, never the owner's knowledge of
            # what it watches for the rest of its life.
            self.failing = True
            delay = self.backoff.delay(failures + 1)
            log.exception(
                "a watch broke; retrying", extra={"watch": self.what, "retry_in_s": round(delay, 1)}
            )
            return delay


async def sleep_or_stop(seconds: float, stop: asyncio.Event) -> bool:
    """Wait `seconds`; True when `stop` was set first."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
