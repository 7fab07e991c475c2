"""A hop still queued (every hop thread busy, their cap reached) when its call is cancelled by kubelet's
deadline: the call drops it at once (`hops.Running.drop`), and it never runs: no GET of the claim, no
file written or removed, the lock let go before any thread frees up. A hop whose thread has taken it up
is not dropped, and behaves as before. Real threads, the real Preparer and the embedded API; one test
over the real DRA socket, with kubelet's deadline."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from dra_helpers import (
    CLAIMS,
    DRIVER,
    NIC0,
    NIC1,
    Dirs,
    driving,
    idle,
    put_claim,
    queued,
    ref,
    result,
    start_preparer,
)
from prometheus_client import REGISTRY

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import cdi, hops
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, file_name
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_operator.demo.kubeapi import RunningAPI

CAP = 2
DROPPED = "was dropped before its hop started"
REF = ClaimRef("ml", "0b6a3c1e-93f4-4f0e-8d7b-5a3f1e2c4d5e", "claim")


class Pause:
    """Holds the first thread that reaches it until `go` is set (`arrived` says one is held); armed
    once: every later thread passes."""

    def __init__(self) -> None:
        self.arrived, self.go = threading.Event(), threading.Event()
        self._armed = True
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            armed, self._armed = self._armed, False
        if armed:
            self.arrived.set()
            self.go.wait(30)


class Pool(hops.HopThreads):
    """The driver's hop threads, with a pause a test may arm just after a thread takes a job off the
    backlog (before the job starts)."""

    def __init__(self) -> None:
        super().__init__()
        self.after_take: Pause | None = None

    def _next(self) -> Callable[[], None] | None:
        job = super()._next()
        if job is not None and self.after_take is not None:
            self.after_take.hold()
        return job


class Blockers:
    """Every hop thread busy, each with a job that waits for its release."""

    def __init__(self, pool: hops.HopThreads, count: int = CAP) -> None:
        self.releases = [threading.Event() for _ in range(count)]
        self._running = threading.Semaphore(0)
        for release in self.releases:
            pool.submit(functools.partial(self._hold, release))
        for _ in self.releases:
            assert self._running.acquire(timeout=10), "a blocking job never started"

    def _hold(self, release: threading.Event) -> None:
        self._running.release()
        release.wait(30)

    def release_one(self) -> None:
        next(r for r in self.releases if not r.is_set()).set()

    def release(self) -> None:
        for r in self.releases:
            r.set()

    @property
    def held(self) -> bool:
        return not all(r.is_set() for r in self.releases)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Pool:
    monkeypatch.setattr(hops, "MAX_THREADS", CAP)
    threads = Pool()
    monkeypatch.setattr(hops, "THREADS", threads)
    return threads


class Busy:
    """Blocking jobs on the pool, made by each test when it needs them (after its warm-up), all released
    at its end."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.made: list[Blockers] = []

    def block(self, count: int = CAP) -> Blockers:
        b = Blockers(self.pool, count)
        self.made.append(b)
        return b

    def release(self) -> None:
        for b in self.made:
            b.release()


@pytest.fixture
def busy(pool: Pool) -> Iterator[Busy]:
    b = Busy(pool)
    yield b
    b.release()


@dataclass
class Rig:
    """The embedded API, the HGX host and its record, and the pool with its blocking jobs."""

    api: RunningAPI
    dirs: Dirs
    host: tuple[SysfsBuilder, Libraries]
    spec: DevicesSpec
    busy: Busy

    @property
    def pool(self) -> Pool:
        return self.busy.pool

    def preparer(self) -> Preparer:
        return start_preparer(self.api, self.dirs, self.host[0].host, RecordSource(self.spec))

    def claim(self, name: str, device: str = NIC0) -> ClaimRef:
        return ref(put_claim(self.api, name, [result(device)]))

    def reads(self) -> int:
        """The claim GETs the API server has received."""
        return self.api.count("GET", CLAIMS)

    def files(self, p: Preparer, claim: ClaimRef) -> tuple[bool, bool, bool]:
        """The claim's spec, its entry's file, its entry in the checkpoint read afresh."""
        return (
            os.path.exists(cdi.spec_path(self.dirs.cdi, DRIVER, claim.uid)),
            os.path.exists(os.path.join(p.checkpoint.directory, file_name(claim.uid))),
            claim.uid in Checkpoint(p.checkpoint.path).claims,
        )

    def settled(self) -> tuple[int, int, int]:
        """The pool's threads, idle threads and queued jobs."""
        return self.pool._threads, self.pool._idle, len(self.pool._backlog)

    async def warmed(self, p: Preparer) -> None:
        """A prepare and its unprepare: the verbs cache warm (the one-hop path), the threads made."""
        warm = self.claim("warm", NIC1)
        assert (await p.prepare([warm]))[warm.uid].error == ""
        assert await p.unprepare([warm]) == {warm.uid: ""}
        await p.syncs.drain(5)
        await self.quiet()

    async def quiet(self) -> None:
        """Until every hop thread made waits for work: a thread counts itself idle just after its job, and
        a blocking job submitted before that is queued, where a pause armed on the backlog holds it."""
        await idle(self.pool, self.pool._threads)


@pytest.fixture
def rig(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec, busy: Busy
) -> Rig:
    return Rig(api, dirs, hgx_host, hgx_spec, busy)


async def cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel the call and wait for it to end (a hang guard: a call that waits for a thread fails)."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)


def dropped_count(what: str = "prepare") -> float:
    """nodefabric_dra_(un)prepares_total{outcome="dropped"}: process-wide, so tests compare before/after."""
    name = f"nodefabric_dra_{what}s_total"
    return REGISTRY.get_sample_value(name, {"outcome": "dropped"}) or 0.0


def drops(caplog: pytest.LogCaptureFixture, claim: ClaimRef, what: str = "prepare") -> int:
    return sum(
        1
        for r in caplog.records
        if r.getMessage() == f"a cancelled {what} {DROPPED}" and getattr(r, "claim", None) == str(claim)
    )


def call(fn: Callable[..., object], *args: object, claim: ClaimRef | None = None) -> asyncio.Task[Any]:
    """A call awaiting its hop, submitted within the call as the Preparer submits its hops."""

    async def calling() -> object:
        return await hops.finish(claim or REF, hops.hop(fn, *args))

    return asyncio.create_task(calling())


# --- a queued prepare, dropped -------------------------------------------------------------------------


async def test_a_prepare_cancelled_while_its_hop_is_queued_never_reads_nor_writes_its_claim(rig: Rig) -> None:
    p = rig.preparer()
    await rig.warmed(p)
    claim = rig.claim("queued")
    reads = rig.reads()
    held = rig.busy.block()
    task = asyncio.create_task(p.prepare([claim]))
    await queued(rig.pool, 1)
    await cancelled(task)
    # At once: every thread still busy, the lock free, the job off the backlog, no hop left to await.
    assert held.held and not p._lock.locked() and not rig.pool._backlog
    assert p._waits.give_up() == 0
    held.release()
    await idle(rig.pool, CAP)
    assert rig.reads() == reads, "the dropped hop read its claim"
    assert rig.files(p, claim) == (False, False, False) and claim.uid not in p.checkpoint.claims
    assert rig.settled() == (CAP, CAP, 0)


async def test_the_next_call_for_the_claim_gets_the_lock_at_once_and_prepares_it_whole(rig: Rig) -> None:
    """kubelet's retry, while every thread is still busy: it gets the lock (its own hop is queued, the
    dropped one's is not), and once a thread frees up it prepares the claim with one GET, its own."""
    p = rig.preparer()
    await rig.warmed(p)
    claim = rig.claim("retried")
    reads = rig.reads()
    held = rig.busy.block()
    task = asyncio.create_task(p.prepare([claim]))
    await queued(rig.pool, 1)
    await cancelled(task)
    retry = asyncio.create_task(p.prepare([claim]))
    await queued(rig.pool, 1)  # the retry's own hop: it holds the lock, every thread still busy
    assert held.held and p._lock.locked()
    held.release_one()
    out = (await asyncio.wait_for(retry, 10))[claim.uid]
    assert out.error == "" and [d.device for d in out.devices] == [NIC0]
    assert rig.reads() == reads + 1
    held.release()
    await idle(rig.pool, CAP)
    assert rig.reads() == reads + 1, "the dropped hop ran after all"
    await p.syncs.drain(5)
    assert rig.files(p, claim) == (True, True, True)
    assert rig.settled() == (CAP, CAP, 0)


async def test_a_dropped_hop_is_logged_once_with_its_claim_however_often_its_call_is_cancelled(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    p = rig.preparer()
    claim = rig.claim("logged")
    before = dropped_count()
    held = rig.busy.block()
    with caplog.at_level(logging.WARNING):
        task = asyncio.create_task(p.prepare([claim]))
        await queued(rig.pool, 1)
        task.cancel()  # kubelet's deadline, then the server's stop, before the call runs again
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        held.release()
        await idle(rig.pool, CAP)
    assert drops(caplog, claim) == 1, caplog.text
    assert dropped_count() == before + 1, "counted once, as logged"
    assert "a cancelled prepare failed" not in caplog.text and "cannot prepare" not in caplog.text


async def test_a_prepare_queued_past_kubelets_deadline_over_the_socket_is_dropped(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The real driver and kubelet's real call: its deadline passes while the hop waits for a thread.
    The server's cancellation drops it; kubelet's retry is answered once a thread frees up, the claim
    read once (by the retry) and written once."""
    async with driving(rig.api, rig.dirs, rig.host[0].host, rig.spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        warm = rig.claim("warm", NIC1)
        assert (await plugin.prepare(warm))[warm.uid].error == ""
        claim = rig.claim("late")
        reads = rig.reads()
        held = rig.busy.block()
        with caplog.at_level(logging.WARNING):
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await plugin.prepare(claim, timeout=0.5)
            assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            for _ in range(1000):  # the server's own cancellation of the call follows the deadline
                if drops(caplog, claim):
                    break
                await asyncio.sleep(0.01)
            assert drops(caplog, claim) == 1, caplog.text
            assert held.held and not r.driver.preparer._lock.locked() and not rig.pool._backlog
            retry = asyncio.create_task(plugin.prepare(claim))
            await queued(rig.pool, 1)
            held.release()
            out = (await asyncio.wait_for(retry, 10))[claim.uid]
        assert out.error == "" and [d.device_name for d in out.devices] == [NIC0]
        await idle(rig.pool, CAP)
        assert rig.reads() == reads + 1
        await r.driver.preparer.syncs.drain(5)
        assert rig.files(r.driver.preparer, claim) == (True, True, True)


# --- a queued unprepare, dropped -----------------------------------------------------------------------


async def test_an_unprepare_cancelled_while_its_hop_is_queued_leaves_the_claim_prepared(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """kubelet was told the unprepare failed: the claim's files stay, and its retry removes them."""
    p = rig.preparer()
    claim = rig.claim("kept")
    assert (await p.prepare([claim]))[claim.uid].error == ""
    await p.syncs.drain(5)
    before = dropped_count("unprepare")
    held = rig.busy.block()
    with caplog.at_level(logging.WARNING):
        task = asyncio.create_task(p.unprepare([claim]))
        await queued(rig.pool, 1)
        await cancelled(task)
        assert held.held and not p._lock.locked()
        held.release()
        await idle(rig.pool, CAP)
    assert drops(caplog, claim, "unprepare") == 1, caplog.text
    assert dropped_count("unprepare") == before + 1
    assert rig.files(p, claim) == (True, True, True) and claim.uid in p.checkpoint.claims
    assert await p.unprepare([claim]) == {claim.uid: ""}
    assert rig.files(p, claim) == (False, False, False)


# --- the thread taking the job up as the call is cancelled ----------------------------------------------


def pause_at(moment: str, pool: Pool, monkeypatch: pytest.MonkeyPatch) -> Pause:
    """A pause for the next thread that takes a job up: just after it takes the job off the backlog,
    just before its start gate, or just past it (before the hop's function)."""
    pause = Pause()
    if moment == "taken off the backlog":
        pool.after_take = pause
        return pause
    real = hops.Running.begin

    def begin(running: hops.Running[Any]) -> bool:
        if moment == "at the start gate":
            pause.hold()
            return real(running)
        began = real(running)
        pause.hold()
        return began

    monkeypatch.setattr(hops.Running, "begin", begin)
    return pause


@pytest.mark.parametrize("what", ["prepare", "unprepare"])
@pytest.mark.parametrize("moment", ["taken off the backlog", "at the start gate", "past the start gate"])
async def test_a_cancel_racing_the_thread_that_takes_the_job_up(
    rig: Rig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, what: str, moment: str
) -> None:
    """A thread frees up and takes the queued job as the call is cancelled, the thread held at `moment`
    while the cancel lands. Before the start gate (off the backlog, or at the gate itself) the call wins:
    it drops the hop, lets go at once, and the thread then runs nothing. Past the gate the hop has
    started and behaves as before: a prepare still reading its claim walks away (the thread reads, and
    writes nothing), an unprepare holds the lock until its thread has removed the claim."""
    p = rig.preparer()
    claim = rig.claim("raced")
    if what == "unprepare":
        assert (await p.prepare([claim]))[claim.uid].error == ""
        await p.syncs.drain(5)
        await rig.quiet()
    else:
        await rig.warmed(p)
    before, reads = rig.files(p, claim), rig.reads()
    pause = pause_at(moment, rig.pool, monkeypatch)
    held = rig.busy.block()
    started = moment == "past the start gate"
    waits = started and what == "unprepare"  # a started hop that writes: the call waits for its end
    with caplog.at_level(logging.WARNING):
        task = asyncio.create_task(p.prepare([claim]) if what == "prepare" else p.unprepare([claim]))
        await queued(rig.pool, 1)
        held.release_one()  # that thread takes the queued job, and is held at `moment`
        assert await asyncio.to_thread(pause.arrived.wait, 10)
        assert not rig.pool._backlog
        task.cancel()
        if waits:
            done, _ = await asyncio.wait([task], timeout=0.2)
            assert not done and p._lock.locked(), "a started unprepare let go of the claim mid-hop"
            pause.go.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert waits or (not pause.go.is_set() and not p._lock.locked()), "the call waited for the thread"
        pause.go.set()
        held.release()
        await idle(rig.pool, CAP)
    assert drops(caplog, claim, what) == (0 if started else 1), caplog.text
    assert rig.settled() == (CAP, CAP, 0)
    if what == "prepare":
        assert rig.reads() == reads + (1 if started else 0)
        assert rig.files(p, claim) == (False, False, False)
        assert (await asyncio.wait_for(p.prepare([claim]), 10))[claim.uid].error == ""  # kubelet's retry
        await p.syncs.drain(5)
        assert rig.files(p, claim) == (True, True, True)
    else:
        assert rig.files(p, claim) == ((False, False, False) if started else before)
        assert await asyncio.wait_for(p.unprepare([claim]), 10) == {claim.uid: ""}
        assert rig.files(p, claim) == (False, False, False)


# --- the pool's counts ----------------------------------------------------------------------------------


async def test_dropped_jobs_leave_the_backlog_and_the_others_run_in_order(pool: Pool, busy: Busy) -> None:
    held = busy.block()
    ran: list[int] = []
    calls = [call(ran.append, i) for i in range(4)]
    await queued(pool, 4)
    await cancelled(calls[1])
    await cancelled(calls[2])
    assert len(pool._backlog) == 2 and held.held
    held.release_one()
    await asyncio.wait_for(asyncio.gather(calls[0], calls[3]), 10)
    assert ran == [0, 3]
    held.release()
    await idle(pool, CAP)
    assert ran == [0, 3] and (pool._threads, pool._idle, len(pool._backlog)) == (CAP, CAP, 0)
    # Later hops get the idle threads, and one past the cap queues and runs.
    more = busy.block()
    late = call(ran.append, 9)
    await queued(pool, 1)
    more.release_one()
    await asyncio.wait_for(late, 10)
    assert ran == [0, 3, 9]


async def test_a_hop_handed_to_an_idle_thread_and_dropped_at_its_start_gate_never_runs(
    pool: Pool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No cap reached: the job goes straight to a thread, and the call is cancelled before that thread
    begins it. The gate decides as for a queued job; nothing was queued, so nothing is withdrawn."""
    assert await asyncio.wait_for(call(lambda: "warm"), 10) == "warm"
    await idle(pool, 1)
    pause = pause_at("at the start gate", pool, monkeypatch)
    ran: list[str] = []
    with caplog.at_level(logging.WARNING):
        task = call(ran.append, "dropped")
        assert await asyncio.to_thread(pause.arrived.wait, 10)
        await cancelled(task)
        pause.go.set()
        await idle(pool, 1)
    assert ran == [] and drops(caplog, REF) == 1
    assert (pool._threads, pool._idle, len(pool._backlog)) == (1, 1, 0)
    assert await asyncio.wait_for(call(lambda: "next"), 10) == "next"


async def test_a_thread_that_cannot_start_leaves_the_counts_right_for_queued_and_dropped_hops(
    pool: Pool, busy: Busy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread busy, the second cannot start (the process at its thread limit): refused, uncounted.
    Then the second starts, a hop past the cap queues, is dropped, and the pool still counts right."""
    busy.block(1)
    ran: list[str] = []

    def at_limit(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", at_limit)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            hops.hop(ran.append, "refused")
    assert (pool._threads, pool._idle, len(pool._backlog)) == (1, 0, 0)
    busy.block(1)
    task = call(ran.append, "dropped")
    await queued(pool, 1)
    await cancelled(task)
    assert (pool._threads, pool._idle, len(pool._backlog)) == (CAP, 0, 0)
    busy.release()
    await idle(pool, CAP)
    assert ran == [] and (pool._threads, pool._idle, len(pool._backlog)) == (CAP, CAP, 0)


async def test_cancels_racing_threads_each_hop_runs_once_or_is_dropped_never_both(
    pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """Bursts past the cap, each led by hops that hold both threads until a moment drawn among the
    burst's cancels, the cancels themselves landing between loop passes while threads free up: each hop
    either ran (once) or was dropped (logged, never run), and the pool ends idle with nothing queued."""
    rng = random.Random(7)
    ran: list[int] = []
    ran_lock = threading.Lock()

    def work(i: int, gate: threading.Event | None) -> int:
        if gate is not None:
            gate.wait(10)
        with ran_lock:
            ran.append(i)
        return i

    size, bursts = 30, 10
    refs = [ClaimRef("ml", f"uid-{i}", f"c{i}") for i in range(size * bursts)]
    answered: set[int] = set()
    with caplog.at_level(logging.WARNING):
        for base in range(0, len(refs), size):
            gate = threading.Event()
            calls = {
                i: call(work, i, gate if i - base < CAP else None, claim=refs[i])
                for i in range(base, base + size)
            }
            await asyncio.sleep(0)  # every call awaits its hop
            opened = rng.randint(0, 10)
            for n, i in enumerate(rng.sample(sorted(calls), 10)):
                if n == opened:
                    gate.set()
                for _ in range(rng.randint(0, 2)):
                    await asyncio.sleep(0)
                calls[i].cancel()
            gate.set()
            for i, task in calls.items():
                with contextlib.suppress(asyncio.CancelledError):
                    assert await asyncio.wait_for(task, 10) == i
                    answered.add(i)
    await idle(pool, pool._threads)
    dropped = {i for i, r in enumerate(refs) if drops(caplog, r) == 1}
    assert len(ran) == len(set(ran)), "a hop ran twice"
    assert set(ran) | dropped == set(range(len(refs))) and not set(ran) & dropped
    assert answered <= set(ran) and dropped, "no cancel landed while a hop was queued"
    assert (pool._idle, len(pool._backlog)) == (pool._threads, 0) and pool._threads <= CAP
