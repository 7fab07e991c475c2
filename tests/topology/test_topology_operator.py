"""End to end: the real operator (kopf) against the embedded API serving the Kueue, KAI and Volcano CRDs
(their schema facts, demo/targets/), a fleet with nodefabric, Topograph and cloud zone labels. Every object it
writes is checked against the targets' schemas and CEL rules; the fleet changes under it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from topology_fixtures import (
    FABRIC,
    HOST,
    KAI,
    KUEUE,
    KUEUE_V1BETA1_ONLY,
    LEAF,
    REGION,
    TIER1,
    VOLCANO,
    ZONE,
    crd,
    problems,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from operator_harness import Client, eventually, running_operator, settle

from nodefabric_devicemanager import crd as devices_crd
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.topology import report
from nodefabric_operator.topology.shell import TopologyOptions

KUEUE_T = "kueue.x-k8s.io/v1beta2/topologies"
KUEUE_T1 = "kueue.x-k8s.io/v1beta1/topologies"
KAI_T = "kai.scheduler/v1alpha1/topologies"
HN = "topology.volcano.sh/v1alpha1/hypernodes"
FT = f"{report.GROUP}/{report.VERSION}/{report.PLURAL}"
ROLES = "rbac.authorization.k8s.io/v1/clusterroles"
FILES = {KUEUE_T: KUEUE, KUEUE_T1: KUEUE_V1BETA1_ONLY, KAI_T: KAI, HN: VOLCANO}


def node_labels(n: int, *, fabric: str | None, leaf: str, spine: str, zone: str) -> dict[str, str]:
    out = {HOST: f"gpu-{n}", LEAF: leaf, TIER1: spine, ZONE: zone, REGION: "eu-1"}
    if fabric:
        out[FABRIC] = fabric
    return out


FLEET = {
    "gpu-0": node_labels(0, fabric="nvl-a", leaf="leaf-1", spine="sp-1", zone="eu-1a"),
    "gpu-1": node_labels(1, fabric="nvl-a", leaf="leaf-1", spine="sp-1", zone="eu-1a"),
    "gpu-2": node_labels(2, fabric="nvl-b", leaf="leaf-2", spine="sp-1", zone="eu-1a"),
    "gpu-3": node_labels(3, fabric=None, leaf="leaf-3", spine="sp-2", zone="eu-1b"),
}


@pytest.fixture
async def api() -> AsyncIterator[RunningAPI]:
    crds = [devices_crd.devices_crd(), crd(KUEUE), crd(KAI), crd(VOLCANO), report.crd()]
    async with running_api(crds) as k:
        k.api.declare(ROLES, kind="ClusterRole", namespaced=False)
        yield k


def _all(k: RunningAPI, key: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for obj in k.api.store.select(key):
        out[obj["metadata"]["name"]] = obj
    return out


def levels(obj: dict[str, Any] | None) -> list[str]:
    return [x["nodeLabel"] for x in (obj or {}).get("spec", {}).get("levels", [])]


def assert_valid(k: RunningAPI, keys: Iterable[str] = (KUEUE_T, KAI_T, HN)) -> None:
    for key in keys:
        for obj in _all(k, key).values():
            assert problems(obj, FILES[key]) == [], obj
            assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "nodefabric"


async def add_nodes(client: Client, fleet: dict[str, dict[str, str]]) -> None:
    for name, labels in fleet.items():
        await client.node(name, labels)


def options(**more: Any) -> TopologyOptions:
    return TopologyOptions(**{"debounce": 0.05, **more})


async def test_the_fleet_becomes_three_projections_kept_current_with_violations_left_out(
    api: RunningAPI,
) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options()) as metrics:
        want = [REGION, ZONE, TIER1, LEAF, FABRIC, HOST]
        await eventually(lambda: levels(_all(k, KUEUE_T).get("nodefabric")) == want)
        await eventually(lambda: levels(_all(k, KAI_T).get("nodefabric")) == want)
        await eventually(lambda: "fabric.nvl-a" in _all(k, HN))
        await settle(k)
        assert_valid(k)
        hns = _all(k, HN)
        assert sorted(hns) == [
            "fabric.nvl-a",
            "fabric.nvl-b",
            "leaf.leaf-1",
            "leaf.leaf-2",
            "leaf.leaf-3",
            "region.eu-1",
            "spine.sp-1",
            "spine.sp-2",
            "zone.eu-1a",
            "zone.eu-1b",
        ]
        assert hns["leaf.leaf-1"]["spec"] == {
            "tier": 1,
            "tierName": "leaf",
            "members": [{"type": "HyperNode", "selector": {"exactMatch": {"name": "fabric.nvl-a"}}}],
        }
        ft = _all(k, FT)["nodefabric"]["status"]
        assert ft["projected"] == "fabric,leaf,spine,zone,region" and ft["violations"] == 0
        assert {t["name"]: t["state"] for t in ft["targets"]}["kueue"].startswith("Topology nodefabric")

        # A change to a label no level reads writes nothing.
        before = k.count()
        writes = {key: _writes(k, key) for key in (KUEUE_T, KAI_T, HN, FT)}
        await client.label_node("gpu-0", {"example.com/unrelated": "x"})
        await settle(k)
        assert {key: _writes(k, key) for key in (KUEUE_T, KAI_T, HN, FT)} == writes
        assert k.count() - before < 10  # the label write and its watch event, nothing of ours

        # A node comes: its new leaf and fabric domain appear; nothing else is rewritten.
        await client.node("gpu-4", node_labels(4, fabric="nvl-c", leaf="leaf-4", spine="sp-2", zone="eu-1b"))
        await eventually(lambda: "fabric.nvl-c" in _all(k, HN) and "leaf.leaf-4" in _all(k, HN))
        await settle(k)
        assert _writes(k, KUEUE_T) == writes[KUEUE_T] and _writes(k, KAI_T) == writes[KAI_T]
        assert_valid(k)

        # A fabric domain across two leaves: reported, and the fabric level leaves every projection.
        uids = {key: _all(k, key)["nodefabric"]["metadata"]["uid"] for key in (KUEUE_T, KAI_T)}
        await client.label_node("gpu-1", {LEAF: "leaf-2"})
        await eventually(lambda: FABRIC not in levels(_all(k, KUEUE_T).get("nodefabric")))
        await eventually(lambda: not any(n.startswith("fabric.") for n in _all(k, HN)))
        await eventually(lambda: _all(k, FT)["nodefabric"]["status"]["violations"] == 1)
        await settle(k)
        assert_valid(k)
        # Kueue's levels changed in place (hostname last before and after); KAI's were replaced.
        assert _all(k, KUEUE_T)["nodefabric"]["metadata"]["uid"] == uids[KUEUE_T]
        assert _all(k, KAI_T)["nodefabric"]["metadata"]["uid"] != uids[KAI_T]
        ft = _all(k, FT)["nodefabric"]["status"]
        violation = [c for c in ft["conditions"] if c["type"] == "NestingViolation"]
        assert [c["reason"] for c in violation] == ["FabricSpansLeaf"]
        assert "nvl-a" in violation[0]["message"] and "gpu-1" in violation[0]["message"]
        fabric = next(lv for lv in ft["levels"] if lv["name"] == "fabric")
        assert fabric["state"] == "violating" and "left out" in fabric["reason"]
        warned = [e for e in _all(k, "v1/events").values() if e["reason"] == report.NOT_NESTED]
        assert len(warned) == 1 and "nvl-a" in warned[0]["message"] and warned[0]["type"] == "Warning"
        assert warned[0]["involvedObject"]["kind"] == "FabricTopology"
        replaced = [e for e in _all(k, "v1/events").values() if e["reason"] == report.REPLACED]
        assert [("kai" in e["message"]) for e in replaced] == [True], [e["message"] for e in replaced]
        assert metrics.topology_violations.labels(level="fabric")._value.get() == 1

        # It nests again: back in every projection, said in an Event.
        await client.label_node("gpu-1", {LEAF: "leaf-1"})
        await eventually(lambda: levels(_all(k, KUEUE_T).get("nodefabric")) == want)
        await eventually(lambda: "fabric.nvl-a" in _all(k, HN))
        await settle(k)
        assert [e["type"] for e in _all(k, "v1/events").values() if e["reason"] == report.NESTED_AGAIN] == [
            "Normal"
        ]
        assert metrics.topology_violations.labels(level="fabric")._value.get() == 0

        # A node goes: its domains go with it.
        await asyncio.to_thread(client.core.delete_node, "gpu-4")
        await eventually(lambda: "leaf.leaf-4" not in _all(k, HN) and "fabric.nvl-c" not in _all(k, HN))
        assert "spine.sp-2" in _all(k, HN)
        await settle(k)
        assert_valid(k)
        # No request touched a Devices record.
        assert k.count(resource="worker.gpustack.ai/v1alpha1/devices") == k.count(
            "GET", "worker.gpustack.ai/v1alpha1/devices"
        )


def _writes(k: RunningAPI, key: str) -> int:
    return sum(k.count(m, key) for m in ("POST", "PATCH", "PUT", "DELETE"))


async def test_uninstall_removes_every_object_through_the_owner(api: RunningAPI) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    role = await asyncio.to_thread(
        kubernetes.client.RbacAuthorizationV1Api(client.core.api_client).create_cluster_role,
        {"metadata": {"name": "nf-nodefabric-operator"}, "rules": []},
    )
    async with running_operator(k, sink="node", topology=options(owner="nf-nodefabric-operator")):
        await eventually(lambda: len(_all(k, HN)) == 10 and "nodefabric" in _all(k, FT))
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T) and "nodefabric" in _all(k, KAI_T))
        await settle(k)
        for key in (KUEUE_T, KAI_T, HN, FT):
            for obj in _all(k, key).values():
                (ref,) = obj["metadata"]["ownerReferences"]
                assert (ref["kind"], ref["name"], ref["uid"]) == (
                    "ClusterRole",
                    "nf-nodefabric-operator",
                    role.metadata.uid,
                )
    # helm uninstall deletes the ClusterRole; the garbage collector takes the rest.
    k.api.remove_object(ROLES, "nf-nodefabric-operator")
    await eventually(lambda: not any(_all(k, key) for key in (KUEUE_T, KAI_T, HN, FT)))


async def test_kueue_v1beta1_only_foreign_objects_and_disabled_targets() -> None:
    crds = [devices_crd.devices_crd(), crd(KUEUE_V1BETA1_ONLY), crd(KAI), crd(VOLCANO)]
    async with running_api(crds) as k:
        client = Client(k.kubeconfig)
        await add_nodes(client, FLEET)
        # Someone's own KAI Topology of our name, and a HyperNode we wrote before Volcano was turned off.
        k.api.put_object(
            KAI_T,
            {
                "apiVersion": "kai.scheduler/v1alpha1",
                "kind": "Topology",
                "metadata": {"name": "nodefabric"},
                "spec": {"levels": [{"nodeLabel": ZONE}]},
            },
        )
        k.api.put_object(
            HN,
            {
                "apiVersion": "topology.volcano.sh/v1alpha1",
                "kind": "HyperNode",
                "metadata": {"name": "leaf.old", "labels": {"app.kubernetes.io/managed-by": "nodefabric"}},
                "spec": {"tier": 0, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "x"}}}]},
            },
        )
        async with running_operator(k, sink="node", topology=options(targets=("kueue", "kai"))):
            await eventually(lambda: "nodefabric" in _all(k, KUEUE_T1))
            await eventually(lambda: not _all(k, HN))
            await settle(k)
            topo = _all(k, KUEUE_T1)["nodefabric"]
            assert topo["apiVersion"] == "kueue.x-k8s.io/v1beta1"
            assert problems(topo, KUEUE_V1BETA1_ONLY) == []
            assert levels(topo) == [REGION, ZONE, TIER1, LEAF, FABRIC, HOST]
            assert levels(_all(k, KAI_T)["nodefabric"]) == [ZONE]  # not ours: left alone
            # No FabricTopology CRD here: the operator goes on without its report.
            assert _writes(k, KAI_T) == 0


async def test_failed_writes_are_retried_and_deleted_objects_come_back_on_resync(api: RunningAPI) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    k.api.fail_next(3, 503)  # the first writes meet an outage
    async with running_operator(k, sink="node", topology=options(resync=1.0)):
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T) and len(_all(k, HN)) == 10)
        await eventually(lambda: "nodefabric" in _all(k, KAI_T) and "nodefabric" in _all(k, FT))
        failed = [e for e in _all(k, "v1/events").values() if e["reason"] == report.WRITE_FAILED]
        assert failed and "HTTP 503" in failed[0]["message"]
        # Someone deletes what we wrote: the next resync reads the targets again and writes it back.
        k.api.remove_object(KUEUE_T, "nodefabric")
        k.api.remove_object(HN, "leaf.leaf-1")
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T) and "leaf.leaf-1" in _all(k, HN))
        await settle(k)
        assert_valid(k)


def test_the_benchmark_runs_and_reports_its_figures() -> None:
    import subprocess

    bench = Path(__file__).resolve().parents[2] / "hack" / "bench_topology.py"
    result = subprocess.run(
        [sys.executable, str(bench), "--nodes", "400"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "projected fabric, leaf, spine, zone, region" in out
    assert "a label no level reads changes                0 writes" in out
    joined = next(line for line in out.splitlines() if "joins an existing domain" in line)
    assert "1 writes {'report': 1}" in joined


async def test_a_kueue_topology_without_hostname_last_is_replaced_and_said(api: RunningAPI) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    old = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "nodefabric", "labels": {"app.kubernetes.io/managed-by": "nodefabric"}},
        "spec": {"levels": [{"nodeLabel": ZONE}]},
    }
    before = k.api.put_object(KUEUE_T, old)
    async with running_operator(k, sink="node", topology=options(targets=("kueue",))):
        await eventually(lambda: levels(_all(k, KUEUE_T).get("nodefabric"))[-1:] == [HOST])
        await settle(k)
    new = _all(k, KUEUE_T)["nodefabric"]
    assert new["metadata"]["uid"] != before["metadata"]["uid"]
    assert problems(new, KUEUE, old=before) != []  # an update would have been refused: hence the replace
    (said,) = [e for e in _all(k, "v1/events").values() if e["reason"] == report.REPLACED]
    assert said["message"].startswith("kueue Topology nodefabric replaced") and ZONE in said["message"]
    # Nothing of a target the configuration leaves out is written.
    assert not _all(k, KAI_T) and not _all(k, HN)


async def test_a_hypernode_deleted_behind_our_back_is_created_when_it_next_changes(api: RunningAPI) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options()):
        await eventually(lambda: "leaf.leaf-1" in _all(k, HN))
        await settle(k)
        k.api.remove_object(HN, "leaf.leaf-1")
        await client.node("gpu-5", node_labels(5, fabric="nvl-z", leaf="leaf-1", spine="sp-1", zone="eu-1a"))
        await eventually(lambda: "leaf.leaf-1" in _all(k, HN))
        await settle(k)
    members = _all(k, HN)["leaf.leaf-1"]["spec"]["members"]
    assert {m["selector"]["exactMatch"]["name"] for m in members} == {"fabric.nvl-a", "fabric.nvl-z"}
    assert not [e for e in _all(k, "v1/events").values() if e["reason"] == report.WRITE_FAILED]


async def test_a_missing_owner_is_said_and_the_objects_are_written_unowned(api: RunningAPI, caplog) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="node", topology=options(owner="no-such-role")):
        await eventually(lambda: "nodefabric" in _all(k, KUEUE_T) and len(_all(k, HN)) == 10)
        await settle(k)
    assert all(
        "ownerReferences" not in o["metadata"] for key in (KUEUE_T, KAI_T, HN) for o in _all(k, key).values()
    )
    assert any("cannot read the owner ClusterRole" in r.getMessage() for r in caplog.records)


async def test_with_the_nodefeature_sink_the_operator_watches_nodes_for_the_topology_alone(
    api: RunningAPI,
) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    async with running_operator(k, sink="nodefeature", topology=options()):
        await eventually(lambda: len(_all(k, HN)) == 10 and "nodefabric" in _all(k, KAI_T))
        await client.label_node("gpu-3", {FABRIC: "nvl-d"})
        await eventually(lambda: "fabric.nvl-d" in _all(k, HN))
        await settle(k)
    assert_valid(k)
    # The Node watch reads; nothing of ours writes a Node or a NodeFeature without a Devices record.
    assert _writes(k, "v1/nodes") == len(FLEET) + 1  # the test's own creates and its one label
    assert _writes(k, "nfd.k8s-sigs.io/v1alpha1/nodefeatures") == 0
