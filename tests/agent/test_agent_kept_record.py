"""What the agent keeps when a read fails: a stored spec that does not parse is never replaced by a partial
(failed) read, and a manufacturer whose fabric cannot be read keeps its recorded group."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pynvml
from agent_fixtures import (
    DEVICES,
    NODE,
    api_with_node,
    break_interface_enumeration,
    conditions,
    make_agent,
    restore_interface_enumeration,
    stored,
    two_nic_host,
)

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.agent.core import Result
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec, Interface
from nodefabric_devicemanager.testing.accelerators import FakeNvml, nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

# A record a later version wrote (a value this version's model refuses), with something worth keeping.
UNPARSEABLE: dict[str, Any] = {"interfaces": [{"name": "ens1f0", "mtu": "jumbo", "rdmaDevice": "mlx5_0"}]}


class Reading:
    def __init__(self, interfaces: list[Interface] | None, failed: set[str] | None = None) -> None:
        self.interfaces = interfaces
        self.groups: list[Any] = []
        self.failed_manufacturers = failed or set()
        self.conditions: list[Any] = []


def test_an_unparseable_record_is_not_rewritten_from_a_failed_read() -> None:
    obj = {"spec": UNPARSEABLE, "status": {}}
    kept = publish.plan(obj, Reading(None), T0)
    assert kept.spec is None, "a failed read would have replaced the record with an empty list"
    assert kept.conditions is not None
    assert {c["type"]: c["status"] for c in kept.conditions}["InterfacesEnumerated"] == "False"

    one_vendor_failed = publish.plan(obj, Reading([Interface(name="eth0")], failed={"nvidia"}), T0)
    assert one_vendor_failed.spec is None, "the failed manufacturer's groups could not be carried over"

    full = publish.plan(obj, Reading([Interface(name="eth0")]), T0)
    assert full.spec == DevicesSpec(interfaces=[Interface(name="eth0")]), "a whole reading rewrites it"


def _seed_unparseable(k: Any) -> None:
    # No write can store this today (the API server validates against the CRD); a record stored
    # under an older schema can be like it.
    node_uid = k.api.stored("v1/nodes", NODE)["metadata"]["uid"]
    k.api.put_object(
        DEVICES,
        {
            "apiVersion": "worker.gpustack.ai/v1alpha1",
            "kind": "Devices",
            "metadata": {
                "name": NODE,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}],
            },
            "spec": UNPARSEABLE,
        },
        validate=False,
    )


async def test_a_failed_read_leaves_an_unparseable_record_and_hands_nothing_on(tmp_path) -> None:
    two_nic_host(tmp_path)
    break_interface_enumeration(tmp_path)
    async with api_with_node() as k:
        _seed_unparseable(k)
        agent = make_agent(k, tmp_path)
        seen: list[DevicesSpec] = []
        agent.subscribe(seen.append)

        outcome = await agent.run_pass()
        assert outcome.ok and outcome.wrote == ("status",)
        assert stored(k)["spec"] == UNPARSEABLE
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "False"
        assert seen == [], "the in-process device plugin would have registered zero devices"

        restore_interface_enumeration(tmp_path)
        outcome = await agent.run_pass()
        assert outcome.result is Result.UPDATED and "spec" in outcome.wrote
        assert [i["name"] for i in stored(k)["spec"]["interfaces"]] == ["ens1f0", "ens1f1"]
        assert [i.name for i in seen[-1].interfaces] == ["ens1f0", "ens1f1"]


async def test_a_manufacturer_whose_fabric_cannot_be_read_keeps_its_recorded_group(tmp_path) -> None:
    # The accelerator reading names a failed manufacturer by its key ("nvidia"), not "NVIDIA".
    b = SysfsBuilder(tmp_path)
    nvml = nvswitch_node(
        b, cluster_uuid=bytes.fromhex("5b0e112233445566778899aabbccddef"), clique_id=1,
        state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
    )  # fmt: skip
    broken = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    libraries = {"nvml": Nvml(nvml)}
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        agent.reader = lambda host: inventory.read(host, libraries=Libraries(nvidia=libraries["nvml"]))
        assert (await agent.run_pass()).result is Result.CREATED
        recorded = stored(k)["spec"]["groups"]
        assert recorded[0]["id"] == "nvidia" and recorded[0]["accelerators"][0]["topology"]["fabric"]["id"]

        libraries["nvml"] = Nvml(broken)
        outcome = await agent.run_pass()
        assert outcome.ok and "spec" not in outcome.wrote, "the fabric is unknown this pass, not gone"
        assert stored(k)["spec"]["groups"] == recorded
        assert conditions(stored(k))["NvidiaFabricRead"]["status"] == "False"

    # With nothing recorded yet, the accelerators are published as read rather than left out.
    fresh = publish.desired_spec(
        inventory.read(HostRoot.at(b.root), libraries=Libraries(Nvml(broken))), None, T0
    )
    assert [len(g.accelerators) for g in fresh.groups] == [8]


async def test_a_first_pass_that_cannot_enumerate_hands_nothing_to_the_plugin(tmp_path) -> None:
    """Registering zero devices is a published fact; a host never read yet supports no such fact."""
    two_nic_host(tmp_path)
    break_interface_enumeration(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        handed: list[DevicesSpec] = []
        agent.subscribe(handed.append)
        outcome = await agent.run_pass()
        assert outcome.result is Result.CREATED
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "False"
        assert handed == [], "the plugin would have registered zero devices from a failed read"

        restore_interface_enumeration(tmp_path)
        await agent.run_pass()
        assert len(handed) == 1 and {i.name for i in handed[0].interfaces} == {"ens1f0", "ens1f1"}
