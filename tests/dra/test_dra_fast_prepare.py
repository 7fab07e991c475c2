"""The first prepare's short cuts (hack/bench_dra.py's first-prepare figures): the spec encoded once for
its file and the checkpoint entry, the spec written without a read first, the checkpoint directory
looked at only when a create says it is missing, and a hop's outcome handed to the loop in one pass.
Each keeps what the longer way did: the same bytes on disk, nothing followed or left behind, the call
woken whatever `on_end` does, a cancelled call still holding the claim until its thread ends."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import DRIVER, NIC0, Dirs, result

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import cdi, checkpoint
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.hops import Running, finish, hop
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.source import RecordSource

UID = "0b6a3c1e-93f4-4f0e-8d7b-5a3f1e2c4d5e"
REF = ClaimRef("ml", UID, "pair")


class Api:
    def __init__(self, claim: dict[str, Any]) -> None:
        self.claim = claim

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claim


def allocated(*devices: str, uid: str = UID) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid},
        "status": {"allocation": {"devices": {"results": [result(d) for d in devices]}}},
    }


def make(dirs: Dirs, host: tuple[SysfsBuilder, Libraries], spec: DevicesSpec, claim: Any) -> Preparer:
    config = dirs.config()
    return Preparer(config, RecordSource(spec), host[0].host, Api(claim), Checkpoint(config.checkpoint_path))


# --- the entry's encoding -------------------------------------------------------------------------------

_CHARS = 'aZ09-_./:="\\\n\t\x00\x1f\x7f\u2028é漢\U0001f600 '


def _text(rng: random.Random, most: int = 12) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, most)))


def _claim(rng: random.Random) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            tuple(_text(rng) for _ in range(rng.randint(0, 3))),
            _text(rng),
            _text(rng),
            tuple(_text(rng, 40) for _ in range(rng.randint(0, 2))),
        )
        for _ in range(rng.randint(0, 4))
    )
    spec: dict[str, Any] = {_text(rng): _text(rng) for _ in range(rng.randint(0, 3))}
    spec["devices"] = [{"name": _text(rng), "edits": [1, -2.5, None, True, {"z": _text(rng), "a": []}]}]
    return PreparedClaim(_text(rng, 40), _text(rng), _text(rng), devices, _text(rng), spec)


def test_an_entry_whose_spec_was_encoded_once_is_byte_for_byte_the_plain_encoding() -> None:
    """What the checksum covers is `json.dumps(body, sort_keys=True)`: the spliced body must be exactly
    that, whatever the strings hold (quotes, backslashes, control characters, non-ASCII), or a restarted
    driver would set every entry aside as corrupt."""
    rng = random.Random(24)
    for _ in range(500):
        claim = _claim(rng)
        spliced = checkpoint.encode(claim, cdi.spec_text(claim.spec))
        assert spliced == checkpoint.encode(claim)
        back = checkpoint.decode(spliced)
        assert back == claim and back.spec == claim.spec
    # The splice is checked like any entry: a byte changed in the spec's part fails the checksum.
    claim = _claim(rng)
    data = checkpoint.encode(claim, cdi.spec_text(claim.spec))
    tampered = data.replace(b'"edits": [1,', b'"edits": [7,', 1)
    assert tampered != data
    with pytest.raises(ValueError, match="checksum"):
        checkpoint.decode(tampered)


async def test_the_spec_file_and_the_entry_hold_the_same_spec(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    p = make(dirs, hgx_host, hgx_spec, allocated(NIC0))
    out = (await p.prepare([REF]))[UID]
    assert out.error == "" and out.devices
    path = cdi.spec_path(dirs.cdi, DRIVER, UID)
    on_disk = Path(path).read_bytes()
    assert on_disk == (json.dumps(json.loads(on_disk), sort_keys=True) + "\n").encode()
    entry = Checkpoint(p.checkpoint.path).get(UID)
    assert entry is not None and entry.spec == json.loads(on_disk) and entry.spec_path == path
    await p.syncs.drain(5)


# --- the spec written without a read first -------------------------------------------------------------


@pytest.mark.parametrize("leftover", ["stale", "symlink", "fifo", "empty"])
async def test_a_first_prepare_replaces_whatever_is_at_its_spec_path_never_following_it(
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    tmp_path: Path,
    leftover: str,
) -> None:
    """No read first: what is under the claim's spec name (a leftover of an older driver, a link, a
    FIFO that would hang a plain open) is replaced by the rename, never written through."""
    path = cdi.spec_path(dirs.cdi, DRIVER, UID)
    os.makedirs(dirs.cdi, exist_ok=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    if leftover == "stale":
        Path(path).write_text('{"kind": "old"}')
    elif leftover == "symlink":
        os.symlink(victim, path)
    elif leftover == "fifo":
        os.mkfifo(path)
    else:
        Path(path).write_bytes(b"")
    p = make(dirs, hgx_host, hgx_spec, allocated(NIC0))
    out = (await asyncio.wait_for(p.prepare([REF]), 10))[UID]
    assert out.error == "" and out.devices
    assert not os.path.islink(path) and os.path.isfile(path)
    spec = cdi.read_spec(path)
    assert spec is not None and spec["kind"] == f"{DRIVER}/nic"
    assert victim.read_text() == "keep me"
    assert sorted(os.listdir(dirs.cdi)) == [os.path.basename(path)], "no temporary left"
    await p.syncs.drain(5)


async def test_a_first_prepare_whose_spec_path_is_a_directory_fails_and_leaves_no_entry(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    path = cdi.spec_path(dirs.cdi, DRIVER, UID)
    os.makedirs(path)
    p = make(dirs, hgx_host, hgx_spec, allocated(NIC0))
    out = (await p.prepare([REF]))[UID]
    assert "writing the CDI spec or the checkpoint failed" in out.error and not out.devices
    assert UID not in p.checkpoint.claims and Checkpoint(p.checkpoint.path).claims == {}
    assert os.listdir(p.checkpoint.directory) == [] and os.listdir(path) == []


# --- the checkpoint directory, looked at only when missing ----------------------------------------------


def test_a_reservation_makes_a_missing_directory_and_syncs_its_entry_in_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first claim ever, or a directory removed under the driver: the create says it is missing,
    the directory is made (0700) and its own name synced in the parent before the claim is written."""
    cp = Checkpoint(str(tmp_path / "checkpoint.json"))
    assert not os.path.exists(cp.directory)
    synced: list[str] = []
    real = checkpoint.sync_directory

    def recording(directory: str) -> None:
        synced.append(directory)
        real(directory)

    monkeypatch.setattr(checkpoint, "sync_directory", recording)
    entry = cp.reserve(UID)
    assert synced == [str(tmp_path)], "the new directory's name made durable"
    assert os.stat(cp.directory).st_mode & 0o777 == 0o700
    claim = PreparedClaim(UID, "ml", "pair", (), "", {})
    entry.commit(claim)
    entry.sync()
    assert Checkpoint(cp.path).get(UID) == claim
    # Present: no look at the directory, no sync of the parent.
    synced.clear()
    monkeypatch.setattr(os.path, "isdir", lambda _: pytest.fail("looked at the directory"))
    cp.reserve("u-2").release()
    assert synced == []
    # Removed under the driver: made again.
    monkeypatch.undo()
    cp.remove(UID)
    os.rmdir(cp.directory)
    cp.reserve("u-3").release()
    assert os.path.isdir(cp.directory) and os.listdir(cp.directory) == []


def test_a_reservation_replaces_a_leftover_under_its_name_and_refuses_a_directory(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path / "checkpoint.json"))
    os.makedirs(cp.directory)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, os.path.join(cp.directory, checkpoint.file_name(UID)))
    cp.reserve(UID).commit(PreparedClaim(UID, "ml", "pair", (), "", {}))
    assert victim.read_text() == "keep me" and Checkpoint(cp.path).get(UID) is not None
    os.makedirs(os.path.join(cp.directory, checkpoint.file_name("u-dir")))
    with pytest.raises(IsADirectoryError):
        cp.reserve("u-dir")


# --- a hop's outcome, in one loop pass -------------------------------------------------------------------


async def test_a_settled_hop_wakes_its_call_on_the_next_loop_pass() -> None:
    """The thread hands the outcome over once (`settle`, from call_soon_threadsafe); the call resumes on
    the pass after it. A wrapped executor future, shielded, took two more."""
    loop = asyncio.get_running_loop()
    seen: list[object] = []
    running: Running[object] = Running(loop, seen.append)
    call = asyncio.create_task(finish(REF, running))
    await asyncio.sleep(0)  # the call now waits
    outcome = object()
    running.settle(outcome, None)
    assert seen == [outcome], "on_end runs as the outcome arrives, before the call resumes"
    await asyncio.sleep(0)
    assert call.done() and call.result() is outcome


async def test_a_hop_runs_on_a_hop_thread_and_answers_its_result_or_its_error() -> None:
    ended: list[int] = []
    assert await finish(REF, hop(lambda x: x * 2, 21, on_end=ended.append)) == 42
    assert ended == [42]

    def boom() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        await finish(REF, hop(boom, on_end=lambda _: pytest.fail("on_end saw a failure")))

    def stop() -> None:
        raise StopIteration  # an asyncio future refuses it as an exception: the call would never wake

    with pytest.raises(RuntimeError, match="StopIteration"):
        await asyncio.wait_for(finish(REF, hop(stop)), 10)


async def test_a_cancelled_call_waits_for_its_thread_and_on_end_still_sees_the_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kubelet's deadline mid-hop: the call is cancelled, yet it ends only once its thread has (the lock
    it holds stays held), cancelled again meanwhile or not; what the thread did still reaches on_end."""
    started, release = threading.Event(), threading.Event()
    ended: list[str] = []

    def work() -> str:
        started.set()
        release.wait(10)
        return "written"

    call = asyncio.create_task(finish(REF, hop(work, on_end=ended.append)))
    await asyncio.sleep(0)  # the call awaits its hop (as a prepare's task does from its first step)
    while not started.is_set():
        await asyncio.sleep(0.01)
    call.cancel()
    await asyncio.sleep(0.05)
    assert not call.done(), "the call ended while its thread still ran"
    call.cancel()  # a second cancel (the server's stop) does not let it go either
    await asyncio.sleep(0.05)
    assert not call.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 10)
    assert ended == ["written"]

    # A cancelled hop whose thread then fails says so.
    started.clear()
    release.clear()

    def failing() -> None:
        started.set()
        release.wait(10)
        raise OSError(5, "Input/output error")

    with caplog.at_level(logging.WARNING):
        call = asyncio.create_task(finish(REF, hop(failing), "unprepare"))
        await asyncio.sleep(0)
        while not started.is_set():
            await asyncio.sleep(0.01)
        call.cancel()
        await asyncio.sleep(0.02)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 10)
    assert any("a cancelled unprepare failed" in r.getMessage() for r in caplog.records)


async def test_an_on_end_that_fails_still_answers_the_call(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_: object) -> None:
        raise RuntimeError("bookkeeping broke")

    with caplog.at_level(logging.ERROR):
        assert await asyncio.wait_for(finish(REF, hop(lambda: "done", on_end=broken)), 10) == "done"
    assert any("recording a hop's outcome failed" in r.getMessage() for r in caplog.records)
