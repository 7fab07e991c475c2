"""The pure topology rules as tables: levels, the nesting check over fleets, and each projection checked
against the targets' schema facts and CEL rules (demo/targets/)."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest
from topology_fixtures import (
    FABRIC,
    HOST,
    KAI,
    KUEUE,
    KUEUE_V1BETA1_ONLY,
    LEAF,
    REGION,
    SPINE,
    TIER0,
    TIER1,
    VOLCANO,
    ZONE,
    problems,
)

from nodefabric_operator import labels as nf_labels
from nodefabric_operator.extender.config import Level
from nodefabric_operator.topology import levels as lv
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.nesting import ABSENT, PROJECTED, VIOLATING, Hierarchy, check

LEVELS = lv.default_levels()
Fleet = dict[str, dict[str, str]]


def rack(n: int, *, fabric: str | None, leaf: str, spine: str = "sp-1", zone: str = "z-a") -> dict[str, str]:
    out = {HOST: f"gpu-{n}", LEAF: leaf, SPINE: spine, ZONE: zone, REGION: "r-1"}
    if fabric is not None:
        out[FABRIC] = fabric
    return out


def clean_fleet() -> Fleet:
    """Two NVL domains under one leaf, a third under another leaf, two CPU nodes without a domain."""
    fleet = {}
    for n in range(4):
        fleet[f"gpu-{n}"] = rack(n, fabric="nvl-a" if n < 2 else "nvl-b", leaf="leaf-1")
    for n in range(4, 6):
        fleet[f"gpu-{n}"] = rack(n, fabric="nvl-c", leaf="leaf-2", spine="sp-2", zone="z-b")
    for n in range(6, 8):
        fleet[f"gpu-{n}"] = rack(n, fabric=None, leaf="leaf-2", spine="sp-2", zone="z-b")
    return fleet


def states(h: Hierarchy) -> dict[str, str]:
    return {c.name: c.state for c in h.levels}


# --- levels ----------------------------------------------------------------------------------------------


def test_default_levels_read_the_operators_fabric_key_and_every_leaf_key_the_extender_reads() -> None:
    names = [x.name for x in LEVELS]
    assert names == ["fabric", "leaf", "spine", "core", "zone", "region"]
    assert LEVELS[0].keys[0] == nf_labels.key(nf_labels.DEFAULT_DOMAIN, nf_labels.FABRIC_DOMAIN)
    from nodefabric_operator.extender.config import default_levels as ext

    group = next(x for x in ext("gpustack.ai") if x.name == "network-group")
    assert set(group.keys) < set(LEVELS[1].keys)
    assert TIER0 in LEVELS[1].keys and TIER1 in LEVELS[2].keys
    lv.check(LEVELS)
    # Another label domain moves the fabric key with it.
    assert lv.default_levels("example.org")[0].keys[0] == "feature.example.org/fabric.domain"


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([], "at least one"),
        ("fabric", "invalid topology levels"),
        ([{"name": "a", "keys": ["x"]}, {"name": "a", "keys": ["y"]}], "unique"),
        ([{"name": "a", "keys": [HOST]}], "added by every projection"),
        ([{"name": "a", "keys": ["k"]}, {"name": "b", "keys": ["k"]}], "is in levels a and b"),
        ([{"name": "a", "keys": ["bad key!"]}], "not a qualified label key"),
        ([{"name": "a", "keys": ["x/" + "n" * 64]}], "not a qualified label key"),
        # A label key the API server accepts (a prefix of 253, a name of 63) that Kueue's and KAI's
        # nodeLabel (316 at most) refuse: every Topology write would fail.
        ([{"name": "a", "keys": ["p" * 253 + "/" + "n" * 63]}], "longer than 316"),
        ([{"name": "a-", "keys": ["x"]}], "must be a DNS label"),
        ([{"name": "a", "keys": []}], "invalid topology levels"),
        ([{"name": "a", "keys": ["x"], "extra": 1}], "invalid topology levels"),
        ([{"name": 7, "keys": ["x"]}], "invalid topology levels"),
    ],
)
def test_bad_level_configuration_is_refused_with_the_reason(data: Any, fragment: str) -> None:
    with pytest.raises(lv.LevelsError, match=re.escape(fragment)):
        lv.parse_levels(data)


def test_named_levels_take_other_keys() -> None:
    changed = lv.with_keys(LEVELS, {"leaf": ["example.com/rack"], "zone": []})
    assert [x.keys for x in changed][1:] == [("example.com/rack",), *(x.keys for x in LEVELS[2:])]
    with pytest.raises(lv.LevelsError, match=r"level keys for \['rack'\]: no such level"):
        lv.with_keys(LEVELS, {"rack": ["k"]})
    with pytest.raises(lv.LevelsError, match="is in levels fabric and leaf"):
        lv.with_keys(LEVELS, {"leaf": [FABRIC]})
    with pytest.raises(lv.LevelsError, match="invalid level keys"):
        lv.with_keys(LEVELS, ["leaf"])


def test_levels_are_renamed_and_reordered_by_configuration() -> None:
    custom = lv.parse_levels(
        [
            {"name": "nvl", "keys": [FABRIC]},
            {"name": "rack-switch", "keys": [TIER0, LEAF], "title": "rack"},
            {"name": "zone", "keys": [ZONE]},
        ]
    )
    h = check(custom, clean_fleet())
    assert [c.name for c in h.projected] == ["nvl", "rack-switch", "zone"]
    assert h.levels[1].key == LEAF  # nobody carries tier-0 here
    body, _ = project.kueue_topology(h, "nodefabric", "v1beta2")
    assert [x["nodeLabel"] for x in body["spec"]["levels"]] == [ZONE, LEAF, FABRIC, HOST]


# --- nesting ---------------------------------------------------------------------------------------------


def test_a_clean_fleet_projects_every_level_it_carries() -> None:
    h = check(LEVELS, clean_fleet())
    assert states(h) == {
        "fabric": PROJECTED,
        "leaf": PROJECTED,
        "spine": PROJECTED,
        "core": ABSENT,
        "zone": PROJECTED,
        "region": PROJECTED,
    }
    assert h.violations == () and h.nodes == 8
    assert h.levels[0].values == 3 and h.levels[0].nodes == 6  # CPU nodes belong to no fabric domain
    assert "no node carries" in h.levels[3].reason()


def test_a_fabric_domain_across_two_leaves_is_a_violation_and_left_out() -> None:
    fleet = clean_fleet()
    fleet["gpu-1"][LEAF] = "leaf-2"  # nvl-a now sits under leaf-1 and leaf-2
    fleet["gpu-1"][SPINE] = "sp-2"
    fleet["gpu-1"][ZONE] = "z-b"
    h = check(LEVELS, fleet)
    assert states(h)["fabric"] == VIOLATING
    assert [c.name for c in h.projected] == ["leaf", "spine", "zone", "region"]
    against = {(v.level, v.value, v.against) for v in h.violations}
    assert against == {("fabric", "nvl-a", "leaf"), ("fabric", "nvl-a", "spine"), ("fabric", "nvl-a", "zone")}
    leaf_v = next(v for v in h.violations if v.against == "leaf")
    assert leaf_v.against_values == ("leaf-1", "leaf-2")
    assert set(leaf_v.nodes) == {"gpu-0", "gpu-1"}
    message = leaf_v.message()
    assert "fabric domain nvl-a" in message and "leaf-1, leaf-2" in message and "gpu-1" in message
    assert "left out of every projection" in h.levels[0].reason()
    assert h.violations_by_level() == {"fabric": 3, "leaf": 0, "spine": 0, "core": 0, "zone": 0, "region": 0}
    body, _ = project.kueue_topology(h, "nodefabric", "v1beta2")
    assert FABRIC not in [x["nodeLabel"] for x in body["spec"]["levels"]]
    assert not any(n.startswith("fabric.") for n in project.hypernodes(h, fleet))


def test_a_leaf_across_two_zones_is_a_violation_of_the_leaf_alone() -> None:
    fleet = clean_fleet()
    fleet["gpu-7"][ZONE] = "z-a"  # leaf-2 now spans z-a and z-b
    h = check(LEVELS, fleet)
    assert states(h) == {
        "fabric": PROJECTED,
        "leaf": VIOLATING,
        "spine": VIOLATING,  # sp-2 spans the zones too
        "core": ABSENT,
        "zone": PROJECTED,
        "region": PROJECTED,
    }
    (v,) = [v for v in h.violations if v.level == "leaf"]
    assert (v.value, v.against, v.against_values) == ("leaf-2", "zone", ("z-a", "z-b"))


def test_missing_labels_are_fine_conflicting_values_are_not() -> None:
    fleet = {
        "a": {FABRIC: "d1", LEAF: "l1"},
        "b": {FABRIC: "d1"},  # no leaf: belongs to no leaf domain
        "c": {LEAF: "l1", ZONE: "z"},  # no fabric domain
        "d": {ZONE: "z"},
        "e": {},
    }
    h = check(LEVELS, fleet)
    assert h.violations == ()
    assert states(h) == {
        "fabric": PROJECTED,
        "leaf": PROJECTED,
        "spine": ABSENT,
        "core": ABSENT,
        "zone": PROJECTED,
        "region": ABSENT,
    }
    fleet["b"][LEAF] = "l2"
    assert {(v.level, v.value) for v in check(LEVELS, fleet).violations} == {("fabric", "d1")}


def test_a_level_added_and_removed_at_run_time() -> None:
    fleet: Fleet = {f"n{i}": {FABRIC: f"d{i // 2}", ZONE: "z"} for i in range(4)}
    before = check(LEVELS, fleet)
    assert [c.name for c in before.projected] == ["fabric", "zone"]
    for i in range(4):
        fleet[f"n{i}"][TIER1] = "s1"  # Topograph v1.1 labels the spine tier
    added = check(LEVELS, fleet)
    assert [c.name for c in added.projected] == ["fabric", "spine", "zone"]
    assert added.levels[2].key == TIER1
    fleet["n3"][TIER1] = "s2"  # d1 now spans two spines
    broken = check(LEVELS, fleet)
    assert [c.name for c in broken.projected] == ["spine", "zone"]
    notes = report.notices(added, broken)
    assert [(n.type, n.reason) for n in notes] == [("Warning", report.NOT_NESTED)]
    assert "d1" in notes[0].message and "n3" in notes[0].message
    for i in range(4):
        del fleet[f"n{i}"][TIER1]  # the spine labels go away: fabric nests again
    removed = check(LEVELS, fleet)
    assert [c.name for c in removed.projected] == ["fabric", "zone"]
    assert [(n.type, n.reason) for n in report.notices(broken, removed)] == [("Normal", report.NESTED_AGAIN)]
    assert report.notices(removed, removed) == []


def test_a_level_carried_under_two_keys_is_read_under_the_first_and_the_rest_are_named() -> None:
    fleet = {"a": {TIER0: "x"}, "b": {LEAF: "y"}, "c": {LEAF: "y"}}
    h = check(LEVELS, fleet)
    leaf = h.levels[1]
    assert leaf.key == LEAF  # the extender's key order: nodefabric's own, Topograph v1.0, ..., tier-0
    assert leaf.elsewhere == ("a",) and leaf.elsewhere_count == 1
    assert "1 nodes carry it only under another key" in leaf.reason()


def test_many_violations_are_capped_in_events_and_conditions() -> None:
    fleet = {}
    for d in range(60):
        fleet[f"a{d}"] = {FABRIC: f"d{d}", LEAF: "l1"}
        fleet[f"b{d}"] = {FABRIC: f"d{d}", LEAF: "l2"}
    h = check(LEVELS, fleet)
    assert len(h.violations) == 60
    notes = report.notices(None, h)
    assert len(notes) == report.MAX_EVENTS and "51 more violations" in notes[-1].message
    conds = report.conditions(h, "2026-01-01T00:00:00Z")
    assert len(conds) == 1 + report.MAX_CONDITIONS
    assert conds[0]["status"] == "False" and "60 violations" in conds[0]["message"]


# --- projections against the targets' schemas --------------------------------------------------------------


def kueue_levels(body: Mapping[str, Any]) -> list[str]:
    return [x["nodeLabel"] for x in body["spec"]["levels"]]


def test_kueue_and_kai_topologies_are_loosest_first_with_hostname_last_and_valid() -> None:
    h = check(LEVELS, clean_fleet())
    body, dropped = project.kueue_topology(h, "nodefabric", "v1beta2")
    assert kueue_levels(body) == [REGION, ZONE, SPINE, LEAF, FABRIC, HOST]
    assert dropped.dropped == ()
    assert body["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "nodefabric"}
    assert problems(body, KUEUE) == []
    v1, _ = project.kueue_topology(h, "nodefabric", "v1beta1")
    assert v1["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert problems(v1, KUEUE_V1BETA1_ONLY) == []
    kai, _ = project.kai_topology(h, "nodefabric")
    assert kai["apiVersion"] == "kai.scheduler/v1alpha1" and kueue_levels(kai) == kueue_levels(body)
    assert problems(kai, KAI) == []


def test_an_empty_fleet_projects_hostname_alone() -> None:
    h = check(LEVELS, {})
    body, _ = project.kueue_topology(h, "nodefabric", "v1beta2")
    assert kueue_levels(body) == [HOST]
    assert problems(body, KUEUE) == []
    assert project.hypernodes(h, {}) == {}


def test_more_levels_than_a_version_allows_drop_the_loosest() -> None:
    many = tuple(Level(name=f"l{i}", keys=(f"example.com/l{i}",)) for i in range(20))
    fleet = {"n": {f"example.com/l{i}": "v" for i in range(20)}}
    h = check(many, fleet)
    for version, limit, crd_name in (("v1beta2", 16, KUEUE), ("v1beta1", 8, KUEUE_V1BETA1_ONLY)):
        body, levels = project.kueue_topology(h, "nodefabric", version)
        assert len(kueue_levels(body)) == limit
        assert kueue_levels(body)[-2:] == ["example.com/l0", HOST]  # the tightest kept
        assert levels.dropped[0] == "example.com/l19"
        assert problems(body, crd_name) == []
    too_many = project.topology_body("kueue.x-k8s.io/v1beta1", "x", [f"example.com/l{i}" for i in range(9)])
    assert problems(too_many, KUEUE_V1BETA1_ONLY) != []  # the fixture does enforce the limit


def test_topology_level_changes_update_or_replace_as_the_targets_rules_say() -> None:
    h1 = check(LEVELS, clean_fleet())
    fleet = clean_fleet()
    fleet["gpu-1"][LEAF] = "leaf-2"
    h2 = check(LEVELS, fleet)
    old, _ = project.kueue_topology(h1, "nodefabric", "v1beta2")
    new, _ = project.kueue_topology(h2, "nodefabric", "v1beta2")
    action = project.topology_action(project.levels_of(old), kueue_levels(new), mutable_with_hostname=True)
    assert action == project.UPDATE and problems(new, KUEUE, old=old) == []
    # A Topology someone wrote without hostname last can only be replaced; the API server says so too.
    foreign = project.topology_body("kueue.x-k8s.io/v1beta2", "nodefabric", [ZONE, LEAF])
    assert project.topology_action(
        project.levels_of(foreign), kueue_levels(new), mutable_with_hostname=True
    ) == (project.REPLACE)
    assert problems(new, KUEUE, old=foreign) != []
    # KAI's levels never change in place.
    kai_old, _ = project.kai_topology(h1, "nodefabric")
    kai_new, _ = project.kai_topology(h2, "nodefabric")
    assert (
        project.topology_action(
            project.levels_of(kai_old), kueue_levels(kai_new), mutable_with_hostname=False
        )
        == project.REPLACE
    )
    assert problems(kai_new, KAI, old=kai_old) != []
    assert project.topology_action(None, kueue_levels(new), mutable_with_hostname=True) == project.CREATE
    assert (
        project.topology_action(kueue_levels(new), kueue_levels(new), mutable_with_hostname=True)
        == project.NONE
    )


def selected(member: Mapping[str, Any], fleet: Fleet) -> set[str]:
    match = member["selector"]["labelMatch"]
    out = set()
    for name, labs in fleet.items():
        if any(labs.get(k) != v for k, v in match.get("matchLabels", {}).items()):
            continue
        if any(
            e["key"] in labs for e in match.get("matchExpressions", ()) if e["operator"] == "DoesNotExist"
        ):
            continue
        out.add(name)
    return out


def nodes_under(name: str, hns: Mapping[str, Any], fleet: Fleet) -> set[str]:
    """The nodes a HyperNode holds, resolved as Volcano would: label matches, and children recursively."""
    out: set[str] = set()
    for m in hns[name]["spec"]["members"]:
        if m["type"] == "Node":
            out |= selected(m, fleet)
        else:
            out |= nodes_under(m["selector"]["exactMatch"]["name"], hns, fleet)
    return out


def test_hypernodes_form_a_tree_that_holds_each_domain_exactly() -> None:
    fleet = clean_fleet()
    fleet["gpu-9"] = {HOST: "gpu-9", FABRIC: "nvl-z", SPINE: "sp-2", ZONE: "z-b", REGION: "r-1"}  # no leaf
    h = check(LEVELS, fleet)
    hns = project.hypernodes(h, fleet)
    for body in hns.values():
        assert problems(body, VOLCANO) == [], body
        assert body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "nodefabric"
    tiers = {b["spec"]["tierName"]: b["spec"]["tier"] for b in hns.values()}
    assert tiers == {
        "fabric": 0,
        "leaf": 1,
        "spine": 2,
        "zone": 4,
        "region": 5,
    }  # core absent: its tier empty
    parents: dict[str, list[str]] = {}
    for name, body in hns.items():
        for m in body["spec"]["members"]:
            if m["type"] == "HyperNode":
                child = m["selector"]["exactMatch"]["name"]
                assert child in hns
                assert hns[child]["spec"]["tier"] < body["spec"]["tier"]
                parents.setdefault(child, []).append(name)
    assert all(len(p) == 1 for p in parents.values())
    assert set(parents) == set(hns) - {"region.r-1"}  # one root
    assert parents["fabric.nvl-z"] == ["spine.sp-2"]  # no leaf: hangs under the spine
    key_of = {c.name: c.key for c in h.projected}
    for name, body in hns.items():
        level = body["spec"]["tierName"]
        value_nodes = {
            n
            for n, labs in fleet.items()
            if key_of[level] in labs and project.hypernode_name(level, labs[key_of[level]]) == name
        }
        assert nodes_under(name, hns, fleet) == value_nodes, name
    # The tightest tier holds its nodes by label alone.
    assert hns["fabric.nvl-a"]["spec"]["members"] == [
        {"type": "Node", "selector": {"labelMatch": {"matchLabels": {FABRIC: "nvl-a"}}}}
    ]


VALUES = ["Rack_1", "rack.1", "rack-1", "A" * 63, "a" * 63, "x" + "_" * 61 + "y", "9", "", "x"]


@pytest.mark.parametrize("value", VALUES)
def test_hypernode_names_are_dns_subdomains_and_never_shared(value: str) -> None:
    name = project.hypernode_name("network-group", value)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name), name
    assert len(name) <= 253 and all(len(part) <= 63 for part in name.split("."))
    others = {project.hypernode_name("network-group", v) for v in VALUES if v != value}
    assert name not in others


# --- the report ------------------------------------------------------------------------------------------


def test_the_report_validates_against_its_crd_and_keeps_transition_times() -> None:
    fleet = clean_fleet()
    fleet["gpu-1"].update({LEAF: "leaf-2", SPINE: "sp-2", ZONE: "z-b"})
    h = check(LEVELS, fleet)
    st = report.status(h, {"kueue": "written", "volcano": "not served"}, "2026-01-01T00:00:00Z")
    body = report.body(st)
    schema = report.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft7Validator(schema).validate(body)
    assert st["projected"] == "leaf,spine,zone,region" and st["violations"] == 3
    assert [c["reason"] for c in st["conditions"]] == [
        "LevelsLeftOut",
        "FabricSpansLeaf",
        "FabricSpansSpine",
        "FabricSpansZone",
    ]
    for c in st["conditions"]:
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", c["reason"])
    later = report.status(
        h, {"kueue": "written", "volcano": "not served"}, "2026-02-02T00:00:00Z", st["conditions"]
    )
    assert later == st  # nothing changed: nothing to write
    assert report.camel("network-group") == "NetworkGroup"


@pytest.mark.parametrize("where", ["crds", "charts/nodefabric/crds"])
def test_the_committed_fabric_topology_crd_is_current(where: str) -> None:
    root = pathlib.Path(__file__).resolve().parents[2]
    path = root / where / report.CRD_FILE
    assert path.read_text() == report.render_crd(), f"{path} is stale: run `make crds`"


# --- random fleets against the definition, checked the slow way --------------------------------------------


def brute_violations(levels: tuple[Level, ...], fleet: Fleet) -> set[tuple[str, str, str]]:
    keys = [next((k for k in x.keys if any(k in labs for labs in fleet.values())), None) for x in levels]
    out = set()
    for i, tight in enumerate(levels):
        for j in range(i + 1, len(levels)):
            ki, kj = keys[i], keys[j]
            if ki is None or kj is None:
                continue
            for a in fleet.values():
                for b in fleet.values():
                    if ki in a and ki in b and kj in a and kj in b and a[ki] == b[ki] and a[kj] != b[kj]:
                        out.add((tight.name, a[ki], levels[j].name))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_random_fleets_match_the_definition_and_project_to_exact_hypernodes(seed: int) -> None:
    import random

    rng = random.Random(seed)
    fleet: Fleet = {}
    for n in range(40):
        fabric = rng.randrange(12)
        leaf = fabric // 3
        spine = leaf // 2
        labs = {
            FABRIC: f"d{fabric}",
            LEAF: f"l{leaf}",
            SPINE: f"s{spine}",
            ZONE: f"z{spine // 1}",
            REGION: "r",
        }
        for key in list(labs):
            if rng.random() < 0.2:
                del labs[key]  # missing labels are fine
        fleet[f"n{n}"] = labs
    complete = seed % 4 == 0
    if complete:  # a quarter of the fleets carry every label
        fleet = {n: {k: f"{k}-{v}" for k, v in labs.items()} for n, labs in fleet.items()}
        for n in range(40):
            fabric = n % 12
            fleet[f"n{n}"] = {
                FABRIC: f"d{fabric}",
                LEAF: f"l{fabric // 3}",
                SPINE: f"s{fabric // 6}",
                ZONE: f"z{fabric // 6}",
                REGION: "r",
            }
    elif seed % 2:  # a few conflicting values
        for _ in range(rng.randrange(1, 4)):
            node = fleet[f"n{rng.randrange(40)}"]
            node[rng.choice([LEAF, SPINE, ZONE])] = f"x{rng.randrange(3)}"
    h = check(LEVELS, fleet)
    assert {(v.level, v.value, v.against) for v in h.violations} == brute_violations(LEVELS, fleet)
    hns = project.hypernodes(h, fleet)
    key_of = {c.name: c.key for c in h.projected}
    for name, body in hns.items():
        assert problems(body, VOLCANO) == []
        level = body["spec"]["tierName"]
        want = {
            n
            for n, labs in fleet.items()
            if key_of[level] in labs and project.hypernode_name(level, labs[key_of[level]]) == name
        }
        got = nodes_under(name, hns, fleet)
        # Never a node outside the domain; the whole domain when every node carries every label.
        assert got <= want and (got == want or not complete), name
    parents: dict[str, int] = {}
    for body in hns.values():
        for m in body["spec"]["members"]:
            if m["type"] == "HyperNode":
                parents[m["selector"]["exactMatch"]["name"]] = (
                    parents.get(m["selector"]["exactMatch"]["name"], 0) + 1
                )
    assert all(count == 1 for count in parents.values())
    for tier in {b["spec"]["tier"] for b in hns.values()}:  # a node in at most one HyperNode per tier
        seen: list[str] = []
        for name, body in hns.items():
            if body["spec"]["tier"] == tier:
                seen += nodes_under(name, hns, fleet)
        assert len(seen) == len(set(seen))
    kueue, _ = project.kueue_topology(h, "nodefabric", "v1beta2")
    assert problems(kueue, KUEUE) == []
