"""A watch of the agent's own Devices object, so the agent never GETs it to learn whether it changed.

The agent keeps the object as it last wrote or saw it. Someone else's write (the operator's status, a
hand edit, a delete) arrives here as an event; the agent then decides again against it, which costs no
request when nothing of ours changed. One object by field selector, resumed from the last
resourceVersion seen (bookmarks keep it fresh), so a reconnect replays nothing; when the API server no
longer holds that version (410 Gone) the object is listed once and the watch resumes from the list.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from nodefabric_devicemanager.agent import workers
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.nodeclient import ApiFailure, Backoff, Cancel, metadata, resource_version

log = logging.getLogger(__name__)

# A list of one object answers within a request timeout; a little more for a slow API server.
LIST_DEADLINE_S = 30.0
# A watch open this long before it ended was healthy: the next one opens at once. One that ended sooner
# counts toward the backoff, as client-go's reflector paces its restarts.
HEALTHY_AFTER_S = 5.0


class ObjectWatch:
    """Runs the watch; `on_event(event)` is called on the event loop for every ADDED/MODIFIED/DELETED
    of the object, and `relist()` (awaited) lists it again when the watch cannot resume."""

    def __init__(
        self,
        client: DevicesClient,
        name: str,
        on_event: Callable[[dict[str, Any]], None],
        relist: Callable[[], Any],
        *,
        backoff: Backoff | None = None,
        healthy_after: float = HEALTHY_AFTER_S,
    ) -> None:
        self.client = client
        self.name = name
        self.on_event = on_event
        self.relist = relist
        self.backoff = backoff or Backoff(base=1.0, cap=60.0)
        self.healthy_after = healthy_after
        self.since = ""  # the resourceVersion to resume from: the last list, event or bookmark
        self.connects = 0
        self._cancel = Cancel()

    def resume_from(self, resource_version_: str) -> None:
        """Where the next watch starts (after a list or a write the agent made)."""
        if resource_version_:
            self.since = resource_version_

    def _consume(self, loop: asyncio.AbstractEventLoop, since: str) -> str:
        """Blocking: stream events until the server ends the watch. Returns the last version seen."""
        last = since
        for event in self.client.watch(self.name, since, self._cancel):
            obj = event.get("object")
            meta = metadata(obj)
            if not meta:
                continue  # not an object: nothing in it can be kept or resumed from
            last = resource_version(obj) or last
            if event.get("type") == "BOOKMARK":
                continue
            if meta.get("name") != self.name:
                continue  # an API server that ignored the field selector
            loop.call_soon_threadsafe(self.on_event, event)
        return last

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        self._cancel = Cancel()
        try:
            while not stop.is_set():
                if not self.since:
                    await self.relist()
                    if not self.since:  # the list failed; the agent logged it
                        failures += 1
                        if await _sleep(self.backoff.delay(failures), stop):
                            return
                        continue
                self.connects += 1
                opened = time.monotonic()
                stream: asyncio.Future[str] = workers.start(
                    self._consume, loop, self.since, name="devices-watch"
                )
                stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
                waited: list[asyncio.Future[Any]] = [stream, stopper]
                await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if stop.is_set():
                    return
                if not stream.done():  # defensive: wait() returned for the stopper only
                    continue
                delay = self._after(stream, failures)
                # A watch that ended (or expired) as soon as it opened, again and again, is paced like a
                # failure: a proxy that closes every stream at once, or a 410 on every resume, must not
                # turn one agent into hundreds of requests a second. The first quick end is free.
                quick = time.monotonic() - opened < self.healthy_after
                failures = failures + 1 if delay is not None or quick else 0
                if delay is None and failures > 1:
                    delay = self.backoff.delay(failures - 1)
                if delay is not None and await _sleep(delay, stop):
                    return
        finally:
            self._cancel.set()

    def _after(self, stream: asyncio.Future[str], failures: int) -> float | None:
        """Where the next watch resumes after `stream` ended; the delay it must wait first when it failed."""
        try:
            self.since = stream.result() or self.since
            return None
        except ApiFailure as exc:
            if exc.kind == "gone":
                log.info("the watch cannot resume; listing the object again", extra={"node": self.name})
                self.since = ""
                return None
            delay = self.backoff.delay(failures + 1)
            log.warning(
                "watch of the devices object failed; retrying",
                extra={"node": self.name, "error": str(exc), "retry_in_s": round(delay, 1)},
            )
            return delay
        except Exception:
            # A bug, or an answer no API server gives, costs this watch, never the agent's knowledge of
            # its object for the rest of its life.
            delay = self.backoff.delay(failures + 1)
            log.exception(
                "watch of the devices object broke; retrying",
                extra={"node": self.name, "retry_in_s": round(delay, 1)},
            )
            return delay


async def _sleep(seconds: float, stop: asyncio.Event) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
