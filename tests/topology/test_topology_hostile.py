"""Hostile cases against the real operator and the embedded API: what the targets' own controllers do to
the objects (Kueue's finalizer on a Topology a ResourceFlavor names), and objects of our names that are
someone else's."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
from typing import Any

import kubernetes
import pytest
from test_topology_operator import (
    FLEET,
    FT,
    HN,
    KAI_T,
    KUEUE_T,
    ROLES,
    Client,
    _all,
    _writes,
    add_nodes,
    api,
    assert_valid,
    eventually,
    levels,
    options,
    running_operator,
    settle,
)
from topology_fixtures import FABRIC, HOST, KAI, KUEUE, LEAF, VOLCANO, ZONE, crd

from nodefabric_devicemanager import crd as devices_crd
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.levels import default_levels
from nodefabric_operator.topology.nesting import check
from nodefabric_operator.topology.shell import Projector

__all__ = ["api"]

IN_USE = "kueue.x-k8s.io/resource-in-use"  # Kueue's finalizer while a ResourceFlavor names the Topology


def _events(k: RunningAPI, reason: str) -> list[dict[str, Any]]:
    return [e for e in _all(k, "v1/events").values() if e["reason"] == reason]


async def test_a_kueue_topology_held_by_its_finalizer_is_replaced_once_it_is_gone(api: RunningAPI) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    # Ours from an older release, without hostname last (so only a delete and a create change it), and
    # held by Kueue's finalizer: a ResourceFlavor names it.
    k.api.put_object(
        KUEUE_T,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Topology",
            "metadata": {
                "name": "nodefabric",
                "labels": {"app.kubernetes.io/managed-by": "nodefabric"},
                "finalizers": [IN_USE],
            },
            "spec": {"levels": [{"nodeLabel": ZONE}]},
        },
    )
    async with running_operator(k, sink="node", topology=options(targets=("kueue",), resync=1.0)):
        await eventually(lambda: _all(k, KUEUE_T)["nodefabric"]["metadata"].get("deletionTimestamp"))
        await asyncio.sleep(3)  # a few retries meet the object still held
        ft = _all(k, FT)["nodefabric"]
        state = {t["name"]: t["state"] for t in ft["status"]["targets"]}["kueue"]
        assert "being deleted" in state and IN_USE in state, state
        # Deleted once, not once per retry; no Event says it was replaced while it still stands.
        assert k.count("DELETE", KUEUE_T) == 1
        assert not _events(k, report.REPLACED)
        (pending,) = _events(k, report.REPLACE_PENDING)
        assert IN_USE in pending["message"] and pending["type"] == "Warning"
        # Kueue lets it go (the ResourceFlavor no longer names it): the new one is written.
        custom = kubernetes.client.CustomObjectsApi(client.core.api_client)
        await asyncio.to_thread(
            custom.patch_cluster_custom_object,
            "kueue.x-k8s.io",
            "v1beta2",
            "topologies",
            "nodefabric",
            {"metadata": {"finalizers": []}},
        )
        await eventually(lambda: levels(_all(k, KUEUE_T).get("nodefabric"))[-1:] == [HOST])
        await settle(k)
        assert_valid(k, (KUEUE_T,))
        (said,) = _events(k, report.REPLACED)
        assert said["message"].startswith("kueue Topology nodefabric replaced") and ZONE in said["message"]
        assert _writes(k, HN) == 0


def _hn_parents(hns: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    parents: dict[str, list[str]] = {}
    for name, body in hns.items():
        for m in body["spec"]["members"]:
            if m["type"] == "HyperNode":
                parents.setdefault(m["selector"]["exactMatch"]["name"], []).append(name)
    return parents


def test_a_hypernode_name_someone_else_holds_is_neither_written_nor_named_by_a_parent() -> None:
    fleet = {n: dict(labs) for n, labs in FLEET.items()}
    h = check(default_levels(), fleet)
    hns = project.hypernodes(h, fleet, taken=frozenset({"fabric.nvl-a"}))
    assert "fabric.nvl-a" not in hns and "fabric.nvl-b" in hns
    # Volcano allows one parent per HyperNode: naming theirs would give it a second one.
    assert "fabric.nvl-a" not in _hn_parents(hns)
    # leaf-1 held only nvl-a, whose nodes carry the fabric level: it has nothing left to hold.
    assert "leaf.leaf-1" not in hns and "leaf.leaf-1" not in _hn_parents(hns)


async def test_a_foreign_hypernode_of_our_name_is_left_alone_and_named_by_none_of_ours(
    api: RunningAPI,
) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    theirs = {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": "fabric.nvl-a"},  # e.g. Volcano's own discovery
        "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "gpu-0"}}}]},
    }
    k.api.put_object(HN, theirs)
    async with running_operator(k, sink="node", topology=options(targets=("volcano",))):
        await eventually(lambda: "fabric.nvl-b" in _all(k, HN) and "nodefabric" in _all(k, FT))
        await settle(k)
        hns = _all(k, HN)
        assert (
            hns["fabric.nvl-a"]["spec"] == theirs["spec"] and "labels" not in hns["fabric.nvl-a"]["metadata"]
        )
        ours = {n: b for n, b in hns.items() if n != "fabric.nvl-a"}
        assert "fabric.nvl-a" not in _hn_parents(ours)
        assert_valid(k, ())
        state = {t["name"]: t["state"] for t in _all(k, FT)["nodefabric"]["status"]["targets"]}["volcano"]
        assert "fabric.nvl-a" in state and "not managed by nodefabric" in state, state
        # Nothing more is written while nothing changes: no create of their name on every pass.
        writes = _writes(k, HN)
        await client.label_node("gpu-3", {"example.com/unrelated": "x"})
        await settle(k)
        assert _writes(k, HN) == writes


def test_a_hypernode_tier_is_its_level_and_never_shifts_when_a_tighter_level_is_left_out() -> None:
    """A Volcano job asks for `highestTierAllowed`: a number. When the fabric level is left out for a
    violation, tier 0 must hold nothing (the job waits, as Kueue's and KAI's would for a level their
    Topology lacks), not become the leaf (the job would be packed across NVLink domains)."""
    fleet = {n: dict(labs) for n, labs in FLEET.items()}
    levels = default_levels()
    position = {lv.name: i for i, lv in enumerate(levels)}
    clean = project.hypernodes(check(levels, fleet), fleet)
    assert {b["spec"]["tierName"]: b["spec"]["tier"] for b in clean.values()} == {
        name: position[name] for name in ("fabric", "leaf", "spine", "zone", "region")
    }
    fleet["gpu-1"][LEAF] = "leaf-2"  # nvl-a now spans two leaves: the fabric level is left out
    h = check(levels, fleet)
    assert "fabric" not in [lv.name for lv in h.projected]
    split = project.hypernodes(h, fleet)
    tiers = {b["spec"]["tierName"]: b["spec"]["tier"] for b in split.values()}
    assert 0 not in tiers.values()
    assert tiers == {name: position[name] for name in ("leaf", "spine", "zone", "region")}
    # The looser levels' HyperNodes are not rewritten for it.
    assert split["zone.eu-1a"] == clean["zone.eu-1a"] and split["region.eu-1"] == clean["region.eu-1"]


# Volcano's admission webhook checks a member's exactMatch.name with IsQualifiedName: a name part of 63
# characters at most, so a HyperNode named longer can exist but no parent can name it.
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
LONG_VALUES = ["a" * 63, "A" * 63, "a" * 62 + "b", "x" * 56, "x" * 55, "nvlink-" + "f" * 56]


@pytest.mark.parametrize("level", ["fabric", "network-group", "l" * 63])
def test_hypernode_names_fit_what_a_parent_can_name(level: str) -> None:
    names = {project.hypernode_name(level, v) for v in LONG_VALUES}
    assert len(names) == len(LONG_VALUES)
    for name in names:
        assert len(name) <= 63 and QUALIFIED_NAME.fullmatch(name), name
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name), name
    # Names that fit already are kept as they were.
    assert project.hypernode_name("fabric", "nvl-a") == "fabric.nvl-a"
    assert project.hypernode_name("leaf", "x" * 58) == "leaf." + "x" * 58


async def test_a_restarted_operator_writes_nothing_when_nothing_changed(api: RunningAPI) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options()):
        await eventually(lambda: len(_all(k, HN)) == 10 and "nodefabric" in _all(k, FT))
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T) and "nodefabric" in _all(k, KAI_T))
        await settle(k)
    # Kueue marks the Topology a ResourceFlavor names; that is no reason to write it again.
    k.api.put_object(
        KUEUE_T,
        {
            **_all(k, KUEUE_T)["nodefabric"],
            "metadata": {**_all(k, KUEUE_T)["nodefabric"]["metadata"], "finalizers": [IN_USE]},
        },
    )
    before = {key: _writes(k, key) for key in (KUEUE_T, KAI_T, HN, FT, "v1/events")}
    async with running_operator(k, sink="node", topology=options()):
        await asyncio.sleep(1.0)
        await settle(k)
    assert {key: _writes(k, key) for key in (KUEUE_T, KAI_T, HN, FT, "v1/events")} == before


async def test_a_kai_topology_crd_serving_only_v1_gets_a_v1_topology() -> None:
    # KAI's Topology has a v1 (its storage version from the release that added it); a cluster whose CRD no
    # longer serves v1alpha1 must not read as "CRD not served".
    kai_v1 = copy.deepcopy(crd(KAI))
    (version,) = kai_v1["spec"]["versions"]
    version["name"] = "v1"
    async with running_api([devices_crd.devices_crd(), kai_v1, report.crd()]) as k:
        client = Client(k.kubeconfig)
        await add_nodes(client, FLEET)
        async with running_operator(k, sink="node", topology=options(targets=("kai",))):
            await eventually(lambda: "nodefabric" in _all(k, "kai.scheduler/v1/topologies"))
            await settle(k)
        topo = _all(k, "kai.scheduler/v1/topologies")["nodefabric"]
        assert topo["apiVersion"] == "kai.scheduler/v1"
        assert levels(topo)[-2:] == [FABRIC, HOST]
        state = {t["name"]: t["state"] for t in _all(k, FT)["nodefabric"]["status"]["targets"]}["kai"]
        assert state.startswith("Topology nodefabric"), state


async def test_a_kueue_topology_deleted_behind_our_back_is_created_when_its_levels_next_change(
    api: RunningAPI,
) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options(targets=("kueue",))):
        await eventually(lambda: FABRIC in levels(_all(k, KUEUE_T).get("nodefabric")))
        await settle(k)
        k.api.remove_object(KUEUE_T, "nodefabric")
        await client.label_node("gpu-1", {LEAF: "leaf-2"})  # the fabric level leaves: the levels change
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T))
        await settle(k)
    assert FABRIC not in levels(_all(k, KUEUE_T)["nodefabric"])
    assert_valid(k, (KUEUE_T,))
    assert not _events(k, report.WRITE_FAILED)


async def test_a_fleet_that_never_goes_quiet_still_resyncs(api: RunningAPI) -> None:
    """Nodes flapping more often than the resync period must not starve it: an object deleted behind the
    operator's back comes back within about one period all the same."""
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options(targets=("kueue",), resync=1.0)):
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T))
        await settle(k)
        k.api.remove_object(KUEUE_T, "nodefabric")
        back = False
        for i in range(30):  # a level label changes every 0.2 s; the levels themselves stay as they are
            await client.label_node("gpu-3", {LEAF: f"leaf-{3 if i % 2 else 9}"})
            await asyncio.sleep(0.2)
            if "nodefabric" in _all(k, KUEUE_T):
                back = True
                break
        assert back, "the resync never ran while the fleet kept changing"


async def test_a_node_deleted_between_the_start_listing_and_kopfs_is_dropped_at_the_first_resync(
    api: RunningAPI,
) -> None:
    """The fleet is read once before kopf starts; a node deleted before kopf's own listing is never
    reported gone by kopf. Left in, its old labels could hold a level out as violating forever."""
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    proj = Projector(load_client(k.kubeconfig), options(targets=("kueue",), resync=0.5), Metrics())
    await asyncio.to_thread(proj.prime)
    assert set(proj.fleet) == set(FLEET)
    await asyncio.to_thread(client.core.delete_node, "gpu-3")
    # kopf's listing: every node still there, none of them changed.
    for name in FLEET:
        if name != "gpu-3":
            node = await asyncio.to_thread(client.core.read_node, name)
            proj.node_event(None, {"metadata": {"name": name, "labels": node.metadata.labels}})
    task = asyncio.create_task(proj.run())
    try:
        await eventually(lambda: "gpu-3" not in proj.fleet, timeout=10)
        await eventually(lambda: ZONE in levels(_all(k, KUEUE_T).get("nodefabric")))
        await eventually(lambda: proj.hierarchy is not None and proj.hierarchy.nodes == len(FLEET) - 1)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _volcano_writer(k: RunningAPI, said: list[Any]) -> Any:
    """The topology writer for Volcano alone, its Events kept in `said`."""
    from nodefabric_operator.topology.writer import Writer

    return Writer(
        load_client(k.kubeconfig),
        Metrics(),
        targets=("volcano",),
        name="nodefabric",
        owner=None,
        discovery_ttl=60,
        event=said.append,
    )


async def test_hypernodes_of_our_names_made_after_our_listing_are_kept_or_taken_on_create(
    api: RunningAPI,
) -> None:
    """Created between our listing and our create (another replica, Volcano's discovery): ours is brought
    to what the hierarchy yields through the one write path, someone else's is left alone and named by
    none of ours, and the pass fails nothing."""
    k = api
    said: list[Any] = []
    writer = _volcano_writer(k, said)
    # The writer's calls are synchronous (the shell runs them in a worker thread); so do these.
    await asyncio.to_thread(writer.discover)
    empty = check(default_levels(), {})
    assert await asyncio.to_thread(writer.write_target, project.VOLCANO, empty, {}) == "0 HyperNodes"
    hierarchy = check(default_levels(), FLEET)
    wanted = project.hypernodes(hierarchy, FLEET)
    stale = copy.deepcopy(wanted["region.eu-1"])
    stale["spec"]["members"] = stale["spec"]["members"][:1]
    k.api.put_object(HN, stale)  # ours, as an older pass of another replica left it
    theirs = {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": "fabric.nvl-a"},
        "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "gpu-0"}}}]},
    }
    k.api.put_object(HN, theirs)

    state = await asyncio.to_thread(writer.write_target, project.VOLCANO, hierarchy, FLEET)

    hns = _all(k, HN)
    final = project.hypernodes(hierarchy, FLEET, taken=frozenset({"fabric.nvl-a"}))
    assert hns["region.eu-1"]["spec"] == final["region.eu-1"]["spec"] != stale["spec"]
    assert hns["fabric.nvl-a"]["spec"] == theirs["spec"] and "labels" not in hns["fabric.nvl-a"]["metadata"]
    ours = {n: b for n, b in hns.items() if n != "fabric.nvl-a"}
    assert "fabric.nvl-a" not in _hn_parents(ours)
    assert "not managed by nodefabric: fabric.nvl-a" in state, state
    assert not writer.retry and not said
    assert_valid(k, ())


FOREIGN = "leaf.leaf-1"


async def test_a_hypernode_of_ours_replaced_by_someone_elses_is_never_patched_over(api: RunningAPI) -> None:
    """Ours was written and is known; by hand (or by Volcano's discovery) it is deleted and another
    HyperNode made under its name. The next change of its members must not patch their object: it is
    left alone, named by none of ours, and said in the state, as a name met taken on create is."""
    k = api
    said: list[Any] = []
    writer = _volcano_writer(k, said)
    await asyncio.to_thread(writer.discover)
    hierarchy = check(default_levels(), FLEET)
    await asyncio.to_thread(writer.write_target, project.VOLCANO, hierarchy, FLEET)
    assert project.is_managed(_all(k, HN)[FOREIGN])
    k.api.remove_object(HN, FOREIGN)
    theirs = {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": FOREIGN},
        "spec": {"tier": 2, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "gpu-0"}}}]},
    }
    k.api.put_object(HN, copy.deepcopy(theirs))
    grown = {
        **FLEET,
        "gpu-4": {**FLEET["gpu-1"], HOST: "gpu-4", FABRIC: "nvl-c"},
    }  # leaf.leaf-1 gains a fabric: its members change
    hierarchy = check(default_levels(), grown)

    state = await asyncio.to_thread(writer.write_target, project.VOLCANO, hierarchy, grown)

    hns = _all(k, HN)
    assert hns[FOREIGN]["spec"] == theirs["spec"] and "labels" not in hns[FOREIGN]["metadata"]
    ours = {n: b for n, b in hns.items() if n != FOREIGN}
    assert FOREIGN not in _hn_parents(ours)
    assert f"not managed by nodefabric: {FOREIGN}" in state, state
    # And nothing is written on a pass where nothing changed.
    writes = _writes(k, HN)
    await asyncio.to_thread(writer.write_target, project.VOLCANO, hierarchy, grown)
    assert _writes(k, HN) == writes


@pytest.mark.parametrize(("target", "key"), [("kueue", KUEUE_T), ("kai", KAI_T)])
async def test_a_topology_of_ours_replaced_by_someone_elses_is_never_written_over(
    api: RunningAPI, target: str, key: str
) -> None:
    """Ours deleted and someone else's made under its name since we wrote it, then the levels change: a
    patch for Kueue, and for KAI (whose levels never change in place) a delete and a create. Theirs is
    neither patched over nor the one deleted; it keeps its levels, and the state says why."""
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options(targets=(target,))):
        await eventually(lambda: FABRIC in levels(_all(k, key).get("nodefabric")))
        await settle(k)
        ours = _all(k, key)["nodefabric"]
        k.api.remove_object(key, "nodefabric")
        theirs = {
            "apiVersion": ours["apiVersion"],
            "kind": "Topology",
            "metadata": {"name": "nodefabric"},
            "spec": {"levels": [{"nodeLabel": ZONE}, {"nodeLabel": HOST}]},
        }
        k.api.put_object(key, copy.deepcopy(theirs))
        await client.label_node("gpu-1", {LEAF: "leaf-2"})  # the fabric level leaves: the levels change
        await eventually(
            lambda: "not managed by nodefabric" in str(_all(k, FT).get("nodefabric", {}).get("status"))
        )
        await settle(k)
    live = _all(k, key)["nodefabric"]
    assert live["spec"] == theirs["spec"] and not project.is_managed(live)
    assert not _events(k, report.REPLACED)


async def test_a_target_crd_deleted_and_installed_again_gets_its_objects_written_again(
    api: RunningAPI,
) -> None:
    """Volcano uninstalled (its CRD deleted, every HyperNode with it) and installed again: once discovery
    sees the CRD back, the next pass writes the HyperNodes again, not only the next resync (the writer
    must not keep believing in objects the CRD's deletion took)."""
    k = api
    proj = Projector(
        load_client(k.kubeconfig), options(targets=("volcano",), discovery_ttl=0, resync=3600), Metrics()
    )
    await asyncio.to_thread(proj.reconcile, FLEET)
    wanted = set(_all(k, HN))
    assert wanted
    ext = kubernetes.client.ApiextensionsV1Api(load_client(k.kubeconfig))
    volcano = crd(VOLCANO)
    await asyncio.to_thread(ext.delete_custom_resource_definition, volcano["metadata"]["name"])
    await asyncio.to_thread(proj.reconcile, FLEET)  # "CRD not served"
    k.api.declare_crd(volcano)
    assert _all(k, HN) == {}
    await asyncio.to_thread(proj.reconcile, FLEET)
    assert set(_all(k, HN)) == wanted


async def test_a_kai_topology_deleted_behind_our_back_is_created_without_a_failed_write(
    api: RunningAPI,
) -> None:
    """The replace's delete meeting an object already gone is no failure: the Topology is created, and no
    Warning says a write failed."""
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options(targets=("kai",))):
        await eventually(lambda: FABRIC in levels(_all(k, KAI_T).get("nodefabric")))
        await settle(k)
        k.api.remove_object(KAI_T, "nodefabric")
        await client.label_node("gpu-1", {LEAF: "leaf-2"})
        await eventually(lambda: "nodefabric" in _all(k, KAI_T))
        await settle(k)
    assert FABRIC not in levels(_all(k, KAI_T)["nodefabric"])
    assert_valid(k, (KAI_T,))
    assert not _events(k, report.WRITE_FAILED)


async def test_a_hypernode_of_ours_replaced_by_someone_elses_is_never_deleted(api: RunningAPI) -> None:
    """Ours written and known; deleted by hand and another HyperNode made under its name; then its domain
    leaves the fleet. Theirs must stay."""
    k = api
    said: list[Any] = []
    writer = _volcano_writer(k, said)
    await asyncio.to_thread(writer.discover)
    await asyncio.to_thread(writer.write_target, project.VOLCANO, check(default_levels(), FLEET), FLEET)
    gone = "leaf.leaf-3"
    assert project.is_managed(_all(k, HN)[gone])
    k.api.remove_object(HN, gone)
    theirs = {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": gone},
        "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "gpu-9"}}}]},
    }
    k.api.put_object(HN, copy.deepcopy(theirs))
    smaller = {n: labs for n, labs in FLEET.items() if n != "gpu-3"}  # leaf-3's one node goes

    await asyncio.to_thread(writer.write_target, project.VOLCANO, check(default_levels(), smaller), smaller)

    hns = _all(k, HN)
    assert gone in hns and hns[gone]["spec"] == theirs["spec"] and not project.is_managed(hns[gone])
    assert "zone.eu-1b" not in hns  # ours of the same domain went as they should
    assert not writer.retry and not said


async def test_a_target_crd_deleted_between_two_discoveries_is_a_quiet_skip(api: RunningAPI) -> None:
    """Kueue uninstalled within the discovery period: the next write meets 404 for the resource itself.
    That is the target gone, said as its CRD not served, with no Warning of a failed write; discovery is
    read again at once rather than after its period."""
    k = api
    said: list[Any] = []
    from nodefabric_operator.topology.writer import Writer

    writer = Writer(
        load_client(k.kubeconfig),
        Metrics(),
        targets=("kueue",),
        name="nodefabric",
        owner=None,
        discovery_ttl=3600,
        event=said.append,
    )
    await asyncio.to_thread(writer.discover)
    await asyncio.to_thread(writer.write_target, project.KUEUE, check(default_levels(), FLEET), FLEET)
    assert "nodefabric" in _all(k, KUEUE_T)
    ext = kubernetes.client.ApiextensionsV1Api(load_client(k.kubeconfig))
    await asyncio.to_thread(ext.delete_custom_resource_definition, crd(KUEUE)["metadata"]["name"])
    split = {**FLEET, "gpu-1": {**FLEET["gpu-1"], LEAF: "leaf-2"}}  # the levels change: a write is due

    state = await asyncio.to_thread(writer.write_target, project.KUEUE, check(default_levels(), split), split)

    assert state == "CRD not served" and not said, (state, said)
    await asyncio.to_thread(writer.discover)
    assert writer.served[project.KUEUE] is None


async def test_a_hypernode_whose_managed_by_label_was_removed_is_never_deleted(api: RunningAPI) -> None:
    """`kubectl label hypernode leaf.leaf-3 app.kubernetes.io/managed-by-`: the same object (its uid
    unchanged), now someone else's. When its domain leaves the fleet it stays, as any object without
    the label does."""
    k = api
    said: list[Any] = []
    writer = _volcano_writer(k, said)
    await asyncio.to_thread(writer.discover)
    await asyncio.to_thread(writer.write_target, project.VOLCANO, check(default_levels(), FLEET), FLEET)
    kept = "leaf.leaf-3"
    custom = kubernetes.client.CustomObjectsApi(load_client(k.kubeconfig))
    await asyncio.to_thread(
        custom.patch_cluster_custom_object,
        "topology.volcano.sh",
        "v1alpha1",
        "hypernodes",
        kept,
        {"metadata": {"labels": {project.MANAGED_BY: None}}},
    )
    smaller = {n: labs for n, labs in FLEET.items() if n != "gpu-3"}

    await asyncio.to_thread(writer.write_target, project.VOLCANO, check(default_levels(), smaller), smaller)

    hns = _all(k, HN)
    assert kept in hns and not project.is_managed(hns[kept])
    assert "zone.eu-1b" not in hns
    assert not writer.retry and not said


async def test_a_node_deleted_while_the_watch_was_down_is_dropped(api: RunningAPI) -> None:
    """The Node watch drops and cannot resume (its resourceVersion compacted away: 410), so kopf lists
    again; a node deleted in between is simply absent from that listing, and kopf reports nothing of
    it. Kept, its old labels would hold its domains (or a violation) in the projections for ever."""
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options(targets=("volcano",), resync=1.0)):
        await eventually(lambda: "leaf.leaf-3" in _all(k, HN))
        await settle(k, 0.3)
        lists = k.count(resource="v1/nodes", verb="list")
        # Synchronous, so the operator's watch cannot come back in between: it resumes into a 410.
        k.api.close_watches()
        k.api.remove_object("v1/nodes", "gpu-3")
        k.api.compact()
        await eventually(lambda: k.count(resource="v1/nodes", verb="list") > lists)  # kopf listed again
        await eventually(lambda: "leaf.leaf-3" not in _all(k, HN) and "zone.eu-1b" not in _all(k, HN))
        await eventually(lambda: _all(k, FT)["nodefabric"]["status"]["nodes"] == len(FLEET) - 1)
    assert "leaf.leaf-1" in _all(k, HN)  # the nodes the listing reported stay


async def test_objects_written_after_the_owner_was_recreated_name_its_new_uid(api: RunningAPI) -> None:
    """The owner ClusterRole deleted and created again (`helm upgrade --force`, a GitOps replace): the
    garbage collector takes every object owned by the old uid, and the resync writes them again. Written
    naming the old uid, they would be collected again at once, every resync."""
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "nf-op"},
    }
    old = k.api.put_object(ROLES, copy.deepcopy(role))["metadata"]["uid"]
    async with running_operator(k, sink="node", topology=options(owner="nf-op", resync=1.0)):
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T) and "leaf.leaf-1" in _all(k, HN))
        # Synchronous, so the operator cannot read the owner in between.
        k.api.remove_object(ROLES, "nf-op")
        new = k.api.put_object(ROLES, copy.deepcopy(role))["metadata"]["uid"]
        assert new != old

        def owners() -> set[str]:
            """The owners named, once the garbage collector has done its part: a pass under way when the
            role was replaced may write an object naming the old uid, which a real cluster's collector
            removes as soon as it sees it (the emulator's collects only when an owner is deleted)."""
            uids: set[str] = set()
            for key in (KUEUE_T, KAI_T, HN):
                for name, obj in _all(k, key).items():
                    named = {r["uid"] for r in obj["metadata"].get("ownerReferences", [])}
                    if named and k.api.store.by_uid(next(iter(named))) is None:
                        k.api.remove_object(key, name)
                    uids |= named
            return uids

        await eventually(lambda: owners() == {new} and len(_all(k, HN)) == 10)


async def test_the_report_crd_deleted_between_two_discoveries_is_read_again_at_once(api: RunningAPI) -> None:
    """The FabricTopology CRD deleted (by hand, or a chart's CRD job gone wrong) within the discovery
    period: the report's write meets 404, and discovery is read again on the next pass rather than the
    report written, failed and retried until the period ends."""
    k = api
    from nodefabric_operator.topology.writer import Writer

    writer = Writer(
        load_client(k.kubeconfig),
        Metrics(),
        targets=(),
        name="nodefabric",
        owner=None,
        discovery_ttl=3600,
        event=lambda _: None,
    )
    await asyncio.to_thread(writer.discover)
    states = {t: "disabled by configuration" for t in project.TARGETS}
    await asyncio.to_thread(writer.write_report, check(default_levels(), FLEET), states)
    assert "nodefabric" in _all(k, FT)
    ext = kubernetes.client.ApiextensionsV1Api(load_client(k.kubeconfig))
    await asyncio.to_thread(ext.delete_custom_resource_definition, report.CRD_NAME)
    smaller = {n: labs for n, labs in FLEET.items() if n != "gpu-3"}  # the report's figures change

    await asyncio.to_thread(writer.write_report, check(default_levels(), smaller), states)
    await asyncio.to_thread(writer.discover)

    assert writer.served["report"] is None
