"""The DRA driver, composed: from the latest record it publishes this node's ResourceSlices and serves
kubelet's DRA calls, until stopped. The agent runs it in process (fed by every pass); `nodefabric
draplugin` runs it standalone (reading the host itself).

    source = RecordSource()
    driver = DraDriver(DriverConfig(node_name="gpu-7"), source, HostRoot.at("/host"), DraApi(client, config))
    task = asyncio.create_task(driver.run(stop))
    source.update(spec)          # after every pass
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin.dirwatch import DirWatch
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.dra.publish import DEFAULT_RESYNC_S, SlicePublisher
from nodefabric_deviceplugin.dra.server import DraServers, RegistrationService
from nodefabric_deviceplugin.source import RecordSource

log = logging.getLogger(__name__)

# The sockets' directories are followed with inotify: a socket deleted or replaced (a cleanup, a kubelet
# that wipes its directories) is served again at once, and an idle driver costs no CPU. A slow look backs
# inotify up, and a quicker one replaces it where inotify cannot be used.
SAFETY_POLL_S = 30.0
FALLBACK_POLL_S = 1.0
# A stop waits this long at most for the checkpoint entries' syncs: below the agent's 3 s for each part
# to stop, so what is left is logged by name rather than cut off.
DRAIN_S = 2.0


class DraDriver:
    def __init__(
        self,
        config: DriverConfig,
        source: RecordSource,
        host: HostRoot,
        api: DraApi,
        *,
        resync: float = DEFAULT_RESYNC_S,
        safety_poll: float = SAFETY_POLL_S,
        fallback_poll: float = FALLBACK_POLL_S,
        use_inotify: bool = True,
    ) -> None:
        self.config = config
        self.source = source
        self.safety_poll = safety_poll
        self.fallback_poll = fallback_poll
        self.use_inotify = use_inotify
        self._watches: list[DirWatch] = []
        self.checkpoint = Checkpoint(config.checkpoint_path)
        self.preparer = Preparer(config, source, host, api, self.checkpoint)
        self.publisher = SlicePublisher(api, config, source, host, resync=resync)
        self.registration = RegistrationService(config, on_registered=self.publisher.poke)
        self.servers = DraServers(config, self.preparer, self.registration)
        self.serving = asyncio.Event()  # both sockets served at least once

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) for the agent's /readyz: ready once kubelet's plugin watcher accepted the driver.
        From memory, no I/O: safe on the probe's thread."""
        if self.source.spec is None:
            return False, "DRA driver: waiting for the first device record"
        if not self.serving.is_set():
            return False, f"DRA driver: not serving {self.config.dra_socket} yet"
        if not self.registration.registered.is_set():
            refused = self.registration.last_error
            why = f"kubelet refused it: {refused}" if refused else "waiting for kubelet's plugin watcher"
            return False, f"DRA driver: not registered with kubelet ({why})"
        return True, f"DRA driver: registered as {self.config.driver}"

    @property
    def watching(self) -> bool:
        """Whether inotify follows both socket directories now (else the fallback poll does)."""
        return bool(self._watches) and all(w.active for w in self._watches)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set. Waits for the first record: a host not read yet is not an empty one,
        so no slice is written and no claim answered before it."""
        if self.source.spec is None:
            log.info(
                "waiting for the first device record before serving kubelet",
                extra={"driver": self.config.driver},
            )
            if not await self.source.first_or_stop(stop):
                return
        wake = asyncio.Event()
        publisher = asyncio.create_task(self.publisher.run(stop), name="dra-slices")
        publisher.add_done_callback(lambda _: wake.set())
        # Each record's pool built off the loop as it arrives, so a prepare after a change rarely waits.
        pools = asyncio.create_task(self.preparer.pools.follow(stop), name="dra-pool")
        stopper = asyncio.ensure_future(stop.wait())
        stopper.add_done_callback(lambda _: wake.set())
        if self.use_inotify:
            self._watches = [
                DirWatch(os.path.dirname(path), [os.path.basename(path)], wake.set)
                for path in (self.config.dra_socket, self.config.registration_socket)
            ]
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                wake.clear()
                await self.servers.reconcile(loop.time())
                # After serving: the directories exist. A watch that failed or lost its directory is
                # started again (until then the fallback poll looks).
                for watch in self._watches:
                    if not watch.active:
                        watch.start()
                if not self.servers.dra.needs_serving() and not self.servers.registration.needs_serving():
                    self.serving.set()
                if publisher.done():
                    publisher.result()  # a publisher that ended on its own is a bug: surface it
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self._next_wakeup(loop.time()))
        finally:
            stopper.cancel()
            for watch in self._watches:
                watch.stop()
            publisher.cancel()
            pools.cancel()
            await asyncio.gather(publisher, pools, return_exceptions=True)
            # A pool build still running ends in its thread (a thread cannot be stopped); its outcome,
            # for a driver gone, is no one's news: an Error then would read as a failure of the stop.
            self.preparer.pools.builds.close()
            await self.servers.stop()
            # Every claim recorded durable before we exit, unless the disk does not answer in time.
            await self.preparer.drain(DRAIN_S)
            log.info("DRA driver stopped", extra={"driver": self.config.driver})

    def _next_wakeup(self, now: float) -> float:
        """Seconds until something is due: a socket's retry, else the poll."""
        poll = self.safety_poll if self.watching else self.fallback_poll
        retry = self.servers.next_retry(now)
        return max(0.0, poll if retry is None else min(poll, retry))
