"""Thread hops: the blocking steps of a prepare or an unprepare (the claim's read, its files) run on a
worker thread while the event loop serves other calls, the outcome handed back to the loop in one pass.

The driver's own threads, not the loop's default executor: a hop through `run_in_executor` built a
concurrent future, wrapped it in an asyncio one, and woke the loop twice when it ended (the thread's own
hand-back and the executor future's state copied to the loop); here the thread hands its outcome back
once (`Running.settle`). hack/bench_dra.py times a first prepare beside the same prepare with its hops
on the default executor: lower in six runs of eight on a busy machine, by 0.16-0.40 of a claim GET (in
process, alternated on a quiet one: 60-140 us less). A hop that cannot get a thread is refused before
anything is queued, so it can never run later, after its caller was told it failed; nor does a hop
queued past the cap (or handed to a thread that has not yet begun it) whose call is cancelled first: the
call drops it (`Running.drop`), and it never starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from nodefabric_deviceplugin.dra import metrics
from nodefabric_deviceplugin.dra.claims import ClaimRef

log = logging.getLogger(__name__)

_R = TypeVar("_R")

# Threads are started only when every one is busy: one for a driver's serialised hops, more only while a
# call that walked away (kubelet's deadline) leaves its thread reading a slow API server, or while several
# drivers share the process. The cap is the default executor's on a small node; past it, hops wait (and
# one whose call is cancelled meanwhile is dropped, never run: see `Running.drop`).
MAX_THREADS = min(32, (os.cpu_count() or 1) + 4)

_Job = Callable[[], None]


class HopThreads:
    """The process's hop threads, shared by every driver in it. Daemons: a thread stuck on a disk or an
    API server that never answers must not hold the process's exit (a stop's drain is bounded instead)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()  # each spoken for by one thread
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job, each spoken for by one `submit`
        # Jobs queued while every thread was busy and the cap reached, each taken by the first thread
        # to end its job, or withdrawn by its cancelled call (`withdraw`).
        self._backlog: deque[_Job] = deque()

    def submit(self, job: _Job) -> None:
        """Run `job` (which must not raise) on a hop thread. Raises RuntimeError, with nothing queued,
        when a thread is needed and the process cannot start one (at its thread limit)."""
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < MAX_THREADS:
                thread = threading.Thread(target=self._work, name=f"dra-hop-{self._threads}", daemon=True)
                thread.start()  # raises before the job is queued or the thread counted: it never runs
                self._threads += 1
            else:
                self._backlog.append(job)
                return
            self._jobs.put(job)

    def withdraw(self, job: _Job) -> bool:
        """Takes `job` off the backlog: whether it was still there (no thread will take it now). False
        when a thread already has it, or never queued it there: its call must then see to it that the
        job does nothing (`Running.drop`'s start gate), and the thread counts itself as after any job."""
        with self._lock:
            try:
                self._backlog.remove(job)
            except ValueError:
                return False
            return True

    def _work(self) -> None:
        while True:
            job: _Job | None = self._jobs.get()
            while job is not None:
                try:
                    job()
                except BaseException:
                    # A job must not raise; one that does (a hand-back that failed for want of memory)
                    # must not end its thread uncounted: a job queued past the cap would wait for good.
                    log.exception("a hop thread's job raised")
                job = self._next()

    def _next(self) -> _Job | None:
        """After a job: the backlog's first (this thread's next, without going idle), else None, the
        thread counted idle."""
        with self._lock:
            if self._backlog:
                return self._backlog.popleft()
            self._idle += 1
            return None

    def after_fork(self) -> None:
        """In a forked child: the queue and the counts describe threads the child does not have."""
        self.__init__()  # type: ignore[misc]


THREADS = HopThreads()
os.register_at_fork(after_in_child=THREADS.after_fork)


class Running(Generic[_R]):
    """A hop in flight. Its thread hands the outcome to the loop itself (one `call_soon_threadsafe`),
    where `settle` runs `on_end` and wakes the call: one loop pass between the thread's end and the call
    going on.

    `answer` is what the call awaits, cancelled with it; the thread's outcome (`result`, `error`) is
    kept here whatever became of the call, and `on_end` sees every result, a cancelled call's too.

    Its start gate (a lock taken once, never released) settles which comes first: its thread starting
    `fn` (`begin`), or its cancelled call dropping it (`drop`) while it still waits for a thread."""

    __slots__ = ("_ended", "_queued", "_start", "answer", "done", "error", "given_up", "on_end", "result")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_end: Callable[[_R], None] | None) -> None:
        self.answer: asyncio.Future[_R] = loop.create_future()
        self.on_end = on_end
        self.done = False
        self.result: _R | None = None
        self.error: BaseException | None = None
        self._ended: asyncio.Future[None] | None = None  # made only for a call that must wait for the end
        self.given_up = False  # a stop waited for the thread long enough (see `Waits`)
        self._start = threading.Lock()
        self._queued: tuple[HopThreads, _Job] | None = None  # the pool `hop` submitted its job to

    def begin(self) -> bool:
        """On the hop's thread, before `fn`: whether it may run, its call not having dropped it."""
        return self._start.acquire(blocking=False)

    def drop(self) -> bool:
        """On the loop, for a cancelled call: True when the hop had not started and now never will (its
        job, withdrawn from the backlog if it waits there, returns at once on a thread that already took
        it). False when its thread has begun it (or it was never submitted): the call waits for its end."""
        if self._queued is None or not self._start.acquire(blocking=False):
            return False
        pool, job = self._queued
        self._queued = None
        pool.withdraw(job)
        return True

    def settle(self, result: _R | None, error: BaseException | None) -> None:
        """On the loop, once the thread has ended."""
        self.done, self.result, self.error = True, result, error
        # Its job (which holds this hop, `fn`, its arguments and the loop) is needed no longer: kept, the
        # two would hold each other, and the claim with them, until the cycle collector came by.
        self._queued = None
        answer = self.answer
        if not answer.done():
            if error is None:
                answer.set_result(result)  # type: ignore[arg-type]
            else:
                answer.set_exception(error)
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)
        if error is None and self.on_end is not None:
            try:
                self.on_end(result)  # type: ignore[arg-type]
            except Exception:  # never left to the loop: the call above is already woken
                log.exception("recording a hop's outcome failed")

    def give_up(self) -> None:
        """On the loop: `ended` returns now, and at once from here on, the thread still running."""
        self.given_up = True
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

    async def ended(self) -> None:
        """Until the thread has ended (or the hop was given up), however often the waiting call is
        cancelled meanwhile."""
        while not self.done and not self.given_up:
            if self._ended is None:
                self._ended = asyncio.get_running_loop().create_future()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([self._ended])


def _wrapped(fn: Callable[..., Any], exc: BaseException) -> RuntimeError:
    # A repr that fails here (the exception's or the function's) would end the thread before its
    # hand-back: the call would wait for good, its lock held.
    try:
        what = repr(exc)
    except Exception:
        what = type(exc).__name__
    try:
        name = repr(fn)
    except Exception:
        name = type(fn).__qualname__
    error = RuntimeError(f"{name} raised {what}")
    error.__cause__ = exc
    return error


def hop(fn: Callable[..., _R], *args: Any, on_end: Callable[[_R], None] | None = None) -> Running[_R]:
    """`fn(*args)` on a hop thread (`THREADS`), its outcome handed back by the thread itself (`Running`).
    `on_end(result)` runs on the loop when `fn` returns, whether or not the call still waits. Raises
    RuntimeError when no thread can be had (see `HopThreads.submit`): `fn` then never runs; nor does it
    once the call has dropped the hop (`Running.drop`)."""
    loop = asyncio.get_running_loop()
    running: Running[_R] = Running(loop, on_end)

    def job() -> None:
        if not running.begin():
            return  # its call was cancelled while the job still waited for this thread, and dropped it
        try:
            result = fn(*args)
        except StopIteration as exc:  # a future refuses it (TypeError), which would leave the call waiting
            outcome: tuple[_R | None, BaseException | None] = (None, _wrapped(fn, exc))
        except Exception as exc:  # handed to the call as it is
            outcome = (None, exc)
        except BaseException as exc:
            # Not an Exception (SystemExit, KeyboardInterrupt, GeneratorExit, a CancelledError from a
            # concurrent future the thread waited on): raised as it is in the call, SystemExit and
            # KeyboardInterrupt would stop the loop (the whole driver), and a CancelledError would pass
            # for the call's own cancellation (the request's other claims never prepared). On the
            # thread, none of them is the process being stopped: one claim's failure, as any other.
            outcome = (None, _wrapped(fn, exc))
        else:
            outcome = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop is closed: a stop that gave up on this hop
            loop.call_soon_threadsafe(running.settle, *outcome)

    pool = THREADS
    pool.submit(job)
    running._queued = (pool, job)
    return running


class Abandoned(Exception):
    """A first prepare's hop whose call was cancelled before it wrote anything: it writes nothing."""


class WriteGate:
    """Settles, once, which comes first for a first prepare's hop: its thread starting to write the
    claim's files, or its cancelled call walking away. The hop starts with the claim's read, which an
    API server answering slowly can stretch far past kubelet's deadline; a call cancelled during the
    read need not hold the lock for it (the thread, done reading, then writes nothing)."""

    def __init__(self) -> None:
        self._gate = threading.Lock()

    def write(self) -> None:
        """On the hop's thread, before its first change to a file. Raises Abandoned."""
        if not self._gate.acquire(blocking=False):
            raise Abandoned

    def walk_away(self) -> bool:
        """On the loop, for a cancelled call: True when the thread has not begun writing and now never
        will."""
        return self._gate.acquire(blocking=False)


class Waits:
    """The hops one owner's calls await (a Preparer's), for its stop. A call cancelled mid-hop waits for
    its thread to end (see `finish`); a stop that waited for it long enough (a disk that never answers)
    gives the hops up: each such call then ends, its thread left to run on (a daemon: it holds no exit).
    Without that the process could not exit: the loop's end (`asyncio.run`) cancels every task left and
    waits for each, and this one ignores its cancellation until its thread ends, for good on a hung disk.
    Once given up, a hop awaited later is too: the call the lock lets in next may hang on the same disk."""

    def __init__(self) -> None:
        self._running: set[Running[Any]] = set()
        self.given_up = False

    def give_up(self) -> int:
        """On the loop: gives up every hop awaited now, and from now on; how many now."""
        self.given_up = True
        for running in self._running:
            running.give_up()
        return len(self._running)

    def add(self, running: Running[Any]) -> None:
        self._running.add(running)
        if self.given_up:
            running.give_up()

    def discard(self, running: Running[Any]) -> None:
        self._running.discard(running)


async def finish(
    ref: ClaimRef,
    running: Running[_R],
    what: str = "prepare",
    gate: WriteGate | None = None,
    waits: Waits | None = None,
) -> _R:
    """Await a hop that changes the claim's files, to its end even when the call is cancelled (every
    one runs under the Preparer's lock).

    If kubelet's deadline passes mid-hop, the thread cannot be stopped: it ends (the claim recorded,
    or its files removed) before the lock lets the next call in, so the next call never finds the
    claim half written, nor an unprepare still removing what a prepare after it wrote (a spec renamed
    into place after its unprepare, an entry forgotten after it was made again). A hop that has not
    started (still waiting for a thread: every one busy, the cap reached) is dropped at once: it never
    runs, neither its read nor its writes, and the lock is let go now. `gate`: a hop that has not begun
    writing (a first prepare still reading its claim) is walked away from at once. `waits`: the
    owner's, whose stop may give the hop up (see `Waits`)."""
    if waits is not None:
        waits.add(running)
    try:
        return await running.answer
    except asyncio.CancelledError:
        if running.drop():
            log.warning(f"a cancelled {what} was dropped before its hop started", extra={"claim": str(ref)})
            (metrics.UNPREPARES if what == "unprepare" else metrics.PREPARES).labels("dropped").inc()
            raise
        if gate is not None and gate.walk_away():
            raise  # the thread writes nothing now; what it read is dropped
        # Cancelled again (a deadline, then the server's stop): the thread still runs, and the lock
        # stays held until it ends, however often the call is cancelled meanwhile, or until a stop that
        # waited long enough gives it up.
        await running.ended()
        if running.error is not None:
            log.warning(f"a cancelled {what} failed", extra={"claim": str(ref), "why": str(running.error)})
        raise
    finally:
        if waits is not None:
            waits.discard(running)
