"""The pure decision: desired spec, comparison, firstSeenTime, conditions, create / patch / nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from nodefabric_devicemanager import inventory, summary
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import (
    Accelerator,
    AcceleratorGroup,
    Condition,
    DevicesSpec,
    Interface,
    LinkState,
    LinkVerdict,
    VirtualFunction,
)
from nodefabric_devicemanager.testing.scenarios import SCENARIOS
from nodefabric_deviceplugin.resources import partition_endpoints, whole_function_endpoints

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=3)


@dataclass
class FakeReading:
    interfaces: list[Interface] | None
    groups: list[AcceleratorGroup] = field(default_factory=list)
    failed_manufacturers: set[str] = field(default_factory=set)
    conditions: list[Condition] = field(default_factory=list)


def failed(reason: str = "mlx5_1: port 1 state '1: DOWN'", when: datetime | None = None) -> LinkVerdict:
    return LinkVerdict(state=LinkState.FAILED, reason=reason, first_seen_time=when)


def pf_with_vfs(link: LinkVerdict | None, vf_link: LinkVerdict | None = None) -> Interface:
    vfs = [
        VirtualFunction(pci_bus_id=f"0000:17:00.{n}", rdma=True, rdma_device=f"mlx5_{n + 1}", link=vf_link)
        for n in (2, 10, 3)
    ]
    return Interface(name="ens1f0", pci_bus_id="0000:17:00.0", pci_switches=["0000:16:01.0"], link=link,
                     virtual_functions=vfs)  # fmt: skip


def test_a_persisting_failure_keeps_its_first_seen_time():
    stored = [pf_with_vfs(failed(when=T0), vf_link=failed(when=T0))]
    fresh = [pf_with_vfs(failed(), vf_link=failed())]
    out = publish.carry_first_seen(fresh, stored, T1)
    assert out[0].link is not None and out[0].link.first_seen_time == T0
    assert {vf.link.first_seen_time for vf in out[0].virtual_functions if vf.link} == {T0}


def test_a_new_failure_is_stamped_now_and_a_recovery_clears_the_time():
    ok = LinkVerdict(state=LinkState.OK, reason="up")
    out = publish.carry_first_seen([pf_with_vfs(failed())], [pf_with_vfs(ok)], T1)
    assert out[0].link is not None and out[0].link.first_seen_time == T1
    healed = publish.carry_first_seen([pf_with_vfs(ok)], [pf_with_vfs(failed(when=T0))], T1)
    assert healed[0].link is not None and healed[0].link.first_seen_time is None
    # Unverified is not Failed: an unreadable port never carries a failure time.
    unverified = LinkVerdict(state=LinkState.UNVERIFIED, reason="unreadable")
    out = publish.carry_first_seen([pf_with_vfs(unverified)], [pf_with_vfs(failed(when=T0))], T1)
    assert out[0].link is not None and out[0].link.first_seen_time is None


def test_comparison_ignores_order_and_first_seen_time_but_not_content():
    a = DevicesSpec(interfaces=[pf_with_vfs(failed(when=T0)), Interface(name="eth0")])
    shuffled = pf_with_vfs(failed(when=T1))
    shuffled.virtual_functions.reverse()
    b = DevicesSpec(interfaces=[Interface(name="eth0"), shuffled])
    assert publish.same_spec(a, b)

    c = b.model_copy(deep=True)
    c.interfaces[1].virtual_functions[0].rdma_device = "mlx5_9"
    assert not publish.same_spec(a, c)
    d = a.model_copy(deep=True)
    d.interfaces[0].pci_switches = ["0000:16:01.0", "0000:15:01.0"]
    assert not publish.same_spec(a, d), "pciSwitches order means innermost first; it is compared as is"


def test_vfs_compare_by_numeric_pci_address():
    key = publish.canonical(DevicesSpec(interfaces=[pf_with_vfs(None)]))["interfaces"][0]["virtualFunctions"]
    assert [vf["pciBusId"] for vf in key] == ["0000:17:00.2", "0000:17:00.3", "0000:17:00.10"]


def test_a_failed_enumeration_keeps_the_stored_interfaces():
    stored = DevicesSpec(interfaces=[pf_with_vfs(None)])
    spec = publish.desired_spec(FakeReading(interfaces=None), stored, T1)
    assert spec.interfaces == stored.interfaces
    assert publish.desired_spec(FakeReading(interfaces=[]), stored, T1).interfaces == []


def test_a_failed_manufacturer_keeps_its_stored_groups_and_others_are_replaced():
    nvidia_old = AcceleratorGroup(
        id="nvidia", manufacturer="nvidia", accelerators=[Accelerator(id="GPU-a", index=0)]
    )
    amd_old = AcceleratorGroup(id="amd", manufacturer="amd", accelerators=[Accelerator(id="amd-0", index=0)])
    amd_new = AcceleratorGroup(id="amd", manufacturer="amd", accelerators=[])
    stored = DevicesSpec(groups=[nvidia_old, amd_old])
    reading = FakeReading(interfaces=[], groups=[amd_new], failed_manufacturers={"nvidia"})
    spec = publish.desired_spec(reading, stored, T1)
    assert spec.groups == [amd_new, nvidia_old]


def test_conditions_merge_by_type_and_keep_other_writers_verbatim():
    theirs = {"type": "LabelsPublished", "status": "True", "observedGeneration": 4, "lastTransitionTime": "x"}
    ours = {"type": "InterfacesEnumerated", "status": "True", "reason": "Enumerated", "message": "",
            "lastTransitionTime": "2026-11-01T12:00:00Z"}  # fmt: skip
    same = Condition(type="InterfacesEnumerated", status="True", reason="Enumerated")
    assert publish.merge_conditions([theirs, ours], [same], T1) is None

    down = Condition(type="InterfacesEnumerated", status="False", reason="EnumerationFailed", message="boom")
    merged = publish.merge_conditions([ours, theirs], [down], T1)
    assert merged is not None
    assert merged[1] == theirs
    assert merged[0]["status"] == "False" and merged[0]["lastTransitionTime"] == "2026-11-01T15:00:00Z"

    # A malformed entry of ours is rewritten rather than crashing the pass.
    broken = {"type": "InterfacesEnumerated", "status": "Perhaps"}
    merged = publish.merge_conditions([broken], [same], T1)
    assert merged is not None and merged[0]["status"] == "True"


def test_the_reading_always_says_what_was_enumerated():
    types = {c.type: c.status for c in publish.reported_conditions(FakeReading(interfaces=None))}
    assert types == {"InterfacesEnumerated": "False", "AcceleratorsEnumerated": "True"}
    reading = FakeReading(interfaces=[], failed_manufacturers={"amd"})
    types = {c.type: c.status for c in publish.reported_conditions(reading)}
    assert types == {"InterfacesEnumerated": "True", "AcceleratorsEnumerated": "False"}


def test_plan_creates_patches_or_does_nothing():
    reading = FakeReading(interfaces=[Interface(name="eth0", mtu=1500)])
    first = publish.plan(None, reading, T0)
    assert first.create and first.spec is not None and first.conditions is not None
    assert first.summary == {"rdmaServed": 0, "failedLinks": 0, "notRead": ""}
    stored = {"spec": first.spec.wire(), "status": {"conditions": first.conditions, **first.summary}}
    again = publish.plan(stored, reading, T1)
    assert not again.writes
    changed = publish.plan(stored, FakeReading(interfaces=[Interface(name="eth0", mtu=9000)]), T1)
    assert changed.spec is not None and changed.conditions is None and not changed.create
    garbage = publish.plan({"spec": {"interfaces": "nonsense"}, "status": {}}, reading, T1)
    assert garbage.spec is not None, "a spec that does not parse is rewritten whole"


# --- rdmaServed counts what the device plugin serves -------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_served_count_is_what_the_device_plugin_builds_its_families_from(tmp_path, scenario):
    # The count lives below the device plugin (the agent may not import it); the plugin's own family
    # builders are the reference, on every fixture host (VFs, top-level VFs, soft RDMA, platform NICs).
    SCENARIOS[scenario](tmp_path)
    spec = inventory.read(HostRoot.at(tmp_path)).spec()
    expected = len(whole_function_endpoints(spec)) + len(partition_endpoints(spec))
    assert summary.served_endpoints(spec) == expected
    assert publish.summaries(spec, [])["rdmaServed"] == expected


def test_the_served_count_leaves_out_efa_and_counts_a_bond_once():
    efa = Interface(name="efa0", pci_bus_id="0000:10:1c.0", rdma_device="rdmap16s28", pci_vendor="1d0f")
    bond_a = Interface(name="ens1f0", pci_bus_id="0000:19:00.0", rdma_device="mlx5_bond_0")
    bond_b = Interface(name="ens1f1", pci_bus_id="0000:19:00.1", rdma_device="mlx5_bond_0")
    spec = DevicesSpec(interfaces=[efa, bond_a, bond_b])
    assert summary.served_endpoints(spec) == 1 == len(whole_function_endpoints(spec))
