"""Group identity and size from each label family, and the placement annotations."""

from __future__ import annotations

import pytest
from extender_fixtures import explicit, extender, filter_, fleet, pod

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import InvalidPlacement, group_of

CONFIG = ExtenderConfig()


@pytest.mark.parametrize(
    ("labels", "annotations", "key", "size"),
    [
        ({"scheduling.x-k8s.io/pod-group": "pg"}, {}, "ml/scheduler-plugins/pg", None),
        (
            {"kueue.x-k8s.io/pod-group-name": "kq"},
            {"kueue.x-k8s.io/pod-group-total-count": "4"},
            "ml/kueue/kq",
            4,
        ),
        (
            {"jobset.sigs.k8s.io/jobset-name": "js", "batch.kubernetes.io/job-name": "js-w-0"},
            {},
            "ml/jobset/js",
            None,
        ),
        ({"batch.kubernetes.io/job-name": "jb"}, {}, "ml/job/jb", None),
        (
            {"training.kubeflow.org/job-name": "pt", "training.kubeflow.org/replica-type": "worker"},
            {},
            "ml/kubeflow/pt",
            None,
        ),
        (
            {"leaderworkerset.sigs.k8s.io/name": "lws", "leaderworkerset.sigs.k8s.io/group-index": "2"},
            {"leaderworkerset.sigs.k8s.io/size": "4"},
            "ml/leaderworkerset/lws-2",
            4,
        ),
        ({"volcano.sh/job-name": "vj"}, {"scheduling.k8s.io/group-name": "vj-pg"}, "ml/volcano/vj", None),
        (
            {"placement.gpustack.ai/group": "mine", "batch.kubernetes.io/job-name": "j"},
            {"placement.gpustack.ai/group-size": "16"},
            "ml/explicit/mine",
            16,
        ),
    ],
)
def test_group_identity_and_size_per_label_family(labels, annotations, key, size):
    spec = group_of(pod("p-0", labels=labels, annotations=annotations), CONFIG)
    assert spec is not None
    assert (spec.key, spec.size) == (key, size)
    # No homogeneity annotation: the configured default for the pod's resources applies (None here).
    assert (spec.locality, spec.rank, spec.homogeneous_keys) == ("prefer", "spread", None)


def test_explicit_size_overrides_a_family_size_and_annotations_choose_policies():
    p = pod(
        "p",
        labels={"kueue.x-k8s.io/pod-group-name": "kq"},
        annotations={
            "kueue.x-k8s.io/pod-group-total-count": "4",
            "placement.gpustack.ai/group-size": "8",
            "placement.gpustack.ai/locality": "zone",
            "placement.gpustack.ai/rank": "first-fit",
            "placement.gpustack.ai/homogeneous": "nvidia.com/gpu.product, example.com/torch",
        },
    )
    spec = group_of(p, CONFIG)
    assert spec is not None
    assert (spec.size, spec.locality, spec.rank) == (8, "zone", "first-fit")
    assert spec.homogeneous_keys == ("nvidia.com/gpu.product", "example.com/torch")


@pytest.mark.parametrize("name", ["has spaces", "x" * 64, 'quote"d', "-leading"])
def test_an_explicit_group_name_is_a_label_value(name: str):
    with pytest.raises(InvalidPlacement) as refused:
        group_of(pod("p", annotations={"placement.gpustack.ai/group": name}), CONFIG)
    assert "placement.gpustack.ai/group" in str(refused.value) and "is not a label value" in str(
        refused.value
    )


def test_a_pod_of_no_group_and_a_configured_domain():
    assert group_of(pod("web"), CONFIG) is None
    other = ExtenderConfig(domain="example.org")
    spec = group_of(pod("p", labels={"placement.example.org/group": "g"}), other)
    assert spec is not None and spec.key == "ml/explicit/g"
    assert group_of(pod("p", labels={"placement.gpustack.ai/group": "g"}), other) is None


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"placement.gpustack.ai/locality": "rack"},
            "placement.gpustack.ai/locality 'rack' is not one of prefer, "
            "fabric, network-group, zone, region, any",
        ),
        ({"placement.gpustack.ai/rank": "random"}, "placement.gpustack.ai/rank 'random' is not one of"),
        (
            {"placement.gpustack.ai/group-size": "eight"},
            "placement.gpustack.ai/group-size: group size 'eight': not a plain ASCII decimal number",
        ),
        (
            {"placement.gpustack.ai/group-size": "1_000"},
            "placement.gpustack.ai/group-size: group size '1_000': not a plain ASCII decimal number",
        ),
        (
            {"placement.gpustack.ai/group-size": "\u0668"},  # ARABIC-INDIC DIGIT EIGHT: int() takes it
            "placement.gpustack.ai/group-size: group size '\u0668': not a plain ASCII decimal number",
        ),
        (
            {"placement.gpustack.ai/group-size": " 8"},
            "placement.gpustack.ai/group-size: group size ' 8': not a plain ASCII decimal number",
        ),
        ({"placement.gpustack.ai/group-size": "0"}, "group size '0': outside 1..100000"),
        ({"placement.gpustack.ai/group-size": "9" * 40}, "9999... (40 characters)': outside 1..100000"),
        ({"kueue.x-k8s.io/pod-group-total-count": "+4"}, "kueue.x-k8s.io/pod-group-total-count: group size"),
        (
            {"placement.gpustack.ai/homogeneous": "nvidia.com/gpu.product, not a key!"},
            "placement.gpustack.ai/homogeneous: 'not a key!' is not a label key",
        ),
        (
            {"placement.gpustack.ai/homogeneous": ",".join(f"example.com/k{i}" for i in range(17))},
            "placement.gpustack.ai/homogeneous names 17 keys, at most 16",
        ),
    ],
)
def test_bad_annotations_are_clear_errors(annotations, message):
    labels = {"placement.gpustack.ai/group": "g"}
    if any(k.startswith("kueue") for k in annotations):
        labels = {"kueue.x-k8s.io/pod-group-name": "kq"}
    with pytest.raises(InvalidPlacement) as refused:
        group_of(pod("p", labels=labels, annotations=annotations), CONFIG)
    assert message in str(refused.value)
    assert refused.value.group is not None  # recorded under its group


@pytest.mark.parametrize(
    ("annotations", "locality", "rank"),
    [
        ({"placement.gpustack.ai/locality": "network_group"}, "network-group", "spread"),
        ({"placement.gpustack.ai/rank": "first_fit"}, "prefer", "first-fit"),
        ({"placement.gpustack.ai/rank": "most_free_memory"}, "prefer", "most-free-memory"),
        ({"placement.gpustack.ai/locality": "network-group", "placement.gpustack.ai/rank": "first-fit"},
         "network-group", "first-fit"),
    ],
)  # fmt: skip
def test_the_seeds_spellings_are_aliases(annotations, locality, rank):
    spec = group_of(pod("p", labels={"placement.gpustack.ai/group": "g"}, annotations=annotations), CONFIG)
    assert spec is not None and (spec.locality, spec.rank) == (locality, rank)
    config = ExtenderConfig.model_validate(
        {"defaultLocality": "network_group", "defaultRank": "most_free_memory"}
    )
    assert (config.default_locality, config.default_rank) == ("network-group", "most-free-memory")


async def test_invalid_annotation_makes_every_node_unresolvable_with_the_message():
    nodes = fleet(per_zone=1)
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        p = pod("p", **explicit("g", 2, locality="closest"))
        result = await filter_(client, p, names)
        assert result["NodeNames"] == [] and result["FailedNodes"] == {}
        assert set(result["FailedAndUnresolvableNodes"]) == set(names)
        assert (
            "placement.gpustack.ai/locality 'closest' is not one of"
            in result["FailedAndUnresolvableNodes"][names[0]]
        )


async def test_size_from_podgroup_min_member_and_from_the_pods_seen():
    nodes = fleet(per_zone=4)
    names = [n["metadata"]["name"] for n in nodes]
    podgroup = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "ml"},
        "spec": {"minMember": 3},
    }
    job_pods = [pod(f"jb-{i}", gpus=8, labels={"batch.kubernetes.io/job-name": "jb"}) for i in range(4)]
    async with extender([*nodes, podgroup, *job_pods]) as client:
        await filter_(client, pod("pg-0", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "pg"}), names)
        await filter_(client, job_pods[0], names)
        groups = {g["group"]: g for g in await (await client.get("/debug/groups")).json()}
        assert (groups["ml/scheduler-plugins/pg"]["size"], groups["ml/scheduler-plugins/pg"]["sizeFrom"]) == (
            3,
            "PodGroup minMember",
        )
        assert (groups["ml/job/jb"]["size"], groups["ml/job/jb"]["sizeFrom"]) == (4, "pods seen")
        assert groups["ml/job/jb"]["level"] == "zone"
