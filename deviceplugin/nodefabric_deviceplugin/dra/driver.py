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

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.dra.publish import DEFAULT_RESYNC_S, SlicePublisher
from nodefabric_deviceplugin.dra.server import DraServers, RegistrationService
from nodefabric_deviceplugin.source import RecordSource

log = logging.getLogger(__name__)


class DraDriver:
    def __init__(
        self,
        config: DriverConfig,
        source: RecordSource,
        host: HostRoot,
        api: DraApi,
        *,
        resync: float = DEFAULT_RESYNC_S,
        poll_interval: float = 0.2,
    ) -> None:
        self.config = config
        self.source = source
        self.poll_interval = poll_interval
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
        publisher = asyncio.create_task(self.publisher.run(stop), name="dra-slices")
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                await self.servers.reconcile(loop.time(), self.poll_interval)
                if not self.servers.dra.needs_serving() and not self.servers.registration.needs_serving():
                    self.serving.set()
                if publisher.done():
                    publisher.result()  # a publisher that ended on its own is a bug: surface it
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.poll_interval)
        finally:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
            await self.servers.stop()
            log.info("DRA driver stopped", extra={"driver": self.config.driver})
