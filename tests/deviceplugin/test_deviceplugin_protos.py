"""The committed stubs are what the committed proto generates, and the proto is wire-compatible."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
API = REPO / "deviceplugin" / "nodefabric_deviceplugin" / "api"

# Version stamps of the generator itself: a newer grpcio-tools must not read as a changed proto.
_STAMPS = [
    (re.compile(r"ValidateProtobufRuntimeVersion\(.*?\)", re.S), "ValidateProtobufRuntimeVersion(...)"),
    (re.compile(r"Protobuf Python Version: .*"), "Protobuf Python Version: ..."),
    (re.compile(r"GRPC_GENERATED_VERSION = .*"), "GRPC_GENERATED_VERSION = ..."),
]


def unstamped(text: str) -> str:
    for pattern, replacement in _STAMPS:
        text = pattern.sub(replacement, text)
    return text


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(REPO / "hack" / "gen_protos.py"), "--out", str(tmp_path)], check=True)
    for name in ("deviceplugin_pb2.py", "deviceplugin_pb2.pyi", "deviceplugin_pb2_grpc.py"):
        fresh = unstamped((tmp_path / "nodefabric_deviceplugin" / "api" / name).read_text())
        committed = unstamped((API / name).read_text())
        assert fresh == committed, f"{name} is stale: run `make protos` (hack/gen_protos.py)"


def test_method_paths_and_field_numbers_match_kubelet() -> None:
    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    fields = {
        "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
        "Device": {"ID": 1, "health": 2, "topology": 3},
        "NUMANode": {"ID": 1},
        "ContainerPreferredAllocationRequest": {
            "available_deviceIDs": 1,
            "must_include_deviceIDs": 2,
            "allocation_size": 3,
        },
        "ContainerAllocateResponse": {
            "envs": 1,
            "mounts": 2,
            "devices": 3,
            "annotations": 4,
            "cdi_devices": 5,
        },
        "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
    }
    for message, numbers in fields.items():
        descriptor = pb.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in descriptor.fields} == numbers
    assert (
        pb.NUMANode.DESCRIPTOR.fields_by_name["ID"].type
        == pb.NUMANode.DESCRIPTOR.fields_by_name["ID"].TYPE_INT64
    )
