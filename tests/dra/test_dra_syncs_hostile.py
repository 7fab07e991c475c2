"""The checkpoint entry's syncs after kubelet's answer, attacked over the real DRA socket: a slow or failing
disk, many claims in one call, an unprepare or a stop while syncs are pending, a power loss in the window.
Faults are injected at the os calls only (fdatasync, write); the files and the gRPC are real."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from dra_helpers import (
    CLAIMS,
    DRIVER,
    NIC0,
    Dirs,
    HeldWrites,
    HgxDriver,
    fd_path,
    put_claim,
    ref,
    result,
    shutdown,
)
from prometheus_client import REGISTRY

from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim, file_name
from nodefabric_operator.demo.kubeapi import RunningAPI


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Disk:
    """os.fdatasync of checkpoint entries, held until released (a slow disk), recording which file each
    sync reached."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.release = threading.Event()
        self.synced: list[str] = []
        self.entered = threading.Event()
        self._real: Callable[[int], None] = os.fdatasync

    def fdatasync(self, fd: int) -> None:
        path = fd_path(fd)
        if path.startswith(self.directory):
            self.entered.set()
            self.release.wait(30)
            self.synced.append(os.path.basename(path).removesuffix(" (deleted)"))
        self._real(fd)


def unsynced() -> float:
    return REGISTRY.get_sample_value("nodefabric_dra_unsynced_claims") or 0.0


async def test_syncs_pending_behind_a_slow_disk_hold_no_descriptor_each(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """Many claims in one call, the disk slow to sync: each entry waits for its sync after the answer,
    and must not hold a descriptor while it waits. With the container runtime's default soft limit of
    1,024 descriptors, 1,000 claims queued behind a slow disk would fail every prepare after them."""
    claims = [put_claim(api, f"many-{i}", [result(NIC0)]) for i in range(120)]
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        disk = Disk(r.driver.checkpoint.directory)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(os, "fdatasync", disk.fdatasync)
                before = open_fds()
                out = await plugin.prepare(*(ref(c) for c in claims))
                assert all(not e.error for e in out.values()) and len(out) == len(claims)
                held = open_fds() - before
                assert unsynced() >= len(claims) - 1, "the syncs wait behind the slow disk"
                disk.release.set()
                await asyncio.wait_for(r.driver.preparer.syncs.drain(), 30)
            assert held < 10, f"{held} descriptors held by {len(claims)} pending syncs"
            assert unsynced() == 0 and len(disk.synced) == len(claims)
        finally:
            disk.release.set()


async def test_an_unprepare_while_the_sync_is_pending_keeps_the_claim_gone(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """The unprepare answers at once (its own unlink synced), the pending sync then finds the entry gone:
    no failure counted, nothing comes back at the next start, and the claim prepares again afresh."""
    claim = put_claim(api, "short", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    failures = REGISTRY.get_sample_value("nodefabric_dra_checkpoint_sync_failures_total") or 0.0
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        disk = Disk(r.driver.checkpoint.directory)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(os, "fdatasync", disk.fdatasync)
                first = await plugin.prepare(ref(claim))
                assert not first[uid].error
                assert await asyncio.wait_for(plugin.unprepare(ref(claim)), 10) == {uid: ""}
                assert Checkpoint(r.driver.config.checkpoint_path).claims == {}
                disk.release.set()
                await asyncio.wait_for(r.driver.preparer.syncs.drain(), 10)
            assert (
                REGISTRY.get_sample_value("nodefabric_dra_checkpoint_sync_failures_total") or 0.0
            ) == failures
            assert Checkpoint(r.driver.config.checkpoint_path).claims == {}
            assert os.listdir(r.driver.checkpoint.directory) == []
            reads = api.count("GET", CLAIMS)
            again = await plugin.prepare(ref(claim))
            assert again == first and api.count("GET", CLAIMS) == reads + 1
        finally:
            disk.release.set()


async def test_a_stop_waits_for_a_prepare_whose_deadline_passed_mid_write_and_syncs_its_entry(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """kubelet's deadline passes while the entry is being written; the driver is stopped meanwhile. The
    write finishes on its thread after the stop began: the driver must not end before that entry's sync
    (it answers nothing, but the claim is recorded and kubelet's next call is answered from it)."""
    claim = put_claim(api, "late", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        directory = r.driver.checkpoint.directory
        name = file_name(uid)
        slow_write = HeldWrites(directory)
        hold, entered = slow_write.hold, slow_write.entered
        real_sync = os.fdatasync
        synced: list[str] = []

        def fdatasync(fd: int) -> None:
            synced.append(os.path.basename(fd_path(fd)))
            real_sync(fd)

        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(os, "write", slow_write)
                patch.setattr(os, "fdatasync", fdatasync)
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await plugin.prepare(ref(claim), timeout=0.5)
                assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and entered.is_set()
                threading.Timer(1.5, hold.set).start()  # the write ends after the stop began
                began = time.monotonic()
                await shutdown(r)
                took = time.monotonic() - began
                stopped_synced = list(synced)
            assert name in stopped_synced, f"the driver stopped after {took:.2f}s with the entry unsynced"
            assert stopped_synced.count(name) == 1, "the cancelled prepare's entry is synced once"
            assert REGISTRY.get_sample_value("nodefabric_dra_prepared_claims") == 1, "and counted as prepared"
            assert list(Checkpoint(r.driver.config.checkpoint_path).claims) == [uid]
        finally:
            hold.set()


@pytest.mark.parametrize("loss", ["missing", "empty", "torn"])
async def test_a_power_loss_before_the_sync_prepares_the_claim_again_from_the_api(
    api: RunningAPI,
    dirs: Dirs,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    loss: str,
) -> None:
    """What the README says a power loss in the window leaves (the entry missing, empty or torn, and
    /var/run/cdi emptied): the restarted driver answers kubelet's repeated prepare the same, read again
    from the API, and the unprepare then removes both files."""
    claim = put_claim(api, "lost", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        first = await plugin.prepare(ref(claim))
    entry = Path(r.driver.checkpoint.directory, file_name(uid))
    whole = entry.read_bytes()
    if loss == "missing":
        entry.unlink()
    elif loss == "empty":
        entry.write_bytes(b"")
    else:
        entry.write_bytes(whole[: len(whole) // 2] + b"\0" * (len(whole) - len(whole) // 2))
    for spec in os.listdir(dirs.cdi):
        os.unlink(os.path.join(dirs.cdi, spec))
    reads = api.count("GET", CLAIMS)
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert r.driver.checkpoint.claims == {}
        again = await plugin.prepare(ref(claim))
        assert again == first and api.count("GET", CLAIMS) == reads + 1
        assert len(os.listdir(dirs.cdi)) == 1
        assert list(Checkpoint(r.driver.config.checkpoint_path).claims) == [uid]
        assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert os.listdir(dirs.cdi) == []
        left = sorted(os.listdir(r.driver.checkpoint.directory))
        assert left == ([entry.name + ".corrupt"] if loss == "torn" else [])


async def test_an_unprepare_retried_after_its_directory_sync_failed_syncs_before_it_answers(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """The first unprepare unlinks the entry and fails on the directory's fsync (kubelet hears the error
    and retries). The retry finds the file already gone; it must still fsync the directory before it
    answers, or an unprepare answered to kubelet could have its entry come back after a power loss."""
    claim = put_claim(api, "retried", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        directory = r.driver.checkpoint.directory
        real = os.fsync
        synced: list[str] = []

        def failing(fd: int) -> None:
            if fd_path(fd) == directory:
                raise OSError(5, "Input/output error")
            real(fd)

        def counting(fd: int) -> None:
            synced.append(fd_path(fd))
            real(fd)

        assert not (await plugin.prepare(ref(claim)))[uid].error
        await asyncio.wait_for(r.driver.preparer.drain(), 10)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "fsync", failing)
            out = await plugin.unprepare(ref(claim))
        assert "Input/output error" in out[uid]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "fsync", counting)
            assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert directory in synced, "the retry answered without the unlink made durable"
        assert r.driver.checkpoint.claims == {} and os.listdir(dirs.cdi) == []


def test_a_held_claim_whose_checkpoint_directory_is_gone_still_unprepares(tmp_path: Path) -> None:
    """The retry's directory sync must not turn a removed checkpoint directory into an unprepare that
    fails for good; a claim never held costs no sync at all."""
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"))
    entry = checkpoint.reserve("u-1")
    entry.commit(PreparedClaim("u-1", "ml", "c", (), ""))
    entry.sync()
    shutil.rmtree(checkpoint.directory)
    checkpoint.remove("u-1")
    assert checkpoint.claims == {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: pytest.fail("a claim never held synced the directory"))
        checkpoint.remove("u-2")


HUNG_EXIT = """
import asyncio, logging, os, sys, threading
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim
from nodefabric_deviceplugin.dra.syncs import Syncs

logging.basicConfig(format="%(message)s %(claim_uids)s")
os.fdatasync = lambda fd: threading.Event().wait()  # a disk that never answers


async def main() -> None:
    checkpoint = Checkpoint(sys.argv[1])
    entry = checkpoint.reserve("u-1")
    entry.commit(PreparedClaim("u-1", "ml", "c", (), ""))
    syncs = Syncs()
    syncs.start(entry)
    print(await syncs.drain(0.3), flush=True)


asyncio.run(main())
"""


def test_a_sync_that_never_returns_holds_neither_the_stop_nor_the_process_exit(tmp_path: Path) -> None:
    """A disk that never answers an fdatasync: the stop's drain gives up after its bound, and the process
    then exits (the sync thread must not be one that interpreter exit joins)."""
    began = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", HUNG_EXIT, str(tmp_path / "checkpoint.json")],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit: {exc.stdout!r} {exc.stderr!r}")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "False\n" and time.monotonic() - began < 15
    assert "u-1" in out.stderr and "not synced" in out.stderr, out.stderr


async def test_a_driver_stopped_with_a_sync_hung_ends_within_its_bound_and_says_what_is_unsynced(
    api: RunningAPI,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    caplog: pytest.LogCaptureFixture,
) -> None:
    claim = put_claim(api, "hung", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        disk = Disk(r.driver.checkpoint.directory)
        try:
            with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.ERROR):
                patch.setattr(os, "fdatasync", disk.fdatasync)
                assert not (await plugin.prepare(ref(claim)))[uid].error
                began = time.monotonic()
                await shutdown(r)
                took = time.monotonic() - began
            assert took < 10, f"the stop took {took:.1f}s"
            [logged] = [rec for rec in caplog.records if "not synced" in rec.getMessage()]
            assert logged.__dict__["claim_uids"] == [uid] and logged.__dict__["unsynced"] == 1
        finally:
            disk.release.set()


@pytest.mark.parametrize("change", ["unlinked", "fifo", "symlink", "directory", "directory-gone"])
def test_whatever_replaced_an_entry_before_its_sync_neither_hangs_nor_is_written_through(
    tmp_path: Path, change: str
) -> None:
    """Between the commit (before kubelet's answer) and the sync (after it), the entry's name may be
    unlinked (an unprepare: its own unlink was synced, nothing to do) or hold something planted there;
    the directory may be gone (the entry is lost for good: a failure, logged and counted by the caller)."""
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"))
    entry = checkpoint.reserve("u-1")
    entry.commit(PreparedClaim("u-1", "ml", "c", (), ""))
    target = tmp_path / "elsewhere"
    target.write_bytes(b"untouched")
    path = Path(entry.path)
    if change == "directory-gone":
        shutil.rmtree(checkpoint.directory)
    else:
        path.unlink()
        if change == "fifo":
            os.mkfifo(path)
        elif change == "symlink":
            path.symlink_to(target)
        elif change == "directory":
            path.mkdir()
    done = threading.Event()
    failed: list[BaseException] = []

    def sync() -> None:
        try:
            entry.sync()
        except OSError as exc:
            failed.append(exc)
        done.set()

    threading.Thread(target=sync, daemon=True).start()
    assert done.wait(10), "the sync hung on what was put under the entry's name"
    assert target.read_bytes() == b"untouched"
    assert bool(failed) == (change != "unlinked"), failed
    entry.sync()  # once only: a second call does nothing


@pytest.mark.parametrize("loss", ["missing", "empty", "torn"])
async def test_a_power_loss_before_the_sync_then_an_unprepare_removes_the_spec_by_its_name(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec, loss: str
) -> None:
    """The pod went while the node was down: kubelet's first call after the reboot is the unprepare. The
    entry is lost (missing, empty or torn), the spec survived (a CDI directory that is not a tmpfs): the
    spec is found by its name and removed, and nothing of the claim is left but a set-aside torn file."""
    claim = put_claim(api, "gone-while-down", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert not (await plugin.prepare(ref(claim)))[uid].error
    entry = Path(r.driver.checkpoint.directory, file_name(uid))
    {
        "missing": entry.unlink,
        "empty": lambda: entry.write_bytes(b""),
        "torn": lambda: entry.write_bytes(b"{"),
    }[loss]()
    assert len(os.listdir(dirs.cdi)) == 1
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert os.listdir(dirs.cdi) == []
        left = sorted(os.listdir(r.driver.checkpoint.directory))
        assert left == ([entry.name + ".corrupt"] if loss == "torn" else [])


def test_a_close_that_fails_after_the_write_refuses_the_claim_and_leaves_no_entry(tmp_path: Path) -> None:
    """Some file systems report a write's failure only at close (EIO, ENOSPC on NFS): the claim is
    refused, so its entry must not stay on disk to come back as prepared at the next start."""
    path = str(tmp_path / "checkpoint.json")
    checkpoint = Checkpoint(path)
    entry = checkpoint.reserve("u-1")
    real = os.close

    def failing(fd: int) -> None:
        reached = fd_path(fd).startswith(checkpoint.directory)
        real(fd)  # Linux closes the descriptor whatever close returns
        if reached:
            raise OSError(5, "Input/output error")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "close", failing)
        with pytest.raises(OSError, match="Input/output"):
            entry.commit(PreparedClaim("u-1", "ml", "c", (), ""))
    assert checkpoint.claims == {}
    assert os.listdir(checkpoint.directory) == [] and Checkpoint(path).claims == {}
