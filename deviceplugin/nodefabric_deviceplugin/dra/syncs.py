"""Checkpoint entries made durable after kubelet's answer (see checkpoint: why that is safe).

One thread of their own, one sync at a time: a sync never waits behind, or holds up, the API reads and
file writes that prepares run on the default executor, and syncs that queue up behind a slow disk cost
kubelet's calls nothing (an entry waiting for its sync holds no descriptor: `Reservation.sync` reopens
its file). A sync that fails is logged and counted; its claim stays
prepared (kubelet was answered, and the content is written), only a power loss could now lose it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from nodefabric_deviceplugin.dra import metrics
from nodefabric_deviceplugin.dra.checkpoint import Reservation

log = logging.getLogger(__name__)


class Syncs:
    def __init__(self) -> None:
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dra-sync")
        self._pending: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, entry: Reservation) -> None:
        """Sync a committed entry in the background (on the running loop)."""
        future = asyncio.get_running_loop().run_in_executor(self._thread, entry.sync)
        self._pending.add(future)
        metrics.UNSYNCED_CLAIMS.set(len(self._pending))
        future.add_done_callback(lambda done: self._done(entry, done))

    def _done(self, entry: Reservation, done: asyncio.Future[None]) -> None:
        self._pending.discard(done)
        metrics.UNSYNCED_CLAIMS.set(len(self._pending))
        if done.cancelled():
            return
        exc = done.exception()
        if exc is None:
            return
        metrics.CHECKPOINT_SYNC_FAILURES.inc()
        log.error(
            "a prepared claim's checkpoint entry could not be synced; the claim stays prepared, but a"
            " power loss now would lose its entry (kubelet then prepares it again from the API)",
            extra={"claim_uid": entry.uid, "path": entry.path, "why": str(exc)},
        )

    async def drain(self) -> None:
        """Wait for every sync started (on stop: a stopping driver leaves no entry unsynced)."""
        while self._pending:
            await asyncio.wait(list(self._pending))
