"""A first prepare in one thread hop: the claim's read, the grant and both files on one worker thread when
the verbs devices are cached for the record; the budgeted off-loop verbs read and a second hop when they
are not. Attacked over the real DRA socket and the embedded API: kubelet's deadline mid-hop, an unprepare
or a prepare of the same claim racing it, a write failing after the call was cancelled."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import pytest
from dra_helpers import (
    DRIVER,
    NIC0,
    NIC1,
    Dirs,
    HeldWrites,
    HgxDriver,
    fd_path,
    put_claim,
    ref,
    result,
    start_preparer,
)
from prometheus_client import REGISTRY

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import cdi, hops
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, file_name
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.verbs import VerbsCache, VerbsTable, read_table
from nodefabric_operator.demo.kubeapi import RunningAPI


class Hops(hops.HopThreads):
    """The driver's hop threads, counting what each prepare sent to one."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted = 0

    def submit(self, job: Callable[[], None]) -> None:
        self.submitted += 1
        super().submit(job)


class RecordingReader:
    """The real verbs read, noting the thread each read ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, host: HostRoot, wanted: Iterable[str]) -> VerbsTable:
        self.threads.append(threading.current_thread().name)
        return read_table(host, wanted)


def preparer(
    api: RunningAPI, dirs: Dirs, host: HostRoot, source: RecordSource, reader: RecordingReader
) -> Preparer:
    return start_preparer(api, dirs, host, source, verbs=VerbsCache(host, reader=reader))


async def test_a_first_prepare_with_its_verbs_devices_cached_takes_one_thread_hop(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first claim of a record misses the verbs cache: its read runs on the budgeted reader's own
    thread (never the hop's, which a FIFO in sysfs would hang) and the files take a second hop. Every
    claim after it in the same record, on any device the read answered, takes one hop in all."""
    reader = RecordingReader()
    source = RecordSource(hgx_spec)
    p = preparer(api, dirs, hgx_host[0].host, source, reader)
    counted = Hops()
    monkeypatch.setattr(hops, "THREADS", counted)
    first, second = put_claim(api, "a", [result(NIC0)]), put_claim(api, "b", [result(NIC1)])

    out = await p.prepare([ref(first)])
    assert out[ref(first).uid].error == "" and counted.submitted == 2, counted.submitted
    assert len(reader.threads) == 1 and reader.threads[0].startswith("read "), reader.threads

    counted.submitted = 0
    out = await p.prepare([ref(second)])
    assert out[ref(second).uid].error == ""
    assert counted.submitted == 1, f"a first prepare with its verbs cached took {counted.submitted} hops"
    assert len(reader.threads) == 1, "no second read of the host"
    spec = cdi.read_spec(cdi.spec_path(dirs.cdi, DRIVER, ref(second).uid))
    assert spec is not None and spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"].startswith(
        "/dev/infiniband/uverbs"
    )
    assert set(Checkpoint(p.checkpoint.path).claims) == {ref(first).uid, ref(second).uid}
    await p.syncs.drain(5)

    # A new record: the cache no longer answers, and the read goes through the budgeted path again.
    changed = hgx_spec.model_copy(update={"interfaces": list(reversed(hgx_spec.interfaces))})
    assert source.update(changed)
    third = put_claim(api, "c", [result(NIC1)])
    counted.submitted = 0
    out = await p.prepare([ref(third)])
    assert out[ref(third).uid].error == ""
    assert len(reader.threads) == 2 and counted.submitted == 2, (reader.threads, counted.submitted)
    await p.syncs.drain(5)


async def test_a_claim_without_our_devices_and_a_missing_claim_take_one_hop_and_write_nothing(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = RecordingReader()
    p = preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec), reader)
    counted = Hops()
    monkeypatch.setattr(hops, "THREADS", counted)
    theirs = put_claim(api, "theirs", [result(NIC0, driver="other.example.com")])
    out = await p.prepare([ref(theirs), ClaimRef("ml", "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "gone")])
    assert out[ref(theirs).uid].error == "" and not out[ref(theirs).uid].devices
    assert "does not exist" in out["1b4e28ba-2fa1-11d2-883f-0016d3cca427"].error
    assert counted.submitted == 2 and reader.threads == []
    assert p.checkpoint.claims == {} and not os.path.exists(dirs.cdi)


@pytest.mark.parametrize("then", ["unprepare", "prepare"])
async def test_a_single_hop_cancelled_mid_write_holds_the_claim_until_written_then_answers_whole(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec, then: str
) -> None:
    """kubelet's deadline passes while the one hop is writing the claim's entry, and kubelet at once
    unprepares (or prepares again) the same claim. That call waits for the hop's thread to end: the
    unprepare then removes both files for good; the prepare answers what the hop wrote, from the
    checkpoint, without a second read of the API."""
    warm, late = put_claim(api, "warm", [result(NIC0)]), put_claim(api, "late", [result(NIC1)])
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        directory = r.driver.checkpoint.directory
        try:
            assert (await plugin.prepare(ref(warm)))[ref(warm).uid].error == ""  # the verbs cache is warm
            reads = r.driver.preparer.verbs.reads
            uid = ref(late).uid
            slow_write = HeldWrites(directory)
            hold, entered = slow_write.hold, slow_write.entered

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(os, "write", slow_write)
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await plugin.prepare(ref(late), timeout=0.5)
                assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and entered.is_set()
                released = 0.0

                def release() -> None:
                    nonlocal released
                    released = time.monotonic()
                    hold.set()

                threading.Timer(0.5, release).start()
                if then == "unprepare":
                    answer: Any = await plugin.unprepare(ref(late))
                    answered = time.monotonic()
                else:
                    answer = await plugin.prepare(ref(late))
                    answered = time.monotonic()
            assert released and answered >= released, "the racing call ran while the hop was still writing"
            spec = cdi.spec_path(dirs.cdi, DRIVER, uid)
            if then == "unprepare":
                assert answer == {uid: ""}
                assert not os.path.exists(spec) and not os.path.exists(
                    os.path.join(directory, file_name(uid))
                )
                assert uid not in Checkpoint(r.driver.config.checkpoint_path).claims
            else:
                assert answer[uid].error == "" and [d.device_name for d in answer[uid].devices] == [NIC1]
                assert os.path.exists(spec)
                await r.driver.preparer.syncs.drain(5)
                assert uid in Checkpoint(r.driver.config.checkpoint_path).claims
            assert r.driver.preparer.verbs.reads == reads, "the cancelled claim took the one-hop path"
            assert REGISTRY.get_sample_value("nodefabric_dra_prepared_claims") == (
                2 if then == "prepare" else 1
            )
        finally:
            hold.set()


async def test_a_single_hop_whose_write_fails_after_its_cancel_leaves_neither_file(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """The deadline passes mid-write and the write then fails (a full disk): no spec, no entry, nothing
    counted as prepared, and kubelet's next call prepares the claim afresh."""
    warm, late = put_claim(api, "warm", [result(NIC0)]), put_claim(api, "late", [result(NIC1)])
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        directory = r.driver.checkpoint.directory
        try:
            assert (await plugin.prepare(ref(warm)))[ref(warm).uid].error == ""
            uid = ref(late).uid
            full = HeldWrites(directory, fail=OSError(28, "No space left on device"))
            hold, entered = full.hold, full.entered

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(os, "write", full)
                with pytest.raises(grpc.aio.AioRpcError):
                    await plugin.prepare(ref(late), timeout=0.5)
                assert entered.is_set()
                threading.Timer(0.3, hold.set).start()
                assert await plugin.unprepare(ref(warm)) == {ref(warm).uid: ""}  # waits for the hop's end
            assert not os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, uid))
            assert os.listdir(directory) == [] and os.listdir(dirs.cdi) == []
            assert REGISTRY.get_sample_value("nodefabric_dra_prepared_claims") == 0
            again = (await plugin.prepare(ref(late)))[uid]
            assert again.error == "" and [d.device_name for d in again.devices] == [NIC1]
        finally:
            hold.set()


async def test_an_unprepare_cancelled_mid_removal_ends_before_the_claim_is_prepared_again(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """kubelet's deadline passes while an unprepare waits for its directory fsync, and the claim is
    prepared again at once. The prepare must wait for the removal to end: run beside it, the removal
    would forget the entry the prepare just made (and a spec rewrite could land after its unlink)."""
    claim = put_claim(api, "again", [result(NIC0)])
    uid = ref(claim).uid
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        directory = r.driver.checkpoint.directory
        try:
            assert (await plugin.prepare(ref(claim)))[uid].error == ""
            await r.driver.preparer.syncs.drain(5)
            hold, entered = threading.Event(), threading.Event()
            real_fsync = os.fsync

            def slow_fsync(fd: int) -> None:
                if fd_path(fd) == directory:
                    entered.set()
                    hold.wait(30)
                real_fsync(fd)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(os, "fsync", slow_fsync)
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await plugin.unprepare(ref(claim), timeout=0.5)
                assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and entered.is_set()
                threading.Timer(0.5, hold.set).start()
                again = (await plugin.prepare(ref(claim)))[uid]
            assert again.error == "" and [d.device_name for d in again.devices] == [NIC0]
            assert uid in r.driver.checkpoint.claims, "the prepare's entry was forgotten by the late removal"
            assert os.path.exists(os.path.join(directory, file_name(uid)))
            assert os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, uid))
            await r.driver.preparer.syncs.drain(5)
            assert uid in Checkpoint(r.driver.config.checkpoint_path).claims
        finally:
            hold.set()


@pytest.mark.parametrize("fault", ["emfile", "cdi dir is a file", "symlink at every temporary name"])
async def test_a_single_hop_that_cannot_write_the_spec_leaves_neither_file(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    fault: str,
) -> None:
    """The verbs cache warm (one hop), the spec's write fails: the claim is refused with the reason,
    its reserved entry is given back, nothing is counted prepared, and once the fault is gone the next
    call prepares it."""
    from nodefabric_deviceplugin.dra import files

    reader = RecordingReader()
    p = preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec), reader)
    warm, late = put_claim(api, "warm", [result(NIC0)]), put_claim(api, "late", [result(NIC1)])
    assert (await p.prepare([ref(warm)]))[ref(warm).uid].error == ""
    uid = ref(late).uid
    real_open = os.open
    monkeypatch = pytest.MonkeyPatch()
    try:
        if fault == "emfile":

            def full(path: str, flags: int, mode: int = 0o777, **kw: Any) -> int:
                if os.path.basename(path).startswith(".") and path.endswith(".tmp"):
                    raise OSError(24, "Too many open files")
                return real_open(path, flags, mode, **kw)

            monkeypatch.setattr(os, "open", full)
            why = "Too many open files"
        elif fault == "cdi dir is a file":
            os.rename(dirs.cdi, dirs.cdi + ".moved")
            open(dirs.cdi, "w").close()
            why = "Not a directory"
        else:
            monkeypatch.setattr(files.random, "getrandbits", lambda bits: 7)
            name = f".{os.path.basename(cdi.spec_path(dirs.cdi, DRIVER, uid))}.{7:012x}.tmp"
            os.symlink("/etc/passwd", os.path.join(dirs.cdi, name))
            why = "no free temporary name"
        out = (await p.prepare([ref(late)]))[uid]
        assert why in out.error and not out.devices
        assert uid not in p.checkpoint.claims and uid not in Checkpoint(p.checkpoint.path).claims
        assert os.listdir(p.checkpoint.directory) == [file_name(ref(warm).uid)]
        assert not os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, uid))
    finally:
        monkeypatch.undo()
        if fault == "cdi dir is a file":
            os.unlink(dirs.cdi)
            os.rename(dirs.cdi + ".moved", dirs.cdi)
    again = (await p.prepare([ref(late)]))[uid]
    assert again.error == "" and os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, uid))
    await p.syncs.drain(5)


async def test_every_preparer_of_a_process_syncs_on_one_thread(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """Drivers made and dropped (a test process, a restart in process) leave no idle sync thread each:
    entries of two Preparers are synced, durably, by the same one thread."""
    synced_on: list[int | None] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced_on.append(threading.current_thread().ident)
        real_fdatasync(fd)

    claims: list[tuple[Preparer, ClaimRef]] = []
    for i, nic in enumerate((NIC0, NIC1)):
        own = Dirs(f"{dirs.plugin}/{i}", f"{dirs.registry}/{i}", f"{dirs.cdi}/{i}")
        p = start_preparer(api, own, hgx_host[0].host, RecordSource(hgx_spec))
        claims.append((p, ref(put_claim(api, f"p{i}", [result(nic)]))))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fdatasync", fdatasync)
        for p, claim in claims:
            assert (await p.prepare([claim]))[claim.uid].error == ""
            assert await p.syncs.drain(5)
    assert len(synced_on) == 2 and len(set(synced_on)) == 1, synced_on
    assert [t.name for t in threading.enumerate()].count("dra-sync") == 1
    for p, claim in claims:
        assert claim.uid in Checkpoint(p.checkpoint.path).claims


async def test_a_hop_cancelled_twice_still_holds_the_claim_until_its_thread_ends(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """kubelet's deadline, then the server's stop, cancel the same call while its hop writes: the lock is
    released only once the thread ended, the claim whole."""
    p = preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec), RecordingReader())
    warm, late = put_claim(api, "warm", [result(NIC0)]), put_claim(api, "late", [result(NIC1)])
    assert (await p.prepare([ref(warm)]))[ref(warm).uid].error == ""
    slow_write = HeldWrites(p.checkpoint.directory)
    hold, entered = slow_write.hold, slow_write.entered

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "write", slow_write)
            call = asyncio.create_task(p.prepare([ref(late)]))
            assert await asyncio.to_thread(entered.wait, 10)
            for _ in range(3):
                call.cancel()
                await asyncio.sleep(0.05)
                assert p._lock.locked() and not call.done(), "released while the hop was still writing"
            hold.set()
            with pytest.raises(asyncio.CancelledError):
                await call
        assert not p._lock.locked()
        assert ref(late).uid in p.checkpoint.claims and os.path.exists(
            cdi.spec_path(dirs.cdi, DRIVER, ref(late).uid)
        )
        await p.syncs.drain(5)
        assert ref(late).uid in Checkpoint(p.checkpoint.path).claims
    finally:
        hold.set()


async def test_a_spec_rewrite_cancelled_mid_write_lands_before_the_unprepare_that_follows(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """A repeated prepare rewrites a spec a reboot took; kubelet's deadline passes mid-rename and it
    unprepares the claim at once. The unprepare must run after the rename, or the spec it could not yet
    see would stay in the runtime's directory for good."""
    claim = put_claim(api, "rewrite", [result(NIC0)])
    uid = ref(claim).uid
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        spec = cdi.spec_path(dirs.cdi, DRIVER, uid)
        try:
            assert (await plugin.prepare(ref(claim)))[uid].error == ""
            os.unlink(spec)  # /var/run/cdi emptied by a reboot
            hold, entered = threading.Event(), threading.Event()
            real_replace = os.replace

            def slow_replace(src: str, dst: str) -> None:
                if dst == spec:
                    entered.set()
                    hold.wait(30)
                real_replace(src, dst)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(os, "replace", slow_replace)
                with pytest.raises(grpc.aio.AioRpcError):
                    await plugin.prepare(ref(claim), timeout=0.5)
                assert entered.is_set()
                threading.Timer(0.5, hold.set).start()
                assert await plugin.unprepare(ref(claim)) == {uid: ""}
            assert not os.path.exists(spec), "the rewrite landed after the unprepare"
            assert os.listdir(dirs.cdi) == [] and uid not in r.driver.checkpoint.claims
        finally:
            hold.set()


class SlowReader:
    """The driver's claim reader, holding each read of `name` until `release` is set (an API server
    that answers slowly, or trickles its answer)."""

    def __init__(self, real: Any, name: str) -> None:
        self.real, self.name = real, name
        self.entered, self.release = threading.Event(), threading.Event()
        self.done = threading.Event()

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            if name == self.name:
                self.entered.set()
                self.release.wait(30)
            return self.real.get_claim(namespace, name)  # type: ignore[no-any-return]
        finally:
            if name == self.name:
                self.done.set()


async def test_a_first_prepare_cancelled_while_it_reads_its_claim_lets_go_at_once_and_writes_nothing(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """kubelet's deadline passes while the claim's read is still on its way: the call lets the lock go at
    once (other claims are prepared and unprepared meanwhile), and the thread, once its read returns,
    writes nothing: no entry, no spec. kubelet's retry then prepares the claim whole."""
    p = preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec), RecordingReader())
    warm, slow, other = (
        put_claim(api, n, [result(d)]) for n, d in (("warm", NIC0), ("slow", NIC1), ("o", NIC0))
    )
    assert (await p.prepare([ref(warm)]))[ref(warm).uid].error == ""  # the verbs cache is warm
    assert (await p.unprepare([ref(warm)])) == {ref(warm).uid: ""}
    reader = SlowReader(p.api, "slow")
    p.api = reader
    try:
        call = asyncio.create_task(p.prepare([ref(slow)]))
        assert await asyncio.to_thread(reader.entered.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 5)
        assert not p._lock.locked(), "a call cancelled during its claim's read still held the lock"
        out = await asyncio.wait_for(p.prepare([ref(other)]), 10)  # while the slow read still waits
        assert out[ref(other).uid].error == ""
        assert not reader.done.is_set()
    finally:
        reader.release.set()
    assert await asyncio.to_thread(reader.done.wait, 10)
    await asyncio.sleep(0.2)  # the abandoned thread ends its hop after the read returns
    uid = ref(slow).uid
    assert uid not in p.checkpoint.claims and uid not in Checkpoint(p.checkpoint.path).claims
    assert not os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, uid))
    assert not os.path.exists(os.path.join(p.checkpoint.directory, file_name(uid)))
    out = await p.prepare([ref(slow)])  # kubelet's retry
    assert out[uid].error == "" and os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, uid))
    await p.syncs.drain(5)
