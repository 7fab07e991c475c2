"""Checkpoint entries made durable after kubelet's answer (see checkpoint: why that is safe).

One thread of their own, one sync at a time, shared by every driver of the process (one idle thread,
not one per driver, however many are made and stopped): a sync never waits behind, or holds up, the
API reads and file writes that prepares run on their hop threads (hops), and syncs that queue up behind
a slow disk cost kubelet's calls nothing (an entry waiting for its sync holds no descriptor:
`Reservation.sync` reopens its file). A sync that fails is logged and counted; its claim stays prepared
(kubelet was answered, and the content is written), only a power loss could now lose it. A disk that
never answers holds every driver's syncs of the process alike: in the agent there is one driver.

The thread is a daemon and a stop's drain is bounded: a disk that never answers an fdatasync must not
hold the driver's stop, nor the process's exit (the interpreter joins every thread that is not a
daemon, for good). What a stop leaves unsynced is logged; it is written, so only a power loss in the
next moments could lose it, and kubelet would then prepare those claims again from the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading

from nodefabric_deviceplugin.dra import metrics
from nodefabric_deviceplugin.dra.checkpoint import Reservation

log = logging.getLogger(__name__)

# A sync starts this long after its entry was written: by then kubelet's answer has left. Started at
# once, the sync thread's first steps (waking, open, fstat: the GIL and a CPU) competed with the loop
# sending that answer: x0.07-0.15 of a claim GET on a first prepare (bench_dra's loop in one process,
# at once and 2 ms after alternated claim by claim, three runs). The window a power loss can hit grows
# by as much; a stop's drain still waits for the sync (the timer runs on the loop the drain awaits).
START_AFTER_S = 0.002

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


class _Worker:
    """The process's one sync thread, started with its first job (again in a child after a fork, which
    keeps the queue but not the thread)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # drivers on loops of their own may start it at once

    def put(self, job: _Job) -> None:
        self._jobs.put(job)
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    thread = threading.Thread(target=self._work, name="dra-sync", daemon=True)
                    try:
                        thread.start()
                    except RuntimeError as exc:
                        # The process is at its thread limit: the syncs queued fail (logged, counted; their
                        # claims stay prepared) rather than wait for good, and the next job starts it again.
                        # Kept, the thread that never ran would have left every later sync queued.
                        self._fail_queued(exc)
                        return
                    self._thread = thread

    def _fail_queued(self, exc: Exception) -> None:
        while True:
            try:
                loop, future, _ = self._jobs.get_nowait()
            except queue.Empty:
                return
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_settle, future, exc)

    def _work(self) -> None:
        while True:
            _sync(*self._jobs.get())

    def after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]


_WORKER = _Worker()
os.register_at_fork(after_in_child=_WORKER.after_fork)


class Syncs:
    def __init__(self) -> None:
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
        loop.call_later(START_AFTER_S, _WORKER.put, (loop, future, entry))

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
