"""The pool and its ResourceSlices as pure functions of the record (and the link layers read beside it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from dra_helpers import NODE, SPLIT_PF, gpu_pcie_roots, read, refusals

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import NoAscend
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.models import DevicesSpec, Interface, LinkState, LinkVerdict, VirtualFunction
from nodefabric_devicemanager.testing import scenarios
from nodefabric_devicemanager.testing.accelerators import HGX_GPUS, nvswitch_node
from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.devices import Role, device_name, pool_devices, published
from nodefabric_deviceplugin.dra.linklayer import link_layer, link_layers
from nodefabric_deviceplugin.dra.slices import (
    MAX_DEVICES_PER_SLICE,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    DesiredSlice,
    LiveSlice,
    canonical,
    content,
    desired_slices,
    live_slice,
    plan,
    resource_slice,
    slice_name,
)
from nodefabric_deviceplugin.resources import RdmaEndpoint

CONFIG = DriverConfig(node_name=NODE)


def devices_of(spec: DevicesSpec, layers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """device name -> attributes, across every desired slice."""
    desired = desired_slices(spec, CONFIG, layers or {}) or []
    return {d["name"]: d["attributes"] for s in desired for d in s.spec["devices"]}


def value(attrs: dict[str, Any], name: str) -> Any:
    return next(iter(attrs[name].values())) if name in attrs else None


# --- attributes on the fixture hosts ----------------------------------------------------------------------


def test_a_gpu_and_the_nic_under_its_switch_share_pcie_root(hgx_spec: DevicesSpec) -> None:
    devices = devices_of(hgx_spec)
    gpus = gpu_pcie_roots(hgx_spec)
    by_rdma = {value(a, "rdmaDevice"): a for a in devices.values()}
    for i, gpu in enumerate(HGX_GPUS[:7]):  # GPU i and mlx5_i hang from one PCIe switch
        nic = by_rdma[f"mlx5_{i}"]
        assert value(nic, PCIE_ROOT) == gpus[gpu], (gpu, nic)
        # ...and no other GPU's root: a matchAttribute constraint picks exactly this pair.
        assert [g for g, root in gpus.items() if root == value(nic, PCIE_ROOT)] == [gpu]
        assert value(nic, "acceleratorDistance") == "PIX"
    # The standard values have the standard's exact form.
    nic0 = by_rdma["mlx5_0"]
    assert value(nic0, PCIE_ROOT) == "pci0000:18"
    assert value(nic0, PCI_BUS_ID) == "0000:1c:00.0"
    assert nic0[NUMA_NODE] == {"int": 0}


def test_every_attribute_is_one_the_api_server_accepts(hgx_spec: DevicesSpec) -> None:
    desired = desired_slices(hgx_spec, CONFIG, {"mlx5_0": "InfiniBand"}) or []
    assert len(desired) == 1
    obj = resource_slice(desired[0], 1, {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u"})
    assert refusals(obj) == []
    kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_our_attributes_describe_the_endpoint(
    hgx_spec: DevicesSpec, hgx_host: tuple[SysfsBuilder, Libraries]
) -> None:
    b, _ = hgx_host
    layers = link_layers(b.host, ["mlx5_0", "mlx5_8"])
    devices = devices_of(hgx_spec, layers)
    nic = devices["pci-0000-1c-00-0"]
    assert {k: value(nic, k) for k in nic if "/" not in k} == {
        "acceleratorDistance": "PIX",
        "functionType": "pf",
        "interfaceName": "ibp28s0",
        "linkLayer": "Ethernet",
        "linkState": "ok",
        "pciDevice": "1021",
        "pciVendor": "15b3",
        "rdmaDevice": "mlx5_0",
    }
    vf = devices["pci-0000-e0-00-1"]
    assert value(vf, "functionType") == "vf"
    assert value(vf, "physicalFunction") == SPLIT_PF
    assert value(vf, "rdmaDevice") == "mlx5_8"
    assert value(vf, "pciDevice") == "101e"
    assert "interfaceName" not in vf  # the VF has no netdev of its own
    # The VFs of NIC 7 sit under GPU 7's PCIe switch, like their PF.
    assert value(vf, PCIE_ROOT) == gpu_pcie_roots(hgx_spec)[HGX_GPUS[7]] == "pci0000:dc"


def test_a_pf_split_into_vfs_is_offered_only_as_its_vfs(hgx_spec: DevicesSpec) -> None:
    names = set(devices_of(hgx_spec))
    assert "pci-0000-e0-00-0" not in names
    assert {"pci-0000-e0-00-1", "pci-0000-e0-00-2", "pci-0000-e0-00-3", "pci-0000-e0-00-4"} <= names
    assert len(names) == 7 + 4


def test_the_fabric_domain_is_the_nodes(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "nvl")
    nvml = nvswitch_node(
        b, cluster_uuid=bytes.fromhex("5b0e112233445566778899aabbccddef"), clique_id=3, state=3
    )
    spec = read(b, Libraries(nvidia=Nvml(nvml), ascend=NoAscend()))
    domains = {value(a, "fabricDomain") for a in devices_of(spec).values()}
    assert domains == {"nvlink-5b0e112233445566778899aabbccddef-3"}


def test_unknown_numa_node_is_absent_never_zero_or_minus_one(tmp_path: Path) -> None:
    spec = read(scenarios.numa_unknown(tmp_path / "h"))
    (attrs,) = devices_of(spec).values()
    assert NUMA_NODE not in attrs
    assert "acceleratorDistance" not in attrs  # no accelerator on this node: no pair to measure


def test_a_vf_without_its_own_numa_node_has_its_pfs() -> None:
    pf = Interface(
        name="ens1",
        pci_bus_id="0000:3b:00.0",
        pci_host_bridge="pci0000:3a",
        numa_affinity="1",
        rdma=True,
        rdma_device="mlx5_0",
        sriov=True,
        sriov_num_vfs=1,
        virtual_functions=[VirtualFunction(pci_bus_id="0000:3b:00.1", rdma=True, rdma_device="mlx5_1")],
    )
    (attrs,) = devices_of(DevicesSpec(interfaces=[pf])).values()
    assert attrs[NUMA_NODE] == {"int": 1}
    assert value(attrs, "physicalFunction") == "0000:3b:00.0"


def test_a_vf_listed_at_top_level_is_still_a_vf() -> None:
    vf = Interface(
        name="",
        pci_bus_id="0000:5e:00.1",
        rdma=True,
        rdma_device="mlx5_0",
        physical_function="0000:5e:00.0",
        link=LinkVerdict(state=LinkState.UNVERIFIED),
    )
    (dev,) = pool_devices(DevicesSpec(interfaces=[vf]))
    assert dev.role is Role.VF and dev.parent == "0000:5e:00.0"
    (attrs,) = devices_of(DevicesSpec(interfaces=[vf])).values()
    assert value(attrs, "linkState") == "unverified"  # unverified stays in the pool


def test_a_failed_link_leaves_the_pool(tmp_path: Path) -> None:
    spec = read(scenarios.down_beside_working(tmp_path / "h"))
    everything = pool_devices(spec)
    assert {d.endpoint.rdma_device: d.allocatable for d in everything} == {"mlx5_0": False, "mlx5_1": True}
    assert [value(a, "rdmaDevice") for a in devices_of(spec).values()] == ["mlx5_1"]
    assert [d.endpoint.rdma_device for d in published(everything)] == ["mlx5_1"]


def test_no_allocatable_endpoint_is_no_slice_and_no_record_is_nothing_to_say(tmp_path: Path) -> None:
    spec = read(scenarios.active_defer(tmp_path / "h"))
    assert desired_slices(spec, CONFIG, {}) == []
    assert desired_slices(None, CONFIG, {}) is None  # not read yet is not empty


def test_endpoints_without_an_rdma_device_or_of_efa_are_not_devices(tmp_path: Path) -> None:
    spec = read(scenarios.virtual_interfaces(tmp_path / "h"))
    assert devices_of(spec) == {}
    efa = Interface(
        name="efa0", pci_bus_id="0000:10:00.0", pci_vendor="1d0f", rdma=True, rdma_device="rdmap16s0"
    )
    assert devices_of(DevicesSpec(interfaces=[efa])) == {}


# --- names ------------------------------------------------------------------------------------------------


def _ep(key: str) -> RdmaEndpoint:
    return RdmaEndpoint(key, "mlx5_0", (), "", (), "", None, True, "")


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("0000:19:00.0", "pci-0000-19-00-0"),
        ("rdma-rxe0", "rdma-rxe0"),
    ],
)
def test_device_names_are_stable_dns_labels(key: str, name: str) -> None:
    assert device_name(_ep(key)) == name


def test_names_that_had_to_change_carry_a_digest_and_never_collide() -> None:
    a, b = device_name(_ep("rdma-mlx5_0")), device_name(_ep("rdma-mlx5-0"))
    assert a != b and a.startswith("rdma-mlx5-0-")
    long = device_name(_ep("rdma-" + "x" * 80))
    assert len(long) <= 63 and long[-1].isalnum()
    assert device_name(_ep("rdma-" + "x" * 80)) == long  # stable
    assert device_name(_ep("rdma-ROCE_Dev")).islower()


def test_slice_names_fit_and_stay_unique_for_the_longest_node_name() -> None:
    config = DriverConfig(node_name=("n" * 62 + ".") * 3 + "n" * 60)
    names = {slice_name(config, i) for i in range(3)}
    assert len(names) == 3 and all(len(n) <= 253 for n in names)


# --- many devices, long values ------------------------------------------------------------------------


def many_vfs(count: int) -> DevicesSpec:
    vfs = [
        VirtualFunction(
            pci_bus_id=f"0000:3b:{(i + 1) // 8:02x}.{(i + 1) % 8}", rdma=True, rdma_device=f"mlx5_{i + 1}"
        )
        for i in range(count)
    ]
    pf = Interface(
        name="ens1",
        pci_bus_id="0000:3b:00.0",
        rdma=True,
        rdma_device="mlx5_0",
        sriov=True,
        sriov_num_vfs=count,
        virtual_functions=vfs,
    )
    return DevicesSpec(interfaces=[pf])


def test_a_pool_over_128_devices_is_split_over_slices_of_one_pool() -> None:
    desired = desired_slices(many_vfs(300), CONFIG, {}) or []
    assert [len(s.spec["devices"]) for s in desired] == [128, 128, 44]
    assert {s.spec["pool"]["resourceSliceCount"] for s in desired} == {3}
    assert len({s.name for s in desired}) == 3
    names = [d["name"] for s in desired for d in s.spec["devices"]]
    assert len(set(names)) == 300
    for s in desired:
        assert refusals(resource_slice(s, 1)) == []
    assert MAX_DEVICES_PER_SLICE == 128


def test_a_value_longer_than_the_api_allows_is_left_out_not_cut() -> None:
    # Two netdevs on one RDMA device (an IPoIB child and its parent), names at the kernel's 15 characters.
    iface = Interface(name="a" * 15, pci_bus_id="0000:19:00.0", rdma=True, rdma_device="mlx5_0")
    others = [iface.model_copy(update={"name": c * 15}) for c in "bcde"]
    (attrs,) = devices_of(DevicesSpec(interfaces=[iface, *others])).values()
    assert "interfaceName" not in attrs  # 5 x 15 + 4 commas = 79 > 64
    two = devices_of(DevicesSpec(interfaces=[iface, others[0]]))
    assert value(next(iter(two.values())), "interfaceName") == "a" * 15 + "," + "b" * 15
    # The limit is in bytes, as the API server counts: five names of five 3-byte characters are 29
    # characters but 79 bytes.
    wide = [iface.model_copy(update={"name": c * 5}) for c in "€₤₹₩₪"]
    (attrs,) = devices_of(DevicesSpec(interfaces=wide)).values()
    assert "interfaceName" not in attrs


# --- link layers from the host -----------------------------------------------------------------------------


def test_link_layers_are_read_from_every_port_and_only_a_single_known_one_counts(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "h")
    b.nic(
        "0000:17:00.0", "ib0", host_bridge="pci0000:16", rdma="mlx5_0", ports=[Port(link_layer="InfiniBand")]
    )
    b.nic(
        "0000:18:00.0",
        "e1",
        host_bridge="pci0000:16",
        rdma="mlx5_1",
        ports=[Port(link_layer="InfiniBand"), Port(link_layer="Ethernet")],
    )
    b.nic("0000:19:00.0", "e2", host_bridge="pci0000:16", rdma="mlx5_2", ports=[Port(link_layer="Unknown")])
    b.nic("0000:1a:00.0", "e3", host_bridge="pci0000:16", rdma="mlx5_3")
    b.write(b.functions["0000:1a:00.0"] / "infiniband" / "mlx5_3" / "ports" / "1" / "link_layer", b"\xff\xfe")
    assert link_layers(b.host, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_9", "../x"]) == {
        "mlx5_0": "InfiniBand"
    }
    assert link_layer(b.host, "") is None


# --- from the live slices to the desired ones ---------------------------------------------------------


def desired_pair() -> list[DesiredSlice]:
    return desired_slices(many_vfs(130), CONFIG, {}) or []


def live_from(desired: list[DesiredSlice], generation: int) -> list[LiveSlice]:
    out = []
    for i, d in enumerate(desired):
        obj = resource_slice(d, generation)
        obj["metadata"]["resourceVersion"] = str(10 + i)
        # What the API server hands back may carry fields it added: they are not ours to compare.
        for dev in obj["spec"]["devices"]:
            dev["allowMultipleAllocations"] = False
        live = live_slice(obj)
        assert live is not None
        out.append(live)
    return out


def test_nothing_is_written_when_the_live_slices_say_what_the_record_says() -> None:
    desired = desired_pair()
    decided = plan(desired, live_from(desired, 4))
    assert decided.writes == 0 and decided.generation == 4


def test_a_change_rewrites_the_pool_at_the_next_generation() -> None:
    desired = desired_pair()
    live = live_from(desired, 4)
    changed = desired_slices(many_vfs(129), CONFIG, {}) or []
    decided = plan(changed, live)
    assert decided.generation == 5
    assert [(d.name, rv) for d, rv in decided.update] == [(s.name, s.resource_version) for s in live]
    assert decided.create == () and decided.delete == ()


def test_slices_no_longer_needed_are_deleted_after_the_new_generation_is_written() -> None:
    live = live_from(desired_pair(), 2)
    fewer = desired_slices(many_vfs(3), CONFIG, {}) or []
    decided = plan(fewer, live)
    assert decided.generation == 3
    assert [d.name for d, _ in decided.update] == [fewer[0].name]
    assert decided.delete == ((live[1].name, live[1].resource_version),)
    # A node that lost every endpoint deletes its whole pool.
    gone = plan([], live)
    assert gone.delete and not gone.create and not gone.update


def test_mixed_generations_or_garbage_in_a_live_slice_are_rewritten() -> None:
    desired = desired_pair()
    live = live_from(desired, 2)
    mixed = [live[0], LiveSlice(live[1].name, live[1].resource_version, 1, live[1].content)]
    assert plan(desired, mixed).generation == 3
    broken = [live[0], LiveSlice(live[1].name, "9", 2, content({"pool": "nonsense", "devices": 7}))]
    assert plan(desired, broken).writes == 2
    assert canonical("garbage") is None and content("garbage") is None
    assert live_slice({"metadata": "x"}) is None
    assert live_slice({"metadata": {"name": "s"}, "spec": {"pool": {"generation": True}}}).generation == 0  # type: ignore[union-attr]


def test_first_publication_creates_every_slice_at_generation_one() -> None:
    desired = desired_pair()
    decided = plan(desired, [])
    assert decided.generation == 1 and [d.name for d in decided.create] == [d.name for d in desired]


# --- beside the device plugin -----------------------------------------------------------------------------


def test_beside_the_device_plugin_every_endpoint_is_offered_exactly_once(hgx_spec: DevicesSpec) -> None:
    from nodefabric_deviceplugin.dra.devices import device_plugin_share
    from nodefabric_deviceplugin.resources import Family, view

    config = DriverConfig(node_name=NODE, functions=("pf",))
    dra = {
        value(d["attributes"], "rdmaDevice")
        for s in desired_slices(hgx_spec, config, {}) or []
        for d in s.spec["devices"]
    }
    share = device_plugin_share(hgx_spec)
    plugin = {
        family: {t.endpoint.rdma_device for t in view(share, family, 2).tokens}
        for family in (Family.EXCLUSIVE, Family.SHARED, Family.PARTITIONED)
    }
    assert dra == {f"mlx5_{i}" for i in range(7)}
    assert plugin == {
        Family.EXCLUSIVE: set(),
        Family.SHARED: set(),
        Family.PARTITIONED: {"mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"},
    }
    everything = {d.endpoint.rdma_device for d in pool_devices(hgx_spec)}
    assert dra | plugin[Family.PARTITIONED] == everything and not dra & plugin[Family.PARTITIONED]
    assert device_plugin_share(None) is None


def test_only_known_function_types_can_be_offered() -> None:
    with pytest.raises(ValueError, match="function types"):
        DriverConfig(node_name=NODE, functions=())
    with pytest.raises(ValueError, match="function types"):
        DriverConfig(node_name=NODE, functions=("pf", "sf"))
