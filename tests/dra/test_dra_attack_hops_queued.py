"""Attacks on the start gate of a queued hop (`hops.Running.begin`/`drop`) and the backlog that holds
its job: what a hop's job keeps alive once it has run or been dropped. Real threads, a real loop."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import weakref
from collections.abc import Iterator

import pytest
from dra_helpers import CLAIMS, NIC0, Dirs, idle, put_claim, queued, ref, result, start_preparer
from prometheus_client import REGISTRY

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import cdi, hops
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_operator.demo.kubeapi import RunningAPI

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


class Held:
    """The pool's one thread busy until `release`."""

    def __init__(self, pool: hops.HopThreads) -> None:
        self.release, began = threading.Event(), threading.Event()

        def hold() -> None:
            began.set()
            self.release.wait(30)

        pool.submit(hold)
        assert began.wait(10), "the blocking job never started"


def samples() -> dict[str, float | None]:
    names = [("nodefabric_dra_prepares_total", {"outcome": o}) for o in ("prepared", "failed", "repeated")]
    out = {labels["outcome"]: REGISTRY.get_sample_value(name, labels) for name, labels in names}
    out["prepared_claims"] = REGISTRY.get_sample_value("nodefabric_dra_prepared_claims")
    return out


async def test_a_stop_that_gave_up_while_a_prepare_was_queued_never_runs_it(
    pool: hops.HopThreads,
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
) -> None:
    """The drain runs out of time while a prepare (its call not yet cancelled) holds the lock, its hop
    queued behind a thread stuck on a disk: it gives the hops up. The loop's end then cancels the call:
    the hop is dropped, not waited for, nor run once the thread frees up (no GET, no file), and the
    metrics count no outcome for it (kubelet was told nothing but its deadline)."""
    p = start_preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec))
    claim = ref(put_claim(api, "stopped", [result(NIC0)]))
    before, reads = samples(), api.count("GET", CLAIMS)
    held = Held(pool)
    try:
        call = asyncio.create_task(p.prepare([claim]))
        await queued(pool, 1)
        await asyncio.wait_for(p.drain(0.05), 10)  # gives up: the call holds the lock
        assert p._waits.given_up and p._lock.locked() and len(pool._backlog) == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 10)
        assert not pool._backlog and not p._lock.locked()
    finally:
        held.release.set()
    await next_job_taken(pool)
    assert api.count("GET", CLAIMS) == reads, "the dropped prepare read its claim"
    assert not os.path.exists(cdi.spec_path(dirs.cdi, p.config.driver, claim.uid))
    assert claim.uid not in Checkpoint(p.config.checkpoint_path).claims
    assert samples() == before
    assert (pool._threads, pool._idle, len(pool._backlog)) == (1, 1, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
async def test_a_child_forked_while_hops_are_queued_runs_its_own_and_none_of_its_parents(
    pool: hops.HopThreads,
) -> None:
    """The fork comes while the parent's one thread is busy and a hop waits behind it. The child has
    neither: its pool starts empty, its own hop gets a thread of its own, and its parent's queued hop
    never runs there (dropped there, it is withdrawn from nothing). The parent's still runs, once."""
    held = Held(pool)
    ran: list[int] = []
    parents = hops.hop(ran.append, os.getpid())
    try:
        await queued(pool, 1)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                pool.after_fork()  # as the module's own hook does for its pool (`hops.THREADS`)
                fresh = (pool._threads, pool._idle, len(pool._backlog)) == (0, 0, 0)
                dropped = parents.drop()

                async def child() -> object:
                    return await hops.finish(REF, hops.hop(lambda: "child"))

                code = 0 if fresh and dropped and asyncio.run(child()) == "child" and not ran else 2
            finally:
                os._exit(code)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        held.release.set()
    await asyncio.wait_for(hops.finish(REF, parents), 10)
    assert ran == [os.getpid()]
