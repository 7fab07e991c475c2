"""The pure rules, as tables: a pod's node rules, nodes and pods read field by field, persisted claims,
and the capacity index against a count done the slow way."""

from __future__ import annotations

import random
from typing import Any

import pytest
from extender_fixtures import node, pod

from nodefabric_operator.extender import decisions
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.index import Index, NodeView, Shape, homog_values
from nodefabric_operator.extender.nodes import NodeError, NodeRecord, Taint, parse_node
from nodefabric_operator.extender.pods import PodError, pod_needs

CONFIG = ExtenderConfig()


def record(
    labels: dict[str, str] | None = None, *, taints: tuple[Taint, ...] = (), gpus: int = 8
) -> NodeRecord:
    return NodeRecord(
        name="gpu-7",
        labels=labels or {"pool": "a", "rank": "5"},
        allocatable={"nvidia.com/gpu": gpus},
        memory=1 << 40,
        cpu=96_000,
        taints=taints,
    )


def needs(**spec: Any) -> Any:
    p = pod("p", gpus=8)
    p["spec"].update(spec)
    return pod_needs(p)


def term(
    *expressions: tuple[str, str, list[str]], fields: list[tuple[str, str, list[str]]] | None = None
) -> Any:
    t: dict[str, Any] = {
        "matchExpressions": [{"key": k, "operator": o, "values": v} for k, o, v in expressions]
    }
    if fields:
        t["matchFields"] = [{"key": k, "operator": o, "values": v} for k, o, v in fields]
    return t


def affinity(*terms: Any) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}


@pytest.mark.parametrize(
    ("spec", "admitted"),
    [
        ({}, True),
        ({"nodeSelector": {"pool": "a"}}, True),
        ({"nodeSelector": {"pool": "b"}}, False),
        ({"nodeSelector": {"absent": ""}}, False),
        (affinity(term(("pool", "In", ["a", "b"]))), True),
        (affinity(term(("pool", "In", ["b"]))), False),
        (affinity(term(("pool", "NotIn", ["b"]))), True),
        (affinity(term(("absent", "NotIn", ["b"]))), True),
        (affinity(term(("pool", "Exists", []))), True),
        (affinity(term(("pool", "DoesNotExist", []))), False),
        (affinity(term(("rank", "Gt", ["4"]))), True),
        (affinity(term(("rank", "Gt", ["5"]))), False),
        (affinity(term(("rank", "Lt", ["6"]))), True),
        (affinity(term(("pool", "Gt", ["1"]))), False),  # not an integer: no match
        (affinity(term(("absent", "Lt", ["9"]))), False),
        (affinity(term(("pool", "In", ["a"]), ("rank", "In", ["6"]))), False),  # ANDed in a term
        (affinity(term(("pool", "In", ["b"])), term(("rank", "In", ["5"]))), True),  # terms ORed
        (affinity(term()), False),  # an empty term matches no node
        (affinity(), False),  # no term at all: nothing matches
        (affinity(term(fields=[("metadata.name", "In", ["gpu-7"])])), True),
        (affinity(term(fields=[("metadata.name", "NotIn", ["gpu-7"])])), False),
    ],
)
def test_node_selector_and_required_affinity(spec: dict[str, Any], admitted: bool):
    assert needs(**spec).admits(record()) is admitted


@pytest.mark.parametrize(
    ("label", "admitted"),
    [
        ("6", True),
        ("+6", True),  # Go's ParseInt takes a sign and leading zeros too
        ("006", True),
        ("-6", False),
        ("1_000", False),  # int() reads 1000; kube-scheduler reads no integer, so no match
        ("99999999999999999999", False),  # beyond int64
        ("9223372036854775807", True),
        ("", False),
    ],
)
def test_gt_and_lt_read_label_values_as_kube_scheduler_does(label: str, admitted: bool):
    assert needs(**affinity(term(("rank", "Gt", ["5"])))).admits(record({"rank": label})) is admitted


NO_SCHEDULE = Taint("team", "ml", "NoSchedule")
SLA = Taint("sla", "950", "NoSchedule")


@pytest.mark.parametrize(
    ("taint", "tolerations", "admitted"),
    [
        (NO_SCHEDULE, [], False),
        (Taint("team", "ml", "NoExecute"), [], False),
        (Taint("team", "ml", "PreferNoSchedule"), [], True),  # only a preference
        (NO_SCHEDULE, [{"key": "team", "operator": "Equal", "value": "ml"}], True),
        (NO_SCHEDULE, [{"key": "team", "value": "ml"}], True),  # Equal is the default operator
        (NO_SCHEDULE, [{"key": "team", "operator": "Equal", "value": "cv"}], False),
        (NO_SCHEDULE, [{"key": "team", "operator": "Exists"}], True),
        (NO_SCHEDULE, [{"operator": "Exists"}], True),  # no key: every taint
        (NO_SCHEDULE, [{"key": "team", "operator": "Exists", "effect": "NoExecute"}], False),
        (NO_SCHEDULE, [{"key": "team", "operator": "Exists", "effect": "NoSchedule"}], True),
        # Gt and Lt (Kubernetes 1.35): the taint's value compared with the toleration's.
        (SLA, [{"key": "sla", "operator": "Gt", "value": "900"}], True),
        (SLA, [{"key": "sla", "operator": "Gt", "value": "950"}], False),
        (SLA, [{"key": "sla", "operator": "Lt", "value": "1000"}], True),
        (SLA, [{"key": "sla", "operator": "Lt", "value": "900", "effect": "NoSchedule"}], False),
        (SLA, [{"key": "team", "operator": "Gt", "value": "1"}], False),  # another key
        (Taint("sla", "high", "NoSchedule"), [{"key": "sla", "operator": "Gt", "value": "1"}], False),
        # Conditions of the moment never make a group "never fit".
        (Taint("node.kubernetes.io/not-ready", "", "NoExecute"), [], True),
        (Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"), [], True),
        (Taint("node.cloudprovider.kubernetes.io/uninitialized", "true", "NoSchedule"), [], True),
    ],
)
def test_taints_and_tolerations(taint: Taint, tolerations: list[dict[str, str]], admitted: bool):
    assert needs(tolerations=tolerations).admits(record(taints=(taint,))) is admitted


def test_allocatable_cpu_memory_and_extended_resources():
    assert needs().admits(record(gpus=8))
    assert not needs().admits(record(gpus=4))  # the pod asks 8 GPUs
    big = pod("p", gpus=1)
    big["spec"]["containers"][0]["resources"]["requests"].update({"cpu": "97", "memory": "2Ti"})
    assert not pod_needs(big).admits(record())


def test_a_pods_requests_as_the_scheduler_counts_them():
    p = pod("p")
    c = p["spec"]["containers"]
    c[0]["resources"] = {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}  # limits only: copied to requests
    c.append(
        {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "500m", "memory": "1Gi"}}}
    )
    p["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"nvidia.com/gpu": "4", "cpu": "100m"}}},  # alone, before
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"memory": "1Gi"}}},
    ]
    p["spec"]["overhead"] = {"cpu": "250m"}
    got = pod_needs(p)
    assert dict(got.extended) == {"nvidia.com/gpu": 4}  # the init container's 4 beats the 2+1 beside it
    assert (got.cpu, got.memory) == (1750, 2 << 30)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"containers": [{"resources": {"requests": {"nvidia.com/gpu": -1}}}]}, "is not a non-negative"),
        ({"containers": [{"resources": {"requests": {"nvidia.com/gpu": True}}}]}, "got bool"),
        ({"containers": [{"resources": []}]}, "spec.containers[0].resources: must be an object"),
        ({"overhead": {"cpu": "x"}}, "spec.overhead['cpu']: 'x' is not a quantity"),
        ({"tolerations": [{"key": 5}]}, "spec.tolerations[0].key: must be a string, got int"),
        ({"tolerations": [{"key": "sla", "operator": "Gt", "value": "1_000"}]},
         "spec.tolerations[0].value: Gt compares integers, got '1_000'"),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}},
         "requiredDuringSchedulingIgnoredDuringExecution: must be an object"),
        (affinity(term(("k", "Near", ["x"])))["affinity"] and affinity(term(("k", "Near", ["x"]))),
         "operator: must be one of DoesNotExist, Exists, Gt, In, Lt, NotIn, got 'Near'"),
    ],
)  # fmt: skip
def test_a_pod_the_extender_cannot_read_is_an_error_naming_the_field(spec: dict[str, Any], message: str):
    with pytest.raises(PodError) as refused:
        pod_needs({"metadata": {}, "spec": spec})
    assert message in str(refused.value)


def test_quantities_read_once_per_spelling_refuse_the_same_values_every_time():
    """The parse of each spelling is kept: a value refused once is refused again, a bool stays apart from
    the 1 it equals, and a value that cannot be kept (a list) is still refused, not crashed on."""
    ok = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": 1, "cpu": "500m"}}}]}
    for _ in range(2):
        assert dict(pod_needs({"metadata": {}, "spec": ok}).extended) == {"nvidia.com/gpu": 1}
    huge = ("9" * 100_000, r"'9{64}\.\.\.' is not a quantity")  # refused before anything hashes it
    for value, message in [(True, "got bool"), ("1.5", "not a whole number"), (["1"], "got list"), huge]:
        spec = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": value}}}]}
        for _ in range(2):
            with pytest.raises(PodError, match=message):
                pod_needs({"metadata": {}, "spec": spec})
    # "1.5" is a whole-number refusal for a GPU but a fine cpu: the flag is part of what is kept.
    half = {"containers": [{"resources": {"requests": {"cpu": "1.5"}}}]}
    assert pod_needs({"metadata": {}, "spec": half}).cpu == 1500


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda n: n.update(metadata="x"), "Node.metadata: must be an object, got str"),
        (
            lambda n: n["metadata"].update(name=""),
            "Node.metadata.name: '' is not a node name (a DNS subdomain)",
        ),
        (lambda n: n["metadata"].update(name="n" * 254), "Node.metadata.name: 'nnnnnnnn"),
        (lambda n: n["metadata"].update(name='we"ird'), "Node.metadata.name: 'we\"ird' is not a node name"),
        (
            lambda n: n["metadata"]["labels"].update(zone=["a"]),
            "Node.metadata.labels['zone']: must be a string",
        ),
        (lambda n: n["metadata"]["labels"].update(zone="z" * 64), "longer than 63 characters"),
        (
            lambda n: n["metadata"]["labels"].update(zone="eu a\n"),
            "Node.metadata.labels['zone']: 'eu a\\n' is not a label value ([A-Za-z0-9_.-])",
        ),
        (
            lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "1.5"}),
            "'1.5' is not a whole number",
        ),
        (lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "\u0668"}), "is not a quantity"),
        (lambda n: n["status"]["allocatable"].update(memory="1e400"), "'1e400' is beyond int64"),
        (lambda n: n["spec"].update(taints={"key": "k"}), "Node.spec.taints: must be a list, got dict"),
        (lambda n: n["spec"].update(taints=[{"effect": "NoSchedule"}]), "taints[0].key: must be a non-empty"),
    ],
)
def test_a_node_the_extender_cannot_read_is_an_error_naming_the_field(mutate: Any, message: str):
    n = node("n-0", zone="z")
    mutate(n)
    with pytest.raises(NodeError) as refused:
        parse_node(n)
    assert message in str(refused.value)


def test_a_node_as_read():
    n = node("n-0", zone="z", gpus=4)
    n["spec"]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    got = parse_node(n)
    assert (got.name, dict(got.allocatable), got.cpu, got.memory) == (
        "n-0",
        {"nvidia.com/gpu": 4},
        96_000,
        1056 << 30,
    )
    assert got.taints == (Taint("k", "", "NoSchedule"),)


# The decision annotation: a copy for `kubectl describe pod`, never read back.


def test_the_decision_text_is_wrapped_for_kubectl_describe():
    summary = (
        "2 of 2 pods of group ml/explicit/train go to zone eu-a (nodes " + ", ".join(["gpu-node"] * 60) + ")"
    )
    decision = decisions.decision_text("placed", summary)
    assert all(len(line) <= decisions.LINE for line in decision.splitlines())
    assert decision.replace("\n", " ") == f"placed: {summary}"
    assert len(decisions.decision_text("wait", "x " * 5000)) <= decisions.MAX_TEXT + 20


@pytest.mark.parametrize(
    ("outcome", "summary", "text"),
    [
        ("never-fits", "never fits: no zone can hold the 8 pods", "never fits: no zone can hold the 8 pods"),
        ("wait", "group g waits for one zone", "wait: group g waits for one zone"),
        ("placed", "8 of 8 pods of group g go to zone a", "placed: 8 of 8 pods of group g go to zone a"),
        ("invalid", "bad locality", "invalid: bad locality"),
    ],
)
def test_the_outcome_is_never_said_twice(outcome: str, summary: str, text: str):
    assert decisions.decision_text(outcome, summary) == text


def test_the_extender_writes_only_the_decision_annotation():
    assert decisions.key(CONFIG) == "placement.gpustack.ai/decision"
    assert not hasattr(decisions, "parse_claim"), "claims are never read back from pods"


# The capacity index against the slow count.


def _view(i: int, rng: random.Random) -> NodeView:
    labels = {"nvidia.com/gpu.product": rng.choice(["H100", "A100", ""])}
    labels = {k: v for k, v in labels.items() if v}
    zone = rng.choice(["z0", "z1", "z2", None])
    region = None if zone is None else ("r0" if zone != "z2" else "r1")
    free = rng.choice([0, 2, 4, 8])
    cpu = rng.choice([0, 6000, 16000])
    return NodeView(
        name=f"n-{i}",
        labels=labels,
        locations=(zone, region),
        free={"nvidia.com/gpu": free},
        allocatable={"nvidia.com/gpu": 8},
        spare=(cpu, 1 << 30, rng.choice([0, 3, 110])),
        size=(16000, 1 << 34, 110),
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_capacity_index_counts_what_a_walk_over_every_node_counts(seed: int):
    rng = random.Random(seed)
    keys = ("nvidia.com/gpu.product",)
    views = {f"n-{i}": _view(i, rng) for i in range(60)}
    index = Index.of(views.values(), 2, [keys])
    # Nodes change as watches deliver: the index follows, and equals one built afresh.
    for _ in range(40):
        changed = _view(rng.randrange(80), rng)
        if rng.random() < 0.2 and changed.name in index.views:
            index.remove(index.views[changed.name])
            views.pop(changed.name)
        else:
            index.add(changed)
            views[changed.name] = changed
    fresh = Index.of(views.values(), 2, [keys])
    h, f = index.homogeneity(keys), fresh.homogeneity(keys)
    assert h.track and not Index.of(views.values(), 2).homogeneity(keys).members  # configured ones only
    assert h.vectors == f.vectors and h.by_values == f.by_values and h.missing == f.missing
    assert h.members == f.members
    for li in range(2):  # each bucket's nodes: a location's nodes of one value tuple, none left out
        walked: dict[Any, set[str]] = {}
        for name, v in views.items():
            values = homog_values(v.labels, keys)
            if values is not None and v.locations[li] is not None:
                walked.setdefault((values, v.locations[li]), set()).add(name)
        assert h.members[li] == walked
    for shape in (Shape({"nvidia.com/gpu": 4}), Shape({"nvidia.com/gpu": 8}), Shape({}, cpu=4000)):
        for share in (1.0, 0.7, 0.2):
            feasible = {n for n in views if rng.random() < share}
            for li in range(3):  # zone, region, any
                got = {b: t for b, t in index.capacities(h, li, shape, feasible).items() if t}
                assert got == _slow_capacities(views, keys, li, shape, feasible), (shape, share, li)


def _slow_capacities(
    views: dict[str, NodeView], keys: tuple[str, ...], li: int, shape: Shape, feasible: set[str]
) -> dict[Any, int]:
    slow: dict[Any, int] = {}
    for name in feasible:
        v = views[name]
        values = homog_values(v.labels, keys)
        loc = v.locations[li] if li < 2 else None
        if values is None or (li < 2 and loc is None):
            continue
        slow[(values, loc)] = slow.get((values, loc), 0) + max(1, shape.now(v))
    return slow


@pytest.mark.parametrize("seed", range(3))
def test_capacities_asked_between_every_change_never_answer_from_a_stale_memo(seed: int):
    """Requests come between watch events: each answer (memoized per index version, per shape) must be
    the walk's over the fleet as it is now, for configured key tuples and for ones a group names (built
    on first use, evicted past EXTRA_KEY_TUPLES, built again), as nodes change product or zone, go and
    come back."""
    from nodefabric_operator.extender.index import EXTRA_KEY_TUPLES

    rng = random.Random(1000 + seed)
    pinned = ("nvidia.com/gpu.product",)
    views = {f"n-{i}": _view(i, rng) for i in range(40)}
    index = Index.of(views.values(), 2, [pinned])
    shapes = (Shape({"nvidia.com/gpu": 2}), Shape({"nvidia.com/gpu": 8}), Shape({}, cpu=4000))
    extra = [(f"x/{k}",) for k in range(EXTRA_KEY_TUPLES + 3)]
    for step in range(300):
        changed = _view(rng.randrange(60), rng)
        if rng.random() < 0.3:  # a label of the extra keys, so their buckets are not empty
            changed = NodeView(
                name=changed.name,
                labels={**changed.labels, rng.choice(extra)[0]: rng.choice(["a", "b"])},
                locations=changed.locations,
                free=changed.free,
                allocatable=changed.allocatable,
                spare=changed.spare,
                size=changed.size,
            )
        if rng.random() < 0.2 and changed.name in index.views:
            index.remove(index.views[changed.name])
            del views[changed.name]
        else:
            index.add(changed)
            views[changed.name] = changed
        keys = pinned if rng.random() < 0.5 else rng.choice(extra)
        h = index.homogeneity(keys)
        shape = rng.choice(shapes)
        feasible = {n for n in views if rng.random() < rng.choice((1.0, 0.8, 0.3))}
        li = rng.randrange(3)
        got = {b: t for b, t in index.capacities(h, li, shape, feasible).items() if t}
        assert got == _slow_capacities(views, keys, li, shape, feasible), (step, keys, shape, li)
        assert index.names == set(views)
