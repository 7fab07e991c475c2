"""CDI: one spec file per prepared claim, which the container runtime applies to the claim's containers.

The content is the device plugin's grant (`allocate.grant`), split the way CDI applies edits:
- each allocated device is a CDI device `<driver>/nic=<claim uid>-<device>` whose edits are the device
  nodes a grant of that one endpoint gives (its own uverbs node, and `rdma_cm` where the host has it);
- the spec-level edits carry `NCCL_IB_HCA` of the whole claim: CDI applies them once per container that
  gets any device of the spec, so a container holding several devices sees the variable once, naming
  exactly the claim's devices. (A container that asks for only some of a claim's requests still sees the
  claim's whole list: CDI cannot make an environment variable depend on which devices were injected.)

The file is `<cdi dir>/<driver>-nic_<claim uid>.json` (CDI's transient-spec naming), written atomically so
the runtime's watcher never reads half a spec.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodefabric_deviceplugin.allocate import PERMISSIONS
from nodefabric_deviceplugin.dra.files import SORTED_JSON, parse_json, read_regular, write_atomically

# The lowest version with everything written here (spec-level edits, device nodes with permissions), so
# every CDI-capable runtime that kubelet's DRA support works with can read it.
CDI_VERSION = "0.5.0"
CLASS = "nic"
MAX_SPEC_BYTES = 1 << 20

log = logging.getLogger(__name__)


def kind(driver: str) -> str:
    return f"{driver}/{CLASS}"


def device_name(claim_uid: str, device: str) -> str:
    # The claim's uid keeps names unique across every spec of the kind, even beside a stale spec.
    return f"{claim_uid}-{device}"


def device_id(driver: str, claim_uid: str, device: str) -> str:
    """The fully qualified CDI device id kubelet hands to the runtime."""
    return f"{kind(driver)}={device_name(claim_uid, device)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    return f"{driver}-{CLASS}_{claim_uid}.json"


def spec_path(cdi_dir: str, driver: str, claim_uid: str) -> str:
    return os.path.join(cdi_dir, spec_file_name(driver, claim_uid))


def build_spec(
    driver: str,
    claim_uid: str,
    device_nodes: Mapping[str, Sequence[str]],
    envs: Mapping[str, str],
) -> dict[str, Any]:
    """The spec of one claim: `device_nodes` maps each allocated device to its host device paths."""
    devices = [
        {
            "name": device_name(claim_uid, device),
            "containerEdits": {"deviceNodes": [{"path": p, "permissions": PERMISSIONS} for p in paths]},
        }
        for device, paths in device_nodes.items()
    ]
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind(driver), "devices": devices}
    if envs:
        spec["containerEdits"] = {"env": [f"{k}={v}" for k, v in sorted(envs.items())]}
    return spec


# Stands for the claim's uid in a template; the spec's other strings (device paths, NCCL_IB_HCA) never
# hold it, which `SpecTemplate.of` checks.
_UID = "\u2063uid\u2063"


@dataclass(frozen=True, slots=True)
class SpecTemplate:
    """The spec of a one-device claim with the claim's uid left open: the same for every claim of that
    device under one verbs table, so a first prepare splices its uid into text encoded once rather than
    building and encoding the spec again (`build_spec`, `spec_text`). Both answers are exactly theirs."""

    kind: str
    device: str
    edits: dict[str, Any]  # the device's containerEdits
    env: dict[str, Any] | None  # the spec-level containerEdits
    head: str  # the spec's text up to the uid in the device's name
    tail: str  # and after it

    @classmethod
    def of(
        cls, driver: str, device: str, paths: Sequence[str], envs: Mapping[str, str]
    ) -> SpecTemplate | None:
        """None when the spec cannot be split around its uid (a string of the spec holding the marker)."""
        spec = build_spec(driver, _UID, {device: paths}, envs)
        head, marker, tail = spec_text(spec).partition(_json_string_body(_UID))
        if not marker or _json_string_body(_UID) in tail:
            return None
        return cls(
            spec["kind"], device, spec["devices"][0]["containerEdits"], spec.get("containerEdits"), head, tail
        )

    def spec(self, claim_uid: str) -> dict[str, Any]:
        """`build_spec` of the claim (its parts shared with the template: specs are never changed)."""
        device = {"name": device_name(claim_uid, self.device), "containerEdits": self.edits}
        spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": [device]}
        if self.env is not None:
            spec["containerEdits"] = self.env
        return spec

    def text(self, claim_uid: str) -> str:
        """`spec_text` of the claim's spec."""
        return self.head + _json_string_body(claim_uid) + self.tail


def _json_string_body(value: str) -> str:
    """A string as `spec_text` writes it inside quotes."""
    return SORTED_JSON.encode(value)[1:-1]


def read_spec(path: str) -> Any:
    """The spec now on disk, or None when it is absent, unreadable or not a regular file (it is then
    written again, replacing whatever is there)."""
    try:
        data = read_regular(path, MAX_SPEC_BYTES)
        return None if data is None else parse_json(data)
    except (OSError, ValueError):
        return None


def write_spec(path: str, spec: Mapping[str, Any]) -> bool:
    """Write the spec unless the same one is already there; returns whether it wrote.

    Not fsynced: the checkpoint entry written next holds the same spec (written before kubelet hears of
    the claim, synced after: see checkpoint), and kubelet prepares every claim again after it restarts
    (a reboot too), which rewrites a spec a power loss took or tore (`read_spec` finds it absent or
    different). Atomic all the same: the runtime's watcher never reads half a spec."""
    if read_spec(path) == spec:
        return False
    write_new_spec(path, spec_text(spec))
    return True


def spec_text(spec: Mapping[str, Any]) -> str:
    """The spec as the file holds it, and as the claim's checkpoint entry embeds it (`checkpoint.encode`).
    Compact: `indent` would take Python's pure-Python encoder, for a file only the runtime reads."""
    return SORTED_JSON.encode(spec)


def write_new_spec(path: str, text: str) -> None:
    """Write the spec of a claim not prepared before (`text`: encoded by `spec_text`), as `write_spec`
    does but without reading what is there first: a first prepare finds no spec of its own under the
    claim's name (a leftover, the only thing that could be there, is replaced whole, as `write_spec`
    replaces a different one)."""
    write_atomically(path, text.encode() + b"\n", sync=False)


def remove_spec(path: str) -> bool:
    """Remove a claim's spec; returns whether there was one. A directory in its place is an error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def remove_temporaries(cdi_dir: str, driver: str) -> int:
    """On start: remove the temporary files of spec writes that a kill interrupted before their rename
    (`files.write_atomically` names them `.<spec file>.<12 hex>.tmp`), ours only: the directory is the
    runtime's, shared with other drivers. Nothing else removes them. Returns how many were removed."""
    ours = re.compile(r"\." + re.escape(f"{driver}-{CLASS}_") + r"[^/]*\.json\.[0-9a-f]{12}\.tmp")
    try:
        names = os.listdir(cdi_dir)
    except OSError:
        return 0  # missing (made by the first write) or unreadable (every write then says why)
    removed = 0
    for name in names:
        if ours.fullmatch(name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(cdi_dir, name))
                removed += 1
    if removed:
        log.info(
            "removed the temporary files of spec writes interrupted by a crash",
            extra={"path": cdi_dir, "files": removed},
        )
    return removed
