"""When the agent runs a pass: a walk first, refreshes every interval, walks after a debounced kernel
uevent and every walk interval, a sync when the watch saw someone else change the object, and sooner
after a failure. A pass is abandoned when the agent stops."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from nodefabric_devicemanager.agent.hostview import HostView, PassKind
from nodefabric_devicemanager.agent.liveobject import LiveObject
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.settings import AgentConfig, Outcome

log = logging.getLogger("nodefabric_devicemanager.agent.core")  # one logger for the agent's passes

RunPass = Callable[[PassKind, asyncio.Event | None], Awaitable[Outcome]]


class Schedule:
    def __init__(
        self, config: AgentConfig, view: HostView, obj: LiveObject, metrics: AgentMetrics, run_pass: RunPass
    ) -> None:
        self.config = config
        self.view = view
        self.obj = obj
        self.metrics = metrics
        self.run_pass = run_pass
        self._uevent = asyncio.Event()

    def trigger(self) -> None:
        """A kernel uevent: walk the host soon; bursts are coalesced by the debounce."""
        self._uevent.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until `stop` is set."""
        watcher: asyncio.Task[None] | None = None
        try:
            failures = 0
            kind = PassKind.WALK
            while not stop.is_set():
                outcome = await self._pass_or_stop(kind, stop)
                if outcome is None:
                    return
                if watcher is None and self.config.watch:
                    # After the first pass, which listed the object: the watch resumes from that list.
                    watcher = asyncio.create_task(self.obj.watch.run(stop), name="devices-watch")
                failures = 0 if outcome.ok else failures + 1
                delay = (
                    self.config.interval
                    if not failures
                    else min(self.config.interval, self.config.backoff.delay(failures))
                )
                next_kind = await self._wait(delay, stop)
                if next_kind is None:
                    return
                kind = next_kind
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    async def _pass_or_stop(self, kind: PassKind, stop: asyncio.Event) -> Outcome | None:
        """A pass, abandoned when `stop` is set: a request or read it waits on may take its full deadline,
        and a stopping agent has no use for its answer. None when stopped."""
        running = asyncio.ensure_future(self.run_pass(kind, stop))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({running, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            return None
        return running.result()

    async def _wait(self, delay: float, stop: asyncio.Event) -> PassKind | None:
        """Wait out `delay`, a uevent burst (then walk) or a watch change (then sync). None when stopping."""
        synced = self.obj.synced
        waiters = [asyncio.ensure_future(e.wait()) for e in (self._uevent, synced, stop)]
        try:
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if stop.is_set():
            return None
        if self._uevent.is_set():
            if await self._debounce(stop):
                return None
            synced.clear()
            return PassKind.WALK
        if synced.is_set():
            synced.clear()
            return PassKind.WALK if self.view.walk_wanted else PassKind.SYNC
        return PassKind.WALK if self.view.walk_due(self.config.walk_interval) else PassKind.REFRESH

    async def _debounce(self, stop: asyncio.Event) -> bool:
        """Wait until the uevents go quiet (at most debounce_max). True when stopping."""
        self.metrics.uevent_bursts.inc()
        log.info("kernel uevents; walking the host", extra={"node": self.config.node})
        burst_started = time.monotonic()
        while self._uevent.is_set():
            self._uevent.clear()
            remaining = self.config.debounce_max - (time.monotonic() - burst_started)
            if remaining <= 0:
                break
            if await sleep(min(self.config.debounce, remaining), stop, self._uevent):
                return True
        self.view.walk_wanted = True
        return stop.is_set()


async def sleep(seconds: float, stop: asyncio.Event | None, wake: asyncio.Event | None = None) -> bool:
    """Sleep, cut short by `stop` (returns True) or by `wake` (returns False)."""
    events = [e for e in (stop, wake) if e is not None]
    if not events:
        await asyncio.sleep(seconds)
        return False
    futures = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(futures, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            f.cancel()
    return stop is not None and stop.is_set()
