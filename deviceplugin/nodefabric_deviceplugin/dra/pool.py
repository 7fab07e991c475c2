"""The pool prepare resolves claims in: this driver's devices of the latest record, by name.

Built once per record version, off the event loop: at 8 PFs x 128 VFs it costs some 25-35 ms of CPU,
which on the loop held every call of the process (the device plugin's streams and Allocates in the agent,
the health endpoints, other claims' gRPC I/O) at every record change. One build at a time, the latest
record wins, a failed build is tried again after a backoff (`offloop.VersionedBuild`, as the device
plugin's lists); the driver builds each new record's pool as it arrives (`follow`), so a prepare rarely
waits for one.

Order: a prepare resolves its claim in a pool at least as new as the record the source held when the
prepare asked (`latest`): a claim allocated from slices published for a record is never resolved in an
older one (where its device may be missing). It may be newer: the record changing again meanwhile, the
newer pool is what prepare resolved in before too.

A prepare waits `budget` seconds at most (`offloop.BUILD_WAIT_S`): a build that does not end (a bug looping in
it) fails the claim with BuildTimeout, naming it, rather than hold the claim lock, and every other
claim's prepare and unprepare with it, until kubelet's own deadline (45 s) cuts the call off with no
reason given. The build goes on; the next prepare shares it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.dra.devices import PoolDevice, offered, pool_devices
from nodefabric_deviceplugin.offloop import (
    BUILD_RETRY,
    BUILD_WAIT_S,
    BuildFailed,
    BuildTimeout,
    VersionedBuild,
)
from nodefabric_deviceplugin.source import RecordSource

Pool = tuple[int, dict[str, PoolDevice]]  # the record version, and its devices by name


def build(spec: DevicesSpec, functions: tuple[str, ...]) -> dict[str, PoolDevice]:
    """The devices of the record this driver offers, by name. Pure: safe on any thread."""
    return {d.name: d for d in offered(pool_devices(spec), functions)}


class Pools:
    def __init__(
        self, source: RecordSource, functions: tuple[str, ...], *, retry: Backoff = BUILD_RETRY
    ) -> None:
        self.source = source
        self.functions = functions
        self._pool: Pool | None = None
        self.builds: VersionedBuild[dict[str, PoolDevice]] = VersionedBuild("the DRA pool", retry)
        self.budget = BUILD_WAIT_S  # how long a prepare waits for its pool

    async def latest(self, budget: float | None = None) -> Pool | None:
        """A pool at least as new as the source's record when called; None before the first record.
        Raises BuildFailed (tried again after its backoff, or at once for another record), BuildTimeout
        (`budget` seconds passed; None: no limit)."""
        try:
            async with asyncio.timeout(budget):
                return await self._latest()
        except TimeoutError:
            raise BuildTimeout(
                self.builds.what, self.source.version, budget or 0.0, self.builds.running_for
            ) from None

    async def _latest(self) -> Pool | None:
        while True:
            version, spec = self.source.snapshot()
            if spec is None:
                return None
            pool = self._pool
            if pool is not None and pool[0] >= version:
                return pool
            built = await self.builds.build(version, functools.partial(build, spec, self.functions))
            if built is None:
                continue  # another record's build was running: look at the latest record again
            if self._pool is None or self._pool[0] < version:
                self._pool = (version, built)
            return self._pool

    async def follow(self, stop: asyncio.Event) -> None:
        """Build each record's pool as it arrives, until `stop`: prepares then find it built. A failed
        build is tried again when its backoff ends (prepare also tries, and says why it cannot)."""
        while not stop.is_set():
            version = self.source.version
            retry: float | None = None
            try:
                await self.latest()
            except BuildFailed as exc:  # logged once per streak by the build
                retry = max(exc.retry_in, 0.01)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed_or_stop(version, stop), retry)

    async def _changed_or_stop(self, version: int, stop: asyncio.Event) -> None:
        changed = asyncio.ensure_future(self.source.changed(version))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            stopped.cancel()
