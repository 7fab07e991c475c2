"""Checkpoint entries made durable after kubelet's answer (see checkpoint: why that is safe).

One thread of their own, one sync at a time: a sync never waits behind, or holds up, the API reads and
file writes that prepares run on the default executor, and syncs that queue up behind a slow disk cost
kubelet's calls nothing (an entry waiting for its sync holds no descriptor: `Reservation.sync` reopens
its file). A sync that fails is logged and counted; its claim stays prepared (kubelet was answered, and
the content is written), only a power loss could now lose it.

The thread is a daemon and a stop's drain is bounded: a disk that never answers an fdatasync must not
hold the driver's stop, nor the process's exit (the interpreter joins every other thread, an executor's
included, for good). What a stop leaves unsynced is logged; it is written, so only a power loss in the
next moments could lose it, and kubelet would then prepare those claims again from the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading

from nodefabric_deviceplugin.dra import metrics
from nodefabric_deviceplugin.dra.checkpoint import Reservation

log = logging.getLogger(__name__)

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]", Reservation]


def _sync(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], entry: Reservation) -> None:
    """On the sync thread: sync the entry and hand the outcome to the loop."""
    outcome: Exception | None = None
    try:
        entry.sync()
    except Exception as exc:  # every failure is the claim's sync failure, logged on the loop
        outcome = exc
    with contextlib.suppress(RuntimeError):  # the loop is closed: a stop that gave up on this sync
        loop.call_soon_threadsafe(_settle, future, outcome)


def _settle(future: asyncio.Future[None], outcome: Exception | None) -> None:
    if future.done():
        return
    if outcome is None:
        future.set_result(None)
    else:
        future.set_exception(outcome)


class Syncs:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pending: dict[asyncio.Future[None], Reservation] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, entry: Reservation) -> None:
        """Sync a committed entry in the background (on the running loop)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending[future] = entry
        metrics.UNSYNCED_CLAIMS.set(len(self._pending))
        future.add_done_callback(lambda done: self._done(entry, done))
        self._jobs.put((loop, future, entry))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="dra-sync", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            _sync(*self._jobs.get())

    def _done(self, entry: Reservation, done: asyncio.Future[None]) -> None:
        self._pending.pop(done, None)
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

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait for every sync started, `timeout` seconds at most (on stop); whether all ended. What is
        left is logged with its claims' uids."""
        try:
            async with asyncio.timeout(timeout):
                while self._pending:
                    await asyncio.wait(list(self._pending))
        except TimeoutError:
            uids = [entry.uid for entry in self._pending.values()]
            log.error(
                "stopping with checkpoint entries written but not synced (the disk did not answer in"
                " time); a power loss now would lose them, and kubelet would prepare those claims again"
                " from the API",
                extra={"unsynced": len(uids), "claim_uids": uids[:50], "timeout_s": timeout},
            )
            return False
        return True
