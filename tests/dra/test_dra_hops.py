"""The driver's hop threads (dra/hops.py): started only when every one is busy, reused when idle, capped
(a hop past the cap waits for a thread, none is started), refused with nothing queued when no thread can
start, surviving whatever a hop raises, and started afresh in a forked child. Real threads, real loops."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from dra_helpers import idle, thread_name

from nodefabric_deviceplugin.dra import hops
from nodefabric_deviceplugin.dra.claims import ClaimRef

REF = ClaimRef("ml", "0b6a3c1e-93f4-4f0e-8d7b-5a3f1e2c4d5e", "claim")


async def run(fn: object, *args: object) -> object:
    return await asyncio.wait_for(hops.finish(REF, hops.hop(fn, *args)), 10)  # type: ignore[arg-type]


async def test_hops_one_after_another_take_one_thread_and_reuse_it(threads: hops.HopThreads) -> None:
    first = await run(thread_name)
    assert isinstance(first, str) and first.startswith("dra-hop-")
    for _ in range(20):
        await idle(threads, 1)
        assert await run(thread_name) == first
    assert threads._threads == 1


async def test_a_hop_while_every_thread_is_busy_gets_a_thread_of_its_own(threads: hops.HopThreads) -> None:
    """A call that walked away leaves its thread reading a slow API server: the next call's hop must not
    wait behind it."""
    release = threading.Event()
    stuck = hops.hop(release.wait, 30)
    try:
        assert await run(lambda: "answered") == "answered"
        assert threads._threads == 2 and not stuck.done
    finally:
        release.set()
    assert await asyncio.wait_for(hops.finish(REF, stuck), 10) is True


async def test_past_the_cap_a_hop_waits_for_a_thread_and_none_is_started(
    threads: hops.HopThreads, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hops, "MAX_THREADS", 2)
    releases = [threading.Event(), threading.Event()]
    busy = [hops.hop(r.wait, 30) for r in releases]
    ran: list[str] = []
    queued = hops.hop(ran.append, "ran")
    waiting = asyncio.create_task(hops.finish(REF, queued))
    await asyncio.sleep(0.2)
    assert ran == [] and not waiting.done() and threads._threads == 2, "a hop past the cap ran or started"
    releases[1].set()
    await asyncio.wait_for(waiting, 10)
    assert ran == ["ran"] and threads._threads == 2
    # The thread that ran the queued hop went idle after it, not before: counts stay exact.
    await idle(threads, 1)
    assert threads._idle == 1 and not threads._backlog
    releases[0].set()
    await asyncio.wait_for(hops.finish(REF, busy[0]), 10)
    await idle(threads, 2)
    assert threads._idle == 2


async def test_a_hop_that_cannot_get_a_thread_is_refused_with_nothing_queued(
    threads: hops.HopThreads, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    with monkeypatch.context() as patch:

        def at_limit(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        patch.setattr(threading.Thread, "start", at_limit)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            hops.hop(ran.append, "refused")
    assert threads._threads == 0
    # The next hop starts a thread; the refused one never runs, before it or after.
    assert await run(ran.append, "next") is None
    await idle(threads, 1)
    assert ran == ["next"]


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), SystemExit(3), GeneratorExit()], ids=repr)
async def test_whatever_a_hop_raises_fails_its_call_and_the_thread_runs_the_next(
    threads: hops.HopThreads, raised: BaseException
) -> None:
    def fail() -> None:
        raise raised

    with pytest.raises(RuntimeError, match=type(raised).__name__):
        await run(fail)
    await idle(threads, 1)
    assert await run(lambda: "next") == "next" and threads._threads == 1


async def test_a_hop_whose_loop_closed_before_it_ended_leaves_the_thread_serving(
    threads: hops.HopThreads,
) -> None:
    """A stop that gave up on a hop (its loop closed): the thread's hand-back finds no loop, and the
    thread goes on to the next hop."""
    release = threading.Event()

    def other_loop() -> None:
        async def start() -> None:
            hops.hop(release.wait, 30)

        asyncio.run(start())  # the loop closes with the hop still running

    await asyncio.to_thread(other_loop)
    release.set()
    await idle(threads, 1)
    assert await run(lambda: "next") == "next" and threads._threads == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
async def test_a_forked_child_starts_hop_threads_of_its_own() -> None:
    """The child inherits the pool's queue and counts but none of its threads: without the reset, a
    count of idle threads the child does not have would queue its hops for good."""
    await run(thread_name)  # the parent's process-wide pool has a thread, idle
    await idle(hops.THREADS, 1)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when its hop ran on a thread of its own
        code = 1
        try:

            async def child() -> object:
                return await asyncio.wait_for(hops.finish(REF, hops.hop(thread_name)), 5)

            code = 0 if str(asyncio.run(child())).startswith("dra-hop-") else 2
        finally:
            os._exit(code)
    _, status = await asyncio.to_thread(os.waitpid, pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
