"""GetPreferredAllocation: distinct endpoints first, then the closest set, then the lowest ids."""

from __future__ import annotations

from dp_helpers import nic, thousand_vfs, vf

from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.preferred import preferred
from nodefabric_deviceplugin.resources import Family, FamilyView, view

SWITCH_A = ("0000:18:08.0", "0000:17:00.0", "0000:16:01.0")
SWITCH_A2 = ("0000:18:10.0", "0000:17:00.0", "0000:16:01.0")
SWITCH_B = ("0000:5d:08.0", "0000:5c:00.0", "0000:5b:01.0")


def topology() -> DevicesSpec:
    """mlx5_0 alone on NUMA 0; mlx5_1 and mlx5_2 behind one switch on NUMA 1; mlx5_3 on NUMA 1 elsewhere."""
    return DevicesSpec(
        interfaces=[
            nic("a", "0000:03:00.0", "mlx5_0", numa="0", host_bridge="pci0000:00"),
            nic("b", "0000:19:00.0", "mlx5_1", numa="1", switches=SWITCH_A, host_bridge="pci0000:16"),
            nic("c", "0000:1a:00.0", "mlx5_2", numa="1", switches=SWITCH_A2, host_bridge="pci0000:16"),
            nic("d", "0000:5e:00.0", "mlx5_3", numa="1", switches=SWITCH_B, host_bridge="pci0000:5b"),
        ]
    )


def all_ids(v: FamilyView) -> list[str]:
    return [t.id for t in v.tokens]


def test_picks_the_pair_behind_one_switch() -> None:
    v = view(topology(), Family.EXCLUSIVE)
    assert preferred(v, all_ids(v), [], 2) == ["0000:19:00.0", "0000:1a:00.0"]


def test_same_numa_node_beats_a_cross_socket_set() -> None:
    v = view(topology(), Family.EXCLUSIVE)
    assert preferred(v, all_ids(v), [], 3) == ["0000:19:00.0", "0000:1a:00.0", "0000:5e:00.0"]


def test_lowest_ids_break_ties() -> None:
    v = view(topology(), Family.EXCLUSIVE)
    assert preferred(v, all_ids(v), [], 1) == ["0000:03:00.0"]
    assert preferred(v, all_ids(v), [], 4) == all_ids(v)


def test_must_include_is_kept_and_the_rest_joins_it_closely() -> None:
    v = view(topology(), Family.EXCLUSIVE)
    # mlx5_3 is required: its NUMA-1 neighbours are closer to it than mlx5_0 is.
    assert preferred(v, all_ids(v), ["0000:5e:00.0"], 2) == ["0000:5e:00.0", "0000:19:00.0"]
    assert preferred(v, all_ids(v), ["0000:5e:00.0", "0000:03:00.0"], 3)[:2] == [
        "0000:5e:00.0",
        "0000:03:00.0",
    ]
    assert preferred(v, all_ids(v), ["0000:19:00.0"], 2) == ["0000:19:00.0", "0000:1a:00.0"]


def test_shared_spreads_over_distinct_endpoints_before_doubling_up() -> None:
    v = view(topology(), Family.SHARED, shared_count=3)
    chosen = preferred(v, all_ids(v), [], 6)
    endpoints = [v.by_id[i].endpoint.rdma_device for i in chosen]
    assert sorted(set(endpoints)) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert len(chosen) == len(set(chosen)) == 6
    # The two extra tokens land on two different adapters, not both on one.
    assert max(endpoints.count(e) for e in set(endpoints)) == 2


def test_shared_with_one_endpoint_left_takes_its_tokens() -> None:
    v = view(topology(), Family.SHARED, shared_count=3)
    available = [i for i in all_ids(v) if i.startswith("0000:19:00.0")]
    assert preferred(v, available, [], 2) == ["0000:19:00.0-0", "0000:19:00.0-1"]


def test_shared_must_include_token_of_one_endpoint_prefers_another_endpoint_next() -> None:
    v = view(topology(), Family.SHARED, shared_count=3)
    chosen = preferred(v, all_ids(v), ["0000:19:00.0-2"], 2)
    assert chosen == ["0000:19:00.0-2", "0000:1a:00.0-0"]


def test_ids_unknown_to_the_family_are_never_preferred() -> None:
    v = view(topology(), Family.EXCLUSIVE)
    assert preferred(v, ["gone", "0000:5e:00.0"], [], 2) == ["0000:5e:00.0"]


def test_partitioned_vfs_of_one_pf_go_together() -> None:
    spec = DevicesSpec(
        interfaces=[
            nic("p0", "0000:19:00.0", "mlx5_0", numa="0", switches=SWITCH_A, host_bridge="pci0000:16",
                vfs=[vf("0000:19:00.1", "mlx5_10"), vf("0000:19:00.2", "mlx5_11")]),
            nic("p1", "0000:5e:00.0", "mlx5_1", numa="1", switches=SWITCH_B, host_bridge="pci0000:5b",
                vfs=[vf("0000:5e:00.1", "mlx5_12"), vf("0000:5e:00.2", "mlx5_13")]),
        ]
    )  # fmt: skip
    for one in spec.interfaces:
        for f in one.virtual_functions:
            f.pci_switches, f.pci_host_bridge = one.pci_switches, one.pci_host_bridge
    v = view(spec, Family.PARTITIONED)
    assert preferred(v, ["0000:19:00.1", "0000:5e:00.1", "0000:5e:00.2"], [], 2) == [
        "0000:5e:00.1",
        "0000:5e:00.2",
    ]


def many_vfs(per_pf: int) -> DevicesSpec:
    """Two PFs on different sockets, each with `per_pf` VFs sharing its bridge path."""
    interfaces = []
    for n, (bus, switches, node) in enumerate((("19", SWITCH_A, "0"), ("5e", SWITCH_B, "1"))):
        vfs = [
            vf(f"0000:{bus}:{i // 8:02x}.{i % 8}", f"mlx5_{100 * (n + 1) + i}") for i in range(1, per_pf + 1)
        ]
        for f in vfs:
            f.pci_switches, f.pci_host_bridge, f.numa_affinity = list(switches), f"pci0000:{bus}", node
        interfaces.append(
            nic(f"p{bus}", f"0000:{bus}:00.0", f"mlx5_{n}", numa=node, switches=switches, vfs=vfs)
        )
    return DevicesSpec(interfaces=interfaces)


def test_a_large_vf_pool_stays_on_one_pf_while_it_can() -> None:
    v = view(many_vfs(20), Family.PARTITIONED)
    available = all_ids(v)[5:]  # the first PF has 15 free, the second 20
    chosen = preferred(v, available, [], 4)
    assert chosen == ["0000:19:00.6", "0000:19:00.7", "0000:19:01.0", "0000:19:01.1"]
    chosen = preferred(v, available, [], 18)
    assert {i[:7] for i in chosen} == {"0000:5e"}
    chosen = preferred(v, available, [], 25)
    assert sum(i.startswith("0000:5e") for i in chosen) == 20


def test_a_large_vf_pool_joins_a_must_include_on_its_pf() -> None:
    v = view(many_vfs(20), Family.PARTITIONED)
    chosen = preferred(v, all_ids(v), ["0000:5e:02.0"], 3)
    assert chosen == ["0000:5e:02.0", "0000:5e:00.1", "0000:5e:00.2"]


def test_a_huge_request_over_a_thousand_vfs_stays_on_one_numa_node() -> None:
    v = view(thousand_vfs(), Family.PARTITIONED)
    ids = all_ids(v)
    chosen = preferred(v, ids, [], 512)
    assert len(chosen) == len(set(chosen)) == 512
    assert {v.by_id[i].endpoint.numa for i in chosen} == {0}
    # Among equals, the lowest ids: the first four PFs' VFs, in order.
    assert chosen == ids[:512]
    # Across the sockets only when one cannot hold them all.
    assert {v.by_id[i].endpoint.numa for i in preferred(v, ids, [], 600)} == {0, 1}


def test_a_must_include_on_node_1_draws_the_rest_to_node_1() -> None:
    v = view(thousand_vfs(), Family.PARTITIONED)
    ids = all_ids(v)
    chosen = preferred(v, ids, [ids[-1]], 8)
    assert chosen[0] == ids[-1] and {v.by_id[i].endpoint.numa for i in chosen} == {1}


def test_too_many_distinct_placements_fall_back_to_the_lowest_ids() -> None:
    # 80 NICs each behind its own switch: 80 placements, past CLASS_LIMIT.
    nics = [
        nic(
            f"e{i}",
            f"0000:{0x10 + i:02x}:00.0",
            f"mlx5_{i}",
            numa=str(i % 2),
            switches=(f"0000:{0x0F + i:02x}:01.0",),
        )
        for i in range(80)
    ]
    v = view(DevicesSpec(interfaces=nics), Family.EXCLUSIVE)
    assert preferred(v, all_ids(v), [], 4) == all_ids(v)[:4]
