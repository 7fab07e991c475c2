"""Attacks on the driver's hop threads (dra/hops.py) and on what a stop does with a hop stuck on them.

Real threads, real loops; the stop is the real driver's (its gRPC servers, its Preparer's drain), run by
`asyncio.run` in a process of its own, as the DRA CLI and the node agent run it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nodefabric_deviceplugin.dra import hops
from nodefabric_deviceplugin.dra.claims import ClaimRef

REF = ClaimRef("ml", "0b6a3c1e-93f4-4f0e-8d7b-5a3f1e2c4d5e", "claim")
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> hops.HopThreads:
    """A pool of this test's own, so counts are not another test's."""
    pool = hops.HopThreads()
    monkeypatch.setattr(hops, "THREADS", pool)
    return pool


async def idle(pool: hops.HopThreads, count: int) -> None:
    """Until `count` hop threads wait for work (a thread counts itself idle just after its job)."""
    for _ in range(1000):
        if pool._idle >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} hop threads never went idle: {pool._idle} idle of {pool._threads}")


def name() -> str:
    return threading.current_thread().name


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
from dra_helpers import DRIVER, Dirs, fd_path, hgx, put_claim, put_node, read, ref, result, start_driver
from nodefabric_operator.demo.kubeapi import running_api

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
NIC0 = "pci-0000-1c-00-0"
step, deadline = sys.argv[3], float(sys.argv[4])
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
        if step != "first prepare":
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
        await asyncio.wait_for(r.task, 20)  # the driver's own stop: bounded by its drain
        await asyncio.gather(kubelet, return_exceptions=True)
        print("driver stopped", flush=True)


asyncio.run(main())
print("exited", flush=True)
"""


@pytest.mark.parametrize("step", ["unprepare", "first prepare", "repeated prepare"])
@pytest.mark.parametrize("deadline", [1.0, 30.0], ids=["deadline-passed", "stopped-mid-call"])
def test_a_stop_with_a_hop_stuck_on_a_hung_disk_lets_the_process_exit(
    tmp_path: Path, step: str, deadline: float
) -> None:
    """A hop stuck for good on a disk that never answers, its call cancelled by kubelet's deadline (or by
    the server's stop): the drain gives up after its bound, as the README says, and the process must then
    exit. The thread is a daemon, but the call still waits for it, however often it is cancelled: the
    loop's end (asyncio.run cancels what is left and waits for it) would wait for that thread for good."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", STUCK_STOP, str(tmp_path), HERE, step, str(deadline)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit: {exc.stdout!r} {exc.stderr!r}")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "driver stopped\nexited\n", (out.stdout, out.stderr)
    assert "still writing" in out.stderr, out.stderr


async def test_a_stop_gives_up_only_its_own_hops_and_a_later_cancel_ends_at_once(
    threads: hops.HopThreads,
) -> None:
    """Two owners (two Preparers) on one loop, each call holding its hop past its cancellation: the stop
    of one gives up its own hops only (the other's call still waits for its thread, its lock held), and a
    hop given up while its call still waited for the answer lets a later cancellation end at once."""
    mine, theirs = threading.Event(), threading.Event()
    waits, others = hops.Waits(), hops.Waits()
    call = asyncio.create_task(hops.finish(REF, hops.hop(mine.wait, 30), waits=waits))
    other = asyncio.create_task(hops.finish(REF, hops.hop(theirs.wait, 30), waits=others))
    try:
        await asyncio.sleep(0)
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
    assert threads._backlog == 1
    release.set()
    assert await answer(queued) is ran[0] and ran[0].is_alive()
    await idle(threads, 1)
    assert threads._threads == 1 and threads._backlog == 0
