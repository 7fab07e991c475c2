"""The DRA protos are wire-compatible with kubelet's (package names in every method path, field numbers).
That their committed stubs are fresh is checked with every other stub's, by `hack/gen_protos.py --check`
(tests/deviceplugin/test_deviceplugin_protos.py)."""

from __future__ import annotations

import pytest

from nodefabric_deviceplugin.dra.api import dra_v1_pb2, dra_v1beta1_pb2
from nodefabric_deviceplugin.dra.api import pluginregistration_pb2 as reg


def test_registration_matches_kubelets_plugin_watcher() -> None:
    service = reg.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    fields = {f.name: f.number for f in reg.PluginInfo.DESCRIPTOR.fields}
    assert fields == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert {f.name: f.number for f in reg.RegistrationStatus.DESCRIPTOR.fields} == {
        "plugin_registered": 1,
        "error": 2,
    }


@pytest.mark.parametrize(("pb", "version"), [(dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")])
def test_dra_plugin_matches_kubelet(pb: object, version: str) -> None:
    descriptor = pb.DESCRIPTOR  # type: ignore[attr-defined]
    service = descriptor.services_by_name["DRAPlugin"]
    assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    numbers = {
        "NodePrepareResourcesRequest": {"claims": 1},
        "NodePrepareResourcesResponse": {"claims": 1},
        "NodePrepareResourceResponse": {"devices": 1, "error": 2},
        "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
        "NodeUnprepareResourcesRequest": {"claims": 1},
        "NodeUnprepareResourcesResponse": {"claims": 1},
        "NodeUnprepareResourceResponse": {"error": 1},
        "Claim": {"namespace": 1, "uid": 2, "name": 3},
    }
    for message, expected in numbers.items():
        assert {f.name: f.number for f in descriptor.message_types_by_name[message].fields} == expected
    # The response maps are keyed by claim uid.
    entry = (
        descriptor.message_types_by_name["NodePrepareResourcesResponse"].fields_by_name["claims"].message_type
    )
    assert (
        entry.GetOptions().map_entry
        and entry.fields_by_name["key"].type == entry.fields_by_name["key"].TYPE_STRING
    )
