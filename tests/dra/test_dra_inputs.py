"""Hostile inputs to the driver's parts: claims the API hands back, the checkpoint on disk, configuration,
an API that fails. Each bad input gets a clear error and loses nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import DRIVER, NODE, Dirs, result
from prometheus_client import REGISTRY

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.nodeclient import ApiFailure
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import cdi
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from nodefabric_deviceplugin.dra.claims import ClaimError, ClaimRef, allocated_devices
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.linklayer import link_layers
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.dra.publish import SlicePublisher
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.verbs import VerbsCache, VerbsTable, read_table

UID = "6f1c2a4e-2b0d-4d43-9a55-0c7f1b2b9e10"
REF = ClaimRef("ml", UID, "pair")


def claim(results: Any, uid: str = UID) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


# --- claims -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        ([], "is not an object"),
        ({"metadata": {"uid": "other"}}, "deleted and recreated"),
        ({"metadata": {"uid": UID}}, "not allocated"),
        ({"metadata": {"uid": UID}, "status": {"allocation": "yes"}}, "not allocated"),
        (claim({"a": 1}), "is not a list"),
        (claim(["x"]), "result 0 is not an object"),
        (claim([result("Not_A_Label")]), "names no valid device"),
        (claim([result("x" * 64)]), "names no valid device"),
        (claim([{"driver": DRIVER, "pool": NODE}]), "names no valid device"),
        (claim([result("pci-0000-19-00-0", pool="elsewhere")]), "not this node's pool"),
    ],
)
def test_a_claim_that_cannot_be_served_says_why(obj: Any, why: str) -> None:
    with pytest.raises(ClaimError, match=why):
        allocated_devices(obj, REF, driver=DRIVER, pool=NODE)


def test_results_of_other_drivers_are_skipped_and_a_missing_request_name_is_empty() -> None:
    results = [
        result("gpu-0", driver="gpu.nvidia.com", pool="anything"),
        {"driver": DRIVER, "pool": NODE, "device": "pci-0000-19-00-0", "request": 7},
        result("pci-0000-1a-00-0", request="nic/rdma"),
    ]
    found = allocated_devices(claim(results), REF, driver=DRIVER, pool=NODE)
    assert [(a.request, a.device) for a in found] == [
        ("", "pci-0000-19-00-0"),
        ("nic/rdma", "pci-0000-1a-00-0"),
    ]
    assert allocated_devices(claim(None), REF, driver=DRIVER, pool=NODE) == []


@pytest.mark.parametrize(
    "ref",
    [
        ClaimRef("ml", "", "x"),
        ClaimRef("ml", "../x", "x"),
        ClaimRef("ml", "a/b", "x"),
        ClaimRef("ml", "u" * 64, "x"),
        ClaimRef("", UID, "x"),
        ClaimRef("Ml", UID, "x"),
        ClaimRef("ml", UID, ""),
        ClaimRef("ml", UID, "a" * 254),
        ClaimRef("ml", UID, "has space"),
    ],
)
def test_claim_references_no_api_server_could_produce_are_refused(ref: ClaimRef) -> None:
    with pytest.raises(ClaimError, match="invalid claim"):
        ref.check()


# --- configuration --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"node_name": ""}, "node name"),
        ({"node_name": "Node_1"}, "node name"),
        ({"domain": "Example.COM"}, "domain"),
        ({"domain": "a" * 60 + ".io"}, "at most 63"),
        ({"plugin_dir": "relative/dir"}, "--plugin-dir must be an absolute path"),
        ({"cdi_dir": "cdi"}, "--cdi-dir must be an absolute path"),
        ({"registry_dir": "/" + "r" * 100}, "longer than 107 bytes"),
    ],
)
def test_bad_configuration_is_refused_with_the_reason(kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        DriverConfig(**{"node_name": NODE, **kwargs})


def test_the_driver_name_and_paths_follow_the_domain() -> None:
    config = DriverConfig(node_name=NODE, domain="example.com", plugin_dir="/p", registry_dir="/r")
    assert config.driver == "rdma.example.com"
    assert config.dra_socket == "/p/rdma.example.com/dra.sock"
    assert config.registration_socket == "/r/rdma.example.com-reg.sock"
    assert config.pool == NODE


# --- the checkpoint -----------------------------------------------------------------------------------------


def prepared(uid: str = UID) -> PreparedClaim:
    device = PreparedDevice(("nic",), NODE, "pci-0000-19-00-0", (f"{DRIVER}/nic={uid}-pci-0000-19-00-0",))
    return PreparedClaim(uid, "ml", "pair", (device,), f"/run/cdi/{DRIVER}-nic_{uid}.json", {"kind": "x"})


def claim_file(tmp_path: Path, uid: str = UID) -> Path:
    return tmp_path / "checkpoint.d" / f"{uid}.json"


def test_the_checkpoint_survives_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint.json")
    Checkpoint(path).put(prepared())
    again = Checkpoint(path)
    assert again.claims == {UID: prepared()}
    assert again.claims[UID].spec == {"kind": "x"}
    assert oct(os.stat(claim_file(tmp_path)).st_mode & 0o777) == "0o600"
    assert not os.path.exists(path), "no whole-file checkpoint is written any more"
    again.remove(UID)
    assert Checkpoint(path).claims == {}
    assert os.listdir(tmp_path / "checkpoint.d") == []


def test_one_file_per_claim_so_a_change_never_rewrites_the_others(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"))
    uids = [str(uuid.uuid4()) for _ in range(50)]
    for uid in uids:
        checkpoint.put(prepared(uid))
    before = {uid: os.stat(claim_file(tmp_path, uid)).st_ino for uid in uids}
    checkpoint.put(prepared(UID))
    checkpoint.remove(uids[0])
    # Every other claim's file is the very file it was: nothing else was rewritten.
    assert {uid: os.stat(claim_file(tmp_path, uid)).st_ino for uid in uids[1:]} == {
        uid: before[uid] for uid in uids[1:]
    }
    assert sorted(Checkpoint(str(tmp_path / "checkpoint.json")).claims) == sorted([*uids[1:], UID])


def test_putting_the_same_claim_twice_is_idempotent(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"))
    checkpoint.put(prepared())
    inode = os.stat(claim_file(tmp_path)).st_ino
    checkpoint.put(prepared())
    assert os.stat(claim_file(tmp_path)).st_ino == inode, "an identical claim is not written again"
    checkpoint.remove(UID)
    checkpoint.remove(UID)  # and a second remove is a no-op
    assert Checkpoint(str(tmp_path / "checkpoint.json")).claims == {}


def test_a_uid_that_is_not_plain_names_a_hashed_file_inside_the_directory(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"))
    odd = "../../etc/passwd"
    # The claim's spec path is the driver's own (a uid never reaches it unchecked, `ClaimRef.check`).
    checkpoint.put(dataclasses.replace(prepared(odd), spec_path=f"/run/cdi/{DRIVER}-nic_{UID}.json"))
    [name] = os.listdir(tmp_path / "checkpoint.d")
    assert name.startswith("h-") and "/" not in name
    assert list(Checkpoint(str(tmp_path / "checkpoint.json")).claims) == [odd]


def test_a_torn_write_loses_only_what_was_being_written(tmp_path: Path) -> None:
    """A crash mid-write: the temporary file of a write that never reached its rename, and a claim file
    whose content did not reach the disk whole (a filesystem without data ordering). Neither is trusted;
    every other claim is kept."""
    path = str(tmp_path / "checkpoint.json")
    checkpoint = Checkpoint(path)
    other = str(uuid.uuid4())
    checkpoint.put(prepared())
    checkpoint.put(prepared(other))
    directory = tmp_path / "checkpoint.d"
    whole = claim_file(tmp_path, other).read_bytes()
    claim_file(tmp_path, other).write_bytes(whole[: len(whole) // 2])  # torn
    (directory / f".{UID}.json.abc123.tmp").write_bytes(whole[:10])  # a write that crashed before rename
    again = Checkpoint(path)
    assert list(again.claims) == [UID]
    assert (directory / f"{other}.json.corrupt").read_bytes() == whole[: len(whole) // 2]
    assert sorted(os.listdir(directory)) == sorted([f"{other}.json.corrupt", f"{UID}.json"])


def test_a_crash_inside_a_put_leaves_the_claim_unrecorded_and_memory_in_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "checkpoint.json")
    checkpoint = Checkpoint(path)
    checkpoint.put(prepared())

    def crash(src: str, dst: str) -> None:
        raise OSError(5, "Input/output error")  # the rename never happens

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        checkpoint.put(prepared(str(uuid.uuid4())))
    monkeypatch.undo()
    assert list(checkpoint.claims) == [UID]
    assert list(Checkpoint(path).claims) == [UID]
    assert sorted(os.listdir(tmp_path / "checkpoint.d")) == [f"{UID}.json"]


def test_a_reserved_claim_is_durable_once_committed_and_gone_when_released(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint.json")
    checkpoint = Checkpoint(path)
    other = str(uuid.uuid4())
    kept = checkpoint.reserve(UID)
    dropped = checkpoint.reserve(other)
    # Reserved: the name exists (empty), nothing is recorded yet.
    assert claim_file(tmp_path).read_bytes() == b"" and checkpoint.claims == {}
    kept.commit(prepared())
    assert Checkpoint(path).claims == {UID: prepared()}, "written (read back by a restart) once committed"
    kept.sync()
    kept.sync()  # a second sync is a no-op
    dropped.release()
    dropped.release()  # a second release is a no-op
    kept.release()  # and releasing a committed reservation keeps the claim
    assert checkpoint.claims == {UID: prepared()}
    assert oct(os.stat(claim_file(tmp_path)).st_mode & 0o777) == "0o600"
    assert os.listdir(tmp_path / "checkpoint.d") == [f"{UID}.json"]
    assert Checkpoint(path).claims == {UID: prepared()}
    with pytest.raises(ValueError, match="already used"):
        kept.commit(prepared())
    with pytest.raises(ValueError, match="already recorded"):
        checkpoint.reserve(UID)  # a held claim is answered from memory, never reserved again
    checkpoint.remove(UID)
    assert Checkpoint(path).claims == {}


def test_an_empty_claim_file_is_an_unfinished_prepare_and_goes_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash between a reservation and its commit: kubelet was never answered, and prepares again."""
    path = str(tmp_path / "checkpoint.json")
    checkpoint = Checkpoint(path)
    checkpoint.put(prepared())
    other = str(uuid.uuid4())
    checkpoint.reserve(other)  # never committed: the process dies here
    with caplog.at_level(logging.INFO):
        again = Checkpoint(path)
    assert list(again.claims) == [UID]
    assert os.listdir(tmp_path / "checkpoint.d") == [f"{UID}.json"], "removed, not set aside"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # A reservation over a leftover file of a claim not held starts it empty.
    claim_file(tmp_path, other).write_bytes(b"leftover")
    again.reserve(other).commit(prepared(other))
    assert sorted(Checkpoint(path).claims) == sorted([UID, other])


def test_a_commit_that_cannot_write_leaves_no_claim_behind_and_one_that_cannot_sync_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails refuses the claim (kubelet is told, nothing stays); a sync that fails comes
    after kubelet's answer: the claim stays recorded, and the caller hears why."""
    path = str(tmp_path / "checkpoint.json")
    checkpoint = Checkpoint(path)
    reservation = checkpoint.reserve(UID)

    def full(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        reservation.commit(prepared())
    monkeypatch.undo()
    assert checkpoint.claims == {}
    assert os.listdir(tmp_path / "checkpoint.d") == []
    assert Checkpoint(path).claims == {}

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    reservation = checkpoint.reserve(UID)
    reservation.commit(prepared())
    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError, match="Input/output"):
        reservation.sync()
    monkeypatch.undo()
    reservation.sync()  # the descriptor was closed once: nothing left to sync or leak
    assert checkpoint.claims == {UID: prepared()} and Checkpoint(path).claims == {UID: prepared()}


@pytest.mark.parametrize("kind", ["fifo", "symlink", "hardlink", "directory"])
def test_a_reservation_over_something_else_replaces_it_without_blocking_or_writing_through(
    tmp_path: Path, kind: str
) -> None:
    """Under a claim's name, not held: a FIFO, a symlink or a hard link to another file is replaced by
    a new file (the rename of a put replaces them too), never opened, followed or written through; a
    directory fails the claim."""
    path = str(tmp_path / "checkpoint.json")
    checkpoint = Checkpoint(path)
    checkpoint.put(prepared())
    other = str(uuid.uuid4())
    target = claim_file(tmp_path, other)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(elsewhere)
    elif kind == "hardlink":
        os.link(elsewhere, target)
    else:
        target.mkdir()
    outcome: list[object] = []

    def reserve() -> None:
        try:
            checkpoint.reserve(other).commit(prepared(other))
            outcome.append("committed")
        except OSError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=reserve, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert outcome, "the reservation blocked"
    assert elsewhere.read_text() == "keep"
    if kind == "directory":
        assert isinstance(outcome[0], OSError) and list(checkpoint.claims) == [UID]
    else:
        assert outcome == ["committed"] and target.is_file() and not target.is_symlink()
        assert sorted(Checkpoint(path).claims) == sorted([UID, other])


def test_a_reservation_in_a_checkpoint_directory_that_is_a_file_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        Checkpoint(str(blocker / "checkpoint.json")).reserve(UID)
    assert blocker.read_text() == "not a directory"


def test_a_whole_file_checkpoint_is_migrated_on_start(tmp_path: Path) -> None:
    from nodefabric_deviceplugin.dra.checkpoint import KIND, _checksum

    path = tmp_path / "checkpoint.json"
    others = [str(uuid.uuid4()) for _ in range(3)]
    claims = {uid: prepared(uid).wire() for uid in [UID, *others]}
    path.write_text(json.dumps({"kind": KIND, "version": 1, "claims": claims, "checksum": _checksum(claims)}))
    migrated = Checkpoint(str(path))
    assert sorted(migrated.claims) == sorted([UID, *others])
    assert migrated.claims[UID] == prepared() and migrated.claims[UID].spec == {"kind": "x"}
    assert not path.exists(), "the old file is removed once every claim has its own"
    assert sorted(os.listdir(tmp_path / "checkpoint.d")) == sorted(f"{u}.json" for u in [UID, *others])
    # Later changes are per claim, and a restart reads them back.
    migrated.remove(others[0])
    assert sorted(Checkpoint(str(path)).claims) == sorted([UID, *others[1:]])


def test_a_migration_interrupted_before_the_old_file_went_runs_again(tmp_path: Path) -> None:
    from nodefabric_deviceplugin.dra.checkpoint import KIND, _checksum

    path = tmp_path / "checkpoint.json"
    claims = {UID: prepared().wire()}
    legacy = json.dumps({"kind": KIND, "version": 1, "claims": claims, "checksum": _checksum(claims)})
    path.write_text(legacy)
    Checkpoint(str(path))
    path.write_text(legacy)  # as if the crash came after the claim files, before the unlink
    again = Checkpoint(str(path))
    assert list(again.claims) == [UID] and not path.exists()
    assert os.listdir(tmp_path / "checkpoint.d") == [f"{UID}.json"]


def test_a_claim_unprepared_while_the_old_file_could_not_be_migrated_stays_unprepared(tmp_path: Path) -> None:
    from nodefabric_deviceplugin.dra.checkpoint import KIND, _checksum

    path = tmp_path / "checkpoint.json"
    other = str(uuid.uuid4())
    claims = {uid: prepared(uid).wire() for uid in (UID, other)}
    path.write_text(json.dumps({"kind": KIND, "version": 1, "claims": claims, "checksum": _checksum(claims)}))
    blocker = tmp_path / "checkpoint.d"
    blocker.write_text("left by someone else")  # the migration cannot make its directory
    held = Checkpoint(str(path))
    assert sorted(held.claims) == sorted([UID, other]) and path.exists()
    with pytest.raises(OSError):
        held.remove(UID)  # still blocked: kubelet hears the error and retries
    assert sorted(held.claims) == sorted([UID, other])
    blocker.unlink()  # cleaned up; kubelet's retry of the unprepare now succeeds
    held.remove(UID)
    # The old file must not bring the unprepared claim back at the next start: the claim may be allocated
    # again later, with other devices, and its stale entry would answer for it.
    again = Checkpoint(str(path))
    assert list(again.claims) == [other]
    assert again.claims[other] == prepared(other)
    assert not path.exists()


def test_a_claim_rewritten_while_the_old_file_could_not_be_migrated_keeps_its_new_entry(
    tmp_path: Path,
) -> None:
    from nodefabric_deviceplugin.dra.checkpoint import KIND, _checksum

    path = tmp_path / "checkpoint.json"
    claims = {UID: prepared().wire()}  # an older driver's entry: no boot id
    path.write_text(json.dumps({"kind": KIND, "version": 1, "claims": claims, "checksum": _checksum(claims)}))
    blocker = tmp_path / "checkpoint.d"
    blocker.write_text("left by someone else")
    held = Checkpoint(str(path))
    blocker.unlink()
    # A prepare after a reboot resolves the claim again and rewrites its entry with today's devices.
    today = PreparedClaim(
        UID, "ml", "pair", prepared().devices, prepared().spec_path, {"kind": "y"}, "boot-2"
    )
    held.put(today)
    # The old file's entry (another boot's device nodes) must not win over it at the next start.
    again = Checkpoint(str(path))
    assert again.claims[UID] == today and again.claims[UID].spec == {"kind": "y"}
    assert not path.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff\xfe garbage",
        b"[]",
        b'{"kind": "nodefabric.dra/checkpoint", "version": 2, "claims": {}}',
        b'{"kind": "nodefabric.dra/checkpoint", "version": 1, "claims": {"u": {}}, "checksum": "0"}',
        b'{"claims": ' * 100_000,
    ],
)
def test_an_unusable_whole_file_checkpoint_is_set_aside_not_trusted(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    assert Checkpoint(str(path)).claims == {}
    assert (tmp_path / "checkpoint.json.corrupt").read_bytes() == content
    assert not path.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"\x00",
        b"\xff\xfe garbage",
        b"[]",
        b'{"kind": "nodefabric.dra/prepared-claim", "version": 3}',
        b"[" * 100_000,  # nested past the interpreter's recursion limit: json raises RecursionError
    ],
)
def test_an_unusable_claim_file_is_set_aside_and_the_rest_kept(tmp_path: Path, content: bytes) -> None:
    path = str(tmp_path / "checkpoint.json")
    Checkpoint(path).put(prepared())
    bad = tmp_path / "checkpoint.d" / f"{uuid.uuid4()}.json"
    bad.write_bytes(content)
    assert list(Checkpoint(path).claims) == [UID]
    assert Path(f"{bad}.corrupt").read_bytes() == content


def test_a_claim_file_whose_entry_is_the_wrong_shape_or_renamed_is_set_aside(tmp_path: Path) -> None:
    from nodefabric_deviceplugin.dra.checkpoint import _checksum

    path = str(tmp_path / "checkpoint.json")
    Checkpoint(path).put(prepared())
    file = claim_file(tmp_path)
    doc = json.loads(file.read_text())
    doc["claim"]["devices"] = [{"requestNames": "nic"}]
    doc["checksum"] = _checksum({"uid": doc["uid"], "claim": doc["claim"]})  # well-formed, bad entry
    file.write_text(json.dumps(doc))
    assert Checkpoint(path).claims == {}
    # A good file under another claim's name is not that claim.
    Checkpoint(path).put(prepared())
    os.rename(claim_file(tmp_path), claim_file(tmp_path, "other-uid"))
    assert Checkpoint(path).claims == {}


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "huge"])
def test_a_checkpoint_path_holding_something_else_never_blocks_or_follows(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "checkpoint.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(17 << 20)
    done: list[Checkpoint] = []
    reader = threading.Thread(target=lambda: done.append(Checkpoint(str(path))), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert done and done[0].claims == {}, "reading the checkpoint blocked"
    if kind == "symlink":
        assert (tmp_path / "elsewhere.json").read_text() == "{}"


def test_a_checkpoint_that_cannot_be_written_keeps_memory_and_disk_in_step(tmp_path: Path) -> None:
    state = tmp_path / "state"
    checkpoint = Checkpoint(str(state / "checkpoint.json"))
    checkpoint.put(prepared())
    # The directory turns into a file (works as root too, unlike a permission change).
    state.rename(tmp_path / "gone")
    state.write_text("not a directory")
    with pytest.raises(OSError):
        checkpoint.put(prepared(str(uuid.uuid4())))
    assert list(checkpoint.claims) == [UID]
    with pytest.raises(OSError):
        checkpoint.remove(UID)
    assert list(checkpoint.claims) == [UID]
    replaced = prepared()
    with pytest.raises(OSError):
        checkpoint.put(PreparedClaim(UID, "ml", "other", (), "", {}))
    assert checkpoint.claims[UID] == replaced


def test_a_checkpoint_directory_that_is_a_file_fails_the_write_and_forgets_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("not a directory")
    checkpoint = Checkpoint(str(blocker / "checkpoint.json"))
    with pytest.raises(OSError):
        checkpoint.put(prepared())
    assert checkpoint.claims == {}


# --- CDI spec files ---------------------------------------------------------------------------------------


def test_a_spec_appears_whole_or_not_at_all_and_its_directory_is_made_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cdi_dir = tmp_path / "cdi"
    path = str(cdi_dir / "spec.json")
    seen: list[list[str]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        seen.append(sorted(os.listdir(cdi_dir)))  # what a watcher sees just before the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    old = os.umask(0o077)  # the mode is forced whatever the umask
    try:
        assert cdi.write_spec(path, {"kind": "x"})  # the directory is made on the first write
    finally:
        os.umask(old)
    monkeypatch.undo()
    [[tmp]] = seen
    assert tmp.startswith(".spec.json.") and tmp.endswith(".tmp")  # a name the runtime's watcher skips
    assert os.listdir(cdi_dir) == ["spec.json"]
    assert json.loads(Path(path).read_text()) == {"kind": "x"}
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    # The same spec again: nothing written.
    assert not cdi.write_spec(path, {"kind": "x"})
    # The directory removed between two writes (an operator's cleanup): made again.
    shutil.rmtree(cdi_dir)
    assert cdi.write_spec(path, {"kind": "y"})
    assert json.loads(Path(path).read_text()) == {"kind": "y"} and os.listdir(cdi_dir) == ["spec.json"]
    # A directory where the spec goes: the write fails and leaves no temporary file.
    blocked = str(cdi_dir / "blocked.json")
    os.mkdir(blocked)
    with pytest.raises(OSError):
        cdi.write_spec(blocked, {"kind": "x"})
    assert sorted(os.listdir(cdi_dir)) == ["blocked.json", "spec.json"]


def test_a_write_never_clobbers_or_follows_what_holds_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leftover, a symlink or a FIFO under the name a write picks is left alone (never opened,
    followed or written through) and another name is taken; when every name it tries is taken, the
    write fails, naming why, and writes nothing."""
    from nodefabric_deviceplugin.dra import files

    path = tmp_path / "spec.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    names = iter([1, 2, 3, 4])
    monkeypatch.setattr(files.random, "getrandbits", lambda bits: next(names))
    (tmp_path / f".spec.json.{1:012x}.tmp").symlink_to(elsewhere)
    os.mkfifo(tmp_path / f".spec.json.{2:012x}.tmp")
    (tmp_path / f".spec.json.{3:012x}.tmp").write_text("leftover")
    files.write_atomically(str(path), b"new", sync=False)
    assert path.read_bytes() == b"new" and elsewhere.read_text() == "keep"
    assert (tmp_path / f".spec.json.{3:012x}.tmp").read_text() == "leftover"
    assert os.path.islink(tmp_path / f".spec.json.{1:012x}.tmp")
    assert not os.path.exists(tmp_path / f".spec.json.{4:012x}.tmp"), "the name it took became the file"

    monkeypatch.setattr(files.random, "getrandbits", lambda bits: 1)  # every try names the symlink
    with pytest.raises(FileExistsError, match="no free temporary name"):
        files.write_atomically(str(path), b"newer")
    assert path.read_bytes() == b"new" and elsewhere.read_text() == "keep"


@pytest.mark.parametrize("fault", ["write", "fsync", "close", "replace", "fchmod"])
def test_a_write_that_fails_at_any_step_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    from nodefabric_deviceplugin.dra import files

    path = tmp_path / "c.json"
    files.write_atomically(str(path), b"old")
    real = getattr(os, fault)
    failed: list[str] = []

    def failing(*args: Any) -> Any:
        if fault == "close" and failed:
            return real(*args)
        failed.append(fault)
        if fault == "close":
            real(*args)  # the descriptor is gone, as a close that fails with EIO leaves it
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, fault, failing)
    with pytest.raises(OSError, match="No space"):
        files.write_atomically(str(path), b"new")
    monkeypatch.undo()
    assert failed and path.read_bytes() == b"old" and os.listdir(tmp_path) == ["c.json"]


def test_a_write_into_a_directory_replaced_by_a_file_or_a_dangling_link_fails_cleanly(tmp_path: Path) -> None:
    from nodefabric_deviceplugin.dra import files

    (tmp_path / "cdi").write_text("not a directory")
    with pytest.raises(NotADirectoryError):
        files.write_atomically(str(tmp_path / "cdi" / "s.json"), b"x")
    assert (tmp_path / "cdi").read_text() == "not a directory"
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        files.write_atomically(str(tmp_path / "link" / "s.json"), b"x")
    assert not (tmp_path / "nowhere").exists()


def test_a_spec_already_in_place_is_not_rewritten(tmp_path: Path) -> None:
    path = str(tmp_path / f"{DRIVER}-nic_{UID}.json")
    spec = cdi.build_spec(
        DRIVER, UID, {"pci-0000-19-00-0": ["/dev/infiniband/uverbs3"]}, {"NCCL_IB_HCA": "=mlx5_0"}
    )
    assert cdi.write_spec(path, spec)
    before = os.stat(path).st_mtime_ns
    time.sleep(0.01)
    assert not cdi.write_spec(path, spec)
    assert os.stat(path).st_mtime_ns == before
    assert [n for n in os.listdir(tmp_path)] == [os.path.basename(path)]  # no temporary left behind
    assert json.loads(Path(path).read_text())["containerEdits"] == {"env": ["NCCL_IB_HCA==mlx5_0"]}


@pytest.mark.parametrize("garbage", [b"\x00\x01", b"[" * 100_000])
def test_a_spec_that_is_garbage_on_disk_is_replaced(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(garbage)
    spec = cdi.build_spec(DRIVER, UID, {"d": ["/dev/x"]}, {})
    assert cdi.write_spec(str(path), spec)
    assert json.loads(path.read_text()) == spec
    assert "containerEdits" not in spec  # no environment: no spec-level edits


# --- prepare against an API that fails ---------------------------------------------------------------------


class FailingApi:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (ApiFailure("unavailable", "read resourceclaim ml/pair: HTTP 503"), "HTTP 503"),
        (ApiFailure("rejected", "read resourceclaim ml/pair: HTTP 403 Forbidden"), "403"),
        (["not", "a", "claim"], "is not an object"),
        (RuntimeError("boom"), "internal error"),
    ],
)
async def test_an_api_failure_fails_that_claim_and_leaves_no_trace(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec, answer: Any, why: str
) -> None:
    config = dirs.config()
    checkpoint = Checkpoint(config.checkpoint_path)
    preparer = Preparer(config, RecordSource(hgx_spec), hgx_host[0].host, FailingApi(answer), checkpoint)
    out = await preparer.prepare([REF, REF])
    assert list(out) == [UID]  # the same claim twice is one entry
    assert why in out[UID].error and not out[UID].devices
    assert checkpoint.claims == {} and not os.path.exists(config.cdi_dir)


async def test_prepare_before_the_first_record_asks_kubelet_to_retry(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries]
) -> None:
    config = dirs.config()
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    preparer = Preparer(config, RecordSource(), hgx_host[0].host, api, Checkpoint(config.checkpoint_path))
    out = await preparer.prepare([REF])
    assert "no device record yet" in out[UID].error


async def test_a_device_whose_verbs_node_is_gone_fails_the_claim_naming_what_was_checked(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    b, _ = hgx_host
    os.unlink(b.path("/dev/infiniband/uverbs0"))
    config = dirs.config()
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    preparer = Preparer(config, RecordSource(hgx_spec), b.host, api, Checkpoint(config.checkpoint_path))
    out = await preparer.prepare([REF])
    assert "no verbs device for RDMA device 'mlx5_0'" in out[UID].error
    assert "/dev/infiniband/uverbs0" in out[UID].error


async def test_a_device_of_a_type_the_driver_does_not_offer_is_refused(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    config = DriverConfig(
        node_name=NODE,
        plugin_dir=dirs.plugin,
        registry_dir=dirs.registry,
        cdi_dir=dirs.cdi,
        functions=("pf",),
    )
    api = FailingApi(claim([result("pci-0000-e0-00-1")]))  # a VF: the device plugin's beside DRA
    preparer = Preparer(
        config, RecordSource(hgx_spec), hgx_host[0].host, api, Checkpoint(config.checkpoint_path)
    )
    out = await preparer.prepare([REF])
    assert "no device pci-0000-e0-00-1" in out[UID].error


# --- a FIFO where sysfs has an attribute, and a read that does not return -----------------------------------


async def test_a_fifo_where_a_verbs_attribute_belongs_fails_the_claim_at_once(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    b, _ = hgx_host
    for path in ("/sys/class/infiniband_verbs/uverbs0/ibdev",):
        b.path(path).unlink()
        os.mkfifo(b.path(path))
    config = dirs.config()
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    preparer = Preparer(config, RecordSource(hgx_spec), b.host, api, Checkpoint(config.checkpoint_path))
    out = await asyncio.wait_for(preparer.prepare([REF]), 10)
    assert "no verbs device for RDMA device 'mlx5_0'" in out[UID].error and "FIFO" in out[UID].error


async def test_a_read_that_does_not_return_fails_the_claim_within_budget_and_starts_no_second(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    b, _ = hgx_host
    hold = threading.Event()

    def stuck_reader(host: HostRoot, wanted: Iterable[str]) -> VerbsTable:
        hold.wait(30)  # a driver holding its lock through a firmware reset
        return read_table(host, wanted)

    config = dirs.config()
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    verbs = VerbsCache(b.host, budget=0.5, reader=stuck_reader)
    preparer = Preparer(
        config, RecordSource(hgx_spec), b.host, api, Checkpoint(config.checkpoint_path), verbs=verbs
    )
    try:
        out = await asyncio.wait_for(preparer.prepare([REF]), 10)
        assert "did not finish within 0.5 s" in out[UID].error
        # The lock is free again: the next claim is answered, waiting on the same read, not a second one.
        other = ClaimRef("ml", str(uuid.uuid4()), "pair")
        api.answer = claim([result("pci-0000-1c-00-0")], uid=other.uid)
        again = await asyncio.wait_for(preparer.prepare([other]), 10)
        assert "did not finish within 0.5 s" in again[other.uid].error
        assert verbs.reads == 1
        hold.set()  # the host answers again: so does prepare
        third = ClaimRef("ml", str(uuid.uuid4()), "pair")
        api.answer = claim([result("pci-0000-1c-00-0")], uid=third.uid)
        async with asyncio.timeout(10):
            while (await preparer.prepare([third]))[third.uid].error:
                await asyncio.sleep(0.05)
    finally:
        hold.set()


async def test_a_fifo_where_a_link_layer_belongs_leaves_the_attribute_out(
    hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    b, _ = hgx_host
    layer = b.path("/sys/class/infiniband/mlx5_0/ports/1/link_layer")
    layer.unlink()
    os.mkfifo(layer)
    layers = await asyncio.wait_for(asyncio.to_thread(link_layers, b.host, ["mlx5_0", "mlx5_1"]), 10)
    assert layers == {"mlx5_1": "Ethernet"}


async def test_a_sync_that_does_not_return_stalls_one_thread_not_the_publisher(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    b, _ = hgx_host
    hold = threading.Event()
    calls: list[str] = []

    class Api:
        def node_owner(self) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u"}

        def list_slices(self) -> tuple[list[dict[str, Any]], str]:
            hold.wait(30)  # an API server that accepted the connection and went silent
            calls.append("list")
            return [], "1"

        def watch_slices(self, since: str, cancel: Any = None) -> Iterator[dict[str, Any]]:
            hold.wait(30)
            return iter(())

        def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
            calls.append("create")
            return body

        def update_slice(self, body: dict[str, Any], version: str) -> dict[str, Any]:
            calls.append("update")
            return body

        def delete_slice(self, name: str, resource_version: str) -> None:
            calls.append("delete")

    publisher = SlicePublisher(Api(), dirs.config(), RecordSource(hgx_spec), b.host, resync=0.1, budget=0.3)
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop))
    try:
        async with asyncio.timeout(10):
            while publisher.flight.stuck_for < 0.5:
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.2)  # more budgets and retries pass
        assert publisher.flight.started == 1 and calls == [] and publisher.syncs == 0
        hold.set()
        async with asyncio.timeout(10):
            while publisher.syncs < 1:
                await asyncio.sleep(0.05)
        assert calls[:2] == ["list", "create"]
    finally:
        hold.set()
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_checkpoint_that_cannot_be_written_fails_the_claim_and_leaves_no_spec(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """The claim's checkpoint file is reserved while the claim is read; when that fails (a full or
    read-only directory; here a file where the directory belongs), the claim is refused before any
    spec is written. When the entry's own write fails (a full disk), no spec is written either (the
    entry comes first): kubelet may never unprepare a claim whose prepare failed, and a spec would stay
    in the runtime's directory for good."""
    config = dirs.config()
    checkpoint = Checkpoint(config.checkpoint_path)
    Path(checkpoint.directory).parent.mkdir(parents=True, exist_ok=True)
    Path(checkpoint.directory).write_text("not a directory")
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    preparer = Preparer(config, RecordSource(hgx_spec), hgx_host[0].host, api, checkpoint)
    out = await preparer.prepare([REF])
    assert "writing the CDI spec or the checkpoint failed" in out[UID].error and not out[UID].devices
    assert checkpoint.claims == {}
    assert not os.path.exists(config.cdi_dir) or os.listdir(config.cdi_dir) == []
    # The directory is usable again, but the entry's write fails.
    os.unlink(checkpoint.directory)
    written: list[int] = []

    def full(fd: int, data: Any) -> int:
        written.append(fd)
        raise OSError(28, "No space left on device")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "write", full)
        out = await preparer.prepare([REF])
    assert written, "the entry's write was reached"
    assert "No space left on device" in out[UID].error and not out[UID].devices
    assert checkpoint.claims == {}
    assert not os.path.exists(config.cdi_dir) or os.listdir(config.cdi_dir) == [], (
        "the spec of a claim not prepared is not left behind"
    )
    assert os.listdir(checkpoint.directory) == [], "nor its checkpoint file"
    # And the claim prepares once the disk is well again.
    out = await preparer.prepare([REF])
    await preparer.syncs.drain()
    assert out[UID].error == "" and list(Checkpoint(config.checkpoint_path).claims) == [UID]


def sync_failures() -> float:
    return REGISTRY.get_sample_value("nodefabric_dra_checkpoint_sync_failures_total") or 0.0


async def test_kubelet_is_answered_before_the_entry_is_synced_and_the_sync_follows(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """The entry is written (a restarted driver reads it) before the answer; its fdatasync, which only a
    power loss needs, runs after it on its own thread, and a stopping driver waits for it."""
    config = dirs.config()
    checkpoint = Checkpoint(config.checkpoint_path)
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    preparer = Preparer(config, RecordSource(hgx_spec), hgx_host[0].host, api, checkpoint)
    syncing, hold = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow_sync(fd: int) -> None:
        syncing.set()
        hold.wait(10)
        real(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fdatasync", slow_sync)
        out = await asyncio.wait_for(preparer.prepare([REF]), 10)  # answered while the sync is held
        assert out[UID].error == "" and out[UID].devices
        async with asyncio.timeout(10):
            while not syncing.is_set():
                await asyncio.sleep(0.01)
        assert len(preparer.syncs) == 1 and REGISTRY.get_sample_value("nodefabric_dra_unsynced_claims") == 1
        assert list(Checkpoint(config.checkpoint_path).claims) == [UID], "written before the answer"
        draining = asyncio.create_task(preparer.syncs.drain())
        await asyncio.sleep(0.1)
        assert not draining.done(), "drain waits for the sync"
        hold.set()
        await asyncio.wait_for(draining, 10)
    assert len(preparer.syncs) == 0 and REGISTRY.get_sample_value("nodefabric_dra_unsynced_claims") == 0


async def test_a_sync_that_fails_after_the_answer_keeps_the_claim_and_says_so(
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kubelet was answered and the entry is written: a disk that fails the sync leaves the claim prepared
    (a repeated prepare answers it, an unprepare removes it), logged as an error and counted."""
    config = dirs.config()
    checkpoint = Checkpoint(config.checkpoint_path)
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    preparer = Preparer(config, RecordSource(hgx_spec), hgx_host[0].host, api, checkpoint)
    failures = sync_failures()

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.ERROR):
        patch.setattr(os, "fdatasync", failing)
        first = await preparer.prepare([REF])
        await preparer.syncs.drain()
    assert first[UID].error == "" and first[UID].devices
    assert sync_failures() == failures + 1
    [logged] = [r for r in caplog.records if "could not be synced" in r.getMessage()]
    assert logged.__dict__["claim_uid"] == UID and "Input/output error" in logged.__dict__["why"]
    assert list(Checkpoint(config.checkpoint_path).claims) == [UID]
    again = await preparer.prepare([REF])
    assert again[UID] == first[UID]
    assert await preparer.unprepare([REF]) == {UID: ""}
    assert Checkpoint(config.checkpoint_path).claims == {} and os.listdir(config.cdi_dir) == []


async def test_a_prepare_cancelled_while_its_files_are_written_leaves_memory_and_disk_in_step(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """kubelet's deadline (or a client cancel) lands while the spec and the checkpoint entry are being
    written in their thread. The thread cannot be stopped, so the reservation must not be given back
    under it: that unlinked the reserved entry between the spec's write and the entry's commit, leaving a
    CDI spec for a claim recorded nowhere (kubelet never unprepares a prepare it saw fail), and could close
    the entry's descriptor while the commit was writing through it."""
    config = dirs.config()
    checkpoint = Checkpoint(config.checkpoint_path)
    api = FailingApi(claim([result("pci-0000-1c-00-0")]))
    preparer = Preparer(config, RecordSource(hgx_spec), hgx_host[0].host, api, checkpoint)
    entered, hold = threading.Event(), threading.Event()
    real = cdi.write_new_spec  # a first prepare's spec write

    def slow_write(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        entered.set()
        hold.wait(10)  # the spec is on disk, after the entry; the hop ends next

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cdi, "write_new_spec", slow_write)
        task = asyncio.create_task(preparer.prepare([REF]))
        async with asyncio.timeout(10):
            while not entered.is_set():
                await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.1)  # the cancellation is delivered while the thread is still writing
        hold.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        await asyncio.sleep(0.3)  # any thread still running has finished
    specs = os.listdir(config.cdi_dir)
    entries = [n for n in os.listdir(checkpoint.directory) if not n.startswith(".")]
    reloaded = Checkpoint(config.checkpoint_path).claims
    if UID in checkpoint.claims:
        assert len(specs) == 1 and len(entries) == 1 and list(reloaded) == [UID]
    else:
        assert specs == [] and entries == [] and reloaded == {}
    # kubelet asks again: answered, and recorded once.
    out = await preparer.prepare([REF])
    assert out[UID].error == "" and out[UID].devices
    assert list(Checkpoint(config.checkpoint_path).claims) == [UID] and len(os.listdir(config.cdi_dir)) == 1
