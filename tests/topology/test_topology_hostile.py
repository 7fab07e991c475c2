"""Hostile cases against the real operator and the embedded API: what the targets' own controllers do to
the objects (Kueue's finalizer on a Topology a ResourceFlavor names), and objects of our names that are
someone else's."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes
from test_topology_operator import (
    FLEET,
    FT,
    HN,
    KUEUE_T,
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
from topology_fixtures import HOST, ZONE

from nodefabric_operator.demo.kubeapi import RunningAPI
from nodefabric_operator.topology import report

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
