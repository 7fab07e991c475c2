"""The resource manager: which endpoints each family serves, token ids, health and NUMA hints."""

from __future__ import annotations

import re

import pytest
from dp_helpers import nic, two_nics_and_vfs, vf

from nodefabric_devicemanager.models import DevicesSpec, Interface, LinkState
from nodefabric_deviceplugin.resources import (
    MAX_ID_LENGTH,
    Family,
    PluginConfig,
    partition_endpoints,
    token_stem,
    view,
    whole_function_endpoints,
)


def ids(spec: DevicesSpec | None, family: Family, shared_count: int = 64) -> list[str]:
    return [t.id for t in view(spec, family, shared_count).tokens]


def test_exclusive_serves_whole_functions_with_a_bound_device_keyed_on_pci_bus_id() -> None:
    assert ids(two_nics_and_vfs(), Family.EXCLUSIVE) == ["0000:19:00.0", "0000:5e:00.0"]


def test_shared_serves_n_tokens_per_whole_function_endpoint() -> None:
    shared = ids(two_nics_and_vfs(), Family.SHARED)
    assert len(shared) == 128 and len(set(shared)) == 128
    assert shared[:2] == ["0000:19:00.0-0", "0000:19:00.0-1"]
    assert shared[64] == "0000:5e:00.0-0"
    assert len(ids(two_nics_and_vfs(), Family.SHARED, shared_count=3)) == 6


def test_a_pf_with_vfs_configured_serves_only_partitions() -> None:
    spec = two_nics_and_vfs()
    assert "0000:86:00.0" not in ids(spec, Family.EXCLUSIVE)
    assert not any(i.startswith("0000:86:") for i in ids(spec, Family.SHARED))
    assert ids(spec, Family.PARTITIONED) == ["0000:86:00.1", "0000:86:00.2"]
    # The VF with no netdev still resolves back to its endpoint.
    token = view(spec, Family.PARTITIONED).by_id["0000:86:00.2"]
    assert (token.endpoint.rdma_device, token.endpoint.netdevs) == ("mlx5_4", ())


@pytest.mark.parametrize(
    ("sriov_pf", "num_vfs", "whole"),
    [
        (True, 2, False),  # a PF with VFs configured: partitioned only
        (True, 0, True),  # SR-IOV capable, no VFs configured: served whole
        (False, 2, True),  # a count without the PF fact (a record the other fact contradicts): whole
    ],
)
def test_both_facts_decide_the_mode(sriov_pf: bool, num_vfs: int, whole: bool) -> None:
    pf = nic("ens3f0", "0000:86:00.0", "mlx5_2", vfs=[vf("0000:86:00.1", "mlx5_3")], num_vfs=num_vfs)
    pf.sriov = sriov_pf
    spec = DevicesSpec(interfaces=[pf])
    assert (ids(spec, Family.EXCLUSIVE) == ["0000:86:00.0"]) is whole
    assert (ids(spec, Family.PARTITIONED) == ["0000:86:00.1"]) is not whole


def test_an_endpoint_without_a_device_name_is_in_no_family() -> None:
    # What an unreadable RDMA tree produces: unverified, rdma false, no device name.
    spec = DevicesSpec(interfaces=[nic("ens1f0", "0000:19:00.0", "", link=LinkState.UNVERIFIED)])
    for family in Family:
        assert ids(spec, family) == []


def test_no_record_and_no_rdma_give_zero_devices() -> None:
    assert ids(None, Family.EXCLUSIVE) == []
    assert ids(DevicesSpec(), Family.PARTITIONED) == []


@pytest.mark.parametrize(
    ("state", "healthy"),
    [(LinkState.OK, True), (LinkState.UNVERIFIED, True), (None, True), (LinkState.FAILED, False)],
)
def test_health_follows_the_link_verdict(state: LinkState | None, healthy: bool) -> None:
    spec = DevicesSpec(interfaces=[nic("ens1f0", "0000:19:00.0", "mlx5_0", link=state)])
    for family in (Family.EXCLUSIVE, Family.SHARED):
        tokens = view(spec, family).tokens
        assert tokens, "a failed endpoint keeps its tokens"
        assert {t.endpoint.healthy for t in tokens} == {healthy}


def test_vf_health_is_its_own() -> None:
    pf = nic("p", "0000:86:00.0", "mlx5_2", vfs=[vf("0000:86:00.1", "mlx5_3", link=LinkState.FAILED)])
    (token,) = view(DevicesSpec(interfaces=[pf]), Family.PARTITIONED).tokens
    assert not token.endpoint.healthy
    assert token.endpoint.reason == "test"


@pytest.mark.parametrize(
    ("own", "parent", "expected"),
    [
        ("3", "1", 3),
        ("", "1", 1),
        ("", "", None),
        ("-1", "", None),
        ("0", "", 0),
        # Not node ids, by the operator's parser (numbers.numa_node): unknown, so the parent's counts.
        ("²", "1", 1),
        ("\u0661", "", None),
        ("01", "", None),
        ("1" * 23, "2", 2),
        ("1024", "", None),
    ],
)
def test_vf_numa_falls_back_to_parent_and_no_hint_when_unknown(
    own: str, parent: str, expected: int | None
) -> None:
    pf = nic("p", "0000:86:00.0", "mlx5_2", numa=parent, vfs=[vf("0000:86:00.1", "mlx5_3", numa=own)])
    (ep,) = partition_endpoints(DevicesSpec(interfaces=[pf]))
    assert ep.numa == expected


def test_whole_function_numa_has_no_parent_to_fall_back_to() -> None:
    (ep,) = whole_function_endpoints(DevicesSpec(interfaces=[nic("e", "0000:19:00.0", "mlx5_0")]))
    assert ep.numa is None


def test_ids_are_stable_whatever_the_record_order() -> None:
    spec = two_nics_and_vfs()
    shuffled = DevicesSpec(interfaces=list(reversed(spec.interfaces)))
    for family in Family:
        assert ids(spec, family) == ids(shuffled, family)


def test_pci_order_is_numeric_not_textual() -> None:
    spec = DevicesSpec(
        interfaces=[
            nic("a", "0000:5e:00.0", "mlx5_0"),
            nic("b", "0000:19:00.0", "mlx5_1"),
            nic("c", "", "rxe0"),
        ]
    )
    assert ids(spec, Family.EXCLUSIVE) == ["0000:19:00.0", "0000:5e:00.0", "rdma-rxe0"]


def test_a_non_pci_endpoint_is_keyed_on_its_device_name_within_63_characters() -> None:
    long_a, long_b = "roce" + "a" * 60, "roce" + "a" * 59 + "b"
    spec = DevicesSpec(interfaces=[nic("x", "", long_a), nic("y", "", long_b)])
    for family in Family.EXCLUSIVE, Family.SHARED:
        tokens = ids(spec, family, shared_count=100_000)
        assert max(len(i) for i in tokens) <= MAX_ID_LENGTH
        assert len(set(tokens)) == len(tokens)
    assert ids(spec, Family.EXCLUSIVE) == ids(spec, Family.EXCLUSIVE)


def test_two_netdevs_on_one_rdma_device_are_one_endpoint() -> None:
    # A RoCE LAG: bond0 (no PCI) and its first port both name mlx5_bond_0.
    spec = DevicesSpec(
        interfaces=[
            nic("bond0", "", "mlx5_bond_0", numa="0"),
            nic("ens1f0", "0000:19:00.0", "mlx5_bond_0", numa="0", link=LinkState.FAILED),
        ]
    )
    (token,) = view(spec, Family.EXCLUSIVE).tokens
    assert token.id == "0000:19:00.0"
    assert token.endpoint.netdevs == ("bond0", "ens1f0")
    assert token.endpoint.healthy  # usable while any member is


def test_two_devices_on_one_function_get_distinct_ids() -> None:
    spec = DevicesSpec(interfaces=[nic("a", "0000:19:00.0", "mlx5_0"), nic("b", "0000:19:00.0", "mlx5_1")])
    assert sorted(ids(spec, Family.EXCLUSIVE)) == ["rdma-0000:19:00.0-mlx5_0", "rdma-0000:19:00.0-mlx5_1"]


def test_config_families_and_names() -> None:
    assert PluginConfig().families() == [Family.EXCLUSIVE, Family.SHARED, Family.PARTITIONED]
    assert PluginConfig(shared=False, partitioned=False).families() == [Family.EXCLUSIVE]
    assert PluginConfig(domain="example.com").resource_name(Family.SHARED) == "device.example.com/rdma.shared"
    with pytest.raises(ValueError, match="--shared-count must be at least 1"):
        PluginConfig(shared_count=0)
    with pytest.raises(ValueError, match="domain"):
        PluginConfig(domain="Not A Domain")


def test_a_top_level_vf_is_never_whole() -> None:
    top_vf = Interface(
        pci_bus_id="0000:86:00.2", rdma=True, rdma_device="mlx5_4", physical_function="0000:86:00.0"
    )
    spec = DevicesSpec(interfaces=[nic("e", "0000:19:00.0", "mlx5_0"), top_vf])
    assert ids(spec, Family.EXCLUSIVE) == ["0000:19:00.0"]
    assert ids(spec, Family.SHARED, 1) == ["0000:19:00.0-0"]
    assert ids(spec, Family.PARTITIONED) == ["0000:86:00.2"]


@pytest.mark.parametrize(
    ("device", "stem"),
    [
        ("hns_0", "rdma-hns_0"),
        ("rxe0", "rdma-rxe0"),
        ("siw_eth0", "rdma-siw_eth0"),
        ("mlx5_bond_0", "rdma-mlx5_bond_0"),
    ],
)
def test_an_endpoint_off_the_pci_bus_is_keyed_on_its_rdma_device(device: str, stem: str) -> None:
    assert token_stem("", device) == stem


@pytest.mark.parametrize("device", ["rxe 0", "rxe/0", "rxé0", "a" * 70, "\udcff"])
def test_an_odd_device_name_gets_a_valid_distinct_id(device: str) -> None:
    stem = token_stem("", device)
    assert len(stem) <= 56 and re.fullmatch(r"[A-Za-z0-9_.:-]+", stem)
    assert stem != token_stem("", device + "x")
    assert stem == token_stem("", device)


def test_efa_is_advertised_under_none_of_the_keys() -> None:
    # AWS's EFA device plugin serves vpc.amazonaws.com/efa; the same adapter must not be handed out twice.
    efa = nic("efa0", "0000:10:1c.0", "rdmap16s28", numa="0").model_copy(update={"pci_vendor": "1d0f"})
    efa_vf = vf("0000:10:1d.1", "rdmap16s29").model_copy(update={"pci_vendor": "1d0f"})
    pf = nic("ens5", "0000:10:1d.0", "", vfs=[efa_vf]).model_copy(update={"pci_vendor": "1d0f"})
    mellanox = nic("ens1f0", "0000:19:00.0", "mlx5_0", numa="0").model_copy(update={"pci_vendor": "15b3"})
    spec = DevicesSpec(interfaces=[efa, pf, mellanox])
    for family in Family:
        devices = [t.endpoint.rdma_device for t in view(spec, family, shared_count=2).tokens]
        assert not [d for d in devices if d.startswith("rdmap")], family
    assert [t.id for t in view(spec, Family.EXCLUSIVE).tokens] == ["0000:19:00.0"]
