"""The fabric record rules, as pure functions of what a vendor library or the driver answered.

Every rule here exists because a wrong value is compared across machines: a fabric id that is a zero,
a marker or a half-registered answer would put unrelated machines in one domain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodefabric_devicemanager.models import Fabric, FabricKind

# --- NVIDIA: nvmlDeviceGetGpuFabricInfoV ------------------------------------------------------------

FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3
NVML_SUCCESS = 0


@dataclass(frozen=True, slots=True)
class NvlinkFabricInfo:
    """What NVML answered for one GPU (struct v2/v3), already copied out of ctypes."""

    cluster_uuid: bytes  # 16 bytes
    status: int  # an nvmlReturn_t: NVML_SUCCESS when registration succeeded
    clique_id: int
    state: int  # NVML_GPU_FABRIC_STATE_*


def nvlink_fabric(info: NvlinkFabricInfo | None) -> Fabric | None:
    """Published only after registration COMPLETED with SUCCESS and a uuid that is not all zero."""
    if info is None:
        return None
    # The state is a one-byte enum; some struct layouts leave garbage in the bytes above it.
    if (info.state & 0xFF) != FABRIC_STATE_COMPLETED or info.status != NVML_SUCCESS:
        return None
    if len(info.cluster_uuid) != 16 or not any(info.cluster_uuid):
        return None
    return Fabric(kind=FabricKind.NVLINK, id=info.cluster_uuid.hex(), clique_id=info.clique_id)


# --- AMD: KFD topology hive_id / xgmi_hive_info ------------------------------------------------------


def xgmi_fabric(hive_id: int | None, members: int) -> Fabric | None:
    """Hive 0 (or no answer) means the GPU is in no hive. `members` counts GPUs sharing the hive."""
    if not hive_id:
        return None
    return Fabric(kind=FabricKind.XGMI, id=str(hive_id), member_count=max(members, 0))


# --- Ascend: dcmi super pod info ----------------------------------------------------------------------

INVALID = 0xFFFFFFFF  # the driver's "not reported" marker for every super pod field

SHAPE_SERVER_8P = "server-8p"
SHAPE_POD_1D = "pod-1d"
SHAPE_POD_2D = "pod-2d"
SHAPE_SERVER_16P = "server-16p"
SHAPE_SERVER_32P = "server-32p"
SHAPE_CARD_1P = "card-1p"
SHAPE_CARD_4P = "card-4p"

# The vendor's super_pod_type numbering.
SHAPE_CODES = {
    0: SHAPE_SERVER_8P,
    1: SHAPE_POD_1D,
    2: SHAPE_POD_2D,
    3: SHAPE_SERVER_16P,
    4: SHAPE_SERVER_32P,
    5: SHAPE_CARD_1P,
    6: SHAPE_CARD_4P,
}
# The two inference cards are recognised by the mainboard they are mounted on, before the pod type.
MAINBOARD_CARD_1P = 0x68
MAINBOARD_CARD_4P = 0x6C

_POD_SHAPES = {SHAPE_POD_1D, SHAPE_POD_2D}
_SUPER_SERVER_SHAPES = {SHAPE_SERVER_8P, SHAPE_CARD_1P, SHAPE_CARD_4P}


@dataclass(frozen=True, slots=True)
class SuperPodInfo:
    """dcmi's super pod answer for one NPU (struct dcmi_spod_info)."""

    super_pod_id: int
    super_pod_size: int
    server_index: int
    chassis_id: int
    super_pod_type: int


def ascend_shape(mainboard_id: int | None, spod: SuperPodInfo | None) -> str:
    """The product shape: the mainboard names the inference cards, else the pod type. "" when unknown."""
    if mainboard_id == MAINBOARD_CARD_1P:
        return SHAPE_CARD_1P
    if mainboard_id == MAINBOARD_CARD_4P:
        return SHAPE_CARD_4P
    if spod is None:
        return ""
    return SHAPE_CODES.get(spod.super_pod_type, "")


def in_super_pod(shape: str, spod: SuperPodInfo | None) -> bool:
    """The vendor's rule: pods always; server-8p and the cards only with a valid id AND size; else never.

    A shape without a name cannot be checked against the exclusions, so it is not in one.
    """
    if spod is None:
        return False
    if shape in _POD_SHAPES:
        return True
    if shape in _SUPER_SERVER_SHAPES:
        return INVALID not in (spod.super_pod_id, spod.super_pod_size)
    return False


def ub_fabric(shape: str, spod: SuperPodInfo | None, endpoints: Sequence[str]) -> Fabric | None:
    """kind, type and endpoints travel either way; id, memberCount, nodeIndex, rackId only in a super pod.

    Each of the three beside the id carries its own marker check: a domain can be identified while its
    size, this machine's index in it or its rack are not. None when the driver answered nothing at all.
    """
    if spod is None and not shape and not endpoints:
        return None
    fabric = Fabric(kind=FabricKind.UB, type=shape, endpoints=list(endpoints))
    if spod is not None and in_super_pod(shape, spod) and spod.super_pod_id != INVALID:
        fabric.id = str(spod.super_pod_id)
        if spod.super_pod_size != INVALID:
            fabric.member_count = spod.super_pod_size
        if spod.server_index != INVALID:
            fabric.node_index = spod.server_index
        if spod.chassis_id != INVALID:
            fabric.rack_id = spod.chassis_id
    return fabric


def endpoint_hex(raw: bytes) -> str:
    """A UB endpoint id as the vendor publishes it: all 16 bytes, lowercase hex, unparsed."""
    return raw.hex()
