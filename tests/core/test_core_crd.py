"""The Devices CRD is generated from the models: stale YAML fails, and real records validate against it."""

from __future__ import annotations

import pathlib
from datetime import UTC, datetime

import jsonschema
import pytest
import yaml

from nodefabric_devicemanager import crd, models

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path", [ROOT / "crds" / crd.CRD_FILE, ROOT / "charts/nodefabric/crds" / crd.CRD_FILE]
)
def test_committed_crd_is_current(path: pathlib.Path) -> None:
    assert path.read_text() == crd.render(), f"{path} is stale: run `make crds`"


def _schema() -> dict:
    return crd.devices_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            yield from _walk(value, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from _walk(node[key], f"{path}[{key}]")


def test_schema_is_structural():
    """Every node has a type, nothing is a $ref or anyOf, no defaults that the API server would inject."""
    for path, node in _walk(_schema()):
        assert "type" in node, path
        assert not {"$ref", "anyOf", "allOf", "oneOf", "default", "title"} & node.keys(), path


def _record() -> models.Devices:
    vf = models.VirtualFunction(pci_bus_id="0000:17:00.2", rdma=True, rdma_device="mlx5_3")
    return models.Devices(
        metadata=models.ObjectMeta(name="gpu-1"),
        spec=models.DevicesSpec(
            interfaces=[
                models.Interface(
                    name="ens1f0",
                    bus="pci",
                    pci_bus_id="0000:17:00.0",
                    pci_switches=["0000:16:01.0", "0000:15:00.0"],
                    rdma=True,
                    rdma_device="mlx5_0",
                    sriov=True,
                    sriov_num_vfs=1,
                    virtual_functions=[vf],
                    link=models.LinkVerdict(
                        state=models.LinkState.FAILED,
                        reason="port 1: state 1: DOWN, phys_state 3: Disabled",
                        first_seen_time=datetime(2026, 11, 1, tzinfo=UTC),
                    ),
                )
            ],
            groups=[
                models.AcceleratorGroup(
                    id="nvidia",
                    manufacturer="NVIDIA",
                    accelerators=[
                        models.Accelerator(
                            id="0000:18:00.0",
                            index=0,
                            topology=models.AcceleratorTopology(
                                links={"1": "NV18"},
                                fabric=models.Fabric(
                                    kind=models.FabricKind.NVLINK, id="ab" * 16, clique_id=1
                                ),
                            ),
                        )
                    ],
                )
            ],
        ),
        status=models.DevicesStatus(
            conditions=[models.Condition(type=models.INTERFACES_ENUMERATED, status="True", reason="Read")]
        ),
    )


def test_a_full_record_validates_against_the_crd_schema():
    obj = _record().wire()
    jsonschema.validate(obj, _schema())
    assert obj["spec"]["interfaces"][0]["virtualFunctions"][0]["rdmaDevice"] == "mlx5_3"
    assert obj["spec"]["interfaces"][0]["link"]["firstSeenTime"] == "2026-11-01T00:00:00Z"


def test_schema_rejects_an_unknown_link_state():
    obj = _record().wire()
    obj["spec"]["interfaces"][0]["link"]["state"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, _schema())


def test_record_round_trips_through_the_wire_form():
    record = _record()
    assert models.Devices.from_wire(yaml.safe_load(yaml.safe_dump(record.wire()))) == record


def test_blank_numa_is_unknown_not_zero():
    assert models.Endpoint().numa_affinity == ""


def test_set_condition_keeps_transition_time_while_status_holds():
    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    first = models.set_condition([], models.Condition(type="A", status="False", reason="X"), t0)
    again = models.set_condition(first, models.Condition(type="A", status="False", reason="Y"), t1)
    assert again[0].last_transition_time == t0 and again[0].reason == "Y"
    flipped = models.set_condition(again, models.Condition(type="A", status="True"), t1)
    assert flipped[0].last_transition_time == t1


def test_set_condition_leaves_other_writers_conditions():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    theirs = models.Condition(type=models.LABELS_PUBLISHED, status="True", last_transition_time=t0)
    out = models.set_condition(
        [theirs], models.Condition(type=models.INTERFACES_ENUMERATED, status="True"), t0
    )
    assert [c.type for c in out] == [models.INTERFACES_ENUMERATED, models.LABELS_PUBLISHED]


def test_fabric_unread_reads_every_manufacturer():
    status = models.DevicesStatus(
        conditions=[
            models.Condition(type="NvidiaFabricRead", status="True"),
            models.Condition(type="AscendFabricRead", status="False", reason="LibraryError"),
        ]
    )
    assert status.fabric_unread()
    assert not status.unread(models.INTERFACES_ENUMERATED)


def test_kubectl_get_device_works_through_short_names():
    names = crd.devices_crd()["spec"]["names"]
    assert {"device", "dev"} <= set(names["shortNames"])
    assert names["singular"] == names["plural"] == "devices"


def test_every_field_has_a_description_for_kubectl_explain():
    missing = [path for path, node in _walk(_schema()) if path != "$" and not node.get("description")]
    # Map values and list items are described by the field that holds them.
    missing = [p for p in missing if not p.endswith(("[items]", "[additionalProperties]"))]
    assert missing == []
    interfaces = _schema()["properties"]["spec"]["properties"]["interfaces"]
    assert "sorted by name" in interfaces["description"]
    assert "innermost first" in interfaces["items"]["properties"]["pciSwitches"]["description"]
    assert "\n" not in interfaces["items"]["properties"]["rdmaSoftware"]["description"]


def test_conditions_are_a_list_map_keyed_by_type():
    conditions = _schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]  # a list-map key must be required


def test_every_integer_is_bounded_inside_int64():
    ints = [(path, node) for path, node in _walk(_schema()) if node.get("type") == "integer"]
    assert ints
    for path, node in ints:
        assert node.get("minimum", -1) >= 0 and node.get("maximum", 2**63) < 2**63, path


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("interfaces", 0, "mtu"), 2**31),
        (("interfaces", 0, "mtu"), -1),
        (("interfaces", 0, "sriovNumVfs"), 70000),
        (("interfaces", 0, "numaAffinity"), "01"),
        (("interfaces", 0, "numaAffinity"), "1024"),
        (("interfaces", 0, "cpuAffinity"), "all"),
        (("groups", 0, "accelerators", 0, "index"), -1),
    ],
)
def test_the_api_server_refuses_a_value_the_host_reader_never_writes(path, value):
    obj = _record().wire()
    node = obj["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, _schema())


def test_an_unknown_mtu_is_left_out_and_readers_stay_tolerant_of_a_hand_edited_numa():
    assert "mtu" not in models.Interface(name="eth0").wire()
    # The pattern is the API server's; a reader of a hand-edited object still parses it (as unknown).
    assert models.Endpoint(numa_affinity="\u00b2").numa_affinity == "\u00b2"
