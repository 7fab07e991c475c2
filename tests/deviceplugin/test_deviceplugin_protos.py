"""The committed stubs are what the committed protos generate, and the proto is wire-compatible."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
API = REPO / "deviceplugin" / "nodefabric_deviceplugin" / "api"


def test_generated_stubs_are_fresh() -> None:
    # Every committed stub (the device plugin's and the DRA driver's), compared by the generator itself.
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


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
