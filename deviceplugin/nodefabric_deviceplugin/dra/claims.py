"""What a ResourceClaim allocated from this node's pool. Pure: the claim is read by the caller.

kubelet names a claim by namespace, name and uid; the claim itself is read from the API, and its uid must
be the one kubelet named (a different uid is a claim deleted and recreated under the same name: preparing
it would hand the new claim's devices to the old pod). Results for other drivers' devices are not ours
and are skipped; a result of ours from another pool cannot be served on this node and fails the claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager import names

GROUP = "resource.k8s.io"
VERSION = "v1"
PLURAL = "resourceclaims"


class ClaimError(Exception):
    """This claim cannot be prepared; the message goes into its entry of the response."""


SHOWN_CHARACTERS = 100


def _shown(text: str) -> str:
    """A value quoted in an error, cut: the error travels back beside the claim's uid, and a value of
    megabytes echoed whole would take the answer past kubelet's 4 MiB limit (every claim's entry lost)."""
    if len(text) <= SHOWN_CHARACTERS:
        return repr(text)
    return f"{text[:SHOWN_CHARACTERS]!r}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    uid: str
    name: str

    def check(self) -> None:
        """Refuse a reference no API server could have produced (the uid also names a file on disk)."""
        if not names.uid(self.uid):
            raise ClaimError(f"invalid claim uid {_shown(self.uid)}")
        if not names.dns_label(self.namespace):
            raise ClaimError(f"invalid claim namespace {_shown(self.namespace)}")
        if not names.dns_subdomain(self.name):
            raise ClaimError(f"invalid claim name {_shown(self.name)}")

    def __str__(self) -> str:
        # Logged on every retry ("cannot prepare a claim") and quoted in errors: a part longer than any
        # valid one (kubelet passes a reference on unchecked) is cut as an error quotes it, so a reference
        # of megabytes makes no line of megabytes. A valid reference reads whole.
        return f"{_part(self.namespace)}/{_part(self.name)} (uid {_part(self.uid)})"


def _part(text: str) -> str:
    return text if len(text) <= names.DNS_SUBDOMAIN_MAX else _shown(text)


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str  # the claim's request (or "<request>/<subrequest>") the device was allocated for
    pool: str
    device: str


def _field(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def allocated_devices(claim: Any, ref: ClaimRef, *, driver: str, pool: str) -> list[AllocatedDevice]:
    """This driver's devices in the claim's allocation, in result order. Raises ClaimError."""
    if not isinstance(claim, dict):
        raise ClaimError(f"claim {ref} is not an object")
    uid = _field(claim, "metadata", "uid")
    if uid != ref.uid:
        raise ClaimError(
            f"claim {ref.namespace}/{ref.name} has uid {uid!r}, not {ref.uid!r}: it was deleted and recreated"
        )
    allocation = _field(claim, "status", "allocation")
    if not isinstance(allocation, dict):
        raise ClaimError(f"claim {ref} is not allocated")
    results = _field(allocation, "devices", "results") or []
    if not isinstance(results, list):
        raise ClaimError(f"claim {ref}: status.allocation.devices.results is not a list")
    out: list[AllocatedDevice] = []
    for i, result in enumerate(results):
        if not isinstance(result, dict):
            raise ClaimError(f"claim {ref}: allocation result {i} is not an object")
        if result.get("driver") != driver:
            continue  # another driver's device: that driver prepares it
        request, rpool, device = result.get("request"), result.get("pool"), result.get("device")
        if not isinstance(device, str) or not names.dns_label(device):
            raise ClaimError(f"claim {ref}: allocation result {i} names no valid device ({device!r})")
        if rpool != pool:
            raise ClaimError(
                f"claim {ref}: device {device} was allocated from pool {rpool!r},"
                f" not this node's pool {pool!r}"
            )
        out.append(AllocatedDevice(request if isinstance(request, str) else "", pool, device))
    return out
