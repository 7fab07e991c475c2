"""The pure parts of group admission, by table: owner sizes, the size rule, the admission rule over
snapshots, and the pin/ungate patches."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest
from admission_world import GATE, fleet, gpod, job_pods

from nodefabric_operator.admission import model, owners, pins
from nodefabric_operator.admission.admit import Member, admit
from nodefabric_operator.admission.controller import BACKOFF_CAP_S, backoff_s
from nodefabric_operator.admission.owners import OwnerError, OwnerRef, Size, owner_size, resolve
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import group_of
from nodefabric_operator.extender.pods import pod_needs

CFG = ExtenderConfig()


def ref(kind: str) -> OwnerRef:
    return OwnerRef("g", "v1", kind.lower() + "s", kind, "ml", "x")


def meta(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "x"}, **obj}


# --- owner sizes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "obj", "size", "source"),
    [
        ("Job", {"spec": {"parallelism": 4}}, 4, "Job x: parallelism"),
        ("Job", {"spec": {}}, 1, "Job x: parallelism"),
        (
            "Job",
            {"spec": {"parallelism": 8, "completions": 4, "completionMode": "Indexed"}},
            4,
            "Job x: completions",
        ),
        (
            "Job",
            {"spec": {"parallelism": 2, "completions": 4, "completionMode": "Indexed"}},
            2,
            "Job x: parallelism",
        ),
        (
            "JobSet",
            {
                "spec": {
                    "replicatedJobs": [
                        {"replicas": 2, "template": {"spec": {"parallelism": 4}}},
                        {"template": {"spec": {}}},
                    ]
                }
            },
            9,
            "JobSet x: replicatedJobs",
        ),
        (
            "LeaderWorkerSet",
            {"spec": {"leaderWorkerTemplate": {"size": 4}}},
            4,
            "LeaderWorkerSet x: leaderWorkerTemplate.size",
        ),
        ("PodGroup", {"spec": {"minMember": 3}}, 3, "PodGroup x: minMember"),
        ("PodGroup", {"spec": {"schedulingPolicy": {"gang": {"minCount": 5}}}}, 5, "PodGroup x: minCount"),
        ("PodGroup", {"spec": {"minCount": 6}}, 6, "PodGroup x: minCount"),
        (
            "MPIJob",
            {"spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 8}}}},
            9,
            "MPIJob x: replica specs",
        ),
        (
            "PyTorchJob",
            {"spec": {"pytorchReplicaSpecs": {"Master": {}, "Worker": {"replicas": 3}}}},
            4,
            "PyTorchJob x: replica specs",
        ),
    ],
)
def test_owner_counts(kind: str, obj: dict[str, Any], size: int, source: str) -> None:
    assert owner_size(ref(kind), meta(obj, kind)) == (size, source)


@pytest.mark.parametrize(
    ("kind", "obj", "error"),
    [
        ("Job", {"spec": {"parallelism": "4"}}, "spec.parallelism must be an integer, got str"),
        ("Job", {"spec": {"parallelism": True}}, "spec.parallelism must be an integer, got bool"),
        ("Job", {"spec": {"parallelism": 4.0}}, "spec.parallelism must be an integer, got float"),
        ("Job", {"spec": {"parallelism": 0}}, "spec.parallelism must be between 1 and 100000, got 0"),
        ("Job", {"spec": {"parallelism": 10**30}}, "must be between 1 and 100000"),
        ("Job", {"spec": {"completionMode": "Indexed"}}, "spec.completions is not set"),
        ("Job", {"spec": []}, "spec must be an object, got list"),
        ("JobSet", {"spec": {"replicatedJobs": []}}, "spec.replicatedJobs must be a non-empty list"),
        ("JobSet", {"spec": {"replicatedJobs": ["x"]}}, "spec.replicatedJobs[0] must be an object, got str"),
        (
            "JobSet",
            {"spec": {"replicatedJobs": [{"replicas": 60000, "template": {"spec": {"parallelism": 60000}}}]}},
            "add up to 3600000000 pods",
        ),
        ("JobSet", {"spec": {"replicatedJobs": [{"replicas": 0}]}}, "add up to 0 pods"),
        ("LeaderWorkerSet", {"spec": {"leaderWorkerTemplate": {"size": -1}}}, "size must be between 1"),
        ("PodGroup", {"spec": {}}, "spec has neither minMember nor a gang minCount"),
        ("PodGroup", {"spec": {"minMember": None}}, "spec.minMember is not set"),
        ("MPIJob", {"spec": {}}, "spec has no ...ReplicaSpecs"),
        (
            "MPIJob",
            {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": "8"}}}},
            "replicas must be an integer",
        ),
    ],
)
def test_unreadable_owner_counts_are_errors_naming_the_field(
    kind: str, obj: dict[str, Any], error: str
) -> None:
    with pytest.raises(OwnerError, match=None) as exc:
        owner_size(ref(kind), meta(obj, kind))
    assert error in str(exc.value)


def test_garbage_owner_object_is_an_error() -> None:
    with pytest.raises(OwnerError):
        owner_size(ref("Job"), "garbage")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("owner", "problem", "declared", "expected"),
    [
        ((4, "Job t: parallelism"), "", [(2, "a"), (3, "b")], Size(4, "Job t: parallelism")),
        (None, "", [(2, "a"), (2, "b"), (None, "c")], Size(2, "declared by the members")),
        (
            None,
            "",
            [(2, "a"), (3, "b")],
            Size(None, "", "members declare different group sizes (a: 2, b: 3)"),
        ),
        (
            None,
            "",
            [(None, "a")],
            Size(None, "", "group size unknown: no owner states it and no member declares it"),
        ),
        (None, "Job ml/t not found", [], Size(None, "", "group size unknown: Job ml/t not found")),
    ],
)
def test_an_owner_count_wins_and_members_must_agree(owner, problem, declared, expected) -> None:
    assert resolve(owner, problem, declared) == expected


def test_owner_refs_by_family() -> None:
    def spec_and_ref(p: dict[str, Any]) -> OwnerRef | None:
        spec = group_of(p, CFG)
        assert spec is not None
        return owners.owner_ref(spec, p)

    assert spec_and_ref(job_pods("t", 1)[0]) == OwnerRef("batch", "v1", "jobs", "Job", "ml", "t")
    lws = gpod(
        "l-0",
        labels={"leaderworkerset.sigs.k8s.io/name": "l", "leaderworkerset.sigs.k8s.io/group-index": "2"},
    )
    assert spec_and_ref(lws) == OwnerRef(
        "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet", "ml", "l"
    )
    wl = gpod("w-0")
    wl["spec"]["schedulingGroup"] = {"podGroupName": "gang"}
    assert spec_and_ref(wl) == OwnerRef(
        "scheduling.k8s.io", "v1alpha1", "podgroups", "PodGroup", "ml", "gang"
    )
    mpi = gpod("m-0", labels={"training.kubeflow.org/job-name": "m"})
    mpi["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "m", "uid": "u", "controller": True}
    ]
    assert spec_and_ref(mpi) == OwnerRef("kubeflow.org", "v2beta1", "mpijobs", "MPIJob", "ml", "m")
    assert spec_and_ref(gpod("e", labels={"placement.gpustack.ai/group": "e"})) is None


def test_workload_ref_names_a_group_per_replica() -> None:
    p = gpod("w-0")
    p["spec"]["workloadRef"] = {"name": "wl", "podGroup": "workers", "podGroupReplicaKey": "1"}
    spec = group_of(p, CFG)
    assert spec is not None and spec.key == "ml/workload/workers/1"
    # Each replica is its own gang, sized by the one PodGroup `workers` they all name.
    assert owners.owner_ref(spec, p) == OwnerRef(
        "scheduling.k8s.io", "v1alpha1", "podgroups", "PodGroup", "ml", "workers"
    )
    p["spec"]["workloadRef"] = {"podGroup": 7}  # garbage: not a group
    assert group_of(p, CFG) is None


def test_a_replica_of_one_pod_group_and_a_pod_group_named_like_it_are_two_groups() -> None:
    """PodGroup `a` replica `b`, and a PodGroup `a-b`: two gangs, two keys and two PlacementGroups (the
    key joined them with "-", and the two were one group, sized and placed as one)."""
    replica, other = gpod("r-0"), gpod("o-0")
    replica["spec"]["workloadRef"] = {"name": "wl", "podGroup": "a", "podGroupReplicaKey": "b"}
    other["spec"]["workloadRef"] = {"name": "wl", "podGroup": "a-b"}
    one, two = group_of(replica, CFG), group_of(other, CFG)
    assert one is not None and two is not None
    assert one.key != two.key
    assert model.object_name(one.key) != model.object_name(two.key)


# --- the admission rule -------------------------------------------------------------------------


def cache(nodes: list[dict[str, Any]], bound: list[dict[str, Any]] = ()) -> Cache:
    c = Cache(CFG)
    for n in nodes:
        c.upsert_node(n)
    for p in bound:
        c.upsert_pod(p)
    return c


def members(n: int, *, gpus: int = 8, gated: bool = True) -> list[Member]:
    return [
        Member(p["metadata"]["name"], p["metadata"]["name"], pod_needs(p), gated)
        for p in job_pods("t", n, gpus=gpus)
    ]


SPEC = group_of(job_pods("t", 1)[0], CFG)


def test_size_unknown_waits_with_the_reason() -> None:
    v = admit(SPEC, Size(None, "", "group size unknown: Job ml/t not found"), members(2), cache(fleet()), CFG)
    assert (v.outcome, v.reason) == ("wait", "group size unknown: Job ml/t not found")


def test_too_few_members_wait() -> None:
    v = admit(SPEC, Size(4, "Job t: parallelism"), members(3), cache(fleet()), CFG)
    assert v.outcome == "wait" and "3 of 4 exist (Job t: parallelism)" in v.reason and not v.assignments


def test_with_more_gated_pods_than_places_the_oldest_are_the_group() -> None:
    ms = [Member(m.name, m.uid, m.needs, True, created=float(10 - i)) for i, m in enumerate(members(5))]
    v = admit(SPEC, Size(4, "s"), ms, cache(fleet()), CFG)
    assert v.outcome == "admitted" and sorted(v.assignments) == ["t-1", "t-2", "t-3", "t-4"]


def test_a_member_neither_gated_nor_bound_does_not_count_and_holds_nothing_back() -> None:
    ms = members(3)
    ms[1] = Member(ms[1].name, ms[1].uid, ms[1].needs, gated=False)
    v = admit(SPEC, Size(3, "s"), ms, cache(fleet()), CFG)
    assert v.outcome == "wait" and "2 of 3 exist" in v.reason
    v = admit(SPEC, Size(2, "s"), ms, cache(fleet()), CFG)
    assert v.outcome == "admitted" and sorted(v.assignments) == ["t-0", "t-2"]


def test_a_complete_bound_group_admits_no_extra_pod() -> None:
    ms = members(3)
    ms = [Member(m.name, m.uid, m.needs, False, node=f"eu-a-{i}") for i, m in enumerate(ms[:2])] + ms[2:]
    v = admit(SPEC, Size(2, "s"), ms, cache(fleet()), CFG)
    assert v.outcome == "wait" and "has its 2 pods bound" in v.reason and not v.assignments


def test_a_replacement_pod_joins_its_bound_members_location() -> None:
    ms = members(3)
    ms = [Member(m.name, m.uid, m.needs, False, node=f"eu-b-{i}") for i, m in enumerate(ms[:2])] + ms[2:]
    v = admit(SPEC, Size(3, "s"), ms, cache(fleet()), CFG)
    assert v.outcome == "admitted" and v.assignments["t-2"].startswith("eu-b-")


def test_only_pods_the_owner_controls_count() -> None:
    owner = owners.Owner(OwnerRef("batch", "v1", "jobs", "Job", "ml", "t"), (2, "Job t"), "", "job-uid")
    mine = gpod(
        "t-0",
        owner={"apiVersion": "batch/v1", "kind": "Job", "name": "t", "uid": "job-uid", "controller": True},
    )
    copied = gpod("t-x", labels={"batch.kubernetes.io/job-name": "t"})
    forged = gpod("t-y", owner={"kind": "Job", "name": "t", "uid": "other", "controller": True})
    assert owners.controls(owner, mine)
    assert not owners.controls(owner, copied) and not owners.controls(owner, forged)
    assert owners.controls(None, copied)  # no owner read: nothing to hold them to
    jobset = owners.Owner(
        OwnerRef("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", "ml", "s"), None, "", "u"
    )
    # Its Jobs control its pods: on its own the pod's reference proves nothing (chain.membership reads it).
    assert not owners.controls(jobset, copied)


def test_admitted_assignments_fill_the_planned_nodes_by_slots_deterministically() -> None:
    snap = cache(fleet(per_zone=4))
    a = admit(SPEC, Size(8, "s"), members(8, gpus=4), snap, CFG)
    b = admit(SPEC, Size(8, "s"), list(reversed(members(8, gpus=4))), cache(fleet(per_zone=4)), CFG)
    assert a.outcome == "admitted" and a.assignments == b.assignments
    per_node: dict[str, int] = {}
    for node in a.assignments.values():
        per_node[node] = per_node.get(node, 0) + 1
    assert sorted(per_node.values()) == [2, 2, 2, 2]  # 8 GPUs a node, 4 a pod
    assert len({n.rsplit("-", 1)[0] for n in per_node}) == 1
    assert a.reason == a.decision.summary


def test_a_group_too_big_for_now_waits_and_one_too_big_for_ever_never_fits() -> None:
    busy = [gpod(f"b-{i}", gated=False) for i in range(7)]
    for i, p in enumerate(busy):
        p["spec"]["nodeName"] = f"eu-{'a' if i < 4 else 'b'}-{i % 4}"
    v = admit(SPEC, Size(4, "s"), members(4), cache(fleet(), busy), CFG)
    assert v.outcome == "wait" and "waits for one" in v.reason
    v = admit(SPEC, Size(9, "s"), members(9), cache(fleet()), CFG)
    assert v.outcome == "never-fits" and v.reason.startswith("never fits")


def test_held_capacity_keeps_the_next_group_off_the_admitted_nodes() -> None:
    snap = cache(fleet())

    def hold(tag: str, assignments: dict[str, str]) -> None:  # what the controller does on admission
        for name, node in assignments.items():
            p = gpod(name)
            p["metadata"]["uid"] = f"{tag}-{name}"
            p["spec"]["nodeName"] = node
            snap.upsert_pod(p)

    first = admit(SPEC, Size(4, "s"), members(4), snap, CFG)
    assert first.outcome == "admitted"
    hold("first", dict(first.assignments))
    other = group_of(job_pods("u", 1)[0], CFG)
    second = admit(other, Size(4, "s"), members(4), snap, CFG)
    assert second.outcome == "admitted"
    assert not set(first.assignments.values()) & set(second.assignments.values())
    hold("second", dict(second.assignments))
    third = admit(other, Size(1, "s"), members(1), snap, CFG)
    assert third.outcome == "wait"


def test_pods_ask_for_the_largest_request_among_members() -> None:
    ms = members(2, gpus=8)
    small = job_pods("t", 1, gpus=1)[0]
    ms[0] = Member("t-0", "t-0", pod_needs(small), True)
    v = admit(SPEC, Size(2, "s"), ms, cache(fleet()), CFG)
    assert v.outcome == "admitted" and len(set(v.assignments.values())) == 2


# --- pins ---------------------------------------------------------------------------------------

TERM = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {pins.REQUIRED: {"nodeSelectorTerms": list(terms)}}}


@pytest.mark.parametrize(
    "aff",
    [
        None,
        {"podAntiAffinity": {}},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        affinity(),
        affinity(TERM),
        affinity(TERM, {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]}),
    ],
)
def test_pinning_narrows_every_term_and_touches_nothing_else(aff: dict[str, Any] | None) -> None:
    p = gpod("p", affinity=aff)
    p["metadata"]["uid"] = "u1"
    p["spec"]["nodeSelector"] = {"pool": "a"}
    patched = jsonpatch.apply_patch(p, pins.pin_patch(p, "n1"))
    assert pins.pinned_to(patched, "n1") and pins.pin_patch(patched, "n1") is None
    terms = patched["spec"]["affinity"]["nodeAffinity"][pins.REQUIRED]["nodeSelectorTerms"]
    before = ((aff or {}).get("nodeAffinity") or {}).get(pins.REQUIRED, {}).get("nodeSelectorTerms") or []
    assert len(terms) == max(1, len(before))
    for old, new in zip(before, terms, strict=False):
        assert new.get("matchExpressions") == old.get("matchExpressions")
    assert patched["spec"]["nodeSelector"] == {"pool": "a"}
    for key in ("podAntiAffinity",):
        assert (patched["spec"]["affinity"].get(key) is None) == ((aff or {}).get(key) is None)


def test_ungating_removes_only_our_gate_and_fails_if_the_list_moved() -> None:
    p = gpod("p", other_gate=True)
    p["metadata"]["uid"] = "u1"
    patch = pins.ungate_patch(p, GATE)
    assert [g["name"] for g in jsonpatch.apply_patch(p, patch)["spec"]["schedulingGates"]] == [
        "example.com/other"
    ]
    moved = {**p, "spec": {**p["spec"], "schedulingGates": [{"name": GATE}]}}
    with pytest.raises(jsonpatch.JsonPatchException):
        jsonpatch.apply_patch(moved, patch)
    recreated = {**p, "metadata": {**p["metadata"], "uid": "u2"}}
    with pytest.raises(jsonpatch.JsonPatchException):
        jsonpatch.apply_patch(recreated, patch)
    assert pins.ungate_patch(gpod("q", gated=False), GATE) is None
    assert pins.ungate_patch({"spec": {"schedulingGates": "garbage"}}, GATE) is None


def test_cordoned_and_momentarily_tainted_nodes_are_not_given_now() -> None:
    nodes = fleet(zones=("eu-a",), per_zone=3)
    nodes[1]["spec"] = {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}
    v = admit(SPEC, Size(2, "s"), members(2), cache(nodes), CFG, unschedulable={"eu-a-0"})
    assert v.outcome == "wait" and not v.assignments  # one node of three is usable now
    v = admit(SPEC, Size(1, "s"), members(1), cache(nodes), CFG, unschedulable={"eu-a-0"})
    assert v.assignments == {"t-0": "eu-a-2"}
    tolerant = job_pods("t", 2)
    for p in tolerant:
        p["spec"]["tolerations"] = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]
    ms = [Member(p["metadata"]["name"], p["metadata"]["name"], pod_needs(p), True) for p in tolerant]
    v = admit(SPEC, Size(2, "s"), ms, cache(nodes), CFG, unschedulable={"eu-a-0"})
    assert sorted(v.assignments.values()) == ["eu-a-1", "eu-a-2"]


def test_each_member_is_given_only_a_node_its_own_rules_admit() -> None:
    """Members whose node rules differ (a leader with its own selector, or any pod of a group without an
    owner): each gets a node its own selector, affinity and tolerations admit, or the group waits. A pin
    to a node the pod itself refuses never binds: it would only time out, be evicted and come back."""
    pods = job_pods("t", 2)
    pods[1]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "eu-b-3"}
    ms = [Member(p["metadata"]["name"], p["metadata"]["name"], pod_needs(p), True) for p in pods]
    snap = cache(fleet())
    v = admit(SPEC, Size(2, "s"), ms, snap, CFG)
    for m in ms:
        if m.name in v.assignments:
            assert m.needs.admits(snap.views[v.assignments[m.name]].record), (m.name, v.assignments)
    assert v.outcome == "wait" and "each pod's own node rules admit" in v.reason, v


def test_backoff_doubles_is_capped_and_cheap_for_any_attempt_count() -> None:
    assert [backoff_s(n, 5.0) for n in (-3, 0, 1, 2, 3)] == [5.0, 5.0, 5.0, 10.0, 20.0]
    assert backoff_s(7, 5.0) == BACKOFF_CAP_S
    # A count read back from a PlacementGroup (int64 in its schema): the cap, at once.
    assert backoff_s(2**62, 5.0) == BACKOFF_CAP_S
    assert backoff_s(10**18, 0.001) == BACKOFF_CAP_S
