"""The CDI spec path a checkpoint entry names is read back from a file, no proof of what lies there: an
entry whose path is relative, or has `..` components, is refused (said by claim, the rest of the
checkpoint kept), and no file outside the configured `--cdi-dir` is ever removed (a symlink out of it
included), whatever the entry names. Each test plants the entry a damaged or hand-made checkpoint
would hold, with a file of the claim's own spec name where that path leads, and checks it survives
the driver's unprepare and its repeated prepare."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from dra_helpers import DRIVER, NIC0, NODE, Dirs, HgxDriver, put_claim, ref, result

from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.dra import cdi
from nodefabric_deviceplugin.dra.checkpoint import (
    KIND,
    VERSION,
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    _checksum,
    file_name,
)
from nodefabric_operator.demo.kubeapi import RunningAPI

NIC1 = "pci-0000-e0-00-1"  # mlx5_8, the first VF of NIC 7
OTHER_BOOT = "0f4c3b1e-7a52-4e8f-9d3a-2b6c1e0a9f11"  # not this machine's: the entry is of another boot
KEEP = b'{"kind": "not a CDI spec of this driver"}\n'  # JSON: read as a spec that is there, and differs
MOVED = "moved a prepared claim's CDI spec to the current --cdi-dir"
RESOLVED = "resolved a claim prepared in an earlier (or unknown) boot again and rewrote its CDI spec"
REFUSED = "a prepared claim's checkpoint entry names an unusable CDI spec path; the entry is refused"
LEFT = (
    "a claim's CDI spec lies outside the current --cdi-dir; left there (only files inside --cdi-dir are"
    " removed), remove it by hand"
)


def plant(dirs: Dirs, claim: dict[str, object], spec_path: str, *, boot_id: str = "") -> PreparedClaim:
    """The claim's entry as a damaged checkpoint holds it (its checksum right), naming `spec_path`."""
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    uid = meta["uid"]
    device = PreparedDevice(("nic",), NODE, NIC0, (cdi.device_id(DRIVER, uid, NIC0),))
    entry = PreparedClaim(
        uid, meta["namespace"], meta["name"], (device,), spec_path, {"cdiVersion": "0.5.0"}, boot_id
    )
    Checkpoint(dirs.config().checkpoint_path).put(entry)
    return entry


def victim(directory: Path, uid: str) -> Path:
    """A file outside the CDI directory under the claim's own spec name: what a bad path leads to."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / cdi.spec_file_name(DRIVER, uid)
    path.write_bytes(KEEP)
    return path


def _relative(dirs: Dirs, uid: str, outside: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(outside)  # a relative path resolves against the process's working directory
    return cdi.spec_file_name(DRIVER, uid)


def _dotdot(dirs: Dirs, uid: str, outside: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return os.path.join(dirs.cdi, os.path.relpath(outside, dirs.cdi), cdi.spec_file_name(DRIVER, uid))


@pytest.mark.parametrize(
    ("make_path", "why"),
    [(_relative, "relative path"), (_dotdot, "'..' component")],
    ids=["relative", "dotdot"],
)
async def test_an_entry_whose_spec_path_escapes_is_refused_and_the_rest_kept(
    api: RunningAPI,
    dirs: Dirs,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    tmp_path: Path,
    *,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_path: Callable[[Dirs, str, Path, pytest.MonkeyPatch], str],
    why: str,
) -> None:
    kept, bad = put_claim(api, "kept", [result(NIC1)]), put_claim(api, "bad", [result(NIC0)])
    kept_uid, bad_uid = kept["metadata"]["uid"], bad["metadata"]["uid"]
    async with hgx_driver(hgx_spec) as r:
        first = (await (await r.kubelet.wait_registered(DRIVER)).prepare(ref(kept)))[kept_uid]
        assert first.error == ""
    outside = tmp_path / "outside"
    target = victim(outside, bad_uid)
    plant(dirs, bad, make_path(dirs, bad_uid, outside, monkeypatch))
    caplog.set_level(logging.ERROR, logger="nodefabric_deviceplugin.dra")
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert await plugin.unprepare(ref(bad)) == {bad_uid: ""}
        assert target.read_bytes() == KEEP
        [said] = [rec for rec in caplog.records if rec.getMessage().startswith(REFUSED)]
        assert said.claim == bad_uid and why in said.why  # type: ignore[attr-defined]
        assert list(r.driver.checkpoint.claims) == [kept_uid]  # the rest of the checkpoint kept
        entry = Path(r.driver.checkpoint.directory, file_name(bad_uid))
        assert not entry.exists() and Path(f"{entry}.corrupt").exists()
        assert (await plugin.prepare(ref(kept)))[kept_uid] == first  # answered from its entry
        # The refused claim: prepared afresh from the API, its spec under --cdi-dir, then unprepared.
        again = (await plugin.prepare(ref(bad)))[bad_uid]
        assert again.error == "" and [d.device_name for d in again.devices] == [NIC0]
        assert Path(dirs.cdi, cdi.spec_file_name(DRIVER, bad_uid)).exists()
        assert await plugin.unprepare(ref(bad)) == {bad_uid: ""}
        assert not Path(dirs.cdi, cdi.spec_file_name(DRIVER, bad_uid)).exists()
    assert target.read_bytes() == KEEP


async def test_a_refused_entry_of_a_whole_file_checkpoint_keeps_the_others(
    dirs: Dirs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An older driver's whole-file checkpoint, migrated on start: one entry refused, the others
    migrated, the old file gone."""
    path = dirs.config().checkpoint_path
    good = PreparedClaim("u-good", "ml", "good", (), os.path.join(dirs.cdi, "x.json"), {})
    bad = PreparedClaim("u-bad", "ml", "bad", (), "relative.json", {})
    claims = {c.uid: c.wire() for c in (good, bad)}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"kind": KIND, "version": VERSION, "claims": claims, "checksum": _checksum(claims)}
    Path(path).write_text(json.dumps(doc))
    caplog.set_level(logging.ERROR, logger="nodefabric_deviceplugin.dra")
    assert list(Checkpoint(path).claims) == ["u-good"]
    [said] = [rec for rec in caplog.records if rec.getMessage().startswith(REFUSED)]
    assert said.claim == "u-bad"  # type: ignore[attr-defined]
    assert not os.path.exists(path) and list(Checkpoint(path).claims) == ["u-good"]


# An entry of an unknown boot whose spec is there is moved (`_relocate`); one of another boot is resolved
# again (`_rewrite`).
@pytest.mark.parametrize("boot_id", ["", OTHER_BOOT], ids=["unknown-boot-moved", "another-boot-resolved"])
async def test_a_spec_path_through_a_symlink_out_of_the_cdi_dir_is_never_removed(
    api: RunningAPI,
    dirs: Dirs,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    tmp_path: Path,
    *,
    caplog: pytest.LogCaptureFixture,
    boot_id: str,
) -> None:
    """`<cdi>/link/<the claim's spec>` with `link` a symlink out of the CDI directory: a plain path
    (absolute, no `..`), so the entry loads; but its file is not inside --cdi-dir. The repeated prepare
    writes the spec under --cdi-dir (moved, as from an earlier --cdi-dir; for another boot's entry,
    resolved again), the unprepare removes that one, and the file the link leads to stays, said."""
    claim = put_claim(api, "linked", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    outside = tmp_path / "outside"
    target = victim(outside, uid)
    os.makedirs(dirs.cdi, exist_ok=True)
    os.symlink(outside, os.path.join(dirs.cdi, "link"))
    planted = os.path.join(dirs.cdi, "link", cdi.spec_file_name(DRIVER, uid))
    plant(dirs, claim, planted, boot_id=boot_id)
    caplog.set_level(logging.WARNING, logger="nodefabric_deviceplugin.dra")
    async with hgx_driver(hgx_spec) as r:
        assert list(r.driver.checkpoint.claims) == [uid]
        plugin = await r.kubelet.wait_registered(DRIVER)
        prepared = (await plugin.prepare(ref(claim)))[uid]
        assert prepared.error == "" and [d.device_name for d in prepared.devices] == [NIC0]
        own = os.path.join(dirs.cdi, cdi.spec_file_name(DRIVER, uid))
        assert os.path.isfile(own) and r.driver.checkpoint.claims[uid].spec_path == own
        assert target.read_bytes() == KEEP
        left = [rec for rec in caplog.records if rec.getMessage() == LEFT]
        assert [(rec.claim, rec.path) for rec in left] == [(uid, planted)]  # type: ignore[attr-defined]
        resolved = bool(boot_id and r.driver.preparer.boot_id)  # both boots known, and different
        path = MOVED if not resolved else RESOLVED
        assert [rec.getMessage() for rec in caplog.records if rec.getMessage() in (MOVED, RESOLVED)] == [path]
        assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert not os.path.exists(own)
    assert target.read_bytes() == KEEP


async def test_an_unprepare_never_removes_the_spec_an_entry_names_outside_the_cdi_dir(
    api: RunningAPI,
    dirs: Dirs,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    tmp_path: Path,
    *,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The entry's path through a symlink out of --cdi-dir, unprepared without a prepare first: only
    the claim's spec under --cdi-dir goes; the file the entry names stays, said by claim and path."""
    claim = put_claim(api, "linked", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    outside = tmp_path / "elsewhere"
    target = victim(outside, uid)
    os.makedirs(dirs.cdi, exist_ok=True)
    os.symlink(outside, os.path.join(dirs.cdi, "link"))
    planted = os.path.join(dirs.cdi, "link", cdi.spec_file_name(DRIVER, uid))
    plant(dirs, claim, planted)
    own = Path(dirs.cdi, cdi.spec_file_name(DRIVER, uid))
    own.write_text("{}\n")
    caplog.set_level(logging.WARNING, logger="nodefabric_deviceplugin.dra")
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert not own.exists() and r.driver.checkpoint.claims == {}
        left = [rec for rec in caplog.records if rec.getMessage() == LEFT]
        assert [(rec.claim, rec.path) for rec in left] == [(uid, planted)]  # type: ignore[attr-defined]
    assert target.read_bytes() == KEEP
