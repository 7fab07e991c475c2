"""The fabric record rules: each rule of the issue is a test here."""

from __future__ import annotations

import pytest

from nodefabric_devicemanager.accelerators.fabric import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_IN_PROGRESS,
    FABRIC_STATE_NOT_STARTED,
    FABRIC_STATE_NOT_SUPPORTED,
    INVALID,
    NvlinkFabricInfo,
    SuperPodInfo,
    ascend_shape,
    in_super_pod,
    nvlink_fabric,
    ub_fabric,
    xgmi_fabric,
)
from nodefabric_devicemanager.models import FabricKind

UUID = bytes.fromhex("5B0E112233445566778899AABBCCDDEF")
NVML_ERROR_UNKNOWN = 999


def info(state=FABRIC_STATE_COMPLETED, status=0, uuid=UUID, clique=7):
    return NvlinkFabricInfo(cluster_uuid=uuid, status=status, clique_id=clique, state=state)


# --- NVIDIA --------------------------------------------------------------------------------------------


def test_nvidia_completed_success_publishes_uuid_as_32_lowercase_hex_and_clique_separately():
    f = nvlink_fabric(info())
    assert f is not None
    assert f.kind is FabricKind.NVLINK
    assert f.id == "5b0e112233445566778899aabbccddef"
    assert f.clique_id == 7
    assert f.member_count == 0  # NVML does not size the clique: unreported
    assert f.wire()["cliqueId"] == 7


@pytest.mark.parametrize(
    "state", [FABRIC_STATE_NOT_SUPPORTED, FABRIC_STATE_NOT_STARTED, FABRIC_STATE_IN_PROGRESS]
)
def test_nvidia_not_supported_not_started_in_progress_publish_nothing(state):
    assert nvlink_fabric(info(state=state)) is None


def test_nvidia_completed_with_an_error_publishes_nothing():
    assert nvlink_fabric(info(status=NVML_ERROR_UNKNOWN)) is None


def test_nvidia_all_zero_uuid_publishes_nothing():
    assert nvlink_fabric(info(uuid=bytes(16))) is None


def test_nvidia_state_is_masked_to_its_byte():
    assert nvlink_fabric(info(state=0xAB00 | FABRIC_STATE_COMPLETED)) is not None
    assert nvlink_fabric(info(state=0xAB00 | FABRIC_STATE_IN_PROGRESS)) is None


def test_nvidia_clique_zero_is_a_real_clique():
    f = nvlink_fabric(info(clique=0))
    assert f is not None
    assert f.clique_id == 0
    assert f.wire()["cliqueId"] == 0


def test_nvidia_no_answer_is_no_fabric():
    assert nvlink_fabric(None) is None


# --- AMD -----------------------------------------------------------------------------------------------


def test_amd_hive_is_xgmi_with_hive_id_and_members():
    f = xgmi_fabric(0x1234ABCD5678, 8)
    assert f is not None
    assert (f.kind, f.id, f.member_count) == (FabricKind.XGMI, str(0x1234ABCD5678), 8)


@pytest.mark.parametrize("hive", [0, None])
def test_amd_hive_zero_means_no_hive(hive):
    assert xgmi_fabric(hive, 8) is None


# --- Ascend --------------------------------------------------------------------------------------------


def sp(pod_id=7, size=384, index=3, chassis=2, type_code=1):
    return SuperPodInfo(pod_id, size, index, chassis, type_code)


@pytest.mark.parametrize(
    ("shape", "info", "inside"),
    [
        ("pod-1d", sp(), True),
        ("pod-2d", sp(type_code=2), True),
        ("pod-1d", sp(size=INVALID), True),  # a pod is in its domain whatever size it reports
        ("pod-1d", sp(pod_id=0, size=0), True),  # zero is a real id and size
        ("server-8p", sp(type_code=0), True),  # the super server
        ("server-8p", sp(pod_id=INVALID, size=INVALID, type_code=0), False),
        ("server-8p", sp(size=INVALID, type_code=0), False),
        ("server-8p", sp(pod_id=INVALID, type_code=0), False),
        ("card-1p", sp(), True),
        ("card-4p", sp(), True),
        ("card-4p", sp(pod_id=INVALID, size=INVALID), False),
        ("server-16p", sp(type_code=3), False),
        ("server-32p", sp(type_code=4), False),
        ("", sp(type_code=99), False),
    ],
)
def test_ascend_shape_rule(shape, info, inside):
    assert in_super_pod(shape, info) is inside


def test_ascend_shape_from_mainboard_then_pod_type():
    assert ascend_shape(0x68, sp(type_code=0)) == "card-1p"
    assert ascend_shape(0x6C, None) == "card-4p"
    assert ascend_shape(0x44, sp(type_code=2)) == "pod-2d"
    assert ascend_shape(0x44, sp(type_code=99)) == ""
    assert ascend_shape(None, None) == ""


def test_ascend_in_super_pod_publishes_coordinates():
    f = ub_fabric("pod-1d", sp(), ["00" * 16])
    assert f is not None
    assert f.wire() == {
        "kind": "ub",
        "id": "7",
        "type": "pod-1d",
        "memberCount": 384,
        "nodeIndex": 3,
        "rackId": 2,
        "endpoints": ["00" * 16],
    }


def test_ascend_not_in_super_pod_keeps_kind_type_endpoints_only():
    eid = "000000000044030000100000df101500"
    f = ub_fabric("server-16p", sp(type_code=3), [eid])
    assert f is not None
    assert f.wire() == {"kind": "ub", "id": "", "type": "server-16p", "memberCount": 0, "endpoints": [eid]}


def test_ascend_invalid_markers_are_never_published():
    f = ub_fabric("pod-1d", sp(size=INVALID, index=INVALID, chassis=INVALID), [])
    assert f is not None
    assert (f.id, f.member_count, f.node_index, f.rack_id) == ("7", 0, None, None)
    g = ub_fabric("pod-2d", sp(pod_id=INVALID, type_code=2), [])
    assert g is not None
    assert g.id == ""
    assert str(INVALID) not in str(g.wire())


def test_ascend_nothing_answered_is_no_fabric():
    assert ub_fabric("", None, []) is None
    f = ub_fabric("card-1p", None, [])
    assert f is not None
    assert (f.kind, f.type, f.id) == (FabricKind.UB, "card-1p", "")
