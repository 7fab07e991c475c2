"""What the topology writer removes, and what it must never remove: Topologies of an earlier
`--topology-name` (ours beyond doubt only), a disabled target's objects, and objects read without a usable
resourceVersion; and a target CRD served only in versions the writer does not know. Against the real
operator, or its writer, and the embedded API; a concurrent writer is played by replacing an object
between the writer's read and its delete."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

from test_topology_operator import (
    FLEET,
    FT,
    HN,
    KAI_T,
    KUEUE_T,
    ROLES,
    Client,
    _all,
    add_nodes,
    api,
    eventually,
    levels,
    options,
    running_operator,
    settle,
)
from topology_fixtures import FABRIC, HOST, KUEUE, LEAF, ZONE, crd

from nodefabric_devicemanager import crd as devices_crd
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.levels import default_levels
from nodefabric_operator.topology.nesting import check
from nodefabric_operator.topology.writer import Writer

__all__ = ["api"]

MANAGED = {"app.kubernetes.io/managed-by": "nodefabric"}
IN_USE = "kueue.x-k8s.io/resource-in-use"  # Kueue's finalizer while a ResourceFlavor names the Topology


def _events(k: RunningAPI, reason: str) -> list[dict[str, Any]]:
    return [e for e in _all(k, "v1/events").values() if e["reason"] == reason]


def _role(k: RunningAPI, name: str) -> str:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}}
    uid: str = k.api.put_object(ROLES, role)["metadata"]["uid"]
    return uid


def _topology(
    api_version: str, name: str, *, labels: dict[str, str] | None = None, owner: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = dict(labels)
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "x", "uid": owner}
        ]
    return {
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": meta,
        "spec": {"levels": [{"nodeLabel": ZONE}, {"nodeLabel": HOST}]},
    }


def _writer(k: RunningAPI, targets: tuple[str, ...], said: list[Any], owner: str | None = None) -> Writer:
    return Writer(
        load_client(k.kubeconfig),
        Metrics(),
        targets=targets,
        name="nodefabric",
        owner=owner,
        discovery_ttl=3600,
        event=said.append,
    )


def _replaced_before_delete(k: RunningAPI, writer: Writer, key: str, victims: set[str]) -> None:
    """Someone else's object made under the name of each of `victims` just before the writer's delete of
    it reaches the server: what a precondition on the version the writer read must protect."""
    real: Callable[..., Any] = writer.objects.custom.delete_cluster_custom_object

    def delete(group: str, version: str, plural: str, name: str, **kwargs: Any) -> Any:
        if name in victims:
            victims.discard(name)
            live = k.api.stored(key, name)
            assert live is not None
            k.api.remove_object(key, name)
            theirs = copy.deepcopy(live)
            theirs["metadata"] = {"name": name}  # no label, no owner: someone else's
            k.api.put_object(key, theirs)
        return real(group, version, plural, name, **kwargs)

    writer.objects.custom.delete_cluster_custom_object = delete  # type: ignore[method-assign]


# --- 1. Topologies of an earlier name ---------------------------------------------------------------------


async def test_a_renamed_topology_leaves_nothing_of_ours_behind_and_nothing_of_anyone_elses(
    api: RunningAPI,
) -> None:
    k = api
    client = Client(k.kubeconfig)
    await add_nodes(client, FLEET)
    uid = _role(k, "nf-op")
    async with running_operator(k, sink="node", topology=options(owner="nf-op", name="gpu-old")):
        await eventually(lambda: "gpu-old" in _all(k, KUEUE_T) and "gpu-old" in _all(k, KAI_T))
        await settle(k)
    # Labelled ours but owned by nobody, or by another owner; owned by us but not labelled: not provably
    # ours, so they stay whatever their names.
    other = _role(k, "someone-else")
    kueue_v, kai_v = _all(k, KUEUE_T)["gpu-old"]["apiVersion"], _all(k, KAI_T)["gpu-old"]["apiVersion"]
    theirs = {
        "copied-label": _topology(kueue_v, "copied-label", labels=MANAGED),
        "other-owner": _topology(kueue_v, "other-owner", labels=MANAGED, owner=other),
        "unlabelled": _topology(kueue_v, "unlabelled", owner=uid),
    }
    for body in theirs.values():
        k.api.put_object(KUEUE_T, copy.deepcopy(body))
    k.api.put_object(KAI_T, _topology(kai_v, "copied-label", labels=MANAGED))

    # `helm upgrade --set operator.topology.name=nodefabric`: the operator starts under the new name.
    async with running_operator(k, sink="node", topology=options(owner="nf-op", resync=1.0)):
        # Each target's Topology of the earlier name goes just before its own is written.
        await eventually(
            lambda: all(
                "nodefabric" in _all(k, key) and "gpu-old" not in _all(k, key) for key in (KUEUE_T, KAI_T)
            )
        )
        # One of ours under another name appearing later (a second release's leftovers restored from a
        # backup, say) goes at the next resync.
        k.api.put_object(KAI_T, _topology(kai_v, "restored", labels=MANAGED, owner=uid))
        await eventually(lambda: "restored" not in _all(k, KAI_T))
        await settle(k)

    assert {n: o["spec"] for n, o in _all(k, KUEUE_T).items() if n != "nodefabric"} == {
        n: b["spec"] for n, b in theirs.items()
    }
    assert set(_all(k, KAI_T)) == {"nodefabric", "copied-label"}
    said = sorted(e["message"] for e in _events(k, report.REMOVED))
    assert said == [
        "kai Topology gpu-old deleted: nodefabric writes its topology as nodefabric now",
        "kai Topology restored deleted: nodefabric writes its topology as nodefabric now",
        "kueue Topology gpu-old deleted: nodefabric writes its topology as nodefabric now",
    ], said


async def test_a_topology_of_an_earlier_name_replaced_after_it_was_listed_is_left_alone(
    api: RunningAPI,
) -> None:
    """Listed as ours, then deleted and another made under its name before the delete arrives: the
    delete names the version listed, so theirs stays; ours of another name listed with it still goes."""
    k = api
    uid = _role(k, "nf-op")
    for name in ("gpu-old", "gpu-older"):
        k.api.put_object(KUEUE_T, _topology("kueue.x-k8s.io/v1beta2", name, labels=MANAGED, owner=uid))
    said: list[Any] = []
    writer = _writer(k, ("kueue",), said, owner="nf-op")
    await asyncio.to_thread(writer.discover)
    await asyncio.to_thread(writer.read_owner)
    _replaced_before_delete(k, writer, KUEUE_T, {"gpu-old"})

    state = await asyncio.to_thread(writer.write_target, project.KUEUE, check(default_levels(), FLEET), FLEET)

    live = _all(k, KUEUE_T)
    assert set(live) == {"gpu-old", "nodefabric"}, set(live)
    assert not project.is_managed(live["gpu-old"])
    assert state.startswith("Topology nodefabric"), state
    assert [n.message for n in said if n.reason == report.REMOVED] == [
        "kueue Topology gpu-older deleted: nodefabric writes its topology as nodefabric now"
    ]
    # Changed since listed: listed again on the next pass (never read by name: the chart's get is
    # limited to the configured name), which finds it no longer ours and leaves it for good.
    assert writer.retry
    writer.retry = False
    await asyncio.to_thread(writer.write_target, project.KUEUE, check(default_levels(), FLEET), FLEET)
    assert set(_all(k, KUEUE_T)) == {"gpu-old", "nodefabric"}
    assert len([n for n in said if n.reason == report.REMOVED]) == 1
    assert not writer.retry


async def test_a_topology_of_an_earlier_name_held_by_its_finalizer_is_deleted_and_said_once(
    api: RunningAPI,
) -> None:
    """A ResourceFlavor still names the old Topology, so Kueue's finalizer keeps it after the delete: the
    resync must not delete it, nor say so, again."""
    k = api
    uid = _role(k, "nf-op")
    old = _topology("kueue.x-k8s.io/v1beta2", "gpu-old", labels=MANAGED, owner=uid)
    old["metadata"]["finalizers"] = [IN_USE]
    k.api.put_object(KUEUE_T, old)
    said: list[Any] = []
    writer = _writer(k, ("kueue",), said, owner="nf-op")
    hierarchy = check(default_levels(), FLEET)
    for _ in range(2):  # the start, and a resync
        await asyncio.to_thread(writer.discover)
        await asyncio.to_thread(writer.read_owner)
        await asyncio.to_thread(writer.write_target, project.KUEUE, hierarchy, FLEET)
        writer.forget()

    assert _all(k, KUEUE_T)["gpu-old"]["metadata"].get("deletionTimestamp")
    assert [r.name for r in k.requests("DELETE", KUEUE_T)] == ["gpu-old"]
    assert [n.reason for n in said] == [report.REMOVED]


# --- 2. A disabled target's objects -----------------------------------------------------------------------


async def test_a_disabled_targets_object_replaced_after_it_was_read_is_left_alone(api: RunningAPI) -> None:
    k = api
    said: list[Any] = []
    writer = _writer(k, (), said)
    hierarchy = check(default_levels(), FLEET)
    await asyncio.to_thread(writer.discover)
    for target in (project.KUEUE, project.VOLCANO):  # written while the targets were on
        earlier = _writer(k, (target,), [])
        await asyncio.to_thread(earlier.discover)
        await asyncio.to_thread(earlier.write_target, target, hierarchy, FLEET)
    assert "nodefabric" in _all(k, KUEUE_T) and {"leaf.leaf-1", "leaf.leaf-2"} <= set(_all(k, HN))
    _replaced_before_delete(k, writer, HN, {"leaf.leaf-1"})
    _replaced_before_delete(k, writer, KUEUE_T, {"nodefabric"})

    await asyncio.to_thread(writer.clean_disabled)

    assert set(_all(k, HN)) == {"leaf.leaf-1"} and not project.is_managed(_all(k, HN)["leaf.leaf-1"])
    assert set(_all(k, KUEUE_T)) == {"nodefabric"} and not project.is_managed(_all(k, KUEUE_T)["nodefabric"])


# --- 3. A CRD served only in versions the writer does not know --------------------------------------------


async def test_a_kueue_crd_served_only_in_a_newer_version_is_said_and_nothing_is_written() -> None:
    newer = copy.deepcopy(crd(KUEUE))
    newer["spec"]["versions"] = [v for v in newer["spec"]["versions"] if v["name"] == "v1beta2"]
    newer["spec"]["versions"][0]["name"] = "v1beta3"
    async with running_api([devices_crd.devices_crd(), newer, report.crd()]) as k:
        client = Client(k.kubeconfig)
        await add_nodes(client, FLEET)
        async with running_operator(k, sink="node", topology=options(targets=("kueue",), resync=1.0)):
            await eventually(lambda: "nodefabric" in _all(k, FT))
            await asyncio.sleep(1.5)  # a resync: said once all the same
            await settle(k)
        state = {t["name"]: t["state"] for t in _all(k, FT)["nodefabric"]["status"]["targets"]}["kueue"]
        assert state == "CRD served in v1beta3; nodefabric writes v1beta2, v1beta1: nothing written", state
        (said,) = _events(k, report.VERSION_UNSUPPORTED)
        assert said["type"] == "Warning"
        assert said["message"] == (
            "kueue: the topologies.kueue.x-k8s.io CRD is served in v1beta3, and nodefabric writes "
            "v1beta2, v1beta1 only: nothing written"
        ), said["message"]
        assert not _all(k, "kueue.x-k8s.io/v1beta3/topologies")
        assert k.count("POST", "kueue.x-k8s.io/v1beta3/topologies") == 0


# --- 4. No delete without a resourceVersion string --------------------------------------------------------


def _answers_without_a_version(writer: Writer, method: str, version: Any) -> None:
    """The writer's `method` answers as a broken proxy or API server might: resourceVersion `version`
    (None: absent)."""
    real: Callable[..., Any] = getattr(writer.objects.custom, method)

    def call(*args: Any, **kwargs: Any) -> Any:
        got = real(*args, **kwargs)
        if isinstance(got, dict):
            got = copy.deepcopy(got)
            got["metadata"].pop("resourceVersion", None)
            if version is not None:
                got["metadata"]["resourceVersion"] = version
        return got

    setattr(writer.objects.custom, method, call)


SPLIT = {**FLEET, "gpu-1": {**FLEET["gpu-1"], LEAF: "leaf-2"}}  # the fabric level leaves: KAI replaces


async def test_a_topology_created_without_a_version_is_read_again_before_its_replace(api: RunningAPI) -> None:
    """The create answered without a resourceVersion; ours then deleted and theirs made under the name.
    The replace must not delete blind: theirs is read, found theirs, and left alone."""
    k = api
    said: list[Any] = []
    writer = _writer(k, ("kai",), said)
    await asyncio.to_thread(writer.discover)
    _answers_without_a_version(writer, "create_cluster_custom_object", None)
    await asyncio.to_thread(writer.write_target, project.KAI, check(default_levels(), FLEET), FLEET)
    assert FABRIC in levels(_all(k, KAI_T)["nodefabric"])
    theirs = _topology("kai.scheduler/v1alpha1", "nodefabric")
    k.api.remove_object(KAI_T, "nodefabric")
    k.api.put_object(KAI_T, copy.deepcopy(theirs))

    state = await asyncio.to_thread(writer.write_target, project.KAI, check(default_levels(), SPLIT), SPLIT)

    assert _all(k, KAI_T)["nodefabric"]["spec"] == theirs["spec"]
    assert state == "topologies nodefabric exists and is not managed by nodefabric: left alone", state


async def test_a_topology_of_ours_read_with_a_garbage_version_is_not_deleted_and_said(
    api: RunningAPI,
) -> None:
    k = api
    said: list[Any] = []
    writer = _writer(k, ("kai",), said)
    await asyncio.to_thread(writer.discover)
    _answers_without_a_version(writer, "create_cluster_custom_object", None)
    await asyncio.to_thread(writer.write_target, project.KAI, check(default_levels(), FLEET), FLEET)
    before = _all(k, KAI_T)["nodefabric"]
    _answers_without_a_version(writer, "get_cluster_custom_object", 41)  # a number, not a string

    state = await asyncio.to_thread(writer.write_target, project.KAI, check(default_levels(), SPLIT), SPLIT)

    assert _all(k, KAI_T)["nodefabric"] == before  # not deleted, not written
    assert state.startswith("write failed: topologies nodefabric read without a resourceVersion"), state
    assert [n.reason for n in said] == [report.WRITE_FAILED] and writer.retry
