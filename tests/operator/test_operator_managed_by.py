"""NodeFeatures an operator made before it wrote the `app.kubernetes.io/managed-by=nodefabric` label:
ours (owned by their Devices record) but unmarked, so once their owners went they would be taken for a
user's. They got the label only at their next label change, which may never come. Now the first sync
after the start patches each such object once; one that carries it costs no request, as before."""

from __future__ import annotations

import copy

from operator_harness import DEVICES, NF, NS, Client, eventually, running_operator, settle, writes
from operator_records import gpu_record

from nodefabric_devicemanager import crd
from nodefabric_operator import sinks
from nodefabric_operator.demo.kubeapi import running_api

RECORDS = 6
OLD = ("n0", "n2", "n4")  # made before the label: stripped of it below


async def test_ours_without_the_managed_by_label_is_patched_once_at_start():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        for i in range(RECORDS):
            await c.node(f"n{i}")
            await c.put_devices(gpu_record(f"n{i}"))
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == RECORDS)
            await settle(k)
        for name in OLD:
            old = copy.deepcopy(k.api.stored(NF, name, NS))
            del old["metadata"]["labels"][sinks.MANAGED_BY]
            k.api.put_object(NF, old)
        before = {name: k.api.stored(NF, name, NS) for name in (f"n{i}" for i in range(RECORDS))}
        nf_writes, statuses = writes(k, NF), k.count("PATCH", DEVICES)
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="unchanged")._value.get() == RECORDS)
            await settle(k)
        patched = sorted(r.url.path.rsplit("/", 1)[-1] for r in k.requests("PATCH", NF))
        assert patched[-len(OLD) :] == sorted(OLD) and writes(k, NF) - nf_writes == len(OLD)
        assert k.count("PATCH", DEVICES) == statuses  # the labels did not change: nor did the status
        for i in range(RECORDS):
            nf = await c.nodefeature(f"n{i}")
            assert nf["metadata"]["labels"] == {sinks.NFD_NODE_NAME: f"n{i}", sinks.MANAGED_BY: sinks.MANAGER}
            assert nf["spec"] == before[f"n{i}"]["spec"]
            assert nf["metadata"]["ownerReferences"] == before[f"n{i}"]["metadata"]["ownerReferences"]
        # Every one marked now: a restart costs nothing.
        again = k.count()
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="unchanged")._value.get() == RECORDS)
            await settle(k)
        assert writes(k, NF) - nf_writes == len(OLD)
        assert k.count("PATCH", DEVICES) == statuses
        assert k.count() > again  # it ran (listed), and wrote nothing


async def test_a_foreign_nodefeature_without_the_label_is_left_alone():
    """Not ours (no owner of ours, no label): never patched to carry our label."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        foreign = {
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
            "kind": "NodeFeature",
            "metadata": {"name": "n0", "namespace": NS, "labels": {sinks.NFD_NODE_NAME: "n0"}},
            "spec": {"labels": {"x": "y"}},
        }
        k.api.put_object(NF, foreign)
        async with running_operator(k):

            async def refused() -> str:
                conds = (await c.devices("n0")).get("status", {}).get("conditions", [])
                return next((x["message"] for x in conds if x["type"] == "LabelsPublished"), "")

            assert "was not made by nodefabric" in await eventually(refused)
            await settle(k)
        assert writes(k, NF) == 0
        assert sinks.MANAGED_BY not in k.api.stored(NF, "n0", NS)["metadata"]["labels"]
