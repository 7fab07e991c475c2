"""Attacks on the start gate of a queued hop (`hops.Running.begin`/`drop`) and the backlog that holds
its job: what a hop's job keeps alive once it has run or been dropped. Real threads, a real loop."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
from dra_helpers import idle

from nodefabric_deviceplugin.dra import hops
from nodefabric_deviceplugin.dra.claims import ClaimRef

REF = ClaimRef("ml", "5d0c2a4e-1f3b-4c6d-9e8f-7a6b5c4d3e2f", "claim")


class Claim:
    """Stands for what a hop's arguments hold (a claim, a plan): something weakly referable."""


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> hops.HopThreads:
    monkeypatch.setattr(hops, "MAX_THREADS", 1)
    threads = hops.HopThreads()
    monkeypatch.setattr(hops, "THREADS", threads)
    return threads


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """Only reference counts free objects: what a cycle holds stays alive and shows."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


async def next_job_taken(pool: hops.HopThreads) -> None:
    """The one thread takes a further job: it holds no reference to the one before."""
    taken = threading.Event()
    pool.submit(taken.set)
    assert await asyncio.to_thread(taken.wait, 10)
    await idle(pool, 1)


def use(claim: Claim) -> str:
    return "done"


@pytest.mark.usefixtures("no_cycle_collector")
async def test_a_hop_that_ran_keeps_nothing_of_its_arguments_alive(pool: hops.HopThreads) -> None:
    """Once its outcome is handed back, a hop holds its job no longer: the job (which holds the hop, its
    function, its arguments and the loop) and the hop would otherwise keep each other, and the claim,
    until the cycle collector came by. (A hop that raised is kept by its error's traceback, as any
    exception keeps its frames.)"""
    claim = Claim()
    alive = weakref.ref(claim)
    running = hops.hop(use, claim)
    assert await asyncio.wait_for(hops.finish(REF, running), 10) == "done"
    await next_job_taken(pool)
    del running, claim
    assert alive() is None, "a settled hop still holds its job, and the claim with it"


@pytest.mark.usefixtures("no_cycle_collector")
async def test_a_dropped_hop_keeps_nothing_of_its_arguments_alive(pool: hops.HopThreads) -> None:
    """A hop queued behind a busy thread, its call cancelled: dropped, withdrawn, nothing kept."""
    release = threading.Event()
    began = threading.Event()

    def hold() -> None:
        began.set()
        release.wait(30)

    pool.submit(hold)
    assert await asyncio.to_thread(began.wait, 10)
    claim = Claim()
    alive = weakref.ref(claim)
    running = hops.hop(use, claim)
    task = asyncio.ensure_future(hops.finish(REF, running))
    await asyncio.sleep(0)
    assert len(pool._backlog) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert not pool._backlog
    release.set()
    await next_job_taken(pool)
    del running, claim, task
    assert alive() is None, "a dropped hop still holds its job, and the claim with it"
    assert (pool._threads, pool._idle, len(pool._backlog)) == (1, 1, 0)
