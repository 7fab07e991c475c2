"""The label set rules, one case per rule of seed 004 ("The three node labels", "The RDMA link check",
"The scale-up fabric") and issue 5."""

from __future__ import annotations

import pytest
from operator_records import devices, gpu, group, nic, nvlink, ub, vf

from nodefabric_devicemanager import models, numbers
from nodefabric_devicemanager.models import LinkState
from nodefabric_operator import labels

P = "feature.gpustack.ai/"
CAPABLE, DISTANCE, NUMA = P + "rdma.capable", P + "rdma.distance", P + "rdma.numa"
DOMAIN, MEMBERS = P + "fabric.domain", P + "fabric.members"
OTHER_PORT = ["0000:18:10.0", "0000:17:00.0", "0000:16:01.0"]  # a sibling downstream port of the switch


def compute(**kw) -> dict[str, str]:
    return labels.compute(devices(**kw)).labels


# --- rdma.capable: usable endpoints ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("interfaces", "capable"),
    [
        pytest.param([nic()], True, id="one-ok-endpoint"),
        pytest.param(
            [nic("ens1f0", link=LinkState.FAILED), nic("ens1f1")], True, id="broken-nic-beside-working"
        ),
        pytest.param(
            [nic("ens1f0", link=LinkState.FAILED), nic("ens1f1", link=LinkState.FAILED)],
            False,
            id="all-failed",
        ),
        pytest.param(
            [nic(rdma=False, link=LinkState.UNVERIFIED)], True, id="unverified-unreadable-tree-counts"
        ),
        pytest.param([nic(rdma=True, link=LinkState.FAILED)], False, id="bound-but-failed-does-not"),
        pytest.param([nic(rdma=True, link=None)], True, id="no-verdict-bound-device"),
        pytest.param([nic(rdma=False, link=None)], False, id="no-verdict-no-device"),
        pytest.param(
            [nic(rdma=False, link=None, vfs=[vf("0000:19:00.2", rdma=True)])], True, id="only-a-vf-is-rdma"
        ),
        pytest.param(
            [nic(link=LinkState.FAILED, vfs=[vf("0000:19:00.2", link=LinkState.FAILED)])],
            False,
            id="pf-and-vf-failed",
        ),
        pytest.param([], False, id="no-interfaces"),
    ],
)
def test_rdma_capable_follows_usable_endpoints(interfaces, capable):
    got = compute(interfaces=interfaces)
    assert (got.get(CAPABLE) == "true") is capable
    assert CAPABLE in got or capable is False  # withheld means absent, never "false"


def test_rdma_endpoint_count_includes_virtual_functions():
    record = devices(interfaces=[nic(vfs=[vf("0000:19:00.2"), vf("0000:19:00.3", link=LinkState.FAILED)])])
    assert labels.compute(record).rdma_endpoints == 2


# --- rdma.distance ---------------------------------------------------------------------------------


def test_distance_absent_without_accelerators():
    assert DISTANCE not in compute(interfaces=[nic()])


def test_distance_absent_without_a_usable_endpoint():
    got = compute(interfaces=[nic(link=LinkState.FAILED)], groups=[group("nvidia", gpu(0))])
    assert DISTANCE not in got


def test_distance_same_switch_is_pix():
    got = compute(interfaces=[nic()], groups=[group("nvidia", gpu(0, switches=OTHER_PORT))])
    assert got[DISTANCE] == "PIX"


def test_distance_is_the_closest_pair():
    far = nic("ens2f0", bus_id="0000:99:00.0", switches=["0000:98:00.0"], numa="1")
    far.pci_host_bridge = "pci0000:98"
    near = nic("ens1f1")
    got = compute(interfaces=[far, near], groups=[group("nvidia", gpu(0), gpu(1, numa="0"))])
    assert got[DISTANCE] == "PIX"


def test_distance_ignores_a_failed_endpoint_even_when_closer():
    near_but_failed = nic("ens1f0", link=LinkState.FAILED)
    far = nic("ens2f0", bus_id="0000:99:00.0", switches=["0000:98:00.0"], numa="1")
    far.pci_host_bridge = "pci0000:98"
    got = compute(interfaces=[near_but_failed, far], groups=[group("nvidia", gpu(0, numa="0"))])
    assert got[DISTANCE] == "SYS"


def test_distance_unk_when_a_coordinate_is_missing():
    got = compute(interfaces=[nic()], groups=[group("nvidia", gpu(0, bus_id=""))])
    assert got[DISTANCE] == "UNK"


# --- rdma.numa -------------------------------------------------------------------------------------


def test_numa_sorted_numerically_joined_with_underscore():
    ifaces = [nic("ens1f0", numa="10"), nic("ens1f1", numa="2"), nic("ens1f2", numa="2")]
    assert compute(interfaces=ifaces)[NUMA] == "2_10"


def test_numa_only_from_usable_endpoints_and_skips_blank():
    ifaces = [nic("ens1f0", numa="1", link=LinkState.FAILED), nic("ens1f1", numa=""), nic("ens1f2", numa="0")]
    assert compute(interfaces=ifaces)[NUMA] == "0"


def test_numa_absent_when_the_kernel_gave_none():
    assert NUMA not in compute(interfaces=[nic(numa="")])


def test_numa_of_a_vf_is_its_own():
    assert (
        compute(interfaces=[nic(rdma=False, link=None, numa="0", vfs=[vf("0000:19:00.2", numa="1")])])[NUMA]
        == "1"
    )


NUMA_TEXTS = ["0", "1", "1023", "1024", "-1", "", "01", "+1", " 1", "1 ", "1\n", "\u0661", "\u00b2", "1e3",
              "0x1", "1_0", "9" * 30, "\x00"]  # fmt: skip


@pytest.mark.parametrize("text", NUMA_TEXTS)
def test_numa_is_read_by_the_parser_behind_the_device_plugins_hints(text):
    """A NUMA value gives a label exactly when numbers.numa_node() gives the device plugin a hint, and
    the same node; a present value it refuses withholds the label (never a part of the set)."""
    result = labels.compute(
        devices(interfaces=[nic(numa=text), nic("ens2f0", bus_id="0000:1b:00.0", numa="")])
    )
    hint = numbers.numa_node(text)
    if hint is not None:
        assert result.labels[NUMA] == str(hint)
    else:
        assert NUMA not in result.labels
        refused = text not in ("", "-1")
        assert [(w.key, w.value) for w in result.withheld] == ([(NUMA, text)] if refused else [])


def test_numa_not_a_node_id_is_withheld_not_mangled():
    result = labels.compute(devices(interfaces=[nic(numa="0-1")]))
    assert NUMA not in result.labels
    assert [(w.key, w.value) for w in result.withheld] == [(NUMA, "0-1")]


# --- fabric.domain / fabric.members ----------------------------------------------------------------


def test_fabric_domain_with_clique_and_members():
    got = compute(groups=[group("nvidia", gpu(0, fabric=nvlink()), gpu(1, fabric=nvlink()))])
    assert got[DOMAIN] == "nvlink-5b0e112233445566778899aabbccddef-1"
    assert got[MEMBERS] == "18"


def test_fabric_domain_without_clique_keeps_two_parts():
    got = compute(groups=[group("ascend", gpu(0, fabric=ub("7")), gpu(1, fabric=ub("7")))])
    assert got[DOMAIN] == "ub-7"


def test_mixed_vendor_node_never_publishes_a_domain():
    got = compute(groups=[group("nvidia", gpu(0, fabric=nvlink())), group("ascend", gpu(1, fabric=ub("7")))])
    assert DOMAIN not in got and MEMBERS not in got


def test_one_accelerator_without_fabric_withholds_the_domain():
    got = compute(groups=[group("nvidia", gpu(0, fabric=nvlink()), gpu(1, fabric=None))])
    assert DOMAIN not in got


def test_different_cliques_of_one_cluster_are_different_domains():
    got = compute(groups=[group("nvidia", gpu(0, fabric=nvlink(clique=1)), gpu(1, fabric=nvlink(clique=2)))])
    assert DOMAIN not in got


def test_members_need_agreement():
    got = compute(groups=[group("ascend", gpu(0, fabric=ub(members=48)), gpu(1, fabric=ub(members=24)))])
    assert got[DOMAIN] == "ub-7" and MEMBERS not in got


def test_members_need_a_nonzero_count():
    got = compute(groups=[group("ascend", gpu(0, fabric=ub(members=0)))])
    assert got[DOMAIN] == "ub-7" and MEMBERS not in got


def test_no_accelerators_no_fabric_labels():
    assert compute(interfaces=[nic()]).keys() == {CAPABLE, NUMA}


@pytest.mark.parametrize(
    "bad_id",
    [
        "x" * 61,
        "a/b",
        "ends-with-dash-",
        # `$` matches before a final newline: each of these passed a `^...$` check, and the API server
        # would have refused the whole write, every other label of the node with it.
        "7\n",
        "7\r",
        "7\x00",
        "7 ",
        "\u0667",  # an Arabic-Indic digit: alphanumeric to str.isalnum(), not a label character
        "7\n" + "x" * 100_000,
    ],
)
def test_invalid_domain_value_is_withheld_with_its_members(bad_id):
    result = labels.compute(devices(groups=[group("amd", gpu(0, fabric=ub(bad_id)))]))
    assert DOMAIN not in result.labels and MEMBERS not in result.labels
    assert result.fabric_domain == ""
    assert [(w.key, w.value) for w in result.withheld] == [(DOMAIN, f"ub-{bad_id}")]


# --- values, domain, summaries ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"),
    [("true", True), ("0_1", True), ("a.b-c_d", True), ("", True), ("x" * 63, True), ("x" * 64, False),
     ("0,1", False), ("-a", False), ("a.", False), ("@ref", False), ("a\n", False), ("\na", False),
     ("a\nb", False), ("true\n", False), ("\uff41", False), ("\u0663", False), ("a" * 62 + "\n", False)],
)  # fmt: skip
def test_value_validity(value, ok):
    assert (labels.value_problem(value) is None) is ok


def test_domain_is_configurable():
    got = labels.compute(devices(interfaces=[nic()]), "example.com").labels
    assert got == {"feature.example.com/rdma.capable": "true", "feature.example.com/rdma.numa": "0"}


@pytest.mark.parametrize(
    "domain",
    [
        "",
        "Bad_Domain",
        "-x.com",
        "a..b",
        "gpustack.ai\n",
        "\ngpustack.ai",
        "\uff47.ai",
        "gpustack.ai/",
        "a/b",
    ],
)
def test_invalid_domain_refused(domain):
    with pytest.raises(labels.InvalidDomain):
        labels.check_domain(domain)


def test_summaries_for_status_columns():
    result = labels.compute(
        devices(interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink(clique=None)))])
    )
    assert (result.rdma_endpoints, result.best_distance, result.fabric_domain) == (
        1,
        "PIX",
        "nvlink-5b0e112233445566778899aabbccddef",
    )


# --- failure signals and the removal plan ------------------------------------------------------------


def test_frozen_families_follow_the_agent_conditions():
    assert labels.frozen_families(devices().status) == frozenset()
    failed_ifaces = devices(conditions={models.INTERFACES_ENUMERATED: False}).status
    assert labels.frozen_families(failed_ifaces) == {"rdma"}
    assert labels.frozen_families(devices(conditions={models.ACCELERATORS_ENUMERATED: False}).status) == {
        "fabric"
    }
    assert labels.frozen_families(devices(conditions={"NvidiaFabricRead": False}).status) == {"fabric"}
    # Unknown is not a read either: a hand-edited (or future) Unknown freezes removal as False does.
    unknown = {models.INTERFACES_ENUMERATED: "Unknown", "NvidiaFabricRead": "Unknown"}
    assert labels.frozen_families(devices(conditions=unknown).status) == {"rdma", "fabric"}
    assert (
        labels.frozen_families(devices(conditions={models.INTERFACES_ENUMERATED: True}).status) == frozenset()
    )


def test_plan_removes_only_our_families():
    current = {
        CAPABLE: "true",
        DOMAIN: "ub-7",
        P + "custom": "1",
        "feature.other.io/rdma.capable": "true",
        "zone": "a",
    }
    plan = labels.plan(current, {CAPABLE: "true"}, domain="gpustack.ai")
    assert [(c.key, c.kind) for c in plan.changes] == [(DOMAIN, "removed")]
    assert plan.managed == {CAPABLE: "true"}


def test_plan_adds_and_changes():
    plan = labels.plan({NUMA: "0"}, {NUMA: "0_1", CAPABLE: "true"}, domain="gpustack.ai")
    assert [(c.key, c.old, c.new) for c in plan.changes] == [(CAPABLE, None, "true"), (NUMA, "0", "0_1")]


def test_plan_skips_removal_for_a_frozen_family_only():
    current = {CAPABLE: "true", DOMAIN: "ub-7"}
    plan = labels.plan(current, {}, domain="gpustack.ai", frozen=frozenset({"rdma"}))
    assert plan.kept == [CAPABLE]
    assert [(c.key, c.kind) for c in plan.changes] == [(DOMAIN, "removed")]
    assert plan.managed == {CAPABLE: "true"}


def test_plan_with_an_ownership_record_leaves_hand_set_keys():
    current = {CAPABLE: "true", DOMAIN: "hand-set"}
    plan = labels.plan(current, {}, domain="gpustack.ai", owned=frozenset({CAPABLE}))
    assert [(c.key, c.kind) for c in plan.changes] == [(CAPABLE, "removed")]


def test_plan_twice_changes_nothing():
    desired = {CAPABLE: "true", NUMA: "0_1"}
    first = labels.plan({}, desired, domain="gpustack.ai")
    assert labels.plan(first.managed, desired, domain="gpustack.ai").changes == []


@pytest.mark.parametrize("numa", ["²", "٣", "0²"])
def test_a_numa_value_of_non_ascii_digits_is_withheld_not_mangled(numa):
    # "²" made int() raise inside the reconcile; "٣" was published as node 3, a value nobody wrote.
    record = devices("n1", interfaces=[nic(numa=numa), nic("ens2f0", bus_id="0000:1b:00.0", numa="1")])
    result = labels.compute(record)
    assert NUMA not in result.labels
    assert [(w.key, w.value) for w in result.withheld] == [(NUMA, numa)]
    assert result.labels[CAPABLE] == "true"
