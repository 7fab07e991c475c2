"""Prepared claims, on disk: what each claim was given and where its CDI spec is.

kubelet may call NodePrepareResources again for a claim we prepared (its own restart, a pod restart) and
NodeUnprepareResources after we restarted. The checkpoint makes both exact: a second prepare answers what
the first did (and rewrites the spec if the runtime directory lost it, e.g. after a reboot), and an
unprepare removes the spec the prepare wrote, even if `--cdi-dir` changed in between.

The file carries a checksum of its content. One that cannot be read or does not verify is moved aside
(`<name>.corrupt`) with an Error log, and the driver starts with no prepared claims: unprepare then still
finds each spec by its deterministic name, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from nodefabric_deviceplugin.dra.files import read_regular, write_atomically

log = logging.getLogger(__name__)

KIND = "nodefabric.dra/checkpoint"
VERSION = 1
MAX_BYTES = 16 << 20


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

    def wire(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [
                {
                    "requestNames": list(d.request_names),
                    "pool": d.pool,
                    "device": d.device,
                    "cdiDeviceIds": list(d.cdi_device_ids),
                }
                for d in self.devices
            ],
            "specPath": self.spec_path,
            "spec": self.spec,
        }

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
        return cls(uid, _str(obj["namespace"]), _str(obj["name"]), devices, _str(obj["specPath"]), spec)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return [_str(v) for v in value]


def _checksum(claims: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    """The prepared claims by uid, mirrored to one JSON file on every change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            data = read_regular(self.path, MAX_BYTES)
            if data is None:
                return {}
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION:
                raise ValueError("not a checkpoint of this version")
            claims = doc.get("claims")
            if not isinstance(claims, dict) or doc.get("checksum") != _checksum(claims):
                raise ValueError("checksum mismatch")
            loaded = {uid: PreparedClaim.from_wire(uid, c) for uid, c in claims.items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            aside = f"{self.path}.corrupt"
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.error(
                "the checkpoint of prepared claims is unusable; moved aside, starting without it"
                " (unprepare still finds each CDI spec by its name)",
                extra={"path": self.path, "moved_to": aside, "why": str(exc)},
            )
            return {}
        log.info("loaded prepared claims", extra={"path": self.path, "claims": len(loaded)})
        return loaded

    def _save(self) -> None:
        claims = {uid: c.wire() for uid, c in sorted(self.claims.items())}
        doc = {"kind": KIND, "version": VERSION, "claims": claims, "checksum": _checksum(claims)}
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", mode=0o600)

    def get(self, uid: str) -> PreparedClaim | None:
        return self.claims.get(uid)

    def put(self, claim: PreparedClaim) -> None:
        """Record a prepared claim; the file is written before this returns (raises OSError if it cannot)."""
        before = self.claims.get(claim.uid)
        self.claims[claim.uid] = claim
        try:
            self._save()
        except OSError:
            if before is None:
                self.claims.pop(claim.uid, None)
            else:
                self.claims[claim.uid] = before
            raise

    def remove(self, uid: str) -> None:
        before = self.claims.pop(uid, None)
        if before is None:
            return
        try:
            self._save()
        except OSError:
            self.claims[uid] = before
            raise
