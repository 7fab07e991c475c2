"""Whole groups or nothing, under every policy (ADR-0004): place, wait or never fits, over real HTTP.

The first pod of a group passes only when one bucket holds every remaining pod now. Otherwise the group
waits (empty NodeNames, FailedNodes with stable reasons, no Error), or, when no set of nodes of the
whole cluster could ever hold it (counting only nodes its pods may use, as if empty), every node is
FailedAndUnresolvable with "never fits" and the pod gets a Warning Event.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from extender_fixtures import PRODUCT, Recorder, explicit, extender, filter_, fleet, node, pod

GROUP = "ml/explicit/train"
OF_ONE = f" of one {PRODUCT}"


def names(nodes: list[dict[str, Any]]) -> list[str]:
    return [n["metadata"]["name"] for n in nodes]


def busy(on: str, gpus: int = 8) -> dict[str, Any]:
    return pod(f"busy-{on}", namespace="other", gpus=gpus, node_name=on, phase="Running")


def group(size: int, *, gpus: int = 8, name: str = "train", **ann: str) -> list[dict[str, Any]]:
    return [pod(f"{name}-{i}", gpus=gpus, **explicit(name, size, **ann)) for i in range(size)]


@pytest.mark.parametrize("locality", ["prefer", "any", "zone"])
async def test_a_group_that_fits_only_in_part_waits_under_every_policy(locality: str):
    nodes = [node(f"n-{i}", zone="z", region="r") for i in range(5)]
    events = Recorder()
    # Two of the five nodes are busy: 3 of the 5 pods would fit now, all 5 once they free up.
    async with extender([*nodes, busy("n-3"), busy("n-4")], publisher=events) as client:
        first = group(5, locality=locality)[0]
        for _ in range(3):  # kube-scheduler retries: the same answer, one Event
            result = await filter_(client, first, ["n-0", "n-1", "n-2"])
            assert result["NodeNames"] == [] and result["Error"] == ""
            assert result["FailedAndUnresolvableNodes"] == {}
            bucket = {"prefer": "set of nodes", "any": "set of nodes", "zone": "zone"}[locality]
            assert result["FailedNodes"] == dict.fromkeys(
                ["n-0", "n-1", "n-2"],
                f"group {GROUP} waits for one {bucket} of one {PRODUCT} with room for 5 pods",
            )
        assert [e[1:3] for e in events.events] == [("Normal", "GroupWaiting")]
        (groups,) = await (await client.get("/debug/groups")).json()
        assert groups["outcome"] == "wait" and groups["claims"] == []
        # The busy nodes free up: now the whole group fits and the same pod passes.
        result = await filter_(client, first, names(nodes))
        assert sorted(result["NodeNames"]) == names(nodes)


async def test_prefer_never_fits_when_the_whole_cluster_could_never_hold_the_group():
    nodes = [node(f"n-{i}", zone=f"z{i}", region=f"r{i}") for i in range(3)]
    events = Recorder()
    async with extender(nodes, publisher=events) as client:
        result = await filter_(client, group(5)[0], names(nodes))
        assert result["NodeNames"] == [] and result["FailedNodes"] == {} and result["Error"] == ""
        reason = f"never fits: no set of nodes of one {PRODUCT} can hold the 5 pods of group {GROUP}"
        assert result["FailedAndUnresolvableNodes"] == dict.fromkeys(names(nodes), reason)
        [(name, type_, why, message)] = events.events
        assert (name, type_, why) == ("train-0", "Warning", "GroupNeverFits")
        assert message == f"{reason} (largest holds 3, counting every node the pods may use as empty)"


async def test_nodes_the_cache_does_not_know_yet_make_the_group_wait_not_never_fit():
    nodes = [node(f"n-{i}", zone="z", region="r") for i in range(3)]
    events = Recorder()
    async with extender(nodes, publisher=events) as client:
        # kube-scheduler already knows two nodes that joined a moment ago; the node watch has not
        # delivered them. They may hold the rest of the group: the extender cannot say "never".
        result = await filter_(client, group(5)[0], [*names(nodes), "new-0", "new-1"])
        assert result["NodeNames"] == [] and result["FailedAndUnresolvableNodes"] == {}
        assert result["FailedNodes"] == {
            **dict.fromkeys(
                names(nodes), f"group {GROUP} waits for one set of nodes{OF_ONE} with room for 5 pods"
            ),
            **dict.fromkeys(["new-0", "new-1"], "node is not in the extender's node cache yet"),
        }
        assert [e[1:3] for e in events.events] == [("Normal", "GroupWaiting")]


async def test_two_pods_per_node_count_as_two():
    nodes = [node(f"n-{i}", zone="z") for i in range(3)]
    async with extender(nodes) as client:
        # 4-GPU pods on 8-GPU nodes: 3 nodes hold 6 pods, so a group of 6 fits and one of 7 never does.
        assert len((await filter_(client, group(6, gpus=4)[0], names(nodes)))["NodeNames"]) == 3
        result = await filter_(client, group(7, gpus=4, name="big")[0], names(nodes))
        assert len(result["FailedAndUnresolvableNodes"]) == 3


# "Never fits" counts only nodes the pods may use, as kube-scheduler would judge them were they empty.


def _unusable_by_rule() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(case, what the two extra nodes carry, what the group's pods carry): without the extra nodes the
    group of 4 cannot be held; with them it can, unless the rule excludes them."""
    return [
        ("node selector", {"labels": {"pool": "b"}}, {"nodeSelector": {"pool": "a"}}),
        ("required node affinity", {"labels": {"pool": "b"}}, {"affinity": required("pool", "In", "a")}),
        (
            "untolerated NoSchedule taint",
            {"taints": [{"key": "t", "value": "x", "effect": "NoSchedule"}]},
            {},
        ),
        ("untolerated NoExecute taint", {"taints": [{"key": "t", "effect": "NoExecute"}]}, {}),
        (
            "a taint value a Gt toleration does not reach",
            {"taints": [{"key": "sla", "value": "950", "effect": "NoSchedule"}]},
            {"tolerations": [{"key": "sla", "operator": "Gt", "value": "990"}]},
        ),
        ("allocatable below one pod", {"gpus": 4}, {}),
    ]


def required(key: str, operator: str, *values: str) -> dict[str, Any]:
    """A required node affinity of one expression."""
    expression = {"key": key, "operator": operator, "values": list(values)}
    terms = {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}


def _extra(name: str, carry: dict[str, Any]) -> dict[str, Any]:
    n = node(name, zone="z", gpus=carry.get("gpus", 8), labels=carry.get("labels"))
    if "taints" in carry:
        n["spec"]["taints"] = carry["taints"]
    return n


def _id(value: Any) -> str:
    return value if isinstance(value, str) else ""


async def _two_usable_two_extra(carry: Any, spec: Any) -> dict[str, Any]:
    """A group of 4 on two nodes it may use, beside two more that carry `carry`; the pods carry `spec`.
    kube-scheduler passes only the two; they hold 2 of the 4 pods."""
    base = [node(f"a-{i}", zone="z", labels={"pool": "a"}) for i in range(2)]
    extra = [_extra(f"x-{i}", carry) for i in range(2)]
    p = group(4)[0]
    p["spec"].update(spec)
    async with extender(base + extra) as client:
        return await filter_(client, p, names(base))


@pytest.mark.parametrize(("case", "carry", "spec"), _unusable_by_rule(), ids=_id)
async def test_never_fits_counts_only_nodes_the_pods_may_use(case: str, carry: Any, spec: Any):
    result = await _two_usable_two_extra(carry, spec)
    assert (
        list(result["FailedAndUnresolvableNodes"].values())
        == [f"never fits: no set of nodes of one {PRODUCT} can hold the 4 pods of group {GROUP}"] * 2
    ), case


@pytest.mark.parametrize(
    ("case", "carry", "spec"),
    [
        ("tolerated taint", {"taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]},
         {"tolerations": [{"key": "team", "operator": "Equal", "value": "x", "effect": "NoSchedule"}]}),
        ("tolerate everything", {"taints": [{"key": "team", "effect": "NoExecute"}]},
         {"tolerations": [{"operator": "Exists"}]}),
        ("a Gt toleration below the taint's value", {"taints": [
            {"key": "sla", "value": "950", "effect": "NoSchedule"}]},
         {"tolerations": [{"key": "sla", "operator": "Gt", "value": "900"}]}),
        ("PreferNoSchedule never blocks", {"taints": [{"key": "team", "effect": "PreferNoSchedule"}]}, {}),
        ("a condition taint passes with the condition", {"taints": [
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}, {}),
        ("affinity NotIn admits an absent label", {}, {"affinity": required("pool", "NotIn", "c")}),
    ],
    ids=_id,
)  # fmt: skip
async def test_nodes_the_pods_may_use_make_the_group_wait_not_never_fit(case, carry, spec):
    result = await _two_usable_two_extra(carry, spec)
    assert result["FailedAndUnresolvableNodes"] == {}, case
    assert set(result["FailedNodes"].values()) == {
        f"group {GROUP} waits for one set of nodes of one {PRODUCT} with room for 4 pods"
    }


async def test_later_pods_follow_the_groups_claim():
    nodes = [node(f"a-{i}", zone="eu-a", region="eu") for i in range(3)] + [
        node(f"b-{i}", zone="eu-b", region="eu") for i in range(4)
    ]
    pods = group(3)
    async with extender(nodes) as client:
        first = await filter_(client, pods[0], names(nodes))
        assert sorted(first["NodeNames"]) == ["a-0", "a-1", "a-2"]
        # Not yet bound, the first pod's claim holds the group to eu-a: the second pod is not sent to
        # eu-b even though eu-b alone could now hold the whole group.
        second = await filter_(client, pods[1], ["a-1", "a-2", *names(nodes)[3:]])
        assert sorted(second["NodeNames"]) == ["a-1", "a-2"]
        assert set(second["FailedNodes"].values()) == {"outside zone eu-a of the group"}
        (g,) = await (await client.get("/debug/groups")).json()
        assert g["claims"] == sorted(p["metadata"]["uid"] for p in pods[:2])


def two_zones() -> list[dict[str, Any]]:
    return [node(f"a-{i}", zone="eu-a", region="eu") for i in range(2)] + [
        node(f"b-{i}", zone="eu-b", region="eu") for i in range(2)
    ]


@pytest.mark.parametrize("locality", ["prefer", "zone"])
async def test_a_group_whose_claims_expired_unbound_must_fit_whole_again(locality: str):
    nodes = two_zones()
    now = [1_800_000_000.0]
    pods = group(2, locality=locality)
    # The group's pods are in the cache, as the pod watch shows them: pending, none bound.
    async with extender([*nodes, *pods], clock=lambda: now[0]) as client:
        first = await filter_(client, pods[0], names(nodes))
        assert sorted(first["NodeNames"]) == ["a-0", "a-1"]
        # train-0 was never bound (kube-scheduler failed it after us) and its claim expired; meanwhile
        # a-0 was taken. Nothing of the group holds room, so the next pod is its first again: eu-a
        # holds one pod now, eu-b both, and the pod is not let alone into eu-a.
        now[0] += 301
        second = await filter_(client, pods[1], ["a-1", "b-0", "b-1"])
        assert sorted(second["NodeNames"]) == ["b-0", "b-1"]
        assert second["FailedNodes"] == {"a-1": "outside zone eu-b of the group"}
        (g,) = await (await client.get("/debug/groups")).json()
        assert g["location"] == "eu-b" and g["claims"] == [pods[1]["metadata"]["uid"]]


async def test_a_restarted_job_does_not_follow_its_finished_incarnation_into_a_full_zone():
    nodes = two_zones()
    # A JobSet restarted: the failed pods of its first run still exist, bound in eu-a; the new run's
    # pods have the same group. eu-a now holds one more pod only (a-0 is busy).
    old = []
    for i, p in enumerate(group(2, name="train", locality="zone")):
        p["metadata"]["name"] = f"train-old-{i}"
        p["spec"]["nodeName"], p["status"]["phase"] = f"a-{i}", "Failed"
        old.append(p)
    new = group(2, locality="zone")
    async with extender([*nodes, *old, *new, busy("a-0")]) as client:
        result = await filter_(client, new[0], ["a-1", "b-0", "b-1"])
        assert sorted(result["NodeNames"]) == ["b-0", "b-1"]


async def test_an_unknown_value_never_satisfies_a_homogeneity_requirement():
    labelled = [node(f"h-{i}", zone="z", product="H100") for i in range(3)]
    bare = [node(f"u-{i}", zone="z") for i in range(3)]
    for n in bare:
        del n["metadata"]["labels"][PRODUCT]
    nodes = labelled + bare
    feasible = ["h-0", "h-1", "u-0", "u-1", "u-2"]  # h-2 is busy
    async with extender([*nodes, busy("h-2")]) as client:
        # A GPU group keeps to one GPU model: 3 nodes of unknown model are no set of one model, so the
        # group waits for h-2 ...
        result = await filter_(client, group(3)[0], feasible)
        assert result["FailedAndUnresolvableNodes"] == {}
        assert result["FailedNodes"] == {
            **dict.fromkeys(["u-0", "u-1", "u-2"], f"no {PRODUCT} label (group {GROUP} requires one)"),
            **dict.fromkeys(
                ["h-0", "h-1"], f"group {GROUP} waits for one set of nodes{OF_ONE} with room for 3 pods"
            ),
        }
        # ... and a group of 4 never fits: only 3 nodes have a known model.
        result = await filter_(client, group(4, name="big")[0], feasible)
        assert len(result["FailedAndUnresolvableNodes"]) == 5
        # Placed, the group's nodes share the model: the unknown ones are turned away.
        result = await filter_(client, group(2, name="two")[0], feasible)
        assert sorted(result["NodeNames"]) == ["h-0", "h-1"]
        assert result["FailedNodes"]["u-0"] == f"the group needs {PRODUCT}=H100"


async def test_a_cluster_without_gpu_labels_still_places_groups_that_ask_for_no_gpu():
    """kind, or a CPU-only cluster: no node carries a GPU model, and no group asks for a GPU."""
    nodes = [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"kind-worker{i}", "labels": {
            "kubernetes.io/hostname": f"kind-worker{i}", "kubernetes.io/os": "linux"}},
         "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}}
        for i in range(3)
    ]  # fmt: skip
    async with extender(nodes) as client:
        pods = [pod(f"w-{i}", **explicit("w", 3)) for i in range(3)]
        result = await filter_(client, pods[0], names(nodes))
        assert sorted(result["NodeNames"]) == names(nodes)
        (g,) = await (await client.get("/debug/groups")).json()
        assert g["outcome"] == "placed" and g["homogeneous"] == {}
        assert "3 of 3 pods of group ml/explicit/w go to any location (nodes kind-worker0" in g["summary"]


async def test_amd_groups_keep_to_one_amd_model_and_the_annotation_overrides_the_default():
    amd = "amd.com/gpu.product-name"
    nodes = []
    for i, model in enumerate(["MI300X", "MI300X", "MI250X", "MI250X", "MI250X"]):
        n = node(f"m-{i}", zone="z", labels={amd: model})
        n["status"]["allocatable"]["amd.com/gpu"] = "8"
        nodes.append(n)

    def amd_pod(name: str, size: int, **ann: str) -> dict[str, Any]:
        p = pod(f"{name}-0", **explicit(name, size, **ann))
        p["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] = "8"
        return p

    async with extender(nodes) as client:
        result = await filter_(client, amd_pod("amd", 3), names(nodes))
        assert sorted(result["NodeNames"]) == ["m-2", "m-3", "m-4"]
        assert result["FailedNodes"]["m-0"] == f"the group needs {amd}=MI250X"
        # Four pods: no model has four nodes. With homogeneity turned off for the group, all five qualify.
        assert (await filter_(client, amd_pod("four", 4), names(nodes)))["FailedAndUnresolvableNodes"]
        result = await filter_(client, amd_pod("mixed", 4, homogeneous=""), names(nodes))
        assert len(result["NodeNames"]) == 5


def kind_worker(name: str, zone: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": zone},
        },
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}},
    }


def cpu_pod(name: str, group: str, size: int, cpu: str | None) -> dict[str, Any]:
    p = pod(name, **explicit(group, size))
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}} if cpu else {}
    return p


async def test_pods_asking_no_accelerator_are_counted_by_cpu_memory_and_pod_slots():
    """The kind end-to-end's shape: 4 workers in 2 zones, pods asking for no GPU."""
    workers = [kind_worker(f"w{i}", f"zone-{i // 2}") for i in range(4)]
    names = [w["metadata"]["name"] for w in workers]
    idle = pod("idle", namespace="other", node_name="w0", phase="Running")
    idle["spec"]["containers"][0]["resources"] = {}
    async with extender([*workers, idle]) as client:
        # Eight pause pods (no requests): pod slots bound them, so one zone holds the whole group.
        result = await filter_(client, cpu_pod("pause-0", "pause", 8, None), names)
        assert sorted(result["NodeNames"]) == ["w0", "w1"]
        # Eight pods of 4 CPUs: two per 8-CPU node, so no zone (4) but the four nodes (8) hold them.
        result = await filter_(client, cpu_pod("cpu-0", "cpu", 8, "4"), names)
        assert sorted(result["NodeNames"]) == names
        # Nine never fit, counting every node empty.
        result = await filter_(client, cpu_pod("big-0", "big", 9, "4"), names)
        assert result["FailedAndUnresolvableNodes"]["w0"] == (
            "never fits: no set of nodes can hold the 9 pods of group ml/explicit/big"
        )
    busy = pod("busy", namespace="other", node_name="w0", phase="Running")  # 4 CPUs in use on w0
    async with extender([*workers, busy]) as client:
        result = await filter_(client, cpu_pod("cpu-0", "cpu", 8, "4"), names)
        assert result["NodeNames"] == []  # 7 of 8 fit now: the group waits
        assert set(result["FailedNodes"].values()) == {
            "group ml/explicit/cpu waits for one set of nodes with room for 8 pods"
        }


def _expected_reason(labels: dict[str, str], homog: list[tuple[str, str]], zone: str) -> str:
    """The reason a node outside the group's bucket gets, worked out node by node: the first homogeneity
    key whose value differs, else its zone."""
    for k, v in homog:
        if labels.get(k, "") != v:
            return f"the group needs {k}={v}"
    return f"outside zone {zone} of the group"


@pytest.mark.parametrize("homogeneous", [f"{PRODUCT},example.com/rev", "kubernetes.io/hostname"])
async def test_nodes_off_the_groups_values_get_the_same_reasons_in_a_mixed_fleet(homogeneous: str):
    """Three GPU models and a second key some nodes lack (and some nodes lack the model): every node
    turned away gets the reason a node-by-node walk gives, whether the reasons go by value tuple (many
    nodes per tuple) or node by node (a key as many-valued as the nodes)."""
    products = ["H100", "A100", "L40S"]
    nodes = []
    for i in range(60):
        labels = {"example.com/rev": f"r{i % 2}"} if i % 7 else {}
        n = node(f"n-{i:02d}", zone=f"z{i % 3}", region="r", product=products[i % 3], labels=labels)
        if i % 11 == 0:
            del n["metadata"]["labels"][PRODUCT]
        nodes.append(n)
    by_name = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    keys = homogeneous.split(",")
    async with extender(nodes) as client:
        size = 1 if homogeneous == "kubernetes.io/hostname" else 2
        first = pod("g-0", gpus=8, **explicit("g", size, homogeneous=homogeneous, locality="zone"))
        result = await filter_(client, first, names(nodes))
        allowed = result["NodeNames"]
        assert allowed
        sample = by_name[allowed[0]]
        homog = [(k, sample[k]) for k in keys]
        zone = sample["topology.kubernetes.io/zone"]
        expected = {
            name: _expected_reason(labels, homog, zone)
            for name, labels in by_name.items()
            if name not in allowed
        }
        assert result["FailedNodes"] == expected
        assert {r for r in expected.values() if r.startswith("the group needs")}, "no homogeneity reason"


async def test_an_invalid_placement_is_told_once_per_pod_and_shown_in_debug_groups():
    nodes = fleet(per_zone=1)
    names = [n["metadata"]["name"] for n in nodes]
    recorder = Recorder()
    async with extender(nodes, publisher=recorder) as client:
        bad = pod("bad-0", **explicit("g", 2, locality="closest"))
        for _ in range(3):  # kube-scheduler retries an unschedulable pod
            result = await filter_(client, bad, names)
            assert result["NodeNames"] == [] and set(result["FailedAndUnresolvableNodes"]) == set(names)
        other = pod("bad-1", **explicit("g", 2, locality="closest"))
        await filter_(client, other, names)

        told = [(name, type_, reason) for name, type_, reason, _ in recorder.events]
        assert told == [("bad-0", "Warning", "InvalidPlacement"), ("bad-1", "Warning", "InvalidPlacement")]
        assert "placement.gpustack.ai/locality 'closest' is not one of" in recorder.events[0][3]

        (group,) = await (await client.get("/debug/groups")).json()
        assert (group["group"], group["outcome"]) == ("ml/explicit/g", "invalid")
        assert group["summary"] == recorder.events[0][3]


async def test_a_bad_group_size_is_recorded_under_its_group():
    nodes = fleet(per_zone=1)
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        bad = pod("jb-0", labels={"batch.kubernetes.io/job-name": "jb"})
        bad["metadata"]["annotations"]["placement.gpustack.ai/group-size"] = "eight"
        await filter_(client, bad, names)
        (group,) = await (await client.get("/debug/groups")).json()
        assert (group["group"], group["outcome"]) == ("ml/job/jb", "invalid")
        assert "group-size: group size 'eight': not a plain ASCII decimal number" in group["summary"]


async def test_a_group_that_never_fits_is_logged_once_per_verdict_not_per_retry(caplog):
    nodes = fleet()  # 6 nodes per zone: no zone holds 7 one-node pods
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        with caplog.at_level(logging.WARNING, logger="nodefabric_operator.extender.service"):
            for i in range(3):
                p = pod(f"train-{i}", gpus=8, **explicit("train", 7, locality="zone"))
                for _ in range(2):
                    result = await filter_(client, p, names)
                    assert len(result["FailedAndUnresolvableNodes"]) == 30
    lines = [r for r in caplog.records if r.getMessage() == "group never fits"]
    assert len(lines) == 1
    assert "no zone of one nvidia.com/gpu.product can hold the 7 pods" in lines[0].__dict__["summary"]
