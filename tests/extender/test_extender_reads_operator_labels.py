"""The labels the operator computes for real records are what the extender and the topology writer read.

Each host is laid out as a sysfs tree with recorded NVML answers (an NVLink clique member, or a single
HGX board), read by the agent's inventory into a Devices record, and reduced to node labels by the
operator's `labels.compute`. Those labels, and nothing spelt by hand here, are put on the Nodes the
extender places a group on and the fleet the topology check reads: renaming the fabric-domain key on
either side (or building it from another domain) breaks these tests.
"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from extender_fixtures import ZONE, explicit, extender, filter_, node, pod

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import NoAscend
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import Devices, ObjectMeta
from nodefabric_devicemanager.testing.accelerators import nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_operator import labels
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.topology import nesting
from nodefabric_operator.topology.levels import default_levels as topology_levels

CLUSTER_A = bytes.fromhex("5b0e112233445566778899aabbccdd01")
CLUSTER_B = bytes.fromhex("5b0e112233445566778899aabbccdd02")
# name -> (NVLink cluster uuid, clique id); None: a single HGX board, no multi-node fabric.
HOSTS: dict[str, tuple[bytes, int] | None] = {
    "nvl-a1": (CLUSTER_A, 1),
    "nvl-a2": (CLUSTER_A, 1),
    "nvl-b1": (CLUSTER_B, 1),
    "hgx-0": None,
}


def _record(root: Path, name: str, fabric: tuple[bytes, int] | None) -> Devices:
    """The Devices record the agent would publish for this host."""
    b = SysfsBuilder(root)
    if fabric is None:
        nvml = nvswitch_node(b)
    else:
        uuid, clique = fabric
        nvml = nvswitch_node(
            b, cluster_uuid=uuid, clique_id=clique, state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        )
    reading = inventory.read(HostRoot.at(root), libraries=Libraries(nvidia=Nvml(nvml), ascend=NoAscend()))
    assert reading.ok, reading.conditions
    return Devices(metadata=ObjectMeta(name=name), spec=reading.spec())


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Devices]:
    base = tmp_path_factory.mktemp("hosts")
    return {name: _record(base / name, name, fabric) for name, fabric in HOSTS.items()}


def _computed(records: dict[str, Devices], domain: str = labels.DEFAULT_DOMAIN) -> dict[str, labels.LabelSet]:
    return {name: labels.compute(rec, domain) for name, rec in records.items()}


def _nodes(computed: dict[str, labels.LabelSet]) -> list[dict[str, object]]:
    return [node(name, zone="z1", region="r1", labels=dict(ls.labels)) for name, ls in computed.items()]


def test_the_records_carry_two_fabric_domains_and_one_board_without(records: dict[str, Devices]) -> None:
    computed = _computed(records)
    domains = {name: ls.fabric_domain for name, ls in computed.items()}
    assert domains["nvl-a1"] and domains["nvl-a1"] == domains["nvl-a2"]
    assert domains["nvl-b1"] and domains["nvl-b1"] != domains["nvl-a1"]
    assert domains["hgx-0"] == ""
    # Published as a label, not only computed: what follows reads the label.
    assert all(ls.fabric_domain in ls.labels.values() for ls in computed.values() if ls.fabric_domain)


@pytest.mark.parametrize("domain", [labels.DEFAULT_DOMAIN, "example.com"])
def test_the_extenders_fabric_level_is_the_operators_fabric_domain(
    records: dict[str, Devices], domain: str
) -> None:
    computed = _computed(records, domain)
    config = ExtenderConfig(domain=domain)
    cache = Cache(config)
    cache.load_objects(_nodes(computed))
    fabric = config.level_names.index("fabric")
    got = {name: cache.view_of(cache.nodes[name]).locations[fabric] for name in computed}
    assert got == {name: ls.fabric_domain or None for name, ls in computed.items()}


def test_labels_of_another_domain_are_no_fabric_to_the_default_extender(records: dict[str, Devices]) -> None:
    """The connection is the key, not the value: the same records labelled under another domain give
    the default extender no fabric domain at all (what a renamed key on one side would do)."""
    cache = Cache(ExtenderConfig())
    cache.load_objects(_nodes(_computed(records, "example.com")))
    fabric = cache.config.level_names.index("fabric")
    assert {cache.view_of(n).locations[fabric] for n in cache.nodes.values()} == {None}


async def test_a_group_asking_for_one_fabric_domain_gets_the_nodes_the_operator_labelled_so(
    records: dict[str, Devices],
) -> None:
    """Two 8-GPU pods kept to one fabric domain: only the clique with two members can hold them."""
    nodes = _nodes(_computed(records))
    names = [n["metadata"]["name"] for n in nodes]  # type: ignore[index]
    meta = explicit("train", 2, locality="fabric")
    first = pod("train-0", gpus=8, **meta)
    async with extender(nodes) as client:
        answer = await filter_(client, first, names)
    assert sorted(answer["NodeNames"]) == ["nvl-a1", "nvl-a2"], answer


def test_the_topology_fabric_level_reads_the_operators_label(records: dict[str, Devices]) -> None:
    computed = _computed(records)
    fleet = {name: {**ls.labels, ZONE: "z1"} for name, ls in computed.items()}
    hierarchy = nesting.check(topology_levels(), fleet)
    fabric = next(lv for lv in hierarchy.levels if lv.name == "fabric")
    published = {k for ls in computed.values() for k, v in ls.labels.items() if v == ls.fabric_domain}
    assert fabric.projected and {fabric.key} == published
    # The tightest level reads that label first, whichever of its fallback keys a fleet also carries.
    assert topology_levels()[0].keys[0] == fabric.key
    assert (fabric.nodes, fabric.values) == (3, 2)
