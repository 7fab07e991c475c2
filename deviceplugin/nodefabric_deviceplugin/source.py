"""Where the plugin's record comes from. The servers always answer from "the latest record".

Two sources feed a `RecordSource`:
- the agent, in process: it calls `source.update(spec)` after each pass (from any thread);
- standalone: `poll_host` reads the host itself every few seconds through the inventory.

A failed read is not an empty host: when enumeration fails the last record is kept and the servers go on
answering from it. So is a read that does not finish: it runs off the event loop through the one host
poll (`nodefabric_devicemanager.hostpoll`) with a deadline, and one stuck on a blocking file is never
started again on top of itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from nodefabric_devicemanager import hostpoll
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec, Interface

log = logging.getLogger(__name__)


class RecordSource:
    """The latest Devices spec, a version that grows on every change, and an awaitable change signal."""

    def __init__(self, spec: DevicesSpec | None = None) -> None:
        self._lock = threading.Lock()
        self._spec = spec
        self._version = 0 if spec is None else 1
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def spec(self) -> DevicesSpec | None:
        """The latest record; None until the first one arrives."""
        return self._spec

    @property
    def version(self) -> int:
        return self._version

    def snapshot(self) -> tuple[int, DevicesSpec | None]:
        """The version and the record together, consistent with each other."""
        with self._lock:
            return self._version, self._spec

    def update(self, spec: DevicesSpec) -> bool:
        """Replace the record. Returns whether it changed; waiters wake only when it did. Thread-safe."""
        with self._lock:
            if self._spec is not None and spec == self._spec:
                return False
            self._spec = spec
            self._version += 1
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, fut)
        return True

    async def changed(self, since: int) -> int:
        """Wait until the version differs from `since`; return the new version."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._version != since:
                return self._version
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            await fut
        finally:
            with self._lock:
                if (loop, fut) in self._waiters:
                    self._waiters.remove((loop, fut))
        return self._version

    async def first(self) -> DevicesSpec:
        """The first record, waiting for it if none has arrived yet."""
        while self._spec is None:
            await self.changed(0)
        return self._spec

    async def first_or_stop(self, stop: asyncio.Event) -> bool:
        """Wait for the first record or for `stop`, whichever comes first; whether a record is here. The
        kubelet-facing servers wait so: a host not read yet is not an empty one."""
        if self._spec is not None:
            return True
        first = asyncio.ensure_future(self.first())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({first, stopped}, return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        stopped.cancel()
        return self._spec is not None and not stop.is_set()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


InterfaceReader = Callable[[HostRoot], list[Interface] | None]


def read_interfaces(host: HostRoot) -> list[Interface] | None:
    """The host's interfaces through the inventory; None when enumeration failed."""
    from nodefabric_devicemanager import inventory

    return inventory.read(host).interfaces


HOST_READ_BUDGET_S = hostpoll.DEFAULT_DEADLINE_S


async def poll_host(
    source: RecordSource,
    host: HostRoot,
    *,
    interval: float = 5.0,
    reader: InterfaceReader = read_interfaces,
    stop: asyncio.Event | None = None,
    budget: float = HOST_READ_BUDGET_S,
) -> None:
    """Standalone mode: read the host every `interval` seconds and feed the source until `stop` is set,
    through the one host poll (`hostpoll.poll`: a deadline on each read, SIGTERM never waits on one)."""

    def feed(interfaces: list[Interface] | None) -> None:
        if interfaces is None:
            log.error("could not enumerate interfaces; serving the last record", extra={"root": host.root})
        elif source.update(DevicesSpec(interfaces=interfaces)):
            log.info(
                "device record changed", extra={"interfaces": len(interfaces), "version": source.version}
            )

    await hostpoll.poll(
        lambda: reader(host),
        feed,
        root=host.root,
        interval=interval,
        stop=stop or asyncio.Event(),
        log=log,
        deadline=budget,
    )
