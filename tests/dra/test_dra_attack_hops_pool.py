"""Attacks on the driver's hop threads (dra/hops.py) and on what a stop does with a hop stuck on them.

Real threads, real loops; the stop is the real driver's (its gRPC servers, its Preparer's drain), run by
`asyncio.run` in a process of its own, as the DRA CLI and the node agent run it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dra_helpers import (
    NIC0,
    NIC1,
    Dirs,
    fd_path,
    idle,
    put_claim,
    ref,
    result,
    start_preparer,
    thread_name,
)

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import hops
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_operator.demo.kubeapi import RunningAPI

REF = ClaimRef("ml", "0b6a3c1e-93f4-4f0e-8d7b-5a3f1e2c4d5e", "claim")
HERE = os.path.dirname(os.path.abspath(__file__))


async def answer(running: hops.Running[object]) -> object:
    """The hop's answer, its outcome raised as the call would see it. A hang guard that does not go
    through `finish` (which, cancelled, waits for the thread however long): a hop never answered fails."""
    done, _ = await asyncio.wait([running.answer], timeout=10)
    assert done, "the hop's call was never answered"
    return running.answer.result()


# --- a stop with a hop stuck on a disk that never answers ------------------------------------------------

STUCK_STOP = """
import asyncio, logging, os, sys, tempfile, threading
from pathlib import Path

sys.path.insert(0, sys.argv[2])
from dra_helpers import DRIVER, NIC0, Dirs, fd_path, hgx, put_claim, put_node, read, ref, result, start_driver
from nodefabric_operator.demo.kubeapi import running_api

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
step, deadline, stopper = sys.argv[3], float(sys.argv[4]), sys.argv[5]
entered = threading.Event()


def hang() -> None:  # a disk that never answers
    entered.set()
    threading.Event().wait()


async def main() -> None:
    tmp = Path(sys.argv[1])
    base = tempfile.mkdtemp(prefix="nfhp", dir="/tmp")
    dirs = Dirs(plugin=f"{base}/plugins", registry=f"{base}/reg", cdi=f"{base}/cdi")
    b, libraries = hgx(tmp / "hgx")
    async with running_api(directory=str(tmp)) as k:
        put_node(k)
        claim = ref(put_claim(k, "held", [result(NIC0)]))
        r = await start_driver(k, dirs, b.host, read(b, libraries))
        plugin = await r.kubelet.wait_registered(DRIVER)
        if step not in ("first prepare", "claim read"):
            assert not (await plugin.prepare(claim))[claim.uid].error
            await r.driver.preparer.drain(10)
        directory = r.driver.checkpoint.directory
        real_fsync, real_write = os.fsync, os.write
        if step == "unprepare":  # its entry's unlink made durable: the directory's fsync

            def fsync(fd: int) -> None:
                if fd_path(fd) == directory:
                    hang()
                real_fsync(fd)

            os.fsync = fsync
            call = plugin.unprepare(claim, timeout=deadline)
        elif step == "claim read":  # an API server that never answers the claim's GET
            read_claim = r.driver.preparer.api.get_claim
            r.driver.preparer.api.get_claim = lambda *a: hang() or read_claim(*a)
            call = plugin.prepare(claim, timeout=deadline)
        else:  # the first prepare's entry, or the spec a repeated prepare writes again (lost to a reboot)
            held = directory if step == "first prepare" else dirs.cdi
            if step == "repeated prepare":
                os.unlink(os.path.join(dirs.cdi, os.listdir(dirs.cdi)[0]))

            def write(fd: int, data: bytes) -> int:
                if fd_path(fd).startswith(held):
                    hang()
                return real_write(fd, data)

            os.write = write  # type: ignore[assignment]
            call = plugin.prepare(claim, timeout=deadline)
        kubelet = asyncio.ensure_future(call)
        assert await asyncio.to_thread(entered.wait, 10)
        if deadline < 5:  # kubelet's deadline passes mid-hop, before the stop
            await asyncio.gather(kubelet, return_exceptions=True)
        await r.kubelet.stop()
        r.stop.set()
        if stopper == "driver":
            await asyncio.wait_for(r.task, 20)  # the driver's own stop: bounded by its drain
        else:  # the node agent's: a part still stopping after its bound is cancelled, here mid-drain
            lock = r.driver.preparer._lock
            while not r.task.done() and not lock._waiters:
                await asyncio.sleep(0.01)
            r.task.cancel()
            await asyncio.gather(r.task, return_exceptions=True)
        await asyncio.gather(kubelet, return_exceptions=True)
        print("driver stopped", flush=True)


asyncio.run(main())
print("exited", flush=True)
"""


@pytest.mark.parametrize(
    ("step", "deadline", "stopper"),
    [
        ("unprepare", 1.0, "driver"),
        ("unprepare", 30.0, "driver"),
        ("first prepare", 1.0, "driver"),
        ("first prepare", 30.0, "driver"),
        ("repeated prepare", 1.0, "driver"),
        ("repeated prepare", 30.0, "driver"),
        ("unprepare", 1.0, "agent"),
        ("first prepare", 30.0, "agent"),
        ("claim read", 1.0, "driver"),
        ("claim read", 30.0, "driver"),
    ],
    ids=lambda v: str(v).replace(" ", "-"),
)
def test_a_stop_with_a_hop_stuck_on_a_hung_disk_lets_the_process_exit(
    tmp_path: Path, step: str, deadline: float, stopper: str
) -> None:
    """A hop stuck for good on a disk that never answers, its call cancelled by kubelet's deadline (or by
    the server's stop): the drain gives up after its bound, as the README says, or is cancelled (the node
    agent cancels a part still stopping after 3 s), and the process must then exit. The thread is a
    daemon, but the call still waits for it, however often it is cancelled: the loop's end (asyncio.run
    cancels what is left and waits for it) would wait for that thread for good."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", STUCK_STOP, str(tmp_path), HERE, step, str(deadline), stopper],
            capture_output=True,
            text=True,
            timeout=40,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit: {exc.stdout!r} {exc.stderr!r}")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "driver stopped\nexited\n", (out.stdout, out.stderr)
    # A call still reading its claim holds nothing: it walks away, and the drain finds the lock free.
    assert (step == "claim read") != ("still writing" in out.stderr) or stopper == "agent", out.stderr


async def test_a_stop_gives_up_only_its_own_hops_and_a_later_cancel_ends_at_once(
    threads: hops.HopThreads,
) -> None:
    """Two owners (two Preparers) on one loop, each call holding its hop past its cancellation: the stop
    of one gives up its own hops only (the other's call still waits for its thread, its lock held), and a
    hop given up while its call still waited for the answer lets a later cancellation end at once."""
    mine, theirs = threading.Event(), threading.Event()
    waits, others = hops.Waits(), hops.Waits()
    began = threading.Semaphore(0)

    def held(release: threading.Event) -> bool:
        began.release()
        return release.wait(30)

    call = asyncio.create_task(hops.finish(REF, hops.hop(held, mine), waits=waits))
    other = asyncio.create_task(hops.finish(REF, hops.hop(held, theirs), waits=others))
    try:
        # Both hops under way: one not yet begun would be dropped by its cancelled call, not waited for.
        for _ in range(2):
            assert await asyncio.to_thread(began.acquire, True, 10)
        assert waits.give_up() == 1  # before its call was cancelled (the server's stop comes later)
        call.cancel()
        other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 10)  # a hang guard only: given up, it ends on this pass
        assert not mine.is_set()
        other.cancel()  # cancelled again: still waits for its thread
        done, _ = await asyncio.wait([other], timeout=0.2)
        assert not done, "another owner's call let go of its hop"
        theirs.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(other, 10)
        assert waits.give_up() == 0 and others.give_up() == 0  # none awaited any more
    finally:
        mine.set()
        theirs.set()


# --- whatever a hop's function does, its call is answered and its thread serves on -------------------------


class Unnamed:
    """A callable whose repr raises (a partial of an object with a broken `__repr__`, say)."""

    def __init__(self, raised: BaseException) -> None:
        self.raised = raised

    def __call__(self) -> None:
        self.thread = threading.current_thread()
        raise self.raised

    def __repr__(self) -> str:
        raise ValueError("no repr")


@pytest.mark.parametrize("raised", [StopIteration(), KeyboardInterrupt(), SystemExit(3)], ids=repr)
async def test_a_hop_whose_function_cannot_be_named_still_fails_its_call_and_keeps_its_thread(
    threads: hops.HopThreads, raised: BaseException
) -> None:
    """The error handed to the call names the function; a function whose repr raises must not kill the
    thread before it hands anything back: the call would wait for good, its claim's lock held, and the
    pool would count a thread that no longer exists (past the cap's worth of them, every hop waits)."""
    fn = Unnamed(raised)
    with pytest.raises(RuntimeError, match=f"Unnamed raised {type(raised).__name__}"):
        await answer(hops.hop(fn))
    await idle(threads, 1)
    assert await answer(hops.hop(threading.current_thread)) is fn.thread and fn.thread.is_alive()
    assert threads._threads == 1


async def test_a_job_that_raises_leaves_the_pool_counting_right(
    threads: hops.HopThreads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job must not raise, but one that does (a hand-back that fails for want of memory) must not take
    its thread with it uncounted: the queued job behind it (past the cap) would wait for good."""
    monkeypatch.setattr(hops, "MAX_THREADS", 1)
    release, entered = threading.Event(), threading.Event()
    ran: list[threading.Thread] = []

    def failing() -> None:
        ran.append(threading.current_thread())
        entered.set()
        release.wait(30)
        raise MemoryError

    threads.submit(failing)
    assert await asyncio.to_thread(entered.wait, 10)
    queued = hops.hop(threading.current_thread)  # past the cap: waits for the one thread
    assert len(threads._backlog) == 1
    release.set()
    assert await answer(queued) is ran[0] and ran[0].is_alive()
    await idle(threads, 1)
    assert threads._threads == 1 and not threads._backlog


# --- many submitters: several drivers' loops, each on its own thread, bursts past the cap -----------------


class Checked(hops.HopThreads):
    """The pool, its counts checked under its own lock at every submit and every job's end: a job never
    queued while a thread idles, never more threads than the cap."""

    def __init__(self) -> None:
        super().__init__()
        self.broken: list[str] = []
        self.most_queued = 0

    def submit(self, job: object) -> None:
        with self._lock:
            self._check("submit")
        super().submit(job)  # type: ignore[arg-type]
        with self._lock:
            self._check("submitted")
            self.most_queued = max(self.most_queued, len(self._backlog))

    def _check(self, where: str) -> None:
        if self._idle and self._backlog:
            self.broken.append(f"{where}: {self._idle} idle with {len(self._backlog)} queued")
        if self._threads > hops.MAX_THREADS:
            self.broken.append(f"{where}: {self._threads} threads past the cap")


async def test_bursts_from_several_loops_past_the_cap_run_every_hop_once_and_count_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = Checked()
    monkeypatch.setattr(hops, "THREADS", pool)
    monkeypatch.setattr(hops, "MAX_THREADS", 3)
    loops, per_loop, rounds = 4, 60, 3
    ran: list[tuple[int, int]] = []
    ran_lock = threading.Lock()
    seen: set[threading.Thread] = set()

    def work(n: int, i: int) -> tuple[int, int]:
        with ran_lock:
            ran.append((n, i))
            seen.add(threading.current_thread())
        time.sleep(0.0005)  # hops overlap: the cap is reached and hops queue
        return n, i

    def driver(n: int) -> list[tuple[int, int]]:
        async def burst() -> list[tuple[int, int]]:
            out: list[tuple[int, int]] = []
            for r in range(rounds):
                running = [hops.hop(work, n, r * per_loop + i) for i in range(per_loop)]
                out += await asyncio.gather(*(hops.finish(REF, x) for x in running))
            return out

        return asyncio.run(burst())

    answers = await asyncio.wait_for(
        asyncio.gather(*(asyncio.to_thread(driver, n) for n in range(loops))), 60
    )
    for n, out in enumerate(answers):
        assert out == [(n, i) for i in range(per_loop * rounds)], "a hop answered another's call"
    assert sorted(ran) == sorted((n, i) for n in range(loops) for i in range(per_loop * rounds))
    await idle(pool, pool._threads)
    with pool._lock:
        pool._check("end")
        assert pool._idle == pool._threads <= 3 and not pool._backlog
    assert len(seen) <= 3 and pool.broken == [] and pool.most_queued > 0


async def test_hand_backs_racing_their_loops_close_leave_the_threads_serving(
    threads: hops.HopThreads, caplog: pytest.LogCaptureFixture
) -> None:
    """Stops that gave up on their hops, the loop closing as the thread hands back: the hand-back either
    finds the loop closed or lands in it unrun, and the thread goes on, counted idle."""

    def stops() -> None:
        for _ in range(300):
            loop = asyncio.new_event_loop()
            try:

                async def start() -> None:
                    hops.hop(int)

                loop.run_until_complete(start())
            finally:
                loop.close()

    await asyncio.to_thread(stops)
    await idle(threads, threads._threads)
    assert not threads._backlog and threads._threads <= hops.MAX_THREADS
    assert "raised" not in caplog.text
    assert await answer(hops.hop(lambda: "next")) == "next"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
async def test_a_child_forked_while_the_pool_is_locked_runs_hops() -> None:
    """The fork comes while a submit holds the pool's lock (here: the forking thread itself holds it, the
    worst case): the child's copy of that lock is held for good, by no thread of its own."""
    await answer(hops.hop(thread_name))
    with hops.THREADS._lock:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:

                async def child() -> object:
                    return await answer(hops.hop(thread_name))

                code = 0 if str(asyncio.run(child())).startswith("dra-hop-") else 2
            finally:
                os._exit(code)
    _, status = await asyncio.to_thread(os.waitpid, pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_after_a_stop_gave_up_a_call_that_got_the_lock_next_does_not_wait_for_its_hop_either(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drain gives up on a prepare stuck writing on a hung disk; the call queued behind it for the
    lock then gets it and its own hop hangs on the same disk. The stop has given up: that call, cancelled
    (the loop's end cancels it), must not hold the process's exit either."""
    p = start_preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec))
    first, second = (
        ref(put_claim(api, "first", [result(NIC0)])),
        ref(put_claim(api, "second", [result(NIC1)])),
    )
    directory, real = p.checkpoint.directory, os.write
    release, entered = threading.Event(), threading.Semaphore(0)

    def hung(fd: int, data: bytes) -> int:
        if fd_path(fd).startswith(directory):
            entered.release()
            release.wait(60)
        return real(fd, data)

    monkeypatch.setattr(os, "write", hung)
    try:
        stuck = asyncio.create_task(p.prepare([first]))
        assert await asyncio.to_thread(entered.acquire, True, 10)
        queued = asyncio.create_task(p.prepare([second]))
        await asyncio.sleep(0)
        stuck.cancel()  # kubelet's deadline: the call waits for its thread, the lock held
        await p.drain(0.05)  # gives up: the stuck call ends, and the queued one gets the lock
        done, _ = await asyncio.wait([stuck], timeout=10)
        assert done and stuck.cancelled()
        assert await asyncio.to_thread(entered.acquire, True, 10), "the queued call's hop never wrote"
        queued.cancel()
        done, _ = await asyncio.wait([queued], timeout=10)
        assert done, "a call whose hop hangs after the stop gave up still waits for its thread"
    finally:
        release.set()
    await p.syncs.drain(5)
