"""Prepared claims, on disk: what each claim was given and where its CDI spec is.

kubelet may call NodePrepareResources again for a claim we prepared (its own restart, a pod restart) and
NodeUnprepareResources after we restarted. The checkpoint makes both exact: a second prepare answers what
the first did (and rewrites the spec if the runtime directory lost it), and an unprepare removes the
spec the prepare wrote, even if `--cdi-dir` changed in between. Each entry records the boot it was
prepared in (`bootId`, the kernel's boot id; "" when unknown, as in entries older drivers wrote): after
a reboot the kernel may number the verbs devices differently, and prepare resolves such a claim's devices
again and rewrites its entry (`Checkpoint.put`) before its spec. The key is optional and inside the
checksummed body, so an older driver reads a newer entry (ignoring it) and this one reads an older entry.

One file per claim, in a directory beside the socket (`checkpoint.d/<uid>.json`), so what a prepare or
an unprepare costs does not grow with the number of claims held: the whole-file checkpoint this replaces
rewrote and synced every claim on every change, and 1,500 claims in one NodePrepareResources call ran
past kubelet's 45 s deadline. Each write is crash-safe:

- the claim's file is written to a temporary name and fsynced before it is renamed into place, so the
  name never points at a torn file (a crash leaves the old content, or a `.tmp` that the next start
  deletes);
- the directory is fsynced after the rename (or the unlink), so the entry itself survives a power loss:
  without it a prepare answered to kubelet could come back from a reboot unrecorded, and an unprepared
  claim could come back recorded.

A first prepare records its claim the faster way (`reserve`, `Reservation.commit`, `Reservation.sync`):
once the claim is read and resolved, the claim's file is created empty under its own name and the
claim written into it, then the CDI spec is written (entry first: a kill between the two leaves an
entry whose spec the next prepare rewrites, never a spec no entry names) and kubelet is answered; the
syncs that make the entry durable (the file's fdatasync: its content and size; the directory's fsync:
its name) follow the answer. No rename is needed: the file is new (a claim held is answered from
memory and never reserved), so there is no old content to keep whole.

Why a prepare's syncs may follow the answer, where an unprepare's may not: a crash of this process loses
nothing (the content is written before the answer), and a power loss between the answer and the
syncs (a few milliseconds on an idle disk: they start 2 ms after the write, see syncs; longer behind
the syncs queued on a slow one) leaves the file
missing, empty (removed quietly at the next start) or, on a file system that does not order data
before size, torn (it fails its checksum and is set aside). Either way
the claim is derived again, the same: kubelet's own checkpoint holds the claim and prepares it again
after the reboot, its allocation cannot change while a pod reserves it, and the spec's file and CDI ids
are functions of the driver, the claim's uid and the device; an unprepare finds the spec by its name.
What the window gives up is answering such a claim's next prepare without reading the API. An entry
that comes back after its unprepare, though, would answer a claim allocated again later (same uid, other
devices) with the old devices: an unprepare's directory fsync stays before its answer.

Each file carries a checksum of its content. One that cannot be read or does not verify is moved aside
(`<name>.corrupt`) with an Error log, and only that claim is forgotten: unprepare then still finds its
spec by the spec's deterministic name, so nothing is left behind. A whole-file checkpoint left by an
older driver (`checkpoint.json`) is migrated on start: each claim is written to its own file, then the
old file is removed; a crash in between migrates again on the next start (the writes are idempotent).
While a migration that failed leaves the old file behind, a change to a claim held (an unprepare, an
entry rewritten) migrates the claims held first, and fails until it can: the old file would otherwise
win over the change at the next start.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nodefabric_deviceplugin.dra.files import (
    SORTED_JSON,
    parse_json,
    read_regular,
    write_all,
    write_atomically,
)

log = logging.getLogger(__name__)

KIND = "nodefabric.dra/checkpoint"
VERSION = 1  # the whole-file checkpoint, read only to migrate it
CLAIM_KIND = "nodefabric.dra/prepared-claim"
CLAIM_VERSION = 2
MAX_BYTES = 16 << 20  # the whole-file checkpoint
MAX_CLAIM_BYTES = 4 << 20  # one claim: its CDI spec names at most a few dozen device nodes
SUFFIX = ".json"
# A claim's uid names its file when it is a plain uid (kubelet's are UUIDs); anything else is hashed, so
# no uid can name a path outside the directory or collide with a temporary or set-aside file.
_PLAIN_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
_PLAIN_JSON = json.JSONEncoder()  # a string's encoding: the same with sort_keys or without


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec_path: str  # "" when the claim had none of our devices (no spec was written)
    spec: dict[str, Any] = field(default_factory=dict, compare=False)
    boot_id: str = ""  # the kernel's boot id when it was prepared; "" when unknown (see boot)

    def wire(self) -> dict[str, Any]:
        # Every key here is also written by `_body`, which encodes them one by one.
        return {
            "bootId": self.boot_id,
            "namespace": self.namespace,
            "name": self.name,
            "devices": self.wire_devices(),
            "specPath": self.spec_path,
            "spec": self.spec,
        }

    def wire_devices(self) -> list[dict[str, Any]]:
        return [
            {
                "requestNames": list(d.request_names),
                "pool": d.pool,
                "device": d.device,
                "cdiDeviceIds": list(d.cdi_device_ids),
            }
            for d in self.devices
        ]

    @classmethod
    def from_wire(cls, uid: str, obj: Any) -> PreparedClaim:
        """Raises ValueError (or TypeError, KeyError) on anything that is not what `wire` wrote."""
        devices = tuple(
            PreparedDevice(
                request_names=tuple(_strings(d["requestNames"])),
                pool=_str(d["pool"]),
                device=_str(d["device"]),
                cdi_device_ids=tuple(_strings(d["cdiDeviceIds"])),
            )
            for d in obj["devices"]
        )
        spec = obj.get("spec") or {}
        if not isinstance(spec, dict):
            raise ValueError("spec is not an object")
        boot_id = _str(obj.get("bootId", ""))  # absent in entries older drivers wrote: unknown
        return cls(
            uid, _str(obj["namespace"]), _str(obj["name"]), devices, _str(obj["specPath"]), spec, boot_id
        )


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return [_str(v) for v in value]


def spec_path_problem(path: str) -> str:
    """What makes a recorded spec path unusable ("" when nothing does; "" is also the path of a claim
    with no spec). Every path the driver records is its `--cdi-dir` (absolute) joined with a file name;
    anything else came from a damaged or hand-made file, and acting on it (an unprepare removes the
    spec, a repeated prepare writes it) would touch a file named relative to the process's working
    directory, or, through `..`, outside the directory the path names."""
    if not path:
        return ""
    if "\0" in path:
        return "it holds a NUL byte"
    if not os.path.isabs(path):
        return "it is a relative path (it would resolve against the process's working directory)"
    if ".." in path.split("/"):
        return "it has a '..' component"
    if os.path.normpath(path) != path or path.endswith("/"):
        return "it is not in normal form (empty or '.' components, or a trailing '/')"
    return ""


def _checksum(claims: Any) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).hexdigest()


def file_name(uid: str) -> str:
    """The claim's file name in the checkpoint directory."""
    if _PLAIN_UID.fullmatch(uid):
        return uid + SUFFIX
    return "h-" + hashlib.sha256(uid.encode()).hexdigest()[:40] + SUFFIX


def _body(claim: PreparedClaim, spec_text: str) -> str:
    """`json.dumps({"uid": claim.uid, "claim": claim.wire()}, sort_keys=True)`, with the spec's own
    encoding (`cdi.spec_text`, the same encoder's) spliced in rather than encoded a second time: the
    keys of `wire` in sorted order, each value as that encoder writes it."""
    put = _PLAIN_JSON.encode
    return (
        f'{{"claim": {{"bootId": {put(claim.boot_id)},'
        f' "devices": {SORTED_JSON.encode(claim.wire_devices())}, "name": {put(claim.name)},'
        f' "namespace": {put(claim.namespace)}, "spec": {spec_text}, "specPath": {put(claim.spec_path)}}},'
        f' "uid": {put(claim.uid)}}}'
    )


def encode(claim: PreparedClaim, spec_text: str | None = None) -> bytes:
    """The claim's file: its body encoded once (what the checksum covers), with the kind, the version
    and the checksum spliced in front. One compact encoding, not two indented ones: `indent` takes
    Python's pure-Python encoder, which cost more than a first prepare's every other step past the API
    read. Any JSON layout decodes the same. `spec_text`: the claim's spec already encoded with
    `files.SORTED_JSON` (a first prepare writes the same text to the CDI spec file)."""
    if spec_text is None:
        text = SORTED_JSON.encode({"uid": claim.uid, "claim": claim.wire()})  # as _checksum encodes
    else:
        text = _body(claim, spec_text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    head = f'{{"checksum": "{digest}", "kind": "{CLAIM_KIND}", "version": {CLAIM_VERSION}, '
    return (head + text[1:]).encode() + b"\n"


def decode(data: bytes) -> PreparedClaim:
    """Raises ValueError (TypeError, KeyError, AttributeError) on anything `encode` did not write whole."""
    doc = parse_json(data)
    if not isinstance(doc, dict) or doc.get("kind") != CLAIM_KIND or doc.get("version") != CLAIM_VERSION:
        raise ValueError("not a prepared claim of this version")
    body = {"uid": doc.get("uid"), "claim": doc.get("claim")}
    if doc.get("checksum") != _checksum(body):
        raise ValueError("checksum mismatch")
    return PreparedClaim.from_wire(_str(body["uid"]), body["claim"])


def sync_directory(directory: str) -> None:
    """Make the directory's entries (a rename, an unlink) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Reservation:
    """A claim's file created empty, waiting for the claim's content
    (`Checkpoint.reserve`). Exactly one of `commit` and `release` ends it."""

    def __init__(self, checkpoint: Checkpoint, uid: str, path: str, fd: int) -> None:
        self.checkpoint = checkpoint
        self.uid = uid
        self.path = path
        self._fd: int | None = fd
        self._unsynced = False  # committed, not yet synced

    def commit(self, claim: PreparedClaim, *, spec_text: str | None = None) -> None:
        """Write the claim into its reserved file and record it. Written, not yet synced: every reader
        (this process after a crash of its own included) sees it at once; `sync` makes it survive a
        power loss. Raises OSError, the file then released. `spec_text`: see `encode`."""
        assert claim.uid == self.uid, "a reservation holds one claim's file"
        fd = self._take()
        try:
            try:
                write_all(fd, encode(claim, spec_text))
            finally:
                # Closed now, reopened by `sync`: syncs queued behind a slow disk (a thousand claims in
                # one call) must not each hold a descriptor, or they exhaust the process's limit and
                # fail the prepares after them. Closing keeps the dirty pages; an fdatasync through any
                # descriptor writes them. A close that fails (EIO on some file systems) fails the claim.
                os.close(fd)
        except OSError:
            self._unlink(written=True)
            raise
        self._unsynced = True
        self.checkpoint.claims[claim.uid] = claim

    def sync(self) -> None:
        """Make the committed claim durable: the file's fdatasync (its content and size) and the
        directory's fsync (its name). Raises OSError; the claim stays recorded, only its durability is
        in doubt. A no-op before `commit`, once synced, and when the file is gone from a directory still
        there (the claim was unprepared meanwhile, and that unlink was synced)."""
        if not self._unsynced:
            return
        self._unsynced = False
        try:
            # Non-blocking: whatever was put under the name meanwhile (a FIFO) must not hang the thread.
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if os.path.isdir(self.checkpoint.directory):
                return
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{self.path} is no longer the claim's file")
            os.fdatasync(fd)
        finally:
            os.close(fd)
        sync_directory(self.checkpoint.directory)

    def release(self) -> None:
        """Give the file up unwritten (the claim was not prepared). Not synced: an empty file a crash
        brings back is removed at the next start."""
        fd = self._fd
        if fd is None:
            return
        self._fd = None
        os.close(fd)
        self._unlink(written=False)

    def _take(self) -> int:
        fd = self._fd
        if fd is None:
            raise ValueError(f"the reservation of claim {self.uid} is already used")
        self._fd = None
        return fd

    def _unlink(self, *, written: bool) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            if written:
                # Content may have reached the disk: the file must not come back as a prepared claim.
                sync_directory(self.checkpoint.directory)


class Checkpoint:
    """The prepared claims by uid, each mirrored to its own file on every change.

    `path` is where the whole-file checkpoint of older drivers lives (`<socket dir>/checkpoint.json`);
    the claims are kept in `<socket dir>/checkpoint.d/`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.directory = os.path.join(os.path.dirname(path), "checkpoint.d")
        self._unmigrated = False  # the whole-file checkpoint is still there, its migration having failed
        self.claims: dict[str, PreparedClaim] = self._load()

    # --- start -----------------------------------------------------------------------------------------

    def _load(self) -> dict[str, PreparedClaim]:
        claims = self._load_directory()
        legacy = self._load_legacy()
        if legacy is not None:
            claims.update(legacy)
            self._migrate(legacy.values())
        if claims or legacy is not None:
            log.info("loaded prepared claims", extra={"path": self.directory, "claims": len(claims)})
        return claims

    def _load_directory(self) -> dict[str, PreparedClaim]:
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            # Not a directory, or unreadable: every write fails too, and each prepare says why.
            log.error(
                "the checkpoint directory cannot be listed; starting without prepared claims",
                extra={"path": self.directory, "why": str(exc)},
            )
            return {}
        out: dict[str, PreparedClaim] = {}
        for name in names:
            path = os.path.join(self.directory, name)
            if name.startswith(".") and name.endswith(".tmp"):
                # A write that crashed before its rename: the claim's file still holds what it held.
                with contextlib.suppress(OSError):
                    os.unlink(path)
                continue
            if not name.endswith(SUFFIX):
                continue  # a set-aside .corrupt file, or something not ours
            try:
                data = read_regular(path, MAX_CLAIM_BYTES)
                if data is None:
                    continue
                if not data:
                    # A reservation a crash interrupted before its claim was written (never answered), or
                    # a power loss before its sync (answered): either way kubelet prepares it again.
                    log.info(
                        "removing the empty file of an unfinished or unsynced prepare", extra={"path": path}
                    )
                    os.unlink(path)
                    continue
                claim = decode(data)
                if file_name(claim.uid) != name:
                    raise ValueError(f"the file of claim {claim.uid!r} is named {name}")
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                self._set_aside(path, exc)
                continue
            if self._refused(claim, path):
                continue
            out[claim.uid] = claim
        return out

    def _refused(self, claim: PreparedClaim, path: str) -> bool:
        """Whether the claim's entry names an unusable spec path (`spec_path_problem`): then it is said,
        by claim, and left out, its file (`path`; "" for an entry of the whole-file checkpoint) moved
        aside. The claim is forgotten as a corrupt file's is: an unprepare still finds its spec by the
        spec's name under `--cdi-dir`, and a prepare reads the claim again."""
        problem = spec_path_problem(claim.spec_path)
        if not problem:
            return False
        aside = f"{path}.corrupt" if path else ""
        if path:
            with contextlib.suppress(OSError):
                os.replace(path, aside)
        log.error(
            "a prepared claim's checkpoint entry names an unusable CDI spec path; the entry is refused"
            " (the claim is prepared again from the API, and an unprepare removes only the spec under"
            " --cdi-dir)",
            extra={
                "claim": claim.uid,
                "namespace": claim.namespace,
                "claim_name": claim.name,
                "spec_path": claim.spec_path,
                "why": problem,
                "path": path or self.path,
                "moved_to": aside or None,
            },
        )
        return True

    def _load_legacy(self) -> dict[str, PreparedClaim] | None:
        """The claims of a whole-file checkpoint (None when there is none; {} when it was unusable)."""
        try:
            data = read_regular(self.path, MAX_BYTES)
            if data is None:
                return None
            doc = parse_json(data)
            if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION:
                raise ValueError("not a checkpoint of this version")
            claims = doc.get("claims")
            if not isinstance(claims, dict) or doc.get("checksum") != _checksum(claims):
                raise ValueError("checksum mismatch")
            read = [PreparedClaim.from_wire(uid, c) for uid, c in claims.items()]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            self._set_aside(self.path, exc)
            return None
        # One entry refused keeps the others: the file is migrated without it (and then removed).
        return {c.uid: c for c in read if not self._refused(c, "")}

    def _set_aside(self, path: str, exc: BaseException) -> None:
        aside = f"{path}.corrupt"
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        log.error(
            "a checkpoint file of prepared claims is unusable; moved aside, starting without what it held"
            " (unprepare still finds each CDI spec by its name)",
            extra={"path": path, "moved_to": aside, "why": str(exc)},
        )

    def _migrate(self, claims: Iterable[PreparedClaim]) -> None:
        """Each claim of the whole-file checkpoint into its own file, then the old file removed. A crash
        before the removal migrates again on the next start; rewriting a claim's file is idempotent."""
        try:
            count = self._migrate_now(claims)
        except OSError as exc:
            # The old file stays (and is read again next start); the claims are held in memory.
            self._unmigrated = True
            log.error(
                "could not migrate the whole-file checkpoint; keeping it",
                extra={"path": self.path, "why": str(exc)},
            )
            return
        log.info("migrated the whole-file checkpoint", extra={"path": self.directory, "claims": count})

    def _migrate_now(self, claims: Iterable[PreparedClaim]) -> int:
        """Raises OSError, the old file then kept."""
        self._ensure_directory()
        count = 0
        for claim in claims:
            self._write(claim, sync=False)
            count += 1
        sync_directory(self.directory)  # every migrated entry durable before the old file goes
        os.unlink(self.path)
        sync_directory(os.path.dirname(self.path) or ".")
        self._unmigrated = False
        return count

    # --- changes -------------------------------------------------------------------------------------------

    def _write(self, claim: PreparedClaim, *, sync: bool = True) -> None:
        # write_atomically fsyncs the file before its rename: the name never points at a torn file.
        write_atomically(os.path.join(self.directory, file_name(claim.uid)), encode(claim), mode=0o600)
        if sync:
            sync_directory(self.directory)  # the rename itself survives a power loss

    def _ensure_directory(self) -> None:
        """Create the directory when missing, its own entry synced in the parent (the first claim ever
        written must not vanish with a directory a power loss forgot)."""
        if os.path.isdir(self.directory):
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        sync_directory(os.path.dirname(self.directory) or ".")

    def _finish_migration(self) -> None:
        """Before a claim held is changed: the migration that failed at start, done now. The old file
        still names the claim as it was, and would win over the change at the next start: an unprepared
        claim back, or a rewritten one back with another boot's device nodes. Raises OSError (the change
        is then not made: kubelet hears the error and retries)."""
        if self._unmigrated:
            count = self._migrate_now(list(self.claims.values()))
            log.info("migrated the whole-file checkpoint", extra={"path": self.directory, "claims": count})

    def get(self, uid: str) -> PreparedClaim | None:
        return self.claims.get(uid)

    def put(self, claim: PreparedClaim) -> None:
        """Record a prepared claim; its file is durable before this returns (raises OSError if it cannot).
        Costs one file and two fsyncs, however many claims are held."""
        before = self.claims.get(claim.uid)
        if before == claim and before.spec == claim.spec:
            return  # already recorded exactly so
        self._finish_migration()
        self._ensure_directory()
        self._write(claim)
        self.claims[claim.uid] = claim

    def reserve(self, uid: str) -> Reservation:
        """Create the file of a claim not held yet, empty; `Reservation.commit` then writes the claim
        and `Reservation.sync` makes it durable. Raises OSError.

        The file is always a new one (O_EXCL): whatever is under the name when the claim is not held (a
        leftover of a put or a reservation that never finished, or a symlink, a FIFO, a hard link
        planted there) is unlinked first, never written through, as the rename of `put` replaces it."""
        if uid in self.claims:
            raise ValueError(f"claim {uid} is already recorded; a reservation is for a new claim")
        path = os.path.join(self.directory, file_name(uid))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            # The directory is missing (the first claim ever, or it was removed): made, its own entry
            # synced, only now, so a first prepare's common case costs no look at it.
            self._ensure_directory()
            fd = self._create(path, flags)
        except FileExistsError:
            fd = self._create(path, flags)
        reservation = Reservation(self, uid, path, fd)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
        except BaseException:
            reservation.release()
            raise
        return reservation

    @staticmethod
    def _create(path: str, flags: int) -> int:
        try:
            return os.open(path, flags, 0o600)
        except FileExistsError:
            os.unlink(path)  # a directory there stays, and fails the claim (IsADirectoryError)
            return os.open(path, flags, 0o600)

    def remove(self, uid: str) -> None:
        """Forget a claim; its file is gone for good before this returns (raises OSError if it cannot)."""
        self._finish_migration()
        # Tried even for a claim not held: a put whose directory sync failed left its file behind.
        held = uid in self.claims
        try:
            os.unlink(os.path.join(self.directory, file_name(uid)))
        except FileNotFoundError:
            # Gone already. A claim still held was unlinked by an earlier try whose directory sync
            # failed (kubelet heard the error and retries): that unlink is made durable before this
            # answers. Without a directory there is no entry to come back.
            if held:
                with contextlib.suppress(FileNotFoundError):
                    sync_directory(self.directory)
        else:
            sync_directory(self.directory)  # the unlink survives a power loss: the claim stays gone
        self.claims.pop(uid, None)
